//! Typed summary rows keep the artifacts' columns: every committed serving artifact's summary
//! rows read into [`SummaryRow`] and write back exactly the columns they were read from, names,
//! values and which are absent; a column of the wrong type is named.

use serde_json::{json, Value};
use serving_bench::serving::SummaryRow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            json_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
}

#[test]
fn every_committed_serving_artifacts_rows_read_and_write_back_the_same_columns() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../artifacts");
    let mut files = Vec::new();
    for dir in ["serving-bench", "bench"] {
        json_files(&root.join(dir), &mut files);
    }
    let mut rows = 0;
    for file in &files {
        let stored: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        let body = common::artifact::body(stored).unwrap();
        if body.get("requests").is_none() {
            continue; // another benchmark's artifact
        }
        let Some(summary) = body.get("summary").and_then(Value::as_array) else { continue };
        for (i, stored) in summary.iter().enumerate() {
            let columns: BTreeMap<String, Value> = serde_json::from_value(stored.clone()).unwrap();
            let row = SummaryRow::from_columns(columns.clone())
                .unwrap_or_else(|e| panic!("{}: summary[{i}]: {e}", file.display()));
            assert!(row.other.is_empty(), "{}: summary[{i}]: columns no kind holds: {:?}", file.display(), row.other);
            assert_eq!(row.columns(), columns, "{}: summary[{i}]", file.display());
            rows += 1;
        }
    }
    assert!(rows >= 10, "only {rows} summary rows found under {}", root.display());
}

#[test]
fn a_column_of_the_wrong_type_is_named_and_an_unknown_one_kept() {
    let row: SummaryRow =
        serde_json::from_value(json!({"runtime": "r", "concurrency": 2, "ttft_s_p50": 0.5, "request_rate": "inf"}))
            .unwrap();
    assert_eq!((row.runtime.as_str(), row.concurrency, row.ttft_s.p50), ("r", 2, Some(0.5)));
    assert_eq!(row.open_loop.map(|o| o.request_rate), Some(None), "`inf` is an unbounded rate");
    let wrong = serde_json::from_value::<SummaryRow>(json!({"ttft_s_p50": "fast"})).unwrap_err();
    assert!(wrong.to_string().contains("ttft_s_p50"), "{wrong}");
    let rate = serde_json::from_value::<SummaryRow>(json!({"request_rate": "soon"})).unwrap_err();
    assert!(rate.to_string().contains("request_rate"), "{rate}");
    let kept: SummaryRow = serde_json::from_value(json!({"a_future_column": [1, 2]})).unwrap();
    assert_eq!(kept.columns().get("a_future_column"), Some(&json!([1, 2])));
}
