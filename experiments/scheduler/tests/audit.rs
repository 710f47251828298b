//! The audit on real scheduler artifacts, in a scratch copy of the workspace so that code and
//! manifests can be changed: fresh is ok, changed code or manifest is stale, any hand edit is
//! wrong and named, and pinning takes expectations from a fresh artifact.

use audit::{Audit, Verdict};
use common::artifact::read_artifact;
use common::artifact::{seal, SEAL_KEY};
use common::finding::Report;
use common::qwen::WeightDtype;
use common::workspace::Workspace;
use scheduler::study::SchedulerArtifact;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Scratch {
    _tmp: tempfile::TempDir,
    ws: Workspace,
    models: PathBuf,
}

fn scratch() -> Scratch {
    let real = source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    std::fs::create_dir_all(root.join("experiments")).unwrap();
    for item in ["Cargo.toml", "Cargo.lock", "crates", "manifests", "schemas", "experiments/scheduler"] {
        let status = Command::new("cp").arg("-r").arg(real.join(item)).arg(root.join(item)).status().unwrap();
        assert!(status.success(), "copying {item}");
    }
    let models = tmp.path().join("models");
    Scratch { _tmp: tmp, ws: Workspace { root }, models }
}

impl Scratch {
    fn run(&self, args: &[&str]) -> PathBuf {
        let out = Command::new(env!("CARGO_BIN_EXE_scheduler"))
            .current_dir(&self.ws.root)
            .env("LAB_MODELS_DIR", &self.models)
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rel = stdout
            .lines()
            .find_map(|l| l.strip_prefix("artifact: "))
            .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        self.ws.root.join(rel)
    }

    fn audit(&self, path: &Path) -> Report {
        Audit::new(&self.ws, &[&scheduler::Scheduler]).audit_artifact(path)
    }
}

/// A hand edit of an artifact's JSON.
type Edit = Box<dyn Fn(&mut Value)>;

