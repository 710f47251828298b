//! The whole benchmark end to end, against the embedded server (the `serve` crate, whose own
//! tests cover its answers and limits) and against scripted and unreachable targets.

mod support;

use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn the_benchmark_measures_inter_token_latency_per_token_from_the_embedded_servers_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--target", "openai=embedded", "--continuous-usage", "--rounds", "2", "--concurrency", "1,2"];
    let out = bench_run(tmp.path(), "usage", &args).unwrap();
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert!(a.requests.iter().all(|r| r.ok()));
    for r in &a.requests {
        assert_eq!(r.chunk_tokens.len() as u64, r.chunks, "{r:?}");
        assert_eq!(r.chunk_tokens.iter().sum::<u64>(), r.output_tokens().0, "{r:?}");
    }
    assert!(a.summary.iter().all(|row| row.itl_source == "usage"), "{:?}", a.summary);
    assert_audits_ok(&out);
}

#[test]
fn the_benchmark_runs_end_to_end_on_the_embedded_server() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bench.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(root())
        .env("LAB_MODELS_DIR", tmp.path().join("models"))
        .env("OPENAI_API_KEY", "sk-test-secret-never-recorded")
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains("sk-test-secret-never-recorded"));
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert_eq!(a.runtimes.len(), 2);
    // The manifest: 10 rounds at concurrency 1 and 4, 32 tokens each, through both APIs.
    assert_eq!(a.arguments.rounds, 10);
    assert_eq!(a.requests.len(), 2 * (1 + 4) * 10);
    assert!(a.requests.iter().all(|r| r.ok()), "{:?}", a.requests.iter().find(|r| !r.ok()));
    for r in &a.requests {
        let (n, _) = r.output_tokens();
        assert_eq!(n, 32, "{r:?}");
        assert!(r.scheduled_s <= r.sent_s.unwrap() && r.first_token_s.unwrap() <= r.end_s);
    }
    // The summary is exactly what the records say.
    assert_eq!(a.summary, serving_bench::serving::summarize_all(&a.arguments, &a.runtimes, &a.requests));
    let ollama =
        a.summary.iter().find(|row| row.runtime == "embedded-ollama" && row.concurrency == 4).unwrap().columns();
    assert_eq!((ollama["requests"].as_u64(), ollama["successes"].as_u64()), (Some(40), Some(40)));
    assert!(ollama["prompt_tps_mean"].as_f64().unwrap() > 0.0, "Ollama's counters give prefill speed");
    let openai = a.summary.iter().find(|row| row.runtime == "embedded-openai").unwrap().columns();
    assert!(openai["prompt_tps_mean"].is_null() && openai["prompt_tps_note"].is_string());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("embedded-ollama") && stdout.contains("artifact: "), "{stdout}");
    // Its log, written to a pipe, is plain text: no colour codes.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("INFO") && !stderr.contains('\x1b'), "{stderr}");
    // Not a terminal: progress comes as plain lines, each group's start at once (the warm-ups'
    // first), its counts every few seconds.
    for started in
        ["0/102 requests; embedded-openai warm-up: started", "embedded-ollama concurrency 4 round 10: started"]
    {
        assert!(stderr.lines().any(|l| l.ends_with(started)), "{started}: {stderr}");
    }

    // The audit accepts it, and names a summary number edited by hand even when resealed.
    assert_audits_ok(&out);
    let edited = resealed(&out, |v| v["summary"][1]["ttft_s_p50"] = json!(0.001));
    let report = audit_of(&edited);
    assert_eq!(report.verdict, audit::Verdict::Wrong);
    assert!(report.first_reason().starts_with("summary[1].ttft_s_p50"), "{}", report.first_reason());

    // The manifest's claim, judged for each target apart on its ten paired rounds (levels took
    // turns round by round), printed, and recomputed by the audit.
    let targets: Vec<&str> = a.claims.iter().filter_map(|c| c.scope.as_deref()).collect();
    assert_eq!(targets, ["embedded-openai", "embedded-ollama"]);
    for c in &a.claims {
        assert_eq!(c.claim.id, "batching-raises-aggregate-throughput");
        assert_eq!((c.pairs[0].earlier.as_str(), c.pairs[0].later.as_str()), ("c1", "c4"));
        assert_eq!(c.pairs[0].ratios.len(), 10);
        assert!(c.pairs[0].low.is_some() && c.pairs[0].coverage.unwrap() >= 0.95, "{c:?}");
    }
    assert!(stdout.contains("batching-raises-aggregate-throughput [embedded-openai]"), "{stdout}");
    let edited = resealed(&out, |v| v["claims"][1]["pairs"][0]["low"] = json!(0.5));
    let report = audit_of(&edited);
    assert_eq!(report.verdict, audit::Verdict::Wrong);
    assert!(report.first_reason().starts_with("claims[1]"), "{}", report.first_reason());
    // One paired ratio edited: the finding names that value, and both numbers.
    let stored = a.claims[1].pairs[0].ratios[3];
    let edited = resealed(&out, |v| v["claims"][1]["pairs"][0]["ratios"][3] = json!(0.9));
    let reason = audit_of(&edited).first_reason();
    assert!(
        reason.starts_with(&format!("claims[1].pairs[0].ratios[3]: stored 0.9, but the recorded rounds give {stored}")),
        "{reason}"
    );

    // Forged as a forger would: two requests of one closed round deleted (the failures one
    // would hide), the summary and the claims recomputed from what is left, the seal made anew.
    let edited = forged(&out, |v| {
        let requests = v["requests"].as_array_mut().unwrap();
        let round: Vec<usize> = (0..requests.len())
            .filter(|&i| {
                requests[i]["concurrency"] == 4
                    && requests[i]["round"] == 2
                    && requests[i]["runtime"] == "embedded-openai"
            })
            .collect();
        requests.remove(round[3]);
        requests.remove(round[1]);
    });
    let report = audit_of(&edited);
    assert_eq!(report.verdict, audit::Verdict::Wrong, "{:#?}", report.findings);
    assert!(
        report.first_reason().contains("embedded-openai concurrency 4 round 2: requests [0, 2]"),
        "{}",
        report.first_reason()
    );
}

/// The artifact at `path` edited by `edit`, with every part it derives recomputed (its summary
/// and its claims, as the binary computes them) and its seal made anew: a forgery, beside it.
fn forged(path: &Path, edit: impl FnOnce(&mut Value)) -> PathBuf {
    resealed(path, |v| {
        v.as_object_mut().unwrap().remove("seal");
        edit(v);
        common::experiment::rederive(&serving_bench::ServingBench, v);
    })
}

