//! The fields an artifact repeats from its provenance (`run_id`, `model_id`, `parameters`) are
//! held to it: a sealed edit of one, which no experiment's own checks read, is found wrong by name.

mod support;

use audit::Audit;
use common::workspace::Workspace;
use serde_json::{json, Value};
use std::path::Path;
use tools::registry::EXPERIMENTS;

#[test]
fn an_edited_copy_of_provenance_is_wrong_by_name() {
    let ws = Workspace { root: source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap() };
    let audit = Audit::new(&ws, EXPERIMENTS);
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for file in audit::artifact_files(&ws.artifacts_dir()) {
        let body: Value = common::artifact::read_artifact(&file).unwrap();
        let pinned = body.pointer("/provenance/model/repo").is_some_and(Value::is_string);
        let mut edits: Vec<(&str, String)> = Vec::new();
        if body.get("run_id").is_some() {
            edits.push(("/run_id", "run_id".into()));
        }
        if body.get("model_id").is_some() && pinned {
            edits.push(("/model_id", "model_id".into()));
        }
        let number = body
            .get("parameters")
            .and_then(Value::as_object)
            .and_then(|p| p.iter().find(|(_, v)| v.is_u64()).map(|(k, v)| (k.clone(), v.as_u64().unwrap())));
        let mut forgeries = Vec::new();
        for (pointer, field) in edits {
            let mut forged = body.clone();
            let text = format!("{}x", forged.pointer(pointer).and_then(Value::as_str).unwrap_or_default());
            *forged.pointer_mut(pointer).unwrap() = json!(text);
            forgeries.push((forged, field));
        }
        if let Some((key, n)) = number {
            let mut forged = body.clone();
            forged["parameters"][&key] = json!(n * 2 + 1);
            forgeries.push((forged, format!("parameters.{key}")));
        }
        for (forged, field) in forgeries {
            let path = tmp.path().join("forged.json");
            std::fs::write(&path, support::sealed(forged).to_string()).unwrap();
            let report = audit.audit_artifact(&path);
            assert!(
                report.findings.iter().any(|f| f.check == "invariants" && f.field == field),
                "{}: an edited {field} is not found: {:?}",
                ws.display_path(&file),
                report.findings
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} edits made: the committed artifacts should repeat these fields");
}
