//! The audit and the report binaries as a user runs them: a folder with nothing to audit is an
//! error that says so, and a report marks an artifact the audit finds wrong above its numbers.

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn an_empty_folder_is_nothing_audited_not_a_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_audit")).current_dir(root()).arg(tmp.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(stderr.starts_with("error: nothing audited: no artifact (*.json) under"), "{stderr}");
}

#[test]
fn a_report_marks_an_artifact_the_audit_finds_wrong() {
    let committed = audit::artifact_files(&root().join("artifacts/scheduler"))
        .into_iter()
        .find(|p| !p.to_string_lossy().contains("+custom"))
        .expect("a committed scheduler artifact");
    let tmp = tempfile::tempdir().unwrap();
    let mut v: Value = common::artifact::read_artifact(&committed).unwrap();
    v["summary"][0]["ttft_ms"]["p50"] = json!(0.001);
    let forged = tmp.path().join("forged.json");
    std::fs::write(&forged, support::sealed(v).to_string()).unwrap();
    let out = tmp.path().join("report");
    let o = Command::new(env!("CARGO_BIN_EXE_report"))
        .current_dir(root())
        .arg(&forged)
        .arg(&committed)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(out.join("report.md")).unwrap();
    let marks: Vec<&str> = page.lines().filter(|l| l.contains("The audit finds this artifact WRONG")).collect();
    assert_eq!(marks.len(), 1, "only the forged one is marked: {page}");
    assert!(marks[0].contains("summary[0]"), "{}", marks[0]);
}
