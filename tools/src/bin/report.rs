//! `report`: render artifacts (ours or the predecessor's seeds) into pictures and one Markdown
//! page, and compare two artifacts of one experiment side by side.

use anyhow::{bail, Result};
use clap::Parser;
use common::workspace::Workspace;
use std::path::{Path, PathBuf};
use tools::registry::EXPERIMENTS;

#[derive(Parser)]
#[command(about = "Render artifacts into SVG/PNG charts and one Markdown page; compare artifacts side by side")]
struct Cli {
    /// Artifacts to render [default: the newest artifact of each manifest under artifacts/].
    artifacts: Vec<PathBuf>,
    /// Output folder [default: artifacts/reports].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Compare artifacts of one experiment side by side (two or more: A, B, ...), each with its
    /// ratio to A.
    #[arg(long, num_args = 2.., value_names = ["A", "B"])]
    compare: Vec<PathBuf>,
    /// Draw every round where a section draws one per configuration (the scheduler's
    /// timelines: its median round by default).
    #[arg(long)]
    all_rounds: bool,
}

fn main() {
    tools::main(run)
}

/// The newest artifact of each kind in each folder holding artifacts (one per experiment and
/// manifest; in `artifacts/bench/`, one per experiment and file-name prefix, such as `serving-`
/// and `serving-sweep-`).
fn newest_per_manifest(dir: &Path, reports: &Path) -> Vec<PathBuf> {
    // Keyed by folder, experiment and the name before its time stamp: `artifacts/bench/` holds
    // several experiments' artifacts, and one experiment's of several kinds.
    let mut newest: std::collections::BTreeMap<(PathBuf, String, String), PathBuf> = Default::default();
    for file in audit::artifact_files(dir).into_iter().filter(|f| !f.starts_with(reports)) {
        let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let experiment = std::fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|v| v.pointer("/provenance/experiment").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_default();
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let kind: String = stem.chars().take_while(|c| !c.is_ascii_digit()).collect();
        let key = (parent, experiment, kind);
        if newest.get(&key).is_none_or(|current| file > *current) {
            newest.insert(key, file);
        }
    }
    newest.into_values().collect()
}

/// What the page must say above an artifact's numbers: that the audit finds it wrong (its numbers
/// are not to be trusted), or stale (made by other code than today's), with the first reason.
fn audit_warning(audit: &audit::Audit, ws: &Workspace, path: &Path, value: &serde_json::Value) -> Option<String> {
    let report = match value.get("provenance") {
        Some(_) => audit.audit_artifact(path),
        None => audit.audit_external(path, ws.display_path(path)),
    };
    match report.verdict {
        audit::Verdict::Ok => None,
        audit::Verdict::Stale => Some(format!("Stale: {}. Re-run it to report today's code.", report.first_reason())),
        audit::Verdict::Wrong => Some(format!(
            "The audit finds this artifact WRONG: {}. Its numbers are drawn as recorded; do not trust them.",
            report.first_reason()
        )),
    }
}

fn run(cli: Cli) -> Result<()> {
    let ws = Workspace::discover()?;
    let out = cli.out.unwrap_or_else(|| ws.artifacts_dir().join("reports"));
    let inputs = if cli.artifacts.is_empty() && cli.compare.is_empty() {
        newest_per_manifest(&ws.artifacts_dir(), &out)
    } else {
        cli.artifacts.clone()
    };
    if inputs.is_empty() && cli.compare.is_empty() {
        bail!("no artifacts under artifacts/ yet: run `just reproduce`, or name artifact files");
    }
    report::init_font()?;
    std::fs::create_dir_all(&out)?;
    let mut md = String::from("# Report\n\nRendered from artifacts alone by `just report`.\n\n");
    let audit = audit::Audit::new(&ws, EXPERIMENTS);
    for path in &inputs {
        let mut artifact = report::load(&ws, path, EXPERIMENTS)?;
        artifact.warning = audit_warning(&audit, &ws, path, &artifact.value);
        let options = common::experiment::ReportOptions { all_rounds: cli.all_rounds };
        md.push_str(&report::section(&artifact, &out, &options)?);
        println!("rendered {}", ws.display_path(path));
    }
    if !cli.compare.is_empty() {
        let mut artifacts =
            cli.compare.iter().map(|p| report::load(&ws, p, EXPERIMENTS)).collect::<Result<Vec<_>, _>>()?;
        for (artifact, path) in artifacts.iter_mut().zip(&cli.compare) {
            artifact.warning = audit_warning(&audit, &ws, path, &artifact.value);
        }
        md.push_str(&report::compare(&artifacts)?);
    }
    let page_path = out.join("report.md");
    common::artifact::write_replace(&page_path, md.as_bytes())?;
    println!("report: {}", ws.display_path(&page_path));
    Ok(())
}
