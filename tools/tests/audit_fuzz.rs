//! The audit never panics, whatever an artifact holds: the committed reference artifacts, mutated
//! at random places (fields removed, values replaced by other types, huge or negative numbers,
//! arrays emptied or grown) and resealed so that the checks behind the seal run too. A panic in an
//! experiment's checks would be caught and reported as "panicked"; the property is that none is.

use audit::Audit;
use common::finding::Report;
use common::workspace::Workspace;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::OnceLock;
use tools::registry::EXPERIMENTS;

fn workspace() -> Workspace {
    Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// One committed artifact per experiment (the newest of each), the seal removed; read once.
fn seeds() -> &'static [Value] {
    static SEEDS: OnceLock<Vec<Value>> = OnceLock::new();
    SEEDS.get_or_init(read_seeds)
}

fn read_seeds() -> Vec<Value> {
    let ws = workspace();
    let mut out = Vec::new();
    for e in EXPERIMENTS {
        let files = audit::artifact_files(&ws.artifacts_dir().join(e.name()));
        if let Some(newest) = files.iter().filter(|f| !f.to_string_lossy().contains("+custom")).max() {
            let mut v: Value = common::artifact::read_artifact(newest).unwrap();
            v.as_object_mut().unwrap().remove(common::artifact::SEAL_KEY);
            out.push(v);
        }
    }
    assert!(!out.is_empty(), "no committed artifacts to mutate");
    out
}

/// Every JSON pointer in `v`.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, x)| pointers(x, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| pointers(x, format!("{at}/{i}"), out)),
        _ => {}
    }
    out.push(at);
}

fn mutate(v: &mut Value, pointer: &str, kind: u8) {
    let replacement = match kind % 9 {
        0 => Value::Null,
        1 => json!(-1),
        2 => json!(1e300),
        3 => json!(u64::MAX),
        4 => json!("x"),
        5 => json!([]),
        6 => json!({}),
        7 => json!(0.5),
        _ => {
            // Remove the field or element itself.
            let (parent, last) = pointer.rsplit_once('/').unwrap_or(("", pointer));
            match v.pointer_mut(parent) {
                Some(Value::Object(m)) => {
                    m.remove(last);
                }
                Some(Value::Array(a)) => {
                    if let Ok(i) = last.parse::<usize>() {
                        if i < a.len() {
                            a.remove(i);
                        }
                    }
                }
                _ => {}
            }
            return;
        }
    };
    if let Some(slot) = v.pointer_mut(pointer) {
        *slot = replacement;
    }
}

fn audit_value(v: &Value) -> Report {
    let mut v = v.clone();
    let seal = common::artifact::seal(&v);
    v.as_object_mut().unwrap().insert(common::artifact::SEAL_KEY.into(), serde_json::to_value(seal).unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("mutated.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let ws = workspace();
    Audit::new(&ws, EXPERIMENTS).audit_artifact(&path)
}

fn panicked(r: &Report) -> Option<String> {
    r.findings.iter().find(|f| f.message.contains("panicked")).map(|f| f.message.clone())
}

#[test]
fn an_artifact_without_runs_is_wrong_and_named_not_a_panic() {
    for mut v in seeds().iter().filter(|v| v.get("runs").is_some()).cloned() {
        v["runs"] = json!([]);
        let r = audit_value(&v);
        assert_eq!(r.verdict, audit::Verdict::Wrong);
        assert!(panicked(&r).is_none());
        assert!(r.findings.iter().any(|f| f.field == "runs"), "{:#?}", r.findings);
    }
}

/// The counts a timeline check adds up, each made the largest number a JSON integer holds: a step's
/// tokens and position anywhere in a run (a later prefill chunk adds to what is cached), and a
/// job's prompt and output lengths. The random mutations found this once; this names it.
#[test]
fn the_largest_counts_in_a_timeline_are_wrong_not_a_panic() {
    for seed in seeds().iter().filter(|v| v.pointer("/runs/0/timeline/0").is_some()) {
        let steps = seed.pointer("/runs/0/timeline").and_then(Value::as_array).map_or(0, Vec::len);
        let jobs = seed.pointer("/jobs").and_then(Value::as_array).map_or(0, Vec::len);
        let mut pointers: Vec<String> =
            (0..steps).flat_map(|i| ["tokens", "position"].map(|f| format!("/runs/0/timeline/{i}/{f}"))).collect();
        pointers.extend((0..jobs).flat_map(|j| ["prompt_tokens", "max_new_tokens"].map(|f| format!("/jobs/{j}/{f}"))));
        assert!(!pointers.is_empty());
        for pointer in pointers {
            let mut v = seed.clone();
            *v.pointer_mut(&pointer).unwrap() = json!(u64::MAX);
            let r = audit_value(&v);
            assert!(panicked(&r).is_none(), "{pointer}: {:?}", panicked(&r));
            assert_eq!(r.verdict, audit::Verdict::Wrong, "{pointer} at u64::MAX passed the audit");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn mutated_artifacts_never_make_the_audit_panic(
        which in any::<usize>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let seeds = seeds();
        let mut v = seeds[which % seeds.len()].clone();
        for (at, kind) in edits {
            let mut all = Vec::new();
            pointers(&v, String::new(), &mut all);
            // The root itself ("") is left alone: a non-object artifact is the parse check's case.
            all.retain(|p| !p.is_empty());
            if all.is_empty() {
                break;
            }
            let pointer = all[at % all.len()].clone();
            mutate(&mut v, &pointer, kind);
        }
        let r = audit_value(&v);
        prop_assert!(panicked(&r).is_none(), "{:?}", panicked(&r));
    }
}