#[test]
fn an_open_loop_keeps_its_schedule_and_the_audit_redraws_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = bench_run(
        tmp.path(),
        "open",
        &[
            "--target",
            "openai=embedded",
            "--request-rate",
            "40,inf",
            "--max-concurrency",
            "3",
            "--num-requests",
            "12",
            "--warmup-requests",
            "2",
            "--max-tokens",
            "4",
            "--burstiness",
            "0.5",
            "--slo",
            "ttft_ms=60000",
            "--slo",
            "tpot_ms=60000",
            "--percentiles",
            "90",
            "--export",
            "csv",
            "--export",
            "vllm",
        ],
    )
    .expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert_eq!(a.requests.len(), 24);
    assert!(a.requests.iter().all(|r| r.ok()), "{:?}", a.requests.iter().find(|r| !r.ok()));
    for (rate, group) in [(Some(40.0), &a.requests[..12]), (None, &a.requests[12..])] {
        for (i, r) in group.iter().enumerate() {
            let arrival = r.arrival.unwrap();
            assert_eq!((r.index, arrival.rate_rps, arrival.warmup), (i, rate, i < 2), "{r:?}");
            assert!(r.scheduled_s <= r.sent_s.unwrap(), "{r:?}");
        }
    }
    // Each could be sent from its time or, with every slot taken, from when one was freed; in
    // the closed pool, each request after the first three is due when a slot was freed, which
    // is after as many requests ended.
    for r in &a.requests {
        let admitted = r.arrival.unwrap().admitted_s.unwrap();
        assert!(r.scheduled_s <= admitted && admitted <= r.sent_s.unwrap(), "{r:?}");
    }
    // On a schedule the pacer woke each at its time or later (the machine's share of its
    // lateness); a closed pool has no pacer.
    for r in &a.requests[..12] {
        let woken = r.arrival.unwrap().woken_s.expect("a scheduled request's wake-up");
        assert!(r.scheduled_s <= woken && woken <= r.sent_s.unwrap(), "{r:?}");
    }
    let pool = &a.requests[12..];
    assert!(pool.iter().all(|r| r.arrival.unwrap().woken_s.is_none()));
    assert!(pool.iter().all(|r| r.arrival.unwrap().admitted_s == Some(r.scheduled_s)));
    let mut due: Vec<f64> = pool[3..].iter().map(|r| r.scheduled_s).collect();
    let mut ends: Vec<f64> = pool.iter().map(|r| r.end_s).collect();
    due.sort_by(f64::total_cmp);
    ends.sort_by(f64::total_cmp);
    assert!(due.iter().zip(&ends).all(|(d, e)| d >= e), "{due:?} {ends:?}");
    // The schedule at 40/s is the one its seed draws, to the microsecond.
    let offsets = loadgen::load::schedule(a.arguments.seed, 40.0, 0.5, 12, None);
    for (r, o) in a.requests[..12].iter().zip(&offsets) {
        assert!((r.scheduled_s - a.requests[0].scheduled_s - o).abs() < 1e-6, "{} vs {o}", r.scheduled_s);
    }
    // One summary row per rate, of the ten measured requests, with the client's lateness.
    assert_eq!(a.summary.len(), 2);
    for (row, rate) in a.summary.iter().map(|r| r.columns()).zip([json!(40.0), json!("inf")]) {
        assert_eq!((row["request_rate"].clone(), row["requests"].as_u64()), (rate, Some(10)), "{row:?}");
        assert!(row["send_lateness_s_p99"].as_f64().is_some_and(|l| l >= 0.0), "{row:?}");
        assert!(row["client_lateness_s_max"].as_f64() <= row["send_lateness_s_max"].as_f64(), "{row:?}");
        let delay = row.get("send_delay_s_max").and_then(Value::as_f64);
        match row["request_rate"].is_number() {
            true => assert!(delay.is_some_and(|d| Some(d) <= row["client_lateness_s_max"].as_f64()), "{row:?}"),
            false => assert_eq!(delay, None, "{row:?}"),
        }
        // Generous SLOs: every request meets them; goodput is then every request per second.
        assert_eq!((row["slo_met"].as_u64(), row["slo_met_share"].as_f64()), (Some(10), Some(1.0)), "{row:?}");
        assert!(row["goodput_rps"].as_f64().is_some_and(|g| g > 0.0) && row["ttft_s_p90"].is_number(), "{row:?}");
    }
    assert_audits_ok(&out);
    // Exports: a CSV row per request, and vLLM's result shape per group, measured requests only.
    let csv = std::fs::read_to_string(out.with_extension("csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 24);
    assert!(csv.starts_with("runtime,concurrency,rate_rps,warmup,"), "{csv}");
    let vllm: Value = serde_json::from_str(
        &std::fs::read_to_string(out.with_extension("0-embedded-openai-rate40.vllm.json")).unwrap(),
    )
    .unwrap();
    assert_eq!((vllm["completed"].as_u64(), vllm["request_rate"].as_f64()), (Some(10), Some(40.0)), "{vllm}");
    assert_eq!(vllm["ttfts"].as_array().map(Vec::len), Some(10));
    assert!(vllm["p90_ttft_ms"].is_number() && vllm["request_goodput"].is_number(), "{vllm}");
    assert!(out.with_extension("1-embedded-openai-rate-inf.vllm.json").is_file());
    // A folder's audit takes the artifact and leaves its exports, which have no seal, alone.
    let listed: Vec<_> =
        audit::artifact_files(tmp.path()).into_iter().filter(|p| !p.starts_with(tmp.path().join("models"))).collect();
    assert_eq!(listed, std::slice::from_ref(&out));
    // The report labels the groups by rate and draws latency against throughput across them.
    use common::experiment::Experiment;
    let value: Value = common::artifact::read_artifact(&out).unwrap();
    let section = serving_bench::ServingBench.report("open", "open", &value, &Default::default()).unwrap();
    assert!(section.markdown.contains("embedded-openai rate=40.0 max=3 |"), "{}", section.markdown);
    let stems: Vec<&str> = section.charts.iter().map(|(stem, _)| stem.as_str()).collect();
    assert!(stems.contains(&"sweep-ttft_s_p99") && stems.contains(&"sweep-tpot_s_p50"), "{stems:?}");

    // A request moved off its schedule (sealed again) is named.
    let edited = resealed(&out, |v| {
        let moved = v["requests"][5]["scheduled_s"].as_f64().unwrap() - 0.004;
        v["requests"][5]["scheduled_s"] = json!(moved);
    });
    let report = audit_of(&edited);
    assert_eq!(report.verdict, audit::Verdict::Wrong);
    assert!(report.first_reason().starts_with("requests[5].scheduled_s"), "{}", report.first_reason());
    // A request of the closed pool said to have waited past its time for a slot is named: only
    // a cap on a schedule makes one wait.
    let i = 12 + pool.iter().position(|r| r.sent_s.unwrap() - r.scheduled_s > 1e-5).expect("a request sent 10 us late");
    let edited = resealed(&out, |v| {
        let between = (a.requests[i].scheduled_s + a.requests[i].sent_s.unwrap()) / 2.0;
        v["requests"][i]["arrival"]["admitted_s"] = json!(between);
    });
    let report = audit_of(&edited);
    assert!(
        report.first_reason().starts_with(&format!("requests[{i}].arrival.admitted_s")),
        "{}",
        report.first_reason()
    );
    // A wake-up after the request was sent is named; so is one in the closed pool.
    let edited = resealed(&out, |v| {
        let late = v["requests"][4]["sent_s"].as_f64().unwrap() + 0.001;
        v["requests"][4]["arrival"]["woken_s"] = json!(late);
    });
    let report = audit_of(&edited);
    assert!(report.first_reason().starts_with("requests[4].arrival.woken_s"), "{}", report.first_reason());
    let edited = resealed(&out, |v| v["requests"][13]["arrival"]["woken_s"] = v["requests"][13]["scheduled_s"].clone());
    let report = audit_of(&edited);
    assert!(report.first_reason().starts_with("requests[13].arrival.woken_s"), "{}", report.first_reason());
    // The pacer's note says the embedded server shared the client's workers; a note that they
    // ran at real-time priority contradicts it, though each alone is a note the code writes.
    let pacer = a.measurement_notes["send_pacer"].clone();
    assert!(pacer.contains("shares them"), "{pacer}");
    let raised = loadgen::load::workers_note(Some(loadgen::os::Workers::Realtime)).unwrap();
    let edited = resealed(&out, |v| v["measurement_notes"]["client_workers"] = json!(raised));
    let report = audit_of(&edited);
    assert_eq!(report.verdict, audit::Verdict::Wrong);
    assert!(report.first_reason().contains("measurement_notes"), "{}", report.first_reason());
    // Made by other code (its source hash not today's), the same note is stale, not wrong: that
    // code may have worded its notes otherwise.
    let edited = resealed(&out, |v| {
        v["measurement_notes"]["client_workers"] = json!(raised);
        v["provenance"]["source"]["sha256"] = json!("0".repeat(64));
    });
    let report = audit_of(&edited);
    assert_eq!(report.verdict, audit::Verdict::Stale, "{:#?}", report.findings);
    let notes = report.findings.iter().find(|f| f.field == "measurement_notes").expect("the notes are named");
    assert!(notes.message.contains("re-run it"), "{}", notes.message);
}

#[test]
fn a_sweep_runs_one_at_a_time_then_flat_out_then_at_rates_between_and_the_audit_rederives_them() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--target",
        "openai=embedded",
        "--sweep",
        "4",
        "--max-concurrency",
        "4",
        "--num-requests",
        "8",
        "--warmup-requests",
        "1",
        "--max-tokens",
        "4",
    ];
    let out = bench_run(tmp.path(), "sweep", &args).expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert!(a.requests.iter().all(|r| r.ok()), "{:?}", a.requests.iter().find(|r| !r.ok()));
    // Four groups of eight: one request at a time, then four at a time, then two rates between
    // the completed request rates of those two, evenly spaced, neither end included.
    assert_eq!(a.requests.len(), 32);
    let loads: Vec<(Option<f64>, usize)> =
        a.requests.chunks(8).map(|g| (g[0].arrival.unwrap().rate_rps, g[0].concurrency)).collect();
    assert_eq!(loads[..2], [(None, 1), (None, 4)]);
    let rate = |g: &[serving_bench::serving::RequestRecord]| {
        serving_bench::serving::completed_rate(&g[1..].iter().collect::<Vec<_>>()).unwrap()
    };
    let (low, high) = (rate(&a.requests[..8]), rate(&a.requests[8..16]));
    let between = [low + (high - low) / 3.0, low + 2.0 * (high - low) / 3.0];
    assert_eq!(loads[2..], [(Some(between[0]), 4), (Some(between[1]), 4)], "{low} {high}");
    // One at a time: each request sent after the one before it ended.
    assert!(a.requests[..8].windows(2).all(|w| w[1].sent_s.unwrap() >= w[0].end_s), "{:?}", &a.requests[..8]);
    let labels: Vec<&str> = a
        .summary
        .iter()
        .map(|r| match r.open_loop {
            Some(o) if o.request_rate.is_none() => "inf",
            _ => "rate",
        })
        .collect();
    assert_eq!((labels, a.summary[0].concurrency), (vec!["inf", "inf", "rate", "rate"], 1));
    assert_audits_ok(&out);
    // The audit derives the rates again from the first two groups: a slower synchronous group
    // on file (one end moved, sealed again) no longer gives the rates the run used.
    let edited = resealed(&out, |v| {
        let end = v["requests"][7]["end_s"].as_f64().unwrap() + 1.0;
        v["requests"][7]["end_s"] = json!(end);
    });
    let report = audit_of(&edited);
    assert_eq!(report.verdict, audit::Verdict::Wrong);
    assert!(report.first_reason().contains("not among the sweep's groups"), "{}", report.first_reason());
}

