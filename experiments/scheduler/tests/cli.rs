//! The `scheduler` binary end to end on the tiny generated checkpoint: what it writes, what it
//! refuses, and what it never records.

use common::policy::Policy;
use common::schedule::RunConfig;
use scheduler::study::{consistency, run_invariants, SchedulerArtifact};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Runs the binary from the workspace root with its own models folder.
fn scheduler(models: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scheduler"));
    cmd.current_dir(root()).env("LAB_MODELS_DIR", models).env("HF_HUB_OFFLINE", "1").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read(path: &Path) -> (String, SchedulerArtifact) {
    let text = std::fs::read_to_string(path).unwrap();
    let artifact = common::artifact::read_artifact(path).unwrap();
    (text, artifact)
}

#[test]
fn tiny_manifest_run_writes_a_consistent_artifact_without_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run.json");
    let secret = "hf_TestSecretToken123456";
    let home = "/home/alice-example";
    let o = scheduler(
        &tmp.path().join("models"),
        &[
            "--manifest",
            "manifests/scheduler/tiny.json",
            "--rounds",
            "2",
            "--warmup",
            "0",
            "--out",
            out.to_str().unwrap(),
        ],
        &[("HF_TOKEN", secret), ("HOME", home), ("OPENAI_API_KEY", "sk-another-secret-value")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (text, a) = read(&out);
    for leak in [secret, home, "alice-example", "sk-another-secret-value"] {
        assert!(!text.contains(leak), "artifact leaks {leak}");
    }

    // The seed's fields, the seed's three runs and the batched one, twice.
    assert_eq!(a.model_id, "generated/tiny");
    assert_eq!(a.runs.len(), 8);
    let kinds: Vec<_> = a.runs.iter().map(|r| (r.policy.name(), r.chunk_size, r.round)).collect();
    assert_eq!(
        kinds[..4],
        [("fifo", None, 0), ("interleave", None, 0), ("interleave", Some(64), 0), ("batched", Some(64), 0)]
    );
    // Throughput per configuration, over both rounds, the batched one beside the serial ones.
    assert_eq!(a.throughput.len(), 4);
    assert!(a.throughput.iter().all(|t| t.output_tokens_per_s.n == 2 && t.output_tokens_per_s.p50.unwrap() > 0.0));
    assert_eq!(a.environment.dtype, "f32");
    assert!(a.jobs.iter().all(|j| j.prompt_tokens > 0));

    // Honest-run invariants hold and the ids are identical across policies and rounds.
    for (i, run) in a.runs.iter().enumerate() {
        assert_eq!(run_invariants(i, run, &a.jobs), Vec::new());
        let ids: Vec<_> = run.requests.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["interactive-a", "interactive-b", "long-document"], "sorted by id like the seed");
    }
    assert_eq!(consistency(&a.runs), (true, vec![]));
    // KV cache bytes are exact: keys and values, every layer, F32, prompt plus cap positions in
    // whole tiles.
    let model = common::load::LoadedModel::load(&tmp.path().join("models/generated/tiny")).unwrap();
    let c = &model.config;
    let per_position = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size / c.num_attention_heads) * 4;
    for run in &a.runs {
        for r in &run.requests {
            let job = a.jobs.iter().find(|j| j.id == r.id).unwrap();
            let positions =
                (job.prompt_tokens + job.max_new_tokens).next_multiple_of(common::qwen::KvPool::BLOCK_POSITIONS);
            assert_eq!(r.kv_cache_bytes, per_position * positions, "{}", r.id);
        }
        assert!(run.peak_rss_bytes.unwrap_or(0) > 1 << 20, "peak resident memory recorded on Linux");
    }
    assert!(a.checks.output_ids_identical);
    assert_eq!(a.summary.len(), 12);
    assert!(a.summary.iter().all(|row| row.ttft_ms.n == 2));

    // Provenance: the code that made it, as the audit will recompute it, and the manifest.
    let p = &a.provenance;
    let current = source_hash::hash_crate(&root(), "experiments/scheduler").unwrap();
    assert_eq!(p.source.sha256, current.sha256);
    assert_eq!(a.source_sha256, current.sha256);
    let manifest = p.manifest.as_ref().unwrap();
    assert_eq!(manifest.path, "manifests/scheduler/tiny.json");
    assert_eq!(manifest.sha256, common::manifest::manifest_sha256(&root().join(&manifest.path)).unwrap());
    assert!(p.model.as_ref().unwrap().pinned);
    assert_eq!(p.model.as_ref().unwrap().files.len(), 5);
    assert!(p.host.logical_cores > 0 && p.host.memory_bytes > 0);
    assert!(p.build.rustc.starts_with("rustc "));
    assert!(p.started_at <= p.finished_at);
    assert_eq!(p.settings.effective["rounds"], 2);
}

