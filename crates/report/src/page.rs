//! From artifacts to a report folder: each artifact's section (its experiment's, through the
//! trait) with its charts drawn, and side-by-side comparisons of two artifacts of one experiment.

use crate::charts::render;
use crate::view::Artifact;
use crate::ReportError;
use common::chart::{cell, Chart, Forest, Section};
use common::experiment::ReportOptions;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// Renders one artifact's charts into `out/<name>/` and returns its Markdown section.
pub fn section(a: &Artifact, out: &Path, options: &ReportOptions) -> Result<String, ReportError> {
    let section = a
        .kind
        .report(&a.name, &a.name, &a.value, options)
        .map_err(|cause| ReportError::Section { name: a.name.clone(), cause })?;
    let dir = out.join(&a.name);
    std::fs::create_dir_all(&dir).map_err(|cause| ReportError::Io { path: dir.display().to_string(), cause })?;
    let mut section = section;
    if let Some(warning) = &a.warning {
        // Under the section's heading, before any number.
        let at = section.markdown.find('\n').map_or(section.markdown.len(), |i| i + 1);
        section.markdown.insert_str(at, &format!("\n> **{warning}**\n"));
    }
    claims_section(a, &mut section);
    for (stem, chart) in &section.charts {
        let stem = dir.join(stem);
        render(chart, &stem).map_err(|cause| ReportError::Draw { path: stem.display().to_string(), cause })?;
    }
    Ok(section.markdown)
}

/// Each claim on a line (what it states, what was expected, the measured ratio and interval,
/// the verdict), then their forest plot.
fn claims_section(a: &Artifact, section: &mut Section) {
    if a.claims.is_empty() {
        return;
    }
    let md = &mut section.markdown;
    let _ = writeln!(md, "### Claims\n\nJudged by {}.\n", common::evidence::METHOD);
    let _ = writeln!(md, "| claim | statement | expected | runs (later / earlier) | rounds | ratio [interval] | verdict |\n|---|---|---|---|---|---|---|");
    for r in &a.claims {
        for (i, line) in r.lines().into_iter().enumerate() {
            let (id, statement, expected) = if i == 0 {
                (format!("`{}`", r.label()), r.claim.statement.replace('|', "/"), r.claim.expect.describe())
            } else {
                Default::default()
            };
            let _ = writeln!(
                md,
                "| {id} | {statement} | {expected} | {} | {} | {} | **{}** |",
                line.runs, line.rounds, line.ratio, line.verdict
            );
        }
    }
    let notes: Vec<String> =
        a.claims.iter().filter_map(|r| Some(format!("- `{}`: {}", r.claim.id, r.note.as_ref()?))).collect();
    if !notes.is_empty() {
        let _ = writeln!(md, "\n{}", notes.join("\n"));
    }
    md.push('\n');
    let rows: Vec<(String, &common::evidence::ClaimResult)> = a.claims.iter().map(|c| (String::new(), c)).collect();
    let forest = Forest::of(&format!("Claims: {}", a.name), &rows);
    if !forest.rows.is_empty() {
        section.image("claims", "claims: paired ratios with their intervals", Chart::Forest(forest));
    }
}