#[test]
fn an_open_loop_prints_each_target_over_the_first_under_the_same_load() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pair.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(root())
        .env("LAB_MODELS_DIR", tmp.path().join("models"))
        .args(["--target", "openai=embedded", "--target", "ollama=embedded", "--request-rate", "50,inf"])
        .args(["--max-concurrency", "2", "--num-requests", "6", "--max-tokens", "4", "--slo", "ttft_ms=60000"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let (_, after) = stdout.split_once("each target over embedded-openai under the same load").expect(&stdout);
    // A line per rate, its ratios those of the summary rows under that load.
    let lines: Vec<&str> = after.lines().filter(|l| l.trim_start().starts_with("embedded-ollama")).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (line, rate) in lines.iter().zip([json!(50.0), json!("inf")]) {
        let row = |runtime: &str| {
            a.summary
                .iter()
                .map(|r| r.columns())
                .find(|r| r["runtime"] == runtime && r["request_rate"] == rate)
                .expect("a summary row")
        };
        let ratio =
            |key: &str| row("embedded-ollama")[key].as_f64().unwrap() / row("embedded-openai")[key].as_f64().unwrap();
        // Three significant digits (two decimals from 1 up), as the table promises.
        let shown = |key: &str| {
            let r = ratio(key);
            let decimals = if r >= 1.0 { 2 } else { (2.0 - r.log10().floor()) as usize };
            format!("{r:.decimals$}")
        };
        let expected = format!("TTFT p99 {}x, total p50 {}x", shown("ttft_s_p99"), shown("total_s_p50"));
        assert!(line.contains(&expected) && line.contains("goodput "), "{line} lacks {expected}");
    }
}

/// Sampling flags reach every request and the artifact: the embedded server honours them (a stop
/// string ends answers), the run records them as parameters and its command line, and the audit
/// reads the one from the other.
#[test]
fn sampling_flags_are_sent_recorded_and_audited() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--target",
        "openai=embedded",
        "--rounds",
        "1",
        "--concurrency",
        "2",
        "--max-tokens",
        "12",
        "--temperature",
        "0.8",
        "--top-k",
        "40",
        "--top-p",
        "0.95",
        "--stop",
        "e",
        "--extra-body",
        r#"{"repetition_penalty": 1.05}"#,
    ];
    let path = bench_run(tmp.path(), "sampled", &args).unwrap();
    assert_audits_ok(&path);
    let v: Value = common::artifact::read_artifact(&path).unwrap();
    let sampling = &v["arguments"]["sampling"];
    assert_eq!(
        sampling,
        &serde_json::json!({"temperature": 0.8, "top_p": 0.95, "top_k": 40, "stop": ["e"],
                            "extra_body": {"repetition_penalty": 1.05}})
    );
    // The stop string "e" (a common letter in the tiny vocabulary's text) ends some answer.
    let requests = v["requests"].as_array().unwrap();
    let finished: Vec<&str> = requests.iter().filter_map(|r| r["finish_reason"].as_str()).collect();
    assert!(!finished.is_empty() && finished.contains(&"stop"), "{finished:?}");
    // A forged parameter reads as a run its command line did not make.
    let forged = resealed(&path, |v| v["arguments"]["sampling"]["temperature"] = serde_json::json!(0.3));
    assert_ne!(audit_of(&forged).verdict, audit::Verdict::Ok);
}

