//! `decode-scaling` end to end on the tiny generated checkpoint: the artifact covers every point
//! of every round, audits ok, and an edited step (resealed) is named by the recomputed summary.

use audit::{Audit, Verdict};
use common::workspace::Workspace;
use decode_scaling::{Artifact, DecodeScaling, Engine};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn workspace() -> Workspace {
    Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn audit(path: &Path) -> common::finding::Report {
    let ws = workspace();
    Audit::new(&ws, &[&DecodeScaling]).audit_artifact(path)
}

#[test]
fn a_run_covers_every_point_audits_ok_and_an_edited_step_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run.json");
    let o = Command::new(env!("CARGO_BIN_EXE_decode-scaling"))
        .current_dir(workspace().root)
        .env("LAB_MODELS_DIR", tmp.path().join("models"))
        .args(["--offline", "--rounds", "1", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let a: Artifact = common::artifact::read_artifact(&out).unwrap();
    let p = &a.parameters;
    assert_eq!(p.rounds, 1, "--rounds overrides the manifest");
    // Both loops at every decode point (contexts at batch 1, batches at batch_context), chunk
    // size and prompt length.
    assert_eq!(a.decode.len(), 2 * p.decode_points().len());
    assert_eq!(a.prefill.len(), 2 * p.chunk_sizes.len());
    assert_eq!(a.prompts.len(), 2 * p.prompt_lengths.len());
    for engine in [Engine::Ours, Engine::StockCandle] {
        assert!(a.summary.iter().any(|r| r.engine == engine && r.point == "decode context 64 batch 8"));
    }
    assert_eq!(a.ratios.len(), p.decode_points().len() + p.chunk_sizes.len() + p.prompt_lengths.len());
    assert!(a.decode.iter().all(|d| d.step_ms.len() == p.steps && d.step_ms.iter().all(|t| *t > 0.0)));
    let r = audit(&out);
    assert_eq!(r.verdict, Verdict::Ok, "{:#?}", r.findings);

    // An edited step time, resealed as a careful forger would, no longer gives the summary.
    let mut v: Value = common::artifact::read_artifact(&out).unwrap();
    // (Every step of the point: a median shrugs off one.)
    for t in v["decode"][0]["step_ms"].as_array_mut().unwrap() {
        *t = json!(1000.0);
    }
    v.as_object_mut().unwrap().remove(common::artifact::SEAL_KEY);
    let seal = common::artifact::seal(&v);
    v.as_object_mut().unwrap().insert(common::artifact::SEAL_KEY.into(), serde_json::to_value(seal).unwrap());
    let edited = tmp.path().join("edited.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    let r = audit(&edited);
    assert_eq!(r.verdict, Verdict::Wrong);
    assert!(r.findings.iter().any(|f| f.field.starts_with("summary[")), "{:#?}", r.findings);
    // A point removed is named too.
    v["prefill"].as_array_mut().unwrap().pop();
    std::fs::write(&edited, v.to_string()).unwrap();
    assert!(audit(&edited).findings.iter().any(|f| f.field == "prefill"));
}
