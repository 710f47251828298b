//! Sealed forgeries of every committed artifact. A forger edits one recorded value, recomputes
//! everything the artifact derives from its records (summaries, ratios, per-request numbers,
//! verdicts: the experiment's own `rederive`, as its binary computes them) and makes the seal
//! anew. For every field of every artifact under `artifacts/`, each kind of edit its value allows
//! is made once (on one of the field's instances, drawn from a fixed seed), and the audit's verdict
//! is compared with the untouched artifact's.
//!
//! An edit either is caught (the audit finds something wrong or stale that it did not find in the
//! untouched artifact, so the verdict does not depend on whether the committed artifacts are fresh),
//! or is undone by the recomputation (the field derives from others), or passes. A forgery that passes must be one docs/audit.md lists as
//! consistent with every recorded event: [`CONSISTENT`] is that list, and the test fails on any
//! other. It prints what it counted.
//!
//! The audit runs in a scratch copy of the workspace (sources, manifests, schemas, artifacts), so
//! that forged files sit where the originals do and nothing is written into this checkout.
//! `FORGERY_KINDS=all` (as `just fuzz` sets) makes every kind of edit on every field; by default
//! one kind per field, in turn, and artifacts of over 2 MB only under `all`.

mod support;

use audit::{Audit, Verdict};
use common::finding::Severity;
use common::workspace::Workspace;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use support::sealed;
use tools::registry::EXPERIMENTS;

/// The kinds of edit, by the value they apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Edit {
    /// A real number moved by one part in a billion: a timing nudged within its neighbours.
    Nudge,
    /// A number doubled and one added.
    Jump,
    /// An integer one more.
    Step,
    /// A string with a character appended.
    Text,
    /// A boolean flipped.
    Flip,
    /// `null` made 0.
    Fill,
    /// An array's element removed.
    Drop,
    /// An array's element repeated.
    Repeat,
}

impl Edit {
    fn name(self) -> &'static str {
        match self {
            Edit::Nudge => "nudge",
            Edit::Jump => "jump",
            Edit::Step => "step",
            Edit::Text => "text",
            Edit::Flip => "flip",
            Edit::Fill => "fill",
            Edit::Drop => "drop",
            Edit::Repeat => "repeat",
        }
    }

    /// The edits a value allows.
    fn of(v: &Value) -> &'static [Edit] {
        match v {
            Value::Number(n) if n.is_f64() => &[Edit::Nudge, Edit::Jump],
            Value::Number(_) => &[Edit::Step, Edit::Jump],
            Value::String(_) => &[Edit::Text],
            Value::Bool(_) => &[Edit::Flip],
            Value::Null => &[Edit::Fill],
            Value::Array(a) if !a.is_empty() => &[Edit::Drop, Edit::Repeat],
            _ => &[],
        }
    }

    fn apply(self, v: &mut Value) {
        *v = match (self, &*v) {
            (Edit::Nudge, Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(0.0);
                json!(if x == 0.0 { 1e-9 } else { x * (1.0 + 1e-9) })
            }
            (Edit::Jump, Value::Number(n)) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => json!(u.saturating_mul(2).saturating_add(1)),
                (_, Some(i), _) => json!(i.saturating_mul(2).saturating_add(1)),
                (_, _, Some(f)) => json!(f * 2.0 + 1.0),
                _ => return,
            },
            (Edit::Step, Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => json!(u.saturating_add(1)),
                (_, Some(i)) => json!(i.saturating_add(1)),
                _ => return,
            },
            (Edit::Text, Value::String(s)) => json!(format!("{s}x")),
            (Edit::Flip, Value::Bool(b)) => json!(!b),
            (Edit::Fill, Value::Null) => json!(0),
            (Edit::Drop, Value::Array(a)) => json!(a[..a.len() - 1]),
            (Edit::Repeat, Value::Array(a)) => {
                let mut a = a.clone();
                a.push(a[a.len() - 1].clone());
                json!(a)
            }
            _ => return,
        }
    }
}