/// Runs the benchmark with `args` (models generated under `tmp`), its artifact at
/// `tmp/<name>.json`; the artifact's path, or the run's error output.
fn bench_run(tmp: &Path, name: &str, args: &[&str]) -> Result<PathBuf, String> {
    let out = tmp.join(format!("{name}.json"));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(root())
        .env("LAB_MODELS_DIR", tmp.join("models"))
        .args(args)
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    o.status.success().then_some(out).ok_or_else(|| String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The audit of one artifact, the serving benchmark registered.
fn audit_of(path: &Path) -> common::finding::Report {
    let ws = common::workspace::Workspace { root: root() };
    audit::Audit::new(&ws, &[&serving_bench::ServingBench]).audit_artifact(path)
}

fn assert_audits_ok(path: &Path) {
    let report = audit_of(path);
    assert_eq!(report.verdict, audit::Verdict::Ok, "{:#?}", report.findings);
}

/// The artifact at `path` edited by `edit` and sealed again (as a forger would), beside it.
fn resealed(path: &Path, edit: impl FnOnce(&mut Value)) -> PathBuf {
    // The records as rows (as artifacts were stored before columns, which the audit still reads).
    let mut v: Value = common::artifact::read_artifact(path).unwrap();
    edit(&mut v);
    let map = v.as_object_mut().unwrap();
    map.remove("seal");
    let seal = common::artifact::seal(&Value::Object(map.clone()));
    map.insert("seal".into(), serde_json::to_value(seal).unwrap());
    let edited = path.with_file_name("edited.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    edited
}

/// Starts `serving-bench serve` with `args`; returns the child (its stdout still open) and the
/// first line it printed.
fn serve(models: &Path, args: &[&str]) -> (std::process::Child, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(root())
        .env("LAB_MODELS_DIR", models)
        .args(["serve", "--port", "0"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8];
    let stdout = child.stdout.as_mut().unwrap();
    while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    (child, String::from_utf8(line).unwrap())
}

fn interrupt(mut child: std::process::Child) -> (std::process::ExitStatus, String) {
    std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (status, stderr)
}

#[test]
fn serve_binds_loopback_stops_cleanly_on_ctrl_c_and_warns_off_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let (child, line) = serve(&tmp.path().join("models"), &[]);
    assert!(line.contains("on http://127.0.0.1:") && line.contains("policy batched"), "{line}");
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
    let body: Value = reqwest::blocking_get_json(&format!("{url}/api/version"));
    assert!(body["version"].is_string());
    let (status, stderr) = interrupt(child);
    assert!(status.success(), "{status:?}");
    assert!(!stderr.contains("warning:"), "{stderr}");
    // Every interface: served, with a warning that says so (no traffic is sent to it here).
    let (child, line) = serve(&tmp.path().join("models"), &["--host", "0.0.0.0", "--policy", "fifo"]);
    assert!(line.contains("on http://0.0.0.0:") && line.contains("policy fifo"), "{line}");
    let (status, stderr) = interrupt(child);
    assert!(status.success(), "{status:?}");
    assert!(
        stderr.lines().any(|l| l.starts_with("warning: binding 0.0.0.0") && l.contains("--host 127.0.0.1")),
        "{stderr}"
    );
}

#[test]
fn the_embedded_servers_kv_budget_takes_positions_or_bytes_as_serve_does() {
    let tmp = tempfile::tempdir().unwrap();
    let run = ["--rounds", "1", "--concurrency", "1", "--max-tokens", "4", "--server-kv-budget"];
    let kv = |path: &Path| {
        let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(path).unwrap();
        assert!(a.requests.iter().all(|r| r.ok()), "{:?}", a.requests);
        (a.embedded_kv.unwrap().budget_bytes, a.arguments.server_kv_budget)
    };
    // Four blocks of 64 positions, then the same four blocks' bytes and half a block more
    // (rounded down to whole blocks): one pool, each budget recorded as given.
    let positions = bench_run(tmp.path(), "positions", &[&run[..], &["256"]].concat()).unwrap();
    let (bytes, given) = kv(&positions);
    assert_eq!(given, Some(common::qwen::KvBudget::Positions(256)));
    let flag = format!("{}B", bytes + bytes / 8);
    let in_bytes = bench_run(tmp.path(), "bytes", &[&run[..], &[&flag]].concat()).unwrap();
    assert_eq!(kv(&in_bytes), (bytes, Some(common::qwen::KvBudget::Bytes((bytes + bytes / 8) as u64))));
    for path in [&positions, &in_bytes] {
        assert_audits_ok(path);
    }
    let kib = bench_run(tmp.path(), "kib", &[&run[..], &[&format!("{}KiB", bytes / 1024)]].concat()).unwrap();
    assert!(kv(&kib).0 <= bytes, "{:?}", kv(&kib));
    // Neither positions nor bytes, or less than a block: refused before anything is measured.
    for (bad, says) in [("12XB", "`12XB` is not a KV budget"), ("10", "at least one block of 64 positions")] {
        let e = bench_run(tmp.path(), "bad", &[&run[..], &[bad]].concat()).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
        assert!(!tmp.path().join("bad.json").exists());
    }
}

#[test]
fn credentials_in_a_target_url_are_used_and_never_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let (child, line) = serve(&tmp.path().join("models"), &[]);
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
    // Named by the user, and its /metrics scraped with the same credentials.
    let target = format!("local-server-with-a-long-name=openai={}", url.replace("http://", "http://alice:s3cret@"));
    let run = bench_run(
        tmp.path(),
        "bench",
        &["--target", &target, "--rounds", "1", "--concurrency", "1", "--max-tokens", "4", "--scrape-metrics"],
    );
    interrupt(child);
    let out = run.expect("the benchmark run");
    let text = std::fs::read_to_string(&out).unwrap();
    for leak in ["alice", "s3cret"] {
        assert!(!text.contains(leak), "{leak} is in the artifact");
    }
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert!(a.requests.len() == 1 && a.requests[0].ok(), "{:?}", a.requests);
    assert!(a.runtimes[0].base_url.starts_with("http://<redacted>@127.0.0.1:"), "{:?}", a.runtimes);
    let name = "local-server-with-a-long-name";
    assert_eq!((a.runtimes[0].name.as_str(), a.summary[0].runtime.as_str()), (name, name));
    assert!(
        a.server_metrics[0].scrapes.iter().all(|s| s.error.is_none() && !s.values.is_empty() && s.answer_s.is_some()),
        "{:?}",
        a.server_metrics
    );
    assert!(
        a.summary[0].server.as_ref().and_then(|s| s.server_scrape_ms_p99).is_some_and(|ms| ms > 0.0),
        "{:?}",
        a.summary[0]
    );
    // Both printed tables keep their columns aligned under a name longer than the default width.
    let printed = serving_bench::table::summary(&a);
    for table in printed.split("\n\n") {
        let lines: Vec<&str> = table.lines().filter(|l| l.starts_with("runtime") || l.starts_with(name)).collect();
        assert!(lines.len() >= 2, "{printed}");
        assert!(lines.iter().all(|l| l.chars().count() == lines[0].chars().count()), "{printed}");
    }
    // The audit re-reads the redacted command line and finds it consistent.
    assert_audits_ok(&out);
}

#[test]
fn a_prompts_file_is_sent_in_turn_with_its_own_caps_and_its_digest_is_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("prompts.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"Name three rivers.\", \"max_tokens\": 3}\n\
         {\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Why?\"}], \"max_tokens\": 5}\n",
    )
    .unwrap();
    let out = bench_run(
        tmp.path(),
        "file",
        &[
            "--target",
            "openai=embedded",
            "--prompts",
            file.to_str().unwrap(),
            "--ignore-eos",
            "--rounds",
            "1",
            "--concurrency",
            "4",
            "--warmups",
            "1",
        ],
    )
    .expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    let sent: Vec<(&str, u64)> = a.requests.iter().map(|r| (r.prompt.as_str(), r.output_tokens().0)).collect();
    // In turn after the warm-up's, each with its own cap, reached because end-of-sequence is ignored.
    assert_eq!(sent, [("line-2", 5), ("line-1", 3), ("line-2", 5), ("line-1", 3)]);
    let w = a.workload.as_ref().unwrap();
    assert_eq!((w.source.as_str(), w.items, w.items_with_max_tokens), ("jsonl", 2, 2));
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(
        w.file_sha256.as_deref(),
        Some(common::digest::bytes_digest(&bytes, common::digest::Algorithm::Sha256).as_str())
    );
    assert_eq!(a.prompts.len(), 2);
    assert_audits_ok(&out);
}

#[test]
fn sharegpt_conversations_are_capped_at_their_replies_lengths_as_the_tokenizer_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("conversations.json");
    let replies = ["Rayleigh scattering of sunlight by the air.", "Seven."];
    let conversations = json!([
        {"conversations": [{"from": "human", "value": "Why is the sky blue?"}, {"from": "gpt", "value": replies[0]}]},
        {"conversations": [{"from": "human", "value": "Name a prime."}, {"from": "gpt", "value": replies[1]}]},
        {"conversations": [{"from": "human", "value": "No answer came."}]},
    ]);
    std::fs::write(&file, conversations.to_string()).unwrap();
    let args =
        ["--target", "openai=embedded", "--sharegpt", file.to_str().unwrap(), "--ignore-eos", "--max-tokens", "9"];
    let out = bench_run(
        tmp.path(),
        "sharegpt",
        &[&args[..], &["--rounds", "1", "--concurrency", "3", "--warmups", "0"]].concat(),
    )
    .expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    // The replies' lengths as the pinned checkpoint's tokenizer counts them; no reply: --max-tokens.
    let dir = tmp.path().join("models/generated/tiny");
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let count = |t: &str| tokenizer.encode(t, false).unwrap().get_ids().len() as u64;
    let sent: Vec<(&str, u64)> = a.requests.iter().map(|r| (r.prompt.as_str(), r.output_tokens().0)).collect();
    assert_eq!(
        sent,
        [("conversation-0", count(replies[0])), ("conversation-1", count(replies[1])), ("conversation-2", 9)]
    );
    let w = a.workload.as_ref().unwrap();
    assert_eq!((w.source.as_str(), w.items, w.items_with_max_tokens), ("sharegpt", 3, 2));
    assert!(w.lengths.as_deref().is_some_and(|l| l.contains("each reply's length")), "{w:?}");
    assert_audits_ok(&out);
}

#[test]
fn synthetic_prompts_have_the_lengths_drawn_as_the_tokenizer_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = bench_run(
        tmp.path(),
        "synthetic",
        &[
            "--target",
            "openai=embedded",
            "--input-tokens",
            "fixed:16",
            "--output-tokens",
            "uniform:2:4",
            "--ignore-eos",
            "--synthetic-count",
            "4",
            "--rounds",
            "1",
            "--concurrency",
            "4",
        ],
    )
    .expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    let w = a.workload.as_ref().unwrap();
    assert_eq!(
        (w.source.as_str(), w.items, w.lengths.as_deref()),
        ("synthetic", 4, Some("input fixed:16, output uniform:2:4"))
    );
    // Cut at 16 tokens and decoded: re-encoding gives 16, or one more where the cut split a word.
    assert!(w.prompt_tokens_min.unwrap() >= 16.0 && w.prompt_tokens_max.unwrap() <= 17.0, "{w:?}");
    assert!(a.requests.iter().all(|r| r.ok() && (2..=4).contains(&r.output_tokens().0)), "{:?}", a.requests);
    assert_audits_ok(&out);
}

