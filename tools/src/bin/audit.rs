//! `audit`: check artifacts against their manifests and the current code, read foreign (seed)
//! artifacts, and pin a manifest's expectations from a fresh artifact.

use anyhow::{bail, Result};
use audit::{artifact_files, line_diff, unreproduced, Audit, Verdict};
use clap::Parser;
use common::finding::{Report, Severity};
use common::workspace::Workspace;
use std::path::PathBuf;
use tools::registry::EXPERIMENTS;

#[derive(Parser)]
#[command(about = "Check every artifact against its manifest: ok, stale (code or manifest changed since) or wrong")]
struct Cli {
    /// Artifact files or folders [default: artifacts/].
    paths: Vec<PathBuf>,
    /// Read these as foreign artifacts (e.g. the Python predecessor's seeds): check what their
    /// fields allow, list what they lack.
    #[arg(long, value_name = "FILE")]
    external: Vec<PathBuf>,
    /// Print the full report as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Exit 0 even when some artifacts are stale (none may be wrong).
    #[arg(long)]
    allow_stale: bool,
    /// Rewrite the expectations of this artifact's manifest from it, after showing the change
    /// (`just pin`).
    #[arg(long, value_name = "ARTIFACT", conflicts_with_all = ["paths", "external"])]
    update: Option<PathBuf>,
}

fn main() {
    tools::main(run)
}

fn run(cli: Cli) -> Result<i32> {
    let ws = Workspace::discover()?;
    let audit = Audit::new(&ws, EXPERIMENTS);
    if let Some(artifact) = cli.update {
        let (path, old, new) = audit.pin_from_artifact(&artifact)?;
        let diff = line_diff(&old, &new);
        if diff.is_empty() {
            println!("{}: already pinned to this artifact", ws.display_path(&path));
            return Ok(0);
        }
        println!("{}:", ws.display_path(&path));
        diff.iter().for_each(|l| println!("{l}"));
        common::artifact::write_replace(&path, new.as_bytes())?;
        println!("pinned; review with `git diff` and commit");
        return Ok(0);
    }

    let mut reports: Vec<Report> = Vec::new();
    for file in &cli.external {
        if !file.is_file() {
            bail!("--external {}: no such file", file.display());
        }
        reports.push(audit.audit_external(file, file.display().to_string()));
    }
    let audit_ours = !cli.paths.is_empty() || cli.external.is_empty();
    if audit_ours {
        let roots = if cli.paths.is_empty() { vec![ws.artifacts_dir()] } else { cli.paths.clone() };
        for root in roots {
            if root.is_dir() {
                reports.extend(artifact_files(&root).iter().map(|p| audit.audit_artifact(p)));
            } else if root.is_file() {
                reports.push(audit.audit_artifact(&root));
            } else {
                bail!("{}: no such file or folder", root.display());
            }
        }
    }
    if reports.is_empty() {
        let where_ = if cli.paths.is_empty() {
            ws.display_path(&ws.artifacts_dir())
        } else {
            cli.paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        };
        bail!("nothing audited: no artifact (*.json) under {where_}; run `just reproduce`, or name artifact files");
    }
    let missing = if audit_ours && cli.paths.is_empty() { unreproduced(&ws, &reports) } else { Vec::new() };

    if cli.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "artifacts": reports, "not_yet_reproduced": missing }))?
        );
    } else {
        print_table(&reports, &missing);
    }
    let wrong = reports.iter().any(|r| r.verdict == Verdict::Wrong);
    let stale = reports.iter().any(|r| r.verdict == Verdict::Stale);
    Ok(if wrong || (stale && !cli.allow_stale) { tools::CHECK_FAILED } else { 0 })
}

fn print_table(reports: &[Report], missing: &[String]) {
    let width = reports.iter().map(|r| r.artifact.len()).max().unwrap_or(8).max(8);
    println!("{:<width$}  {:<48}  {:<6}  first reason", "artifact", "manifest", "verdict");
    for r in reports {
        let verdict = match r.verdict {
            Verdict::Ok => "ok",
            Verdict::Stale => "stale",
            Verdict::Wrong => "WRONG",
        };
        let manifest = r.manifest.as_deref().unwrap_or(if r.experiment.is_some() { "-" } else { "?" });
        println!("{:<width$}  {:<48}  {:<6}  {}", r.artifact, manifest, verdict, r.first_reason());
        for finding in r.findings.iter().filter(|f| f.severity == Severity::Note) {
            println!("{:<width$}    note: {}: {}", "", finding.field, finding.message);
        }
    }
    for m in missing {
        println!("{:<width$}  {:<48}  {:<6}  not yet reproduced", "-", m, "-");
    }
    let count = |v| reports.iter().filter(|r| r.verdict == v).count();
    println!(
        "\n{} ok, {} stale, {} wrong, {} manifests not yet reproduced",
        count(Verdict::Ok),
        count(Verdict::Stale),
        count(Verdict::Wrong),
        missing.len()
    );
}
