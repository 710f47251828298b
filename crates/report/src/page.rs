//! From artifacts to a report folder: each artifact's section (its experiment's, through the
//! trait) with its charts drawn, and side-by-side comparisons of two artifacts of one experiment.

use crate::charts::render;
use crate::view::Artifact;
use crate::ReportError;
use common::chart::cell;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// Renders one artifact's charts into `out/<name>/` and returns its Markdown section.
pub fn section(a: &Artifact, out: &Path) -> Result<String, ReportError> {
    let section = a
        .kind
        .report(&a.name, &a.name, &a.value)
        .map_err(|cause| ReportError::Section { name: a.name.clone(), cause })?;
    let dir = out.join(&a.name);
    std::fs::create_dir_all(&dir).map_err(|cause| ReportError::Io { path: dir.display().to_string(), cause })?;
    for (stem, chart) in &section.charts {
        let stem = dir.join(stem);
        render(chart, &stem).map_err(|cause| ReportError::Draw { path: stem.display().to_string(), cause })?;
    }
    Ok(section.markdown)
}

/// Provenance facts worth comparing, as (label, JSON pointer); the seeds have an `environment`
/// or `host` block instead, read where present.
const FACTS: [(&str, &str); 12] = [
    ("CPU", "/provenance/host/cpu_model"),
    ("logical cores", "/provenance/host/logical_cores"),
    ("memory bytes", "/provenance/host/memory_bytes"),
    ("OS / kernel", "/provenance/host/kernel"),
    ("threads", "/provenance/threads"),
    ("rustc", "/provenance/build/rustc"),
    ("source sha256", "/provenance/source/sha256"),
    ("git commit", "/provenance/git/commit"),
    ("model", "/provenance/model/repo"),
    ("model revision", "/provenance/model/revision"),
    ("predecessor environment", "/environment"),
    ("predecessor host", "/host"),
];

/// Side by side: the same metrics of two artifacts with the ratio B / A, then the provenance
/// differences that may explain them.
pub fn compare(a: &Artifact, b: &Artifact) -> Result<String, ReportError> {
    if a.kind.name() != b.kind.name() {
        return Err(ReportError::Unlike { a: a.name.clone(), b: b.name.clone() });
    }
    let mut md = String::new();
    let _ = writeln!(md, "## Comparison: A = {}, B = {}\n", a.name, b.name);
    let _ = writeln!(md, "| what | A | B | B / A |\n|---|---|---|---|");
    let mut row = |what: String, x: Option<f64>, y: Option<f64>| {
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 && x.is_finite() && y.is_finite() => format!("{:.2}", y / x),
            _ => "-".into(),
        };
        let _ = writeln!(md, "| {what} | {} | {} | {ratio} |", cell(x, 3), cell(y, 3));
    };
    for (what, x, y) in a.kind.compare(&a.value, &b.value) {
        row(what, x, y);
    }
    let _ = writeln!(md, "\nProvenance that differs:\n\n| fact | A | B |\n|---|---|---|");
    let show = |v: Option<&Value>| match v {
        None => "(not recorded)".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let weights = |v: &Value| -> Option<Value> {
        v.pointer("/provenance/model/files")?
            .as_array()?
            .iter()
            .find(|f| f.get("path").and_then(Value::as_str) == Some("model.safetensors"))?
            .get("digest")
            .cloned()
    };
    let derived = [("weights sha256", weights(&a.value), weights(&b.value))];
    let pointed = FACTS
        .iter()
        .map(|(label, pointer)| (*label, a.value.pointer(pointer).cloned(), b.value.pointer(pointer).cloned()));
    let mut same = true;
    for (label, x, y) in pointed.chain(derived) {
        let (x, y) = (x.as_ref(), y.as_ref());
        if x != y {
            same = false;
            let _ = writeln!(md, "| {label} | {} | {} |", show(x).replace('|', "/"), show(y).replace('|', "/"));
        }
    }
    if same {
        let _ = writeln!(md, "| (none) | | |");
    }
    md.push('\n');
    Ok(md)
}