/// Generated conversations run turn by turn: each turn resends the history with the server's
/// own reply (its prompt grows by more than that reply), the embedded server reuses the history
/// it has cached, the summary splits first from later turns, and the audit holds a conversation
/// to all its turns in order.
#[test]
fn conversations_resend_the_servers_replies_and_the_audit_holds_their_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--target", "openai=embedded", "--multi-turn", "2:3:80:12", "--max-tokens", "6", "--ignore-eos"];
    let out = bench_run(tmp.path(), "multi", &[&args[..], &["--rounds", "1", "--concurrency", "2"]].concat())
        .expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    let turns: Vec<(usize, Option<usize>)> = a.requests.iter().map(|r| (r.index, r.turn)).collect();
    let mut sorted = turns.clone();
    sorted.sort();
    assert_eq!(sorted, [(0, Some(0)), (0, Some(1)), (0, Some(2)), (1, Some(0)), (1, Some(1)), (1, Some(2))]);
    assert!(a.requests.iter().all(|r| r.ok()), "{:?}", a.requests);
    let mut reusable = 0;
    for index in 0..2 {
        let conversation: Vec<_> = a.requests.iter().filter(|r| r.index == index).collect();
        for w in conversation.windows(2) {
            let (before, after) = (w[0].usage_prompt_tokens.unwrap(), w[1].usage_prompt_tokens.unwrap());
            assert!(
                after > before + w[0].output_tokens().0,
                "the history with the reply and a new turn: {before} -> {after}"
            );
            assert!(w[1].scheduled_s >= w[0].end_s, "a turn waits for the reply before it");
            reusable += before;
        }
    }
    // Every later turn found at least the previous turn's prompt cached.
    let reused = a.embedded_kv.as_ref().unwrap().prefix_cache.unwrap().reused_tokens;
    assert!(reused >= reusable, "{reused} reused, {reusable} positions of earlier prompts");
    let w = a.workload.as_ref().unwrap();
    assert_eq!((w.source.as_str(), w.conversation_turns.clone()), ("multi-turn", vec![3, 3]));
    let row = a.summary[0].columns();
    assert_eq!((row["ttft_s_first_turn_n"].as_u64(), row["ttft_s_later_turns_n"].as_u64()), (Some(2), Some(4)));
    assert_audits_ok(&out);
    // A conversation's last turn dropped, its turns renumbered, one turn given another
    // conversation's prompt, or a later turn's prompt counted shorter than the one before, is
    // caught.
    let last = a.requests.iter().rposition(|r| r.index == 0).unwrap();
    let other = a.requests.iter().find(|r| r.index == 1).unwrap().prompt.clone();
    for edit in [
        Box::new(move |v: &mut Value| {
            v["requests"].as_array_mut().unwrap().remove(last);
        }) as Box<dyn FnOnce(&mut Value)>,
        Box::new(move |v: &mut Value| v["requests"][last]["turn"] = json!(5)),
        Box::new(move |v: &mut Value| v["requests"][last]["prompt"] = json!(other)),
        Box::new(move |v: &mut Value| v["requests"][last]["usage_prompt_tokens"] = json!(3)),
    ] {
        let forged = resealed(&out, |v| {
            edit(v);
            let mut unsealed = v.clone();
            unsealed.as_object_mut().unwrap().remove("seal");
            let a: serving_bench::serving::ServingArtifact = serde_json::from_value(unsealed).unwrap();
            v["summary"] =
                serde_json::to_value(serving_bench::serving::summarize_all(&a.arguments, &a.runtimes, &a.requests))
                    .unwrap();
        });
        let report = audit_of(&forged);
        assert!(
            report.findings.iter().any(|f| f.check == "invariants" && f.message.contains("turn")),
            "{:#?}",
            report.findings
        );
    }
    // The generated workload is redrawn from the seed: other prompts claimed are caught; without
    // the tokenizer it was counted with, a note says it was not redrawn.
    let other = resealed(&out, |v| v["workload"]["items_sha256"] = json!("0".repeat(64)));
    let report = audit_of(&other);
    assert!(report.findings.iter().any(|f| f.message.contains("not what seed")), "{:#?}", report.findings);
    let elsewhere = resealed(&out, |v| v["workload"]["path"] = json!("nowhere"));
    let report = audit_of(&elsewhere);
    assert!(
        report.findings.iter().any(|f| f.message.starts_with("not redrawn: nowhere/tokenizer.json")),
        "{:#?}",
        report.findings
    );
    // Conversations need closed rounds (the flags that make an open loop named) and chat.
    for (extra, expected) in [
        (
            &["--request-rate", "5", "--num-requests", "2"][..],
            "closed rounds (--concurrency, --rounds): --request-rate, --num-requests make an open loop",
        ),
        (&["--max-concurrency", "2", "--duration", "3"][..], "--max-concurrency, --duration make an open loop"),
        (&["--endpoint", "completions"][..], "need chat"),
    ] {
        let e = bench_run(tmp.path(), "refused", &[&args[..], extra].concat()).unwrap_err();
        assert!(e.contains(expected), "{e}");
    }
}

/// A conversations file that mixes conversations of one turn with longer ones sends every item
/// as a conversation, turns numbered, so the audit holds each to its turns; the CSV export
/// carries the turn.
#[test]
fn a_file_of_single_and_multi_turn_conversations_numbers_every_turn() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("mixed.jsonl");
    std::fs::write(
        &file,
        "{\"turns\": [\"Name a colour.\", \"And another?\"]}\n{\"turns\": [\"Say hello.\"]}\n{\"turns\": [\"Count to three.\"], \"system\": \"Be brief.\"}\n",
    )
    .unwrap();
    let args = ["--target", "openai=embedded", "--conversations", file.to_str().unwrap(), "--max-tokens", "4"];
    let extra = ["--ignore-eos", "--rounds", "1", "--concurrency", "3", "--warmups", "0", "--export", "csv"];
    let out = bench_run(tmp.path(), "mixed", &[&args[..], &extra[..]].concat()).expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    let mut turns: Vec<(usize, Option<usize>)> = a.requests.iter().map(|r| (r.index, r.turn)).collect();
    turns.sort();
    assert_eq!(turns, [(0, Some(0)), (0, Some(1)), (1, Some(0)), (2, Some(0))]);
    assert!(a.requests.iter().all(|r| r.ok()), "{:?}", a.requests);
    assert_eq!(a.workload.as_ref().unwrap().conversation_turns, [2, 1, 1]);
    assert_audits_ok(&out);
    let csv = std::fs::read_to_string(out.with_extension("csv")).unwrap();
    assert!(csv.starts_with("runtime,concurrency,rate_rps,warmup,round,index,turn,prompt,"), "{csv}");
    let mut column: Vec<&str> = csv.lines().skip(1).map(|l| l.split(',').nth(6).unwrap()).collect();
    column.sort();
    assert_eq!(column, ["0", "0", "0", "1"]);
}

#[test]
fn replicas_of_one_deployment_are_measured_as_one_target() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, line_a) = serve(&tmp.path().join("models"), &[]);
    let (b, line_b) = serve(&tmp.path().join("models"), &[]);
    let url = |line: &str| line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
    let (url_a, url_b) = (url(&line_a), url(&line_b));
    let run = bench_run(
        tmp.path(),
        "pool",
        &[
            "--target",
            &format!("openai={url_a}@pool"),
            "--target",
            &format!("openai={url_b}@pool"),
            "--rounds",
            "1",
            "--concurrency",
            "4",
            "--max-tokens",
            "4",
            "--scrape-metrics",
        ],
    );
    interrupt(a);
    interrupt(b);
    let out = run.expect("the benchmark run");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert_eq!(a.runtimes.len(), 1);
    assert_eq!((a.runtimes[0].name.as_str(), a.runtimes[0].replicas.clone()), ("pool", vec![url_a, url_b]));
    let served: Vec<Option<usize>> = a.requests.iter().map(|r| r.replica).collect();
    assert_eq!(served, [Some(0), Some(1), Some(0), Some(1)]);
    assert!(a.requests.iter().all(|r| r.ok() && r.runtime == "pool"), "{:?}", a.requests);
    // Both replicas' /metrics, scraped together: the group's tokens are the sum of theirs.
    let replicas: std::collections::BTreeSet<usize> = a.server_metrics[0].scrapes.iter().map(|s| s.replica).collect();
    assert_eq!(replicas, [0, 1].into());
    let generated: u64 = a.requests.iter().map(|r| r.output_tokens().0).sum();
    assert_eq!(a.summary[0].server.as_ref().and_then(|s| s.server_generation_tokens), Some(generated as f64));
    assert_audits_ok(&out);
}