/// What no audit can tell from the rest of an artifact, field by field: docs/audit.md's list of
/// forgeries that are consistent with every recorded event. A pattern is a field path with `[]`
/// for any index and a trailing `*` for anything below; `edits` are the edits that may pass
/// there (empty: any). docs/audit.md's table is this list.
const CONSISTENT: &[(&str, &[&str], &str)] = &[
    // Facts of the machine, the build and the checkout that no other field records.
    ("provenance.host.*", &[], "fact"),
    ("provenance.build.rustc", &[], "fact"),
    ("provenance.build.target", &["text"], "fact"),
    ("provenance.build.features", &[], "fact"),
    ("provenance.git.*", &[], "fact"),
    ("provenance.threads", &[], "fact"),
    // Digests of the code: an edit reads as the staleness a run of older code already has (on an
    // artifact of today's code it is caught).
    ("provenance.source.sha256", &[], "stale"),
    ("provenance.source.files", &[], "stale"),
    ("provenance.build.candle", &[], "stale"),
    ("provenance.build.tokenizers", &[], "stale"),
    // Times and durations a clock read, which no other field constrains beyond their order.
    ("requests[].scheduled_s", &["nudge"], "measured"),
    ("requests[].sent_s", &["nudge"], "measured"),
    ("requests[].first_byte_s", &["nudge"], "measured"),
    ("requests[].first_token_s", &["nudge"], "measured"),
    ("requests[].end_s", &["nudge", "jump"], "measured"),
    ("requests[].arrival.admitted_s", &["nudge"], "measured"),
    ("requests[].arrival.woken_s", &["nudge"], "measured"),
    ("requests[].chunk_gaps_s[]", &["nudge"], "measured"),
    ("server_metrics[].scrapes[].t_s", &["nudge"], "measured"),
    // The CPU a send went from (only a stall probe's group holds it to the CPUs watched), and
    // what the probe read: its spans' times and its window's end moved within their order, a
    // stall moved to another watched CPU or left out, and its wakes and CPU time.
    ("requests[].sent_cpu", &[], "measured"),
    ("machine_stalls[].stalls[].from_s", &["nudge"], "measured"),
    ("machine_stalls[].stalls[].to_s", &["nudge"], "measured"),
    ("machine_stalls[].stalls[].cpu", &["step"], "measured"),
    ("machine_stalls[].stalls", &["drop"], "measured"),
    ("machine_stalls[].from_s", &["nudge"], "measured"),
    ("machine_stalls[].to_s", &["nudge", "jump"], "measured"),
    ("machine_stalls[].wakes", &[], "measured"),
    ("machine_stalls[].cpu_time_s", &[], "measured"),
    ("server_metrics[].scrapes[].answer_s", &["nudge", "jump"], "measured"),
    ("runs[].timeline[].start_ms", &["nudge", "jump"], "measured"),
    ("runs[].timeline[].end_ms", &["nudge"], "measured"),
    ("runs[].scheduler_overhead_ms", &[], "measured"),
    ("runs[].peak_rss_bytes", &[], "measured"),
    ("decode[].step_ms[]", &["nudge", "jump"], "measured"),
    ("prefill[].chunk_ms[]", &["nudge", "jump"], "measured"),
    ("prompts[].ms", &["nudge", "jump"], "measured"),
    ("comparisons[].a[]", &["nudge", "jump"], "measured"),
    ("comparisons[].b[]", &["nudge", "jump"], "measured"),
    ("overhead[].overhead_ms", &[], "measured"),
    ("overhead[].forward_ms", &[], "measured"),
    ("overhead[].steps", &[], "measured"),
    ("native[].resident.ours_peak_bytes", &[], "measured"),
    ("native[].resident.llama_peak_bytes", &[], "measured"),
    // What a server said of its answers, of itself and of its model, recorded as given.
    ("requests[].usage_completion_tokens", &["step"], "server"),
    ("requests[].usage_prompt_tokens", &[], "server"),
    ("requests[].ollama_eval_count", &["step"], "server"),
    ("requests[].ollama_eval_duration_ns", &[], "server"),
    ("requests[].ollama_prompt_eval_count", &[], "server"),
    ("requests[].ollama_prompt_eval_duration_ns", &[], "server"),
    ("requests[].finish_reason", &[], "server"),
    ("requests[].status", &["step"], "server"),
    ("versions.*", &[], "server"),
    ("model_metadata.*", &[], "server"),
    ("runtimes[].base_url", &[], "server"),
    ("runtimes[].model", &[], "server"),
    ("embedded_kv.*", &[], "server"),
    // What a target's /metrics said (its counters held to their order), and why a scrape failed;
    // whether the server closed a request's or a scrape's connection before answering it.
    ("server_metrics[].scrapes[].values.*", &[], "server"),
    ("server_metrics[].scrapes[].error", &["text"], "server"),
    ("requests[].resent", &["flip"], "server"),
    // The log-probabilities a server gave when a prompt was asked again, beyond the two tokens a
    // verdict reads (its margins and verdict are recomputed from those), and where and how the
    // probe's answers parted.
    ("agreement[].explanations[].candidates*", &[], "server"),
    ("agreement[].explanations[].chosen", &["repeat"], "server"),
    ("agreement[].explanations[].token", &[], "server"),
    ("agreement[].explanations[].note", &["text"], "server"),
    // An answer's digest where its text is not kept (under check_agreement or stop strings it is,
    // and the digest is checked against it).
    ("requests[].text_sha256", &["text"], "server"),
    ("server_metrics[].scrapes[].resent", &["flip"], "server"),
    // A KV pool's high-water mark, kept as blocks were taken: a whole number of blocks within the
    // pool and at least the largest request's, which is all the timeline fixes.
    ("runs[].peak_kv_bytes", &["step", "jump"], "pool"),
    // A budget is taken in whole blocks: one that rounds down to the same blocks makes the same pool.
    ("runs[].kv_budget", &["step"], "pool"),
    // What a workload's file held or its draw made: the audit has neither the file nor the
    // tokenizer (a built-in workload's prompts and record are checked; a file's lengths in
    // characters when every item was sent).
    ("workload.path", &[], "workload"),
    ("workload.file_sha256", &[], "workload"),
    ("workload.items_sha256", &[], "workload"),
    ("workload.lengths", &[], "workload"),
    ("workload.items", &[], "workload"),
    ("workload.items_with_max_tokens", &[], "workload"),
    ("workload.prompt_tokens_*", &[], "workload"),
    ("workload.prompt_chars_*", &[], "workload"),
    ("prompts.*", &["text"], "workload"),
    // A drawn or a file's item carries its own cap, which the audit cannot redraw; it checks the
    // answer within it.
    ("requests[].max_tokens", &["step", "jump"], "workload"),
    // What the audit cannot recompute without the model's tokenizer or the peer's files, and the
    // benchmark's words for its comparisons.
    ("runs[].requests[].text", &[], "text"),
    ("prompt_tokens", &[], "text"),
    ("llama_cpp.version", &[], "peer"),
    ("llama_cpp.gguf[].*", &[], "peer"),
    ("llama_cpp.settings.*", &[], "peer"),
    ("agreement[].agree", &["step", "jump"], "peer"),
    ("stream.layer_bytes", &[], "model"),
    ("stream.head_bytes", &[], "model"),
    ("stream.kv_bytes", &[], "model"),
    ("native[].stream.layer_bytes", &[], "model"),
    ("native[].stream.head_bytes", &[], "model"),
    ("native[].stream.kv_bytes", &[], "model"),
    ("native[].resident.kv_bytes", &[], "model"),
    ("comparisons[].a_label", &[], "words"),
    ("comparisons[].b_label", &[], "words"),
    ("comparisons[].meaning", &[], "words"),
    ("comparisons[].unit", &[], "words"),
    // The settings engine-bench's sampled step drew with, which its comparison's meaning also
    // states: no recorded number derives from them.
    ("sampled.*", &[], "words"),
];

