//! No flag and no manifest makes an experiment panic before it runs. Command lines are drawn
//! from every experiment's flags with hostile values (huge, negative, tiny, not a number, empty,
//! malformed), and manifests are the committed ones mutated at random places; each goes through
//! what a binary does with it before it loads a model or sends a request (parse, override the
//! manifest's parameters, validate; for the serving benchmark also its targets, its timeouts and
//! its schedules) and through what the audit does with a manifest (its parameters and claims
//! checked). A refusal is fine; a panic is the failure.
//!
//! `just fuzz` runs each property 100,000 times (`PROPTEST_CASES`, which an explicit count in the
//! config would override); `just test` proptest's default 256.

use common::experiment::AnyManifest;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use tools::registry::EXPERIMENTS;

/// Flags of every experiment's command line (a flag one does not have is its parse error).
const FLAGS: &[&str] = &[
    "--rounds",
    "--warmup",
    "--warmups",
    "--concurrency",
    "--max-tokens",
    "--seed",
    "--request-rate",
    "--sweep",
    "--burstiness",
    "--max-concurrency",
    "--num-requests",
    "--duration",
    "--warmup-requests",
    "--timeout",
    "--connect-timeout",
    "--first-token-timeout",
    "--idle-timeout",
    "--percentiles",
    "--slo",
    "--endpoint",
    "--input-tokens",
    "--output-tokens",
    "--synthetic-count",
    "--header",
    "--record-header",
    "--target",
    "--model-name",
    "--policy",
    "--chunk-size",
    "--max-active",
    "--dtype",
    "--ignore-eos",
    "--insecure",
    "--continuous-usage",
    "--no-stock",
    "--allow-failed-groups",
];

/// Values that have broken parsers and arithmetic before.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "7",
    "64",
    "1e-300",
    "1e300",
    "-0",
    "NaN",
    "inf",
    "-inf",
    "0.5",
    "1e-9",
    "604800",
    "604801",
    "1048576",
    "1048577",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1,2",
    "1,1",
    "4,0",
    "",
    " ",
    "x",
    "fixed:5",
    "fixed:0",
    "uniform:9:2",
    "normal:5:1e300:0:10",
    "ttft_ms=1e300",
    "tpot_ms=-1",
    "e2e_ms=NaN",
    "openai=embedded",
    "ollama=http://a:b@127.0.0.1:99999",
    "openai=http://[::1",
    "grpc=x",
    "openai=http://127.0.0.1:1@grp",
    "X-A: b",
    "X-A:",
    ":b",
    "fifo",
    "batched",
    "lifo",
    "f16",
    "completions",
];

fn arg() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(FLAGS).prop_map(str::to_string),
        3 => proptest::sample::select(VALUES).prop_map(str::to_string),
        1 => (proptest::sample::select(FLAGS), proptest::sample::select(VALUES)).prop_map(|(f, v)| format!("{f}={v}")),
        1 => any::<f64>().prop_map(|f| f.to_string()),
        1 => any::<i64>().prop_map(|i| i.to_string()),
        1 => "\\PC{0,12}",
    ]
}

fn manifests() -> Vec<(String, AnyManifest)> {
    let ws = common::workspace::Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    ws.experiment_manifests().unwrap().into_iter().map(|(p, m)| (ws.display_path(&p), m)).collect()
}

/// What a binary does with its command line and its manifest's parameters before it runs, as far
/// as no model, file or network is needed: `Err` is a refusal, a panic is a bug.
fn before_the_run(experiment: &str, argv: &[String], parameters: &Value) -> Result<(), String> {
    let e = EXPERIMENTS.iter().find(|e| e.name() == experiment).unwrap();
    let settings = e.settings(argv, Some(parameters)).map_err(|e| e.to_string())?;
    let manifest = AnyManifest {
        experiment: experiment.into(),
        model: "tiny".into(),
        parameters: settings.effective.unwrap_or(Value::Null),
        expectations: None,
        source_sha256: None,
        claims: Vec::new(),
    };
    e.check_manifest(&manifest).map_err(|e| e.to_string())?;
    if experiment == "serving-bench" {
        use clap::Parser;
        let cli = serving_bench::cli::Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.bench.targets()?;
        let base: serving_bench::serving::Parameters =
            serde_json::from_value(parameters.clone()).map_err(|e| e.to_string())?;
        use common::experiment::CommandLine;
        serving_bench::cli::check_run(&cli.effective(&base)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn no_panic(what: &str, work: impl FnOnce() -> Result<(), String>) -> Result<(), TestCaseError> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(_) => Ok(()),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(TestCaseError::fail(format!("{what}: panicked: {message}")))
        }
    }
}

/// Every JSON pointer in `v` (the root left out).
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, x)| pointers(x, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| pointers(x, format!("{at}/{i}"), out)),
        _ => {}
    }
    if !at.is_empty() {
        out.push(at);
    }
}

const REPLACEMENTS: &[fn() -> Value] = &[
    || Value::Null,
    || json!(-1),
    || json!(0),
    || json!(1e300),
    || json!(-1e300),
    || json!(5e-324),
    || json!(u64::MAX),
    || json!(i64::MIN),
    || json!("x"),
    || json!([]),
    || json!([0, 0]),
    || json!({}),
    || json!(0.5),
    || json!(true),
];

proptest! {
    #[test]
    fn no_command_line_makes_an_experiment_panic_before_it_runs(
        which in any::<usize>(),
        args in proptest::collection::vec(arg(), 0..8),
    ) {
        let manifests = manifests();
        let (path, m) = &manifests[which % manifests.len()];
        let argv: Vec<String> = std::iter::once(m.experiment.clone()).chain(args).collect();
        no_panic(&format!("{path} with {argv:?}"), || before_the_run(&m.experiment, &argv, &m.parameters))?;
    }

    #[test]
    fn no_manifest_makes_a_check_or_a_run_panic_before_it_runs(
        which in any::<usize>(),
        edits in proptest::collection::vec((any::<usize>(), any::<usize>()), 1..4),
    ) {
        let manifests = manifests();
        let (path, m) = &manifests[which % manifests.len()];
        let mut v = serde_json::to_value(m).unwrap();
        for (at, with) in edits {
            let mut all = Vec::new();
            pointers(&v, String::new(), &mut all);
            if all.is_empty() {
                break;
            }
            if let Some(slot) = v.pointer_mut(&all[at % all.len()]) {
                *slot = REPLACEMENTS[with % REPLACEMENTS.len()]();
            }
        }
        let what = format!("{path} edited to {v}");
        no_panic(&what, || {
            let m: AnyManifest = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
            let e = EXPERIMENTS.iter().find(|e| e.name() == m.experiment).ok_or("no such experiment")?;
            e.check_manifest(&m).map_err(|e| e.to_string())?;
            common::experiment::check_claims(*e, &m).map_err(|e| e.to_string())?;
            before_the_run(&m.experiment, std::slice::from_ref(&m.experiment), &m.parameters)
        })?;
    }
}