/// With `--scrape-metrics`, every group's window (each closed round, each open-loop group) has
/// the target's `/metrics` series, spanning it; the server's counters rose by exactly what the
/// client counted of the group's requests; and the audit holds the series to their order, their
/// counters and their windows.
#[test]
fn the_servers_metrics_are_scraped_through_every_group_and_agree_with_the_client() {
    let tmp = tempfile::tempdir().unwrap();
    let closed = ["--target", "openai=embedded", "--rounds", "2", "--concurrency", "1,3", "--max-tokens", "8"];
    let open = ["--target", "openai=embedded", "--request-rate", "40", "--num-requests", "6", "--max-tokens", "8"];
    for (name, args, windows) in [("closed", &closed[..], 4), ("open", &open[..], 1)] {
        let args: Vec<&str> = args.iter().copied().chain(["--scrape-metrics", "0.1"]).collect();
        let out = bench_run(tmp.path(), name, &args).unwrap();
        let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
        assert_eq!(a.arguments.scrape_metrics_s, Some(0.1));
        assert_eq!(a.server_metrics.len(), windows, "{name}");
        for row in a.summary.iter().map(|r| r.columns()) {
            let group: Vec<_> = a
                .requests
                .iter()
                .filter(|r| r.runtime == row["runtime"] && !r.arrival.is_some_and(|x| x.warmup))
                .filter(|r| row["concurrency"] == r.concurrency)
                .collect();
            let generated: u64 = group.iter().map(|r| r.output_tokens().0).sum();
            let prompt: u64 = group.iter().map(|r| r.usage_prompt_tokens.unwrap()).sum();
            assert_eq!(row["server_dialect"], "embedded", "{row:?}");
            if name == "closed" {
                assert_eq!(row["server_generation_tokens"].as_f64(), Some(generated as f64), "{name}: {row:?}");
                assert_eq!(row["server_prompt_tokens"].as_f64(), Some(prompt as f64), "{name}: {row:?}");
            } else {
                // The open loop's window also holds its warm-up requests.
                assert!(row["server_generation_tokens"].as_f64() >= Some(generated as f64), "{row:?}");
            }
            assert!(row["server_scrapes"].as_u64() >= Some(2) && row["server_scrape_errors"] == 0, "{row:?}");
            assert!(
                row["server_prefix_hit_rate"].as_f64().is_some_and(|h| h > 0.0),
                "the seed's prompts repeat: {row:?}"
            );
        }
        assert_audits_ok(&out);
    }

    // Forgeries, each with its summary recomputed: a counter that falls, a window left without
    // its series, a series that starts after its window did, a scrape moved into the next
    // window, and the run's last scrape moved long after its last request.
    let out = tmp.path().join("closed.json");
    type Forgery = Box<dyn FnOnce(&mut Value)>;
    let last_scrape = |v: &mut Value, series: usize, to: f64| {
        let scrapes = v["server_metrics"][series]["scrapes"].as_array_mut().unwrap();
        let last = scrapes.len() - 1;
        scrapes[last]["t_s"] = json!(to);
    };
    let cases: [(&str, Forgery); 5] = [
        (
            "outside its window",
            Box::new(move |v| {
                let later = v["server_metrics"][1]["scrapes"][1]["t_s"].as_f64().unwrap();
                last_scrape(v, 0, later);
            }),
        ),
        (
            "outside its window",
            Box::new(move |v| {
                let end = v["requests"].as_array().unwrap().iter().map(|r| r["end_s"].as_f64().unwrap());
                let end = end.fold(0.0, f64::max);
                last_scrape(v, 3, end + 4.0);
            }),
        ),
        (
            "fell",
            Box::new(|v| {
                let scrapes = v["server_metrics"][0]["scrapes"].as_array_mut().unwrap();
                let last = scrapes.len() - 1;
                scrapes[last]["values"]["serve_generation_tokens_total"] = json!(0.0);
            }),
        ),
        (
            "was not scraped",
            Box::new(|v| {
                v["server_metrics"].as_array_mut().unwrap().remove(1);
            }),
        ),
        (
            "do not span",
            Box::new(|v| {
                let scrapes = v["server_metrics"][2]["scrapes"].as_array_mut().unwrap();
                scrapes.remove(0);
            }),
        ),
    ];
    for (reason, edit) in cases {
        let report = audit_of(&forged(&out, edit));
        assert_eq!(report.verdict, audit::Verdict::Wrong, "{reason}");
        assert!(report.findings.iter().any(|f| f.message.contains(reason)), "{reason}: {:#?}", report.findings);
    }
}

/// An export never writes over a file: not one that was there, and not the artifact itself when
/// `--out` has the export's extension (the run fails, the artifact stays whole).
#[test]
fn an_export_never_overwrites_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let run = ["--target", "openai=embedded", "--rounds", "1", "--concurrency", "1", "--max-tokens", "2"];
    let artifact = tmp.path().join("self.csv");
    let args: Vec<&str> = run.iter().copied().chain(["--export", "csv", "--out", artifact.to_str().unwrap()]).collect();
    let (status, _, stderr) = bench_output(tmp.path(), &args);
    assert!(!status.success() && stderr.contains("exists; an export never overwrites a file"), "{stderr}");
    assert_audits_ok(&artifact);
    // A file where an export goes stays as it was.
    std::fs::write(tmp.path().join("kept.csv"), "precious").unwrap();
    let e = bench_run(tmp.path(), "kept", &[&run[..], &["--export", "csv"]].concat()).unwrap_err();
    assert!(e.contains("kept.csv: exists"), "{e}");
    assert_eq!(std::fs::read_to_string(tmp.path().join("kept.csv")).unwrap(), "precious");
    assert_audits_ok(&tmp.path().join("kept.json"));
}

/// A tiny blocking GET for the test above (the server runs in another process).
mod reqwest {
    pub fn blocking_get_json(url: &str) -> serde_json::Value {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { ::reqwest::get(url).await.unwrap().json().await.unwrap() })
    }
}

/// `serving-bench` with `args`, its models under `tmp`: its exit status, stdout and stderr.
fn bench_output(tmp: &Path, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(root())
        .env("LAB_MODELS_DIR", tmp.join("models"))
        .args(args)
        .output()
        .unwrap();
    (o.status, String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A target that accepts connections and never answers (a listener whose backlog takes them and
/// that never reads): the run ends with an error naming it within `--timeout` and a second, with
/// a model name given (the metadata calls) and without (the model's discovery).
#[test]
fn a_silent_target_ends_the_run_within_its_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never.json");
    let common = ["--rounds", "1", "--concurrency", "1", "--warmups", "0", "--timeout", "3"];
    for (target, named) in [(format!("ollama={url}"), true), (format!("openai={url}"), false)] {
        let mut args = vec!["--target", &target, "--out", out.to_str().unwrap()];
        args.extend(common);
        if named {
            args.extend(["--model-name", "tiny"]);
        }
        let start = Instant::now();
        let (status, _, stderr) = bench_output(tmp.path(), &args);
        let took = start.elapsed();
        assert!(!status.success(), "{stderr}");
        assert!(stderr.contains("no answer within 3 s (--timeout)"), "{stderr}");
        assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(4), "{target}: {took:?}");
        assert!(!out.exists());
    }
    drop(listener);
}

/// Refused, unreachable-by-URL, untrusted: each says which, and no printed line holds the URL's
/// password.
#[test]
fn unreachable_targets_say_why_and_never_print_a_password() {
    let tmp = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cases = [
        (format!("openai=http://bob:PW4242@127.0.0.1:{closed}"), "connection refused: nothing listens"),
        ("openai=http://bob:PW4242@127.0.0.1:99999".to_string(), "not a valid URL: invalid port number"),
        ("openai=http://127.0.0.1:80 80".to_string(), "not a valid URL"),
    ];
    for (target, expected) in cases {
        let (status, stdout, stderr) = bench_output(tmp.path(), &["--target", &target, "--rounds", "1"]);
        assert!(!status.success(), "{target}");
        let line = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
        assert!(line.contains(expected), "{target}: {stderr}");
        assert!(!stderr.contains("PW4242") && !stdout.contains("PW4242"), "{stderr}");
    }
    // A self-signed certificate: its target says so, and that --insecure exists.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let base = rt.block_on(self_signed_listener());
    let (status, _, stderr) =
        bench_output(tmp.path(), &["--target", &format!("openai={base}"), "--model-name", "m", "--rounds", "1"]);
    assert!(!status.success());
    assert!(stderr.contains("certificate is not trusted; pass --insecure"), "{stderr}");
}

/// A TLS listener with a fresh self-signed certificate that completes no handshake the client
/// refuses (a real server cannot be given an untrusted certificate on demand).
async fn self_signed_listener() -> String {
    let acceptor = support::self_signed_acceptor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move { acceptor.accept(sock).await });
        }
    });
    format!("https://127.0.0.1:{}", addr.port())
}

/// No header value is recorded unless its name is marked with --record-header: not in argv, not
/// in the requested settings, nowhere in the artifact; the audit re-reads the redacted argv.
#[test]
fn header_values_are_recorded_only_when_marked_safe() {
    let tmp = tempfile::tempdir().unwrap();
    let out = bench_run(
        tmp.path(),
        "headers",
        &[
            "--target",
            "openai=embedded",
            "--header",
            "X-Password: S3cretValue",
            "--header=X-Sid: 12",
            "--header",
            "X-Tenant: acme",
            "--record-header",
            "x-tenant",
            "--rounds",
            "1",
            "--concurrency",
            "1",
            "--max-tokens",
            "2",
        ],
    )
    .expect("the benchmark run");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains("S3cretValue") && !text.contains("X-Sid: 12"), "a header value is in the artifact");
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    assert!(a.provenance.argv.contains(&"X-Password:<redacted>".to_string()), "{:?}", a.provenance.argv);
    assert!(a.provenance.argv.contains(&"--header=X-Sid:<redacted>".to_string()), "{:?}", a.provenance.argv);
    assert_eq!(
        a.provenance.settings.requested["header"],
        json!(["X-Password:<redacted>", "X-Sid:<redacted>", "X-Tenant: acme"])
    );
    assert_eq!(a.sent_headers, ["x-password", "x-sid", "x-tenant"]);
    assert_audits_ok(&out);
}

