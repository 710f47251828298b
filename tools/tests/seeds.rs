//! The Python predecessor's two seed artifacts (committed as fixtures) audit as internally
//! consistent, with what they lack listed; broken foreign input is a finding, never a crash.

use audit::{Audit, Verdict};
use common::finding::{Report, Severity};
use common::workspace::Workspace;
use std::path::{Path, PathBuf};
use tools::registry::EXPERIMENTS;

/// The audit of a foreign file, with every registered experiment.
fn audit_external(path: &Path, shown: String) -> Report {
    let ws = Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    Audit::new(&ws, EXPERIMENTS).audit_external(path, shown)
}

fn seed(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/seeds").join(name)
}

fn audit_text(text: &str) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign.txt");
    std::fs::write(&path, text).unwrap();
    audit_external(&path, "foreign.txt".into())
}

fn notes(r: &Report) -> Vec<String> {
    r.findings.iter().filter(|f| f.severity == Severity::Note).map(|f| f.field.clone()).collect()
}

#[test]
fn scheduler_seed_is_consistent_and_its_gaps_are_listed() {
    let r = audit_external(&seed("000_56313d9d03231830.txt"), "000".into());
    assert_eq!(r.experiment.as_deref(), Some("scheduler"));
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.findings);
    let n = notes(&r);
    assert_eq!(n[..3], ["provenance", "runs[].timeline", "runs[].requests[].prompt_tokens"]);
    // Checked against the scheduler manifests' claims: one run each, so point estimates only.
    let claims: Vec<&str> = r.findings.iter().filter(|f| f.check == "claims").map(|f| f.message.as_str()).collect();
    assert!(claims.len() >= 5, "{claims:?}");
    assert!(claims.iter().all(|c| c.contains("inconclusive")), "{claims:?}");
    // interleave / fifo TTFT of interactive-a: 110.5 / 524.6 ms.
    let ttft = claims.iter().find(|c| c.starts_with("`interleave-cuts-interactive-ttft`")).unwrap();
    assert!(ttft.contains("interleave / fifo = 0.211") && ttft.contains("point estimate"), "{ttft}");
}

#[test]
fn serving_seed_is_consistent_and_its_gaps_are_listed() {
    let r = audit_external(&seed("001_9c5fc480f3b35933.txt"), "001".into());
    assert_eq!(r.experiment.as_deref(), Some("serving-bench"));
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.findings);
    let n = notes(&r);
    for expected in
        ["provenance", "requests", "summary[0].prompt_tps_*", "summary[1].prompt_tps_*", "arguments.output_dir"]
    {
        assert!(n.iter().any(|f| f == expected), "{expected} not noted: {n:?}");
    }
    // Its group means give one round each: 54.66 / 23.52 aggregate tokens/s, inconclusive.
    let claim = r.findings.iter().find(|f| f.check == "claims").map(|f| f.message.as_str()).unwrap_or_default();
    assert!(claim.contains("[vllm-metal]") && claim.contains("c4 / c1 = 2.324: inconclusive"), "{claim}");
}

#[test]
fn edited_seed_numbers_are_wrong_and_named() {
    let text = std::fs::read_to_string(seed("000_56313d9d03231830.txt")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["runs"][1]["requests"][0]["ttft_ms"] = serde_json::json!(9999.0);
    let r = audit_text(&v.to_string());
    assert_eq!(r.verdict, Verdict::Wrong);
    assert!(r.first_reason().starts_with("runs[1].requests[0].ttft_ms"), "{}", r.first_reason());

    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["runs"][2]["requests"][1]["output_ids"][3] = serde_json::json!(1);
    assert!(audit_text(&v.to_string()).first_reason().starts_with("runs[2].requests: output ids differ"));

    let serving = std::fs::read_to_string(seed("001_9c5fc480f3b35933.txt")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&serving).unwrap();
    v["summary"][1]["successes"] = serde_json::json!(19);
    let r = audit_text(&v.to_string());
    assert!(
        r.first_reason().starts_with("summary[1].requests: 20 != successes 19 + failures 0"),
        "{}",
        r.first_reason()
    );
}

#[test]
fn garbage_is_a_finding_not_a_crash() {
    for text in
        ["", "not json", "[1,2]", "{\"runs\": 5, \"arrival_policy\": 1}", "{\"summary\": [{}], \"runtimes\": []}", "{}"]
    {
        let r = audit_text(text);
        assert_eq!(r.verdict, Verdict::Wrong, "{text}: {:?}", r.findings);
    }
}