/// How each claim fared in each artifact (A, B, ...): verdict, ratio and interval per pair.
fn compare_claims(artifacts: &[Artifact], letters: &[String], md: &mut String) {
    let mut keys: Vec<(String, Option<String>)> = Vec::new();
    for r in artifacts.iter().flat_map(|a| &a.claims) {
        let key = (r.claim.id.clone(), r.scope.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    if keys.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nClaims, as each artifact judged them (ratio [interval], verdict):\n\n| claim | expected | {} |\n|---|---|{}",
        letters.join(" | "),
        "---|".repeat(letters.len())
    );
    for (id, scope) in keys {
        let mut expected = String::new();
        let cells: Vec<String> = artifacts
            .iter()
            .map(|a| match a.claims.iter().find(|r| r.claim.id == id && r.scope == scope) {
                None => "(not judged)".into(),
                Some(r) => {
                    expected = r.claim.expect.describe();
                    let ratios: Vec<String> = r.pairs.iter().map(common::evidence::describe_ratio).collect();
                    let n = r.pairs.iter().map(|p| p.ratios.len()).min().unwrap_or(0);
                    let rounds = if n == 1 { "1 round".to_string() } else { format!("{n} rounds") };
                    format!("{} ({rounds}): **{}**", ratios.join(", "), r.verdict.name())
                }
            })
            .collect();
        let scope = scope.map(|s| format!(" [{s}]")).unwrap_or_default();
        let _ = writeln!(md, "| `{id}`{scope} | {expected} | {} |", cells.join(" | "));
    }
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

/// Side by side: the same metrics of any number of artifacts of one experiment, each with its
/// ratio to the first (A), then the provenance facts that differ between them (what may explain
/// the differences).
pub fn compare(artifacts: &[Artifact]) -> Result<String, ReportError> {
    let Some((a, others)) = artifacts.split_first() else { return Ok(String::new()) };
    if let Some(other) = others.iter().find(|o| o.kind.name() != a.kind.name()) {
        return Err(ReportError::Unlike { a: a.name.clone(), b: other.name.clone() });
    }
    let letters: Vec<String> = (0..artifacts.len()).map(letter).collect();
    let mut md = String::new();
    let named: Vec<String> = artifacts.iter().zip(&letters).map(|(x, l)| format!("{l} = {}", x.name)).collect();
    let _ = writeln!(md, "## Comparison: {}\n", named.join(", "));
    for (x, l) in artifacts.iter().zip(&letters) {
        if let Some(warning) = &x.warning {
            let _ = writeln!(md, "> **{l}: {warning}**\n");
        }
    }
    let mut header = String::from("| what | A |");
    for l in &letters[1..] {
        let _ = write!(header, " {l} | {l} / A |");
    }
    let _ = writeln!(md, "{header}\n|---|---|{}", "---|---|".repeat(others.len()));
    // Rows by the experiment's label, in first-seen order; each other artifact against A.
    let mut rows: Vec<(String, Option<f64>, Vec<Option<f64>>)> = Vec::new();
    for (k, other) in others.iter().enumerate() {
        for (what, x, y) in a.kind.compare(&a.value, &other.value) {
            let i = match rows.iter().position(|r| r.0 == what) {
                Some(i) => i,
                None => {
                    rows.push((what, x, vec![None; others.len()]));
                    rows.len() - 1
                }
            };
            rows[i].2[k] = y;
        }
    }
    for (what, x, ys) in &rows {
        let mut line = format!("| {what} | {} |", cell(*x, 3));
        for y in ys {
            let ratio = match (x, y) {
                (Some(x), Some(y)) if *x != 0.0 && x.is_finite() && y.is_finite() => format!("{:.2}", y / x),
                _ => "-".into(),
            };
            let _ = write!(line, " {} | {ratio} |", cell(*y, 3));
        }
        let _ = writeln!(md, "{line}");
    }
    compare_claims(artifacts, &letters, &mut md);
    let _ = writeln!(
        md,
        "\nProvenance that differs:\n\n| fact | {} |\n|---|{}",
        letters.join(" | "),
        "---|".repeat(letters.len())
    );
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
    let facts = FACTS
        .iter()
        .map(|(label, pointer)| {
            (*label, artifacts.iter().map(|x| x.value.pointer(pointer).cloned()).collect::<Vec<_>>())
        })
        .chain([("weights sha256", artifacts.iter().map(|x| weights(&x.value)).collect())]);
    let mut same = true;
    for (label, values) in facts {
        if values.iter().any(|v| v != &values[0]) {
            same = false;
            let cells: Vec<String> = values.iter().map(|v| show(v.as_ref()).replace('|', "/")).collect();
            let _ = writeln!(md, "| {label} | {} |", cells.join(" | "));
        }
    }
    if same {
        let _ = writeln!(md, "| (none) |{}", " |".repeat(letters.len()));
    }
    md.push('\n');
    Ok(md)
}

/// `A`, `B`, ..., `Z`, then `A2`, `B2`, ...
fn letter(i: usize) -> String {
    let base = char::from(b'A' + (i % 26) as u8);
    if i < 26 {
        base.to_string()
    } else {
        format!("{base}{}", i / 26 + 1)
    }
}