/// A group in which every request failed (prompts longer than tiny's context): the artifact is
/// written, the run exits 1 with one line saying where, unless --allow-failed-groups.
#[test]
fn a_group_with_no_success_fails_the_run_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let context = common::generate::shape("tiny").unwrap().max_positions;
    let long = format!("fixed:{}", context + 100);
    for allow in [false, true] {
        let out = tmp.path().join(format!("failed-{allow}.json"));
        let mut args = vec![
            "--target",
            "openai=embedded",
            "--input-tokens",
            &long,
            "--synthetic-count",
            "1",
            "--rounds",
            "1",
            "--concurrency",
            "1",
            "--max-tokens",
            "2",
            "--out",
            out.to_str().unwrap(),
        ];
        if allow {
            args.push("--allow-failed-groups");
        }
        let (status, _, stderr) = bench_output(tmp.path(), &args);
        assert!(out.exists(), "the artifact is written either way: {stderr}");
        assert_eq!(status.success(), allow, "{stderr}");
        if !allow {
            let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
            assert_eq!(errors.len(), 1, "{stderr}");
            assert!(
                errors[0].contains(
                    "every request failed in embedded-openai c1 (1 requests; the first: http_status: HTTP 400"
                ),
                "{stderr}"
            );
        }
        let report = audit_of(&out);
        assert_eq!(report.verdict, audit::Verdict::Ok, "{:#?}", report.findings);
        assert!(report.findings.iter().any(|f| f.message.starts_with("every request failed in embedded-openai c1")));
    }
}