fn matches(pattern: &str, field: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => field.starts_with(prefix),
        None => pattern == field,
    }
}

fn consistent(field: &str, edit: Edit) -> bool {
    CONSISTENT.iter().any(|(p, edits, _)| matches(p, field) && (edits.is_empty() || edits.contains(&edit.name())))
}

/// Every field (a leaf, or an array) of `v`, with its JSON pointer and its pattern.
fn fields(v: &Value, pointer: String, pattern: String, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if pattern.is_empty() { k.clone() } else { format!("{pattern}.{k}") };
                fields(x, format!("{pointer}/{}", k.replace('~', "~0").replace('/', "~1")), p, out);
            }
            return;
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                fields(x, format!("{pointer}/{i}"), format!("{pattern}[]"), out);
            }
        }
        _ => {}
    }
    out.push((pointer, pattern));
}

/// A scratch copy of the workspace: what the audit reads (sources for the source hash,
/// manifests, schemas) and the committed artifacts.
fn scratch() -> (tempfile::TempDir, Workspace) {
    let real = source_hash::find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    for item in ["Cargo.toml", "Cargo.lock", "crates", "experiments", "manifests", "schemas", "artifacts"] {
        let status = std::process::Command::new("cp").arg("-r").arg(real.join(item)).arg(root.join(item)).status();
        assert!(status.is_ok_and(|s| s.success()), "copying {item}");
    }
    let _ = std::fs::remove_dir_all(root.join("artifacts/reports"));
    (tmp, Workspace { root })
}

/// A seeded draw, so that a failure names a forgery that the next run makes again.
fn draw(pattern: &str, edit: Edit, n: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (pattern, edit.name(), "forgeries-v1").hash(&mut h);
    (h.finish() % n as u64) as usize
}