fn edit(path: &Path, change: impl FnOnce(&mut Value), reseal: bool) -> PathBuf {
    // Edited as records, then stored again as the writer stores them, under the old seal or a new one.
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let old_seal = stored[SEAL_KEY].clone();
    let mut v = common::artifact::body(stored).unwrap();
    change(&mut v);
    let mut v = common::columns::pack(v);
    let map = v.as_object_mut().unwrap();
    let s = if reseal { serde_json::to_value(seal(&Value::Object(map.clone()))).unwrap() } else { old_seal };
    map.insert(SEAL_KEY.into(), s);
    let edited = path.with_file_name(format!("edited-{}.json", rand_suffix()));
    std::fs::write(&edited, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    edited
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn assert_wrong(r: &Report, field_prefix: &str) {
    assert_eq!(r.verdict, Verdict::Wrong, "{:?}", r.findings);
    assert!(
        r.findings.iter().any(|f| f.field.starts_with(field_prefix)),
        "no finding names {field_prefix}: {:#?}",
        r.findings
    );
}

#[test]
fn fresh_is_ok_and_every_hand_edit_is_wrong_and_named() {
    let s = scratch();
    let path = s.run(&["--rounds", "3", "--warmup", "1"]);
    let r = s.audit(&path);
    assert_eq!(r.verdict, Verdict::Ok, "{:#?}", r.findings);
    assert_eq!(r.manifest.as_deref(), Some("manifests/scheduler/tiny.json"));

    // Edits caught by the seal alone name the part; derived numbers are caught again by the
    // recomputation, which names the exact field.
    let cases: Vec<(&str, Edit)> = vec![
        ("runs[1].requests", Box::new(|v| v["runs"][1]["requests"][2]["ttft_ms"] = json!(0.001))),
        ("runs[0].requests", Box::new(|v| v["runs"][0]["requests"][0]["output_ids"][1] = json!(3))),
        ("runs[2].timeline", Box::new(|v| v["runs"][2]["timeline"][0]["start_ms"] = json!(0.5))),
        ("runs[4].elapsed_ms", Box::new(|v| v["runs"][4]["elapsed_ms"] = json!(1.0))),
        ("provenance.model", Box::new(|v| v["provenance"]["model"]["files"][2]["digest"] = json!("0".repeat(64)))),
        ("provenance.host", Box::new(|v| v["provenance"]["host"]["memory_bytes"] = json!(1))),
        ("summary[3]", Box::new(|v| v["summary"][3]["ttft_ms"]["p50"] = json!(123.0))),
        ("jobs[0]", Box::new(|v| v["jobs"][0]["prompt_tokens"] = json!(7))),
    ];
    for (field, change) in &cases {
        let edited = edit(&path, change, false);
        assert_wrong(&s.audit(&edited), field);
    }
    // Resealed edits (as a careful forger would) are still caught where the numbers must agree.
    let resealed: Vec<(&str, Edit)> = vec![
        ("runs[1].requests[2].ttft_ms", Box::new(|v| v["runs"][1]["requests"][2]["ttft_ms"] = json!(0.001))),
        ("runs[4].elapsed_ms", Box::new(|v| v["runs"][4]["elapsed_ms"] = json!(1.0))),
        (
            "provenance.model.files[2].digest",
            Box::new(|v| v["provenance"]["model"]["files"][2]["digest"] = json!("0".repeat(64))),
        ),
        ("parameters", Box::new(|v| v["parameters"]["rounds"] = json!(9))),
        ("summary[3]", Box::new(|v| v["summary"][3]["ttft_ms"]["p50"] = json!(123.0))),
        ("runs[0].requests[0].output_ids", Box::new(|v| v["runs"][0]["requests"][0]["output_ids"][1] = json!(3))),
    ];
    for (field, change) in &resealed {
        let edited = edit(&path, change, true);
        assert_wrong(&s.audit(&edited), field);
    }
    // Forged as a forger would (edit, recompute the summary and the claims, reseal): every
    // timeline emptied and one request's TTFT halved in every run. The requests no longer follow
    // from a timeline, which an artifact of runs that stepped must have.
    let forged = edit(
        &path,
        |v| {
            v.as_object_mut().unwrap().remove(SEAL_KEY);
            for run in v["runs"].as_array_mut().unwrap() {
                run["timeline"] = json!([]);
                let ttft = run["requests"][0]["ttft_ms"].as_f64().unwrap();
                run["requests"][0]["ttft_ms"] = json!(ttft / 2.0);
            }
            common::experiment::rederive(&scheduler::Scheduler, v);
        },
        true,
    );
    let r = s.audit(&forged);
    assert_wrong(&r, "runs[0].timeline");
    assert!(r.first_reason().contains("empty, but the run has 3 requests"), "{}", r.first_reason());
    // A thinned timeline (a job's first decode step dropped) no longer steps its job as the
    // engine does, whatever was recomputed from it.
    let thinned = edit(
        &path,
        |v| {
            v.as_object_mut().unwrap().remove(SEAL_KEY);
            let timeline = v["runs"][1]["timeline"].as_array_mut().unwrap();
            let first_decode = timeline.iter().position(|s| s["kind"] == "decode").unwrap();
            timeline.remove(first_decode);
            common::experiment::rederive(&scheduler::Scheduler, v);
        },
        true,
    );
    let r = s.audit(&thinned);
    assert_wrong(&r, "runs[1].timeline");
    assert!(r.first_reason().contains("a Decode step of 1 tokens at"), "{}", r.first_reason());

    // A file that is not JSON at all.
    let broken = path.with_file_name("broken.json");
    std::fs::write(&broken, "{\"runs\": [").unwrap();
    assert_wrong(&s.audit(&broken), "");
}

#[test]
fn changed_code_or_manifest_makes_an_artifact_stale_not_wrong() {
    let s = scratch();
    let path = s.run(&["--rounds", "3", "--warmup", "1"]);
    assert_eq!(s.audit(&path).verdict, Verdict::Ok);

    let lib = s.ws.root.join("crates/records/src/stats.rs");
    let original = std::fs::read_to_string(&lib).unwrap();
    // A comment is not code: the artifact stays current.
    std::fs::write(&lib, format!("{original}\n// a reviewer's remark\n")).unwrap();
    assert_eq!(s.audit(&path).verdict, Verdict::Ok);
    std::fs::write(&lib, format!("{original}\nconst _CHANGED: u8 = 1;\n")).unwrap();
    let r = s.audit(&path);
    assert_eq!(r.verdict, Verdict::Stale, "{:#?}", r.findings);
    assert!(r.first_reason().starts_with("provenance.source.sha256: the code changed"), "{}", r.first_reason());
    std::fs::write(&lib, original).unwrap();
    assert_eq!(s.audit(&path).verdict, Verdict::Ok);

    let manifest = s.ws.root.join("manifests/scheduler/tiny.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, format!("{text}\n")).unwrap();
    let r = s.audit(&path);
    assert_eq!(r.verdict, Verdict::Stale, "{:#?}", r.findings);
    assert!(r.first_reason().contains("changed since the run"), "{}", r.first_reason());
}

#[test]
fn a_custom_run_is_filed_apart_and_held_to_its_invariants_and_its_command_line() {
    let s = scratch();
    let path = s.run(&["--rounds", "1", "--warmup", "0"]);
    // Written beside the manifest's own runs, not among them; ok, with a note saying why the
    // manifest's expectations were not applied.
    assert!(path.parent().unwrap().ends_with("artifacts/scheduler/tiny+custom"), "{}", path.display());
    let r = s.audit(&path);
    assert_eq!(r.verdict, Verdict::Ok, "{:#?}", r.findings);
    assert!(
        r.findings.iter().any(|f| f.check == "parameters" && f.message.contains("custom run")),
        "{:#?}",
        r.findings
    );
    // Moved among the manifest's own artifacts, it is wrong.
    let own = s.ws.root.join("artifacts/scheduler/tiny");
    std::fs::create_dir_all(&own).unwrap();
    let moved = own.join(path.file_name().unwrap());
    std::fs::copy(&path, &moved).unwrap();
    assert_wrong(&s.audit(&moved), "parameters.rounds");
    // Its argv edited to claim other settings, or its parameters edited (resealed), it is wrong.
    let argv = edit(&path, |v: &mut Value| v["provenance"]["argv"] = json!(["scheduler", "--rounds", "4"]), true);
    assert_wrong(&s.audit(&argv), "provenance.argv");
    let params = edit(
        &path,
        |v: &mut Value| {
            v["parameters"]["rounds"] = json!(2);
            v["provenance"]["settings"]["effective"]["rounds"] = json!(2);
        },
        true,
    );
    assert_wrong(&s.audit(&params), "parameters.rounds");
}

#[test]
fn pinning_takes_expectations_from_a_fresh_artifact() {
    let s = scratch();
    let manifest = s.ws.root.join("manifests/scheduler/tiny.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["expectations"] = json!({"output_ids": {"interactive-a": [1, 2, 3]}, "predecessor": null});
    std::fs::write(&manifest, serde_json::to_string_pretty(&m).unwrap()).unwrap();

    // Pinned from a run of the manifest as it is (a custom run is refused, below).
    let path = s.run(&[]);
    let r = s.audit(&path);
    assert_wrong(&r, "runs[0].requests");
    assert!(r.findings.iter().any(|f| f.check == "expectations"));

    let (manifest_path, old, new) = Audit::new(&s.ws, &[&scheduler::Scheduler]).pin_from_artifact(&path).unwrap();
    assert_eq!(manifest_path, manifest);
    let diff = audit::line_diff(&old, &new);
    assert!(diff.iter().any(|l| l.starts_with("+ ") && l.contains("source_sha256")), "{diff:?}");
    common::artifact::write_replace(&manifest, new.as_bytes()).unwrap();
    // The pinned manifest matches the next honest run.
    let next = s.run(&["--rounds", "3", "--warmup", "1"]);
    let r = s.audit(&next);
    assert_eq!(r.verdict, Verdict::Ok, "{:#?}", r.findings);
    // An artifact that is wrong for another reason is never pinned from.
    let tampered = edit(&next, |v| v["runs"][0]["elapsed_ms"] = json!(0.0), false);
    let refused = Audit::new(&s.ws, &[&scheduler::Scheduler]).pin_from_artifact(&tampered);
    assert!(matches!(refused, Err(audit::PinError::Refused { .. })), "{refused:?}");
    // Nor from a custom run: its ids answer other parameters than the manifest's.
    let custom = s.run(&["--rounds", "1"]);
    let refused = Audit::new(&s.ws, &[&scheduler::Scheduler]).pin_from_artifact(&custom);
    let refused = refused.unwrap_err();
    assert!(
        matches!(refused, audit::PinError::Refused { .. }) && refused.to_string().contains("custom run"),
        "{refused}"
    );
}

#[test]
fn half_precision_runs_keep_apart_record_their_dtype_and_report_where_ids_leave_f32() {
    let s = scratch();
    let run = |dtype: &str| s.run(&["--dtype", dtype]);
    let path = run("bf16");
    assert!(path.starts_with(s.ws.root.join("artifacts/scheduler/tiny-bf16")), "{}", path.display());
    let a: SchedulerArtifact = read_artifact(&path).unwrap();
    assert_eq!(a.provenance.model.as_ref().unwrap().weights, WeightDtype::Bf16);
    assert_eq!(a.environment.dtype, common::qwen::arithmetic(WeightDtype::Bf16));
    // The tiny checkpoint is stored in BF16, so BF16 weights are its exact values; the layers'
    // activations rounded to BF16 move its logits, not its greedy ids (its margins are wide).
    assert!(a.checks.expected.as_ref().unwrap().matched);
    let r = s.audit(&path);
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.findings);

    // Pins the real ids cannot meet: reduced precision records where it leaves them and audits
    // ok; F32 is held to them.
    let manifest = s.ws.root.join("manifests/scheduler/tiny.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["expectations"]["output_ids"]["interactive-a"][2] = json!(0);
    std::fs::write(&manifest, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let half = run("f16");
    let a: SchedulerArtifact = read_artifact(&half).unwrap();
    let d = a.checks.expected.as_ref().unwrap().first_difference.clone().unwrap();
    assert_eq!((d.job.as_str(), d.index, d.theirs), ("interactive-a", 2, Some(0)));
    assert_eq!(s.audit(&half).verdict, Verdict::Ok, "{:?}", s.audit(&half).findings);
    let full = run("f32");
    assert!(full.starts_with(s.ws.root.join("artifacts/scheduler/tiny/")));
    assert_wrong(&s.audit(&full), "runs[0].requests[0].output_ids[2]");
}

#[test]
fn claims_are_judged_on_paired_rounds_stored_and_recomputed_by_the_audit() {
    let s = scratch();
    let path = s.run(&[]);
    let artifact: SchedulerArtifact = serde_json::from_value(read_artifact(&path).unwrap()).unwrap();
    let manifest: common::experiment::AnyManifest =
        common::manifest::read_experiment_manifest(&s.ws.root.join("manifests/scheduler/tiny.json")).unwrap();
    let judged: Vec<&str> = artifact.claims.iter().map(|c| c.claim.id.as_str()).collect();
    let stated: Vec<&str> = manifest.claims.iter().map(|c| c.id.as_str()).collect();
    assert!(!stated.is_empty());
    assert_eq!(judged, stated);
    for c in &artifact.claims {
        // Paired: one ratio per measured round, each from that round's two runs.
        assert_eq!(c.pairs[0].ratios.len(), artifact.parameters.rounds, "{}", c.claim.id);
        let (low, high) = (c.pairs[0].low.unwrap(), c.pairs[0].high.unwrap());
        assert!(low <= c.pairs[0].estimate.unwrap() && c.pairs[0].estimate.unwrap() <= high, "{c:?}");
    }
    assert_eq!(s.audit(&path).verdict, Verdict::Ok);

    // A stored verdict or ratio that the rounds do not give is wrong, even resealed.
    let flipped = edit(&path, |v| v["claims"][0]["verdict"] = json!("fails"), true);
    assert_wrong(&s.audit(&flipped), "claims[0]");
    let ratio = edit(&path, |v| v["claims"][1]["pairs"][0]["estimate"] = json!(9.0), true);
    assert_wrong(&s.audit(&ratio), "claims[1]");
    // Rounds edited to reverse a finding: the recomputed claim no longer matches the stored one.
    let reversed = edit(
        &path,
        |v| {
            for run in v["runs"].as_array_mut().unwrap() {
                if run["policy"] == "interleave" && run["chunk_size"].is_null() {
                    for r in run["requests"].as_array_mut().unwrap() {
                        r["ttft_ms"] = json!(1e6);
                    }
                }
            }
        },
        true,
    );
    assert_wrong(&s.audit(&reversed), "claims[0]");

    // A manifest that states other claims makes the artifact stale: re-run to judge them.
    let file = s.ws.root.join("manifests/scheduler/tiny.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    m["claims"].as_array_mut().unwrap().pop();
    std::fs::write(&file, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let r = s.audit(&path);
    assert_eq!(r.verdict, Verdict::Stale, "{:#?}", r.findings);
    assert!(r.findings.iter().any(|f| f.check == "claims"), "{:#?}", r.findings);

    // One round is never a verdict: a point estimate, inconclusive, saying why.
    let one = s.run(&["--rounds", "1"]);
    let one: SchedulerArtifact = serde_json::from_value(read_artifact(&one).unwrap()).unwrap();
    assert_eq!(one.claims.len(), m["claims"].as_array().unwrap().len());
    for c in &one.claims {
        assert_eq!(c.verdict, common::evidence::Verdict::Inconclusive, "{c:?}");
        assert!(c.pairs[0].estimate.is_some() && c.pairs[0].low.is_none(), "{c:?}");
        assert!(c.note.as_deref().is_some_and(|n| n.contains("point estimate")), "{c:?}");
    }

    // A claim naming what the manifest does not have stops the run before it measures.
    m["claims"][0]["request"] = json!("interactive-z");
    std::fs::write(&file, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .current_dir(&s.ws.root)
        .env("LAB_MODELS_DIR", &s.models)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("claims[0].request") && stderr.contains("interactive-z"), "{stderr}");
}