/// An `--out` that exists is refused before anything loads or is sent.
#[test]
fn an_existing_out_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("taken.json");
    std::fs::write(&out, "precious").unwrap();
    let (status, _, stderr) = bench_output(tmp.path(), &["--out", out.to_str().unwrap()]);
    assert!(!status.success());
    assert!(stderr.contains("already exists; artifacts are never overwritten"), "{stderr}");
    assert!(!stderr.contains("loading model"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious");
    assert!(!tmp.path().join("models").exists(), "no model was generated");
}

#[test]
fn bad_command_lines_are_one_line_errors_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never.json");
    let cases: [(&[&str], &str); 50] = [
        (
            &["--check-agreement", "--temperature", "0.7"],
            "--check-agreement: check_agreement: compares greedy answers, which sampling makes differ",
        ),
        (
            &["--target", "openai=embedded", "--check-agreement"],
            "--check-agreement compares targets' answers: give at least two --target",
        ),
        (&["--top-p", "0"], "--top-p: sampling.top_p: 0; must be above 0 and at most 1"),
        (&["--top-k", "-2", "--temperature", "1"], "--temperature, --top-k: sampling.top_k: -2"),
        (&["--stop", ""], "sampling.stop: an empty string"),
        (&["--extra-body", "[1]"], "a JSON object is needed"),
        (&["--extra-body", r#"{"stream": false}"#], "sampling.extra_body.stream: the client sets `stream` itself"),
        (
            &["--request-rate", "1e-300", "--num-requests", "2"],
            "arrivals.rates: 1e-300 requests/s: 2 requests take about",
        ),
        (&["--request-rate", "0.000002", "--num-requests", "3"], "more than a week"),
        (&["--concurrency", "1,4,1"], "concurrency[2]: level 1 is given twice"),
        (
            &["--rounds", "1048576", "--concurrency", "1048576", "--max-tokens", "1048576"],
            "rounds: 1048576 would hold about",
        ),
        (&["--target", "vllm"], "write KIND=URL"),
        (&["--target", "grpc=http://127.0.0.1:1"], "unknown target kind `grpc`"),
        (&["--target", "openai=ftp://127.0.0.1:1"], "must start with http:// or https://"),
        (&["--target=-x=openai=http://127.0.0.1:1"], "the name `-x` must be 1 to 64 ASCII letters"),
        (
            &["--target", "openai=openai=http://127.0.0.1:1"],
            "the name `openai` is a kind of API; give the target another",
        ),
        (&["--target", "a b=openai=http://127.0.0.1:1"], "the name `a b` must be"),
        (
            &["--target=openai-2=openai=http://127.0.0.1:1", "--target=openai=http://127.0.0.1:2"],
            "--target openai=http://127.0.0.1:2: `openai-2`, the name it would get, is another target's",
        ),
        (&["--target", "mine=openai=embedded"], "the embedded server is named embedded-openai; leave out NAME="),
        (&["--target", "mine=openai=http://127.0.0.1:1@pool"], "a replica's target is named by its group `pool`"),
        (
            &["--scrape-metrics", "0.01"],
            "--scrape-metrics [<SECONDS>]': `0.01` is not a number of seconds from 0.1 to 3600",
        ),
        (&["--scrape-metrics", "-1"], "`-1` is not a number of seconds from 0.1 to 3600"),
        (&["--scrape-metrics", "7200"], "`7200` is not a number of seconds"),
        (&["--header", "no-colon-here"], "--header no-colon-here: write NAME:VALUE"),
        (&["--api-key-env", "SERVING_BENCH_SURELY_UNSET"], "the variable is not set"),
        (&["--input-tokens", "gauss:3"], "`gauss:3` is not a length distribution"),
        (&["--input-tokens", "fixed:8", "--tokenizer", "/nonexistent"], "/nonexistent/tokenizer.json"),
        (&["--concurrency", "0"], "--concurrency: concurrency: every level must be at least 1"),
        (&["--rounds", "0"], "--rounds: rounds: 0; must be at least 1"),
        (
            &["--multi-turn", "10000:1000:1000:1000", "--tokenizer", "/nonexistent"],
            "--multi-turn 10000:1000:1000:1000: 10010000000 tokens of text to generate, more than",
        ),
        (&["--timeout=-1"], "--timeout <TIMEOUT>': -1: must be above 0"),
        (&["--timeout=1e19"], "at most 604800"),
        (&["--idle-timeout", "1e300"], "at most 604800"),
        (&["--first-token-timeout", "NaN"], "NaN: must be above 0"),
        (&["--connect-timeout", "soon"], "`soon` is not a number of seconds"),
        (&["--concurrency", "1,18446744073709551615"], "concurrency: 18446744073709551615 is more than"),
        (&["--request-rate", "0"], "`0` is not a rate"),
        (&["--request-rate", "5", "--burstiness", "0"], "arrivals.burstiness: 0"),
        (&["--request-rate", "5", "--num-requests", "10", "--warmup-requests", "10"], "arrivals.warmup_requests"),
        (&["--request-rate", "inf", "--duration", "5"], "--request-rate, --duration: arrivals.num_requests"),
        (&["--request-rate", "100,100", "--num-requests", "2"], "arrivals.rates[1]: 100.0 is given twice"),
        (
            &["--burstiness", "0.5"],
            "--burstiness: arrivals.burstiness: shapes the gaps between arrivals at a finite rate",
        ),
        (&["--warmup-requests", "3"], "--warmup-requests: arrivals: unbounded; give num_requests (--num-requests)"),
        (&["--concurrency", "2", "--max-concurrency", "2"], "cannot be used with"),
        (&["--rounds", "2", "--request-rate", "5"], "cannot be used with"),
        (&["--request-rate", "1000000", "--duration", "604800"], "is more than 1048576 requests"),
        (&["--sweep", "1", "--num-requests", "4"], "arrivals.sweep: 1: must be in 2..=100"),
        (&["--sweep", "4", "--request-rate", "5"], "cannot be used with"),
        (&["--sweep", "4", "--num-requests", "4", "--max-concurrency", "1"], "arrivals.max_concurrency: 1 makes"),
        (&["--sweep", "4", "--duration", "5"], "arrivals.num_requests"),
    ];
    for (args, expected) in cases {
        let all: Vec<&str> =
            args.iter().copied().chain(["--model-name", "m", "--out", out.to_str().unwrap()]).collect();
        let (status, _, err) = bench_output(tmp.path(), &all);
        assert!(!status.success(), "{args:?} succeeded");
        assert!(err.lines().any(|l| l.starts_with("error:") && l.contains(expected)), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote an artifact");
    }
}

/// `--check-agreement`: the embedded server through its two APIs gives the same answers, request
/// by request; the same model served in bf16 by a second server parts from them on some prompts,
/// and each is asked again for log-probabilities and judged at the token where they part. The
/// audit recomputes the texts' digests, the comparison and the verdicts, and catches edits to each.
#[test]
fn agreement_is_checked_answer_by_answer_and_every_difference_is_judged() {
    let tmp = tempfile::tempdir().unwrap();
    let (child, line) = serve(&tmp.path().join("models"), &["--dtype", "bf16"]);
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
    let bf16 = format!("bf16=openai={url}");
    let args = [
        "--target",
        "openai=embedded",
        "--target",
        "ollama=embedded",
        "--target",
        &bf16,
        "--rounds",
        "2",
        "--concurrency",
        "1,3",
        "--max-tokens",
        "24",
        "--check-agreement",
    ];
    let run = bench_run(tmp.path(), "agreement", &args);
    interrupt(child);
    let path = run.unwrap();
    assert_audits_ok(&path);
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&path).unwrap();
    assert!(a.requests.iter().all(|r| r.ok() && r.text.is_some() && r.text_sha256.is_some()));
    assert!(a.summary.iter().all(|row| row.inconsistent_outputs == Some(0)), "{:?}", a.summary);
    assert_eq!(a.agreement.len(), 3, "every pair of three targets");
    let same = &a.agreement[0];
    assert_eq!(same.targets, ["embedded-openai".to_string(), "embedded-ollama".to_string()]);
    assert_eq!((same.compared, same.identical, same.explanations.len()), (8, 8, 0), "{same:?}");
    let half = &a.agreement[1];
    assert_eq!(half.compared, 8);
    assert!(half.identical < 8 && !half.explanations.is_empty(), "bf16 parts from f32 somewhere: {half:?}");
    for e in &half.explanations {
        let (t, margins) = (e.token.expect("asked alone, the two still part"), e.margins);
        assert!(margins.iter().all(Option::is_some), "the other's token is among each one's candidates at {t}: {e:?}");
    }
    // Edits the audit recomputes: a kept text, the share, and a verdict.
    let forged = resealed(&path, |v| v["requests"][0]["text"] = json!("something else"));
    assert_ne!(audit_of(&forged).verdict, audit::Verdict::Ok);
    let forged = resealed(&path, |v| v["agreement"][1]["identical"] = json!(8));
    assert_ne!(audit_of(&forged).verdict, audit::Verdict::Ok);
    let forged = resealed(&path, |v| {
        let e = &mut v["agreement"][1]["explanations"][0];
        e["near_tie"] = json!(!e["near_tie"].as_bool().unwrap());
    });
    assert_ne!(audit_of(&forged).verdict, audit::Verdict::Ok);
    let forged = resealed(&path, |v| v["requests"][1]["inconsistency"] = json!("made up"));
    assert_ne!(audit_of(&forged).verdict, audit::Verdict::Ok);
}

/// Pins the calling thread to `cpu` at real-time priority `level`, above the stall probe's.
fn hold_cpu_thread(cpu: usize, level: i32) {
    // SAFETY: a zeroed cpu_set_t is an empty set, CPU_SET writes within it, and both calls
    // act on the calling thread (0) with valid arguments.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        let param = libc::sched_param { sched_priority: level };
        assert_eq!(libc::sched_setscheduler(0, libc::SCHED_FIFO, &param), 0, "real-time priority (root)");
    }
}

/// Under `--stall-probe` each open-loop group at a finite rate is watched on every CPU. A CPU
/// held from the client (a thread above the probe spinning on it 5 ms in every 40, as a host
/// pausing a virtual CPU would) shows as its stalls; every send delay splits into the part a
/// stall of its CPU held and the client's own; the audit names a stall forged outside its
/// group, on a CPU not watched or over another of its CPU, and a group left unwatched.
#[test]
fn the_stall_probe_sets_the_machines_holds_apart_from_the_clients_own_delay() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    // Asked without a schedule, the probe has nothing to watch: one line says so.
    let refused = bench_run(tmp.path(), "closed", &["--target", "openai=embedded", "--stall-probe"]).unwrap_err();
    assert!(refused.contains("stall_probe") && refused.contains("--request-rate"), "{refused}");

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let held = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            hold_cpu_thread(0, 50);
            let mut spans = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(35));
                let from = Instant::now();
                while from.elapsed() < Duration::from_millis(5) {
                    std::hint::spin_loop();
                }
                spans.push(from);
            }
            spans.len()
        })
    };
    let args = [
        "--target",
        "openai=embedded",
        "--stall-probe",
        "--request-rate",
        "100,inf",
        "--max-concurrency",
        "4",
        "--num-requests",
        "60",
        "--warmup-requests",
        "2",
        "--max-tokens",
        "2",
    ];
    let run = bench_run(tmp.path(), "probed", &args);
    stop.store(true, Ordering::Relaxed);
    assert!(held.join().unwrap() > 5);
    let out = run.unwrap();
    let a: serving_bench::serving::ServingArtifact = common::artifact::read_artifact(&out).unwrap();
    // The finite rate's group alone is watched, on every CPU, CPU 0's holds among its stalls.
    assert_eq!(a.machine_stalls.len(), 1, "{:?}", a.machine_stalls);
    let probed = &a.machine_stalls[0];
    assert_eq!((probed.runtime.as_str(), probed.load.as_str()), ("embedded-openai", "rate100"));
    assert!(probed.cpus.contains(&0) && probed.cpu_time_s > 0.0, "{probed:?}");
    let long: Vec<_> = probed.stalls.iter().filter(|s| s.cpu == 0 && s.to_s - s.from_s >= 0.0035).collect();
    assert!(long.len() >= 5, "CPU 0 was held 5 ms in every 40: {:?}", probed.stalls);
    assert!(a.measurement_notes.contains_key("machine_stalls"));
    // Every request of the group says which CPU sent it; its send delay is held plus own.
    let group: Vec<_> = a.requests.iter().filter(|r| r.arrival.is_some_and(|x| x.rate_rps.is_some())).collect();
    assert!(group.iter().all(|r| r.sent_cpu.is_some_and(|c| probed.cpus.contains(&c))), "{group:?}");
    let row = a.summary.iter().map(|r| r.columns()).find(|r| r["request_rate"] == json!(100.0)).unwrap();
    let split: Vec<_> = group
        .iter()
        .filter(|r| !r.arrival.unwrap().warmup)
        .filter_map(|r| serving_bench::serving::split_send(r, &probed.stalls))
        .collect();
    assert_eq!(row["send_held_s_n"].as_u64(), Some(split.len() as u64));
    assert!(split.iter().all(|s| s.held >= 0.0 && s.own >= 0.0), "{split:?}");
    let v = |k: &str| row[k].as_f64().unwrap();
    assert!((v("send_held_s_mean") + v("send_own_s_mean") - v("send_delay_s_mean")).abs() < 1e-9, "{row:?}");
    assert!(v("send_own_s_max") <= v("send_delay_s_max") + 1e-12, "{row:?}");
    let unprobed = a.summary.iter().map(|r| r.columns()).find(|r| r["request_rate"] == json!("inf")).unwrap();
    assert!(!unprobed.contains_key("send_own_s_p99"), "{unprobed:?}");
    assert_audits_ok(&out);

    // Forgeries, sealed with their summaries recomputed: each is named.
    let (first, last) = (long[0], probed.stalls.len() - 1);
    let k = probed.stalls.iter().position(|s| s == first).unwrap();
    let named = |edit: &dyn Fn(&mut Value), what: &str| {
        let report = audit_of(&forged(&out, edit));
        assert_eq!(report.verdict, audit::Verdict::Wrong, "{what}");
        let said = format!("{:?}", report.findings);
        assert!(said.contains(what), "{what}: {said}");
    };
    named(&|v| v["machine_stalls"][0]["stalls"][last]["to_s"] = json!(probed.to_s + 1.0), &format!("stalls[{last}]"));
    named(&|v| v["machine_stalls"][0]["stalls"][k]["cpu"] = json!(4096), &format!("stalls[{k}]"));
    named(
        &|v| {
            let copy = v["machine_stalls"][0]["stalls"][k].clone();
            v["machine_stalls"][0]["stalls"].as_array_mut().unwrap().insert(k + 1, copy);
        },
        &format!("stalls[{}]", k + 1),
    );
    named(
        &|v| {
            v["machine_stalls"] = json!([]);
            v["measurement_notes"].as_object_mut().unwrap().remove("machine_stalls");
        },
        "embedded-openai rate100 was not probed",
    );
    // A probe said to have run with another threshold than the code's.
    named(&|v| v["machine_stalls"][0]["min_stall_s"] = json!(0.0002), "must be the probe's");
}