#[derive(Default)]
struct Tally {
    forgeries: usize,
    caught: usize,
    derived: usize,
    passed: usize,
}

#[test]
fn sealed_forgeries_pass_only_where_the_readme_says_they_can() {
    let all = std::env::var("FORGERY_KINDS").is_ok_and(|v| v == "all");
    let (_tmp, ws) = scratch();
    let audit = Audit::new(&ws, EXPERIMENTS);
    let files: Vec<PathBuf> = audit::artifact_files(&ws.artifacts_dir());
    assert!(!files.is_empty(), "no committed artifacts to forge");
    let mut undocumented: Vec<String> = Vec::new();
    let mut passing: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = Tally::default();
    let mut rows = Vec::new();
    for file in &files {
        // The records as rows (a packed artifact's columns unpacked), and their size as rows, so
        // that the threshold selects the same artifacts whether they are stored as rows or columns.
        let body: Value = common::artifact::read_artifact(file).unwrap();
        if !all && serde_json::to_string_pretty(&body).map_or(0, |t| t.len()) > 2_000_000 {
            continue;
        }
        let shown = ws.display_path(file);
        let baseline = audit.audit_artifact(file);
        assert_ne!(baseline.verdict, Verdict::Wrong, "{shown} is wrong as committed: {}", baseline.first_reason());
        let experiment = body.pointer("/provenance/experiment").and_then(Value::as_str).unwrap_or_default();
        let kind = *EXPERIMENTS.iter().find(|e| e.name() == experiment).expect("a registered experiment");
        let mut by_pattern: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut list = Vec::new();
        fields(&body, String::new(), String::new(), &mut list);
        for (pointer, pattern) in list {
            by_pattern.entry(pattern).or_default().push(pointer);
        }
        let mut tally = Tally::default();
        let forged_path = file.with_file_name(format!("forged-{}", file.file_name().unwrap().to_string_lossy()));
        for (k, (pattern, pointers)) in by_pattern.iter().enumerate() {
            let example = body.pointer(&pointers[0]).cloned().unwrap_or(Value::Null);
            let edits = Edit::of(&example);
            let chosen: Vec<Edit> = if all || edits.is_empty() { edits.to_vec() } else { vec![edits[k % edits.len()]] };
            for edit in chosen {
                // One instance of the field that allows this edit.
                let fits: Vec<&String> =
                    pointers.iter().filter(|p| body.pointer(p).is_some_and(|v| Edit::of(v).contains(&edit))).collect();
                if fits.is_empty() {
                    continue;
                }
                let pointer = fits[draw(pattern, edit, fits.len())];
                let mut forged = body.clone();
                edit.apply(forged.pointer_mut(pointer).unwrap());
                common::experiment::rederive(kind, &mut forged);
                tally.forgeries += 1;
                if forged == body {
                    tally.derived += 1;
                    continue;
                }
                std::fs::write(&forged_path, sealed(forged).to_string()).unwrap();
                let report = audit.audit_artifact(&forged_path);
                let new = |x: &audit::Finding| {
                    x.severity != Severity::Note
                        && !baseline
                            .findings
                            .iter()
                            .any(|b| (b.check, &b.field, &b.message) == (x.check, &x.field, &x.message))
                };
                if report.verdict == Verdict::Wrong || report.findings.iter().any(new) {
                    tally.caught += 1;
                    continue;
                }
                tally.passed += 1;
                *passing.entry(format!("{pattern} ({})", edit.name())).or_default() += 1;
                if !consistent(pattern, edit) {
                    undocumented.push(format!("{shown}: {pattern} ({}, at {pointer})", edit.name()));
                }
            }
        }
        let _ = std::fs::remove_file(&forged_path);
        rows.push(format!(
            "{shown}: {} forgeries over {} fields: {} caught, {} undone by recomputation, {} passed",
            tally.forgeries,
            by_pattern.len(),
            tally.caught,
            tally.derived,
            tally.passed
        ));
        total.forgeries += tally.forgeries;
        total.caught += tally.caught;
        total.derived += tally.derived;
        total.passed += tally.passed;
    }
    println!("{}", rows.join("\n"));
    println!(
        "in all: {} forgeries, {} caught, {} undone by recomputation, {} passed ({} undocumented)",
        total.forgeries,
        total.caught,
        total.derived,
        total.passed,
        undocumented.len()
    );
    for (field, n) in &passing {
        println!("passed: {field} x{n}");
    }
    assert!(
        undocumented.is_empty(),
        "forgeries that pass the audit and no documented reason allows:\n{}",
        undocumented.join("\n")
    );
}