#[test]
fn model_dir_without_manifest_runs_unpinned_and_records_digests() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let dir = tmp.path().join("ckpt");
    common::generate::generate_into(&common::generate::shape("tiny").unwrap(), &dir, false).unwrap();
    let out = tmp.path().join("unpinned.json");
    let o = scheduler(
        &models,
        &[
            "--model-dir",
            dir.to_str().unwrap(),
            "--policy",
            "interleave",
            "--chunk-size",
            "7",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, a) = read(&out);
    assert!(!a.provenance.model.as_ref().unwrap().pinned);
    assert!(a.provenance.manifest.is_none());
    assert_eq!(a.model_revision, None);
    let pin = common::generate::pin_for(&common::generate::shape("tiny").unwrap(), &dir).unwrap();
    for f in &pin.files {
        let recorded = a.provenance.model.as_ref().unwrap().files.iter().find(|r| r.path == f.path).unwrap();
        assert_eq!(recorded.digest, f.digest, "{}", f.path);
    }
    assert_eq!(a.runs.len(), 1);
    assert_eq!((a.runs[0].policy.name(), a.runs[0].chunk_size), ("interleave", Some(7)));
}

/// Writes a variant of the tiny manifest with `edit` applied into a scratch workspace (a
/// manifest is recorded by its path in the workspace, so it must lie in one) and runs it there;
/// returns the outcome and the artifact, if one appeared.
fn run_edited(edit: impl FnOnce(&mut serde_json::Value)) -> (Output, Option<SchedulerArtifact>) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path();
    std::fs::create_dir_all(ws.join("manifests/models")).unwrap();
    std::fs::create_dir_all(ws.join("manifests/scheduler")).unwrap();
    std::fs::copy(root().join("Cargo.lock"), ws.join("Cargo.lock")).unwrap();
    std::fs::copy(root().join("manifests/models/tiny.json"), ws.join("manifests/models/tiny.json")).unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("manifests/scheduler/tiny.json")).unwrap()).unwrap();
    edit(&mut manifest);
    let path = ws.join("manifests/scheduler/edited.json");
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let out = ws.join("out.json");
    let o = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .current_dir(ws)
        .env("LAB_MODELS_DIR", ws.join("models"))
        .env("HF_HUB_OFFLINE", "1")
        .args(["--manifest", "manifests/scheduler/edited.json", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let artifact = out.exists().then(|| read(&out).1);
    (o, artifact)
}

#[test]
fn a_manifest_is_recorded_by_its_workspace_path_from_any_folder_and_one_outside_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    // From a subfolder, with a relative path: recorded relative to the root all the same.
    let out = tmp.path().join("sub.json");
    let o = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .current_dir(root().join("experiments"))
        .env("LAB_MODELS_DIR", &models)
        .env("HF_HUB_OFFLINE", "1")
        .args(["--manifest", "../manifests/scheduler/tiny.json", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, a) = read(&out);
    assert_eq!(a.provenance.manifest.unwrap().path, "manifests/scheduler/tiny.json");
    // A manifest outside the workspace cannot be found again by the audit: refused up front.
    let outside = tmp.path().join("tiny.json");
    std::fs::copy(root().join("manifests/scheduler/tiny.json"), &outside).unwrap();
    let o = scheduler(&models, &["--manifest", outside.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is outside the workspace"), "{}", stderr(&o));
}

#[test]
fn bad_input_is_a_one_line_error_naming_the_field_and_writes_nothing() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let long = "word ".repeat(5000);
    let cases: Vec<(&str, Edit)> = vec![
        ("runs[0].policy: unknown variant `lifo`", Box::new(|m| m["parameters"]["runs"][0]["policy"] = "lifo".into())),
        ("runs[2].chunk_size: 0", Box::new(|m| m["parameters"]["runs"][2]["chunk_size"] = 0.into())),
        ("runs[0].max_active: 0", Box::new(|m| m["parameters"]["runs"][0]["max_active"] = 0.into())),
        (
            "runs[0].max_active: invalid value: integer `-1`",
            Box::new(|m| m["parameters"]["runs"][0]["max_active"] = (-1).into()),
        ),
        ("jobs[1].max_new_tokens: 0", Box::new(|m| m["parameters"]["jobs"][1]["max_new_tokens"] = 0.into())),
        ("jobs[0].id: empty", Box::new(|m| m["parameters"]["jobs"][0]["id"] = "".into())),
        (
            "jobs[2].id: `interactive-a` is used twice",
            Box::new(|m| m["parameters"]["jobs"][2]["id"] = "interactive-a".into()),
        ),
        ("jobs[1].prompt:", Box::new(move |m| m["parameters"]["jobs"][1]["prompt"] = long.into())),
        // The largest cap there is: added to the prompt's length it would wrap; the check must not.
        ("jobs[0].prompt:", Box::new(|m| m["parameters"]["jobs"][0]["max_new_tokens"] = u64::MAX.into())),
        ("parameters.warmup:", Box::new(|m| m["parameters"]["warmup"] = u64::MAX.into())),
        // Counts the machine cannot hold the records of, and waits no clock can keep.
        ("parameters.rounds: 1000000 would hold about", Box::new(|m| m["parameters"]["rounds"] = 1_000_000.into())),
        (
            "jobs[0].arrival_ms: 1e300 ms: must be a time from 0 to 604800000 ms",
            Box::new(|m| m["parameters"]["jobs"][0]["arrival_ms"] = 1e300.into()),
        ),
        ("jobs[2].arrival_ms: -1.0 ms", Box::new(|m| m["parameters"]["jobs"][2]["arrival_ms"] = (-1.0).into())),
        ("unknown field `colour`", Box::new(|m| m["parameters"]["colour"] = "red".into())),
        (
            "sampling.top_p: sampling `top_p` is 0: it must be above 0 and at most 1",
            Box::new(|m| m["parameters"]["sampling"] = serde_json::json!({"temperature": 1.0, "top_p": 0.0})),
        ),
    ];
    for (expected, edit) in cases {
        let (o, artifact) = run_edited(edit);
        let wrote = artifact.is_some();
        let err = stderr(&o);
        let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
        assert!(!o.status.success(), "{expected}: succeeded");
        assert!(line.contains(expected), "expected `{expected}` in: {err}");
        assert!(!wrote, "{expected}: an artifact was written");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Sampling flags override the manifest for every run: the ids then differ from the greedy ones
/// and are the same under every policy and chunk size, and the audit reads the run back.
#[test]
fn sampled_runs_draw_the_same_ids_under_every_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let run = |name: &str, extra: &[&str]| {
        let out = tmp.path().join(name);
        let args: Vec<&str> = ["--rounds", "1", "--warmup", "0", "--chunk-size", "7", "--chunk-size", "64", "--out"]
            .into_iter()
            .chain([out.to_str().unwrap()])
            .chain(extra.iter().copied())
            .collect();
        let o = scheduler(&models, &args, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        read(&out).1
    };
    let sampled = run("sampled.json", &["--temperature", "0.9", "--top-k", "30", "--sampling-seed", "5"]);
    let greedy = run("greedy.json", &[]);
    assert!(sampled.checks.output_ids_identical, "{:?}", sampled.checks.differences);
    assert_eq!(sampled.runs.len(), 6, "every policy with both chunk sizes");
    assert_eq!(sampled.parameters.sampling.top_k, 30);
    assert_ne!(sampled.runs[0].requests[0].output_ids, greedy.runs[0].requests[0].output_ids);
    let ws = common::workspace::Workspace { root: root() };
    let report = audit::Audit::new(&ws, &[&scheduler::Scheduler]).audit_artifact(&tmp.path().join("sampled.json"));
    assert_eq!(report.verdict, audit::Verdict::Ok, "{:#?}", report.findings);
}

#[test]
fn command_line_mistakes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let o = scheduler(&models, &["--policy", "lifo"], &[]);
    assert!(stderr(&o).contains("unknown policy `lifo`; known policies: fifo, interleave"), "{}", stderr(&o));
    for flag in ["--chunk-size", "--max-active", "--rounds"] {
        let o = scheduler(&models, &[flag, "0"], &[]);
        assert!(!o.status.success() && stderr(&o).contains(flag), "{flag}: {}", stderr(&o));
    }
    let o = scheduler(&models, &["--manifest", "manifests/models/tiny.json"], &[]);
    assert!(stderr(&o).contains("unknown field"), "{}", stderr(&o));
}

#[test]
fn an_existing_out_file_is_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("taken.json");
    std::fs::write(&out, "precious").unwrap();
    let o =
        scheduler(&tmp.path().join("models"), &["--rounds", "1", "--warmup", "0", "--out", out.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious");
    // Refused before any work: no model was loaded, no run made.
    assert!(!stderr(&o).contains("loading model") && !stderr(&o).contains("[1/"), "{}", stderr(&o));
}

#[test]
fn default_manifests_carry_the_seed_workload() {
    let seed = scheduler::study::Parameters::seed();
    for name in ["tiny", "qwen2.5-0.5b", "qwen2.5-0.5b-instruct"] {
        let m: common::manifest::ExperimentManifest<scheduler::study::Parameters, serde_json::Value> =
            common::manifest::read_experiment_manifest(&root().join(format!("manifests/scheduler/{name}.json")))
                .unwrap();
        assert_eq!(m.parameters.jobs, seed.jobs, "{name}");
        assert_eq!(m.parameters.runs[..3], seed.runs, "{name}: the seed's runs first");
        let batched = RunConfig {
            policy: Policy::Batched,
            chunk_size: Some(64),
            max_active: 2,
            kv_budget: None,
            prefix_cache: false,
        };
        assert_eq!(m.parameters.runs[3..], [batched], "{name}: then continuous batching on the same workload");
    }
}

/// With prefix reuse as a run parameter, a job whose prompt repeats an earlier one's takes its
/// cached positions (on the timeline as `reused`), computes the same ids, and the audit's
/// invariants hold; a forged reuse in a run without it is caught.
#[test]
fn prefix_reuse_is_a_run_parameter_on_the_timeline_and_changes_no_id() {
    let (o, artifact) = run_edited(|m| {
        let jobs = m["parameters"]["jobs"].as_array_mut().unwrap();
        let mut again = jobs[0].clone();
        again["id"] = "long-document-again".into();
        jobs.push(again);
        let runs = serde_json::json!([
            {"policy": "fifo", "chunk_size": null, "max_active": 1},
            {"policy": "fifo", "chunk_size": null, "max_active": 1, "prefix_cache": true},
            {"policy": "batched", "chunk_size": 64, "max_active": 2, "prefix_cache": true}
        ]);
        m["parameters"]["runs"] = runs;
        m["parameters"]["rounds"] = 1.into();
        m["parameters"]["warmup"] = 0.into();
        m["claims"] = serde_json::json!([]);
        m["expectations"] = serde_json::Value::Null;
    });
    assert!(o.status.success(), "{}", stderr(&o));
    let a = artifact.unwrap();
    assert_eq!(a.jobs[0].id, "long-document");
    let reused =
        |run: usize, job: &str| a.runs[run].timeline.iter().filter(|s| s.job == job).map(|s| s.reused).sum::<usize>();
    assert_eq!(reused(0, "long-document-again"), 0, "no reuse without the parameter");
    assert_eq!(reused(1, "long-document-again"), a.jobs[0].prompt_tokens - 1, "all but its last token");
    assert_eq!(reused(1, "long-document"), 0);
    assert!(a.runs[1].prefix_cache && !a.runs[0].prefix_cache);
    assert_eq!(consistency(&a.runs), (true, vec![]), "reuse changes no id");
    for (i, run) in a.runs.iter().enumerate() {
        assert_eq!(run_invariants(i, run, &a.jobs), Vec::new());
    }
    // Reuse claimed by a run without the parameter is caught.
    let mut forged = a.runs[1].clone();
    forged.prefix_cache = false;
    assert!(!run_invariants(1, &forged, &a.jobs).is_empty());
}
