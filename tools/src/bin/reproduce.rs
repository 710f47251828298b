//! `reproduce`: run every experiment on every manifest whose model is available (its output
//! passed on as it comes, each line prefixed with the manifest), audit each fresh artifact, then
//! print a table of what was reproduced, skipped (and why) or failed, and a table
//! of the manifests' claims as the runs judged them (a failed claim fails the command unless
//! `--allow-failed-claims`). Run it through `just reproduce`,
//! which builds the experiment binaries first.

use anyhow::Result;
use audit::{Audit, Verdict};
use clap::Parser;
use common::evidence::{self, ClaimResult};
use common::experiment::{check_claims, claims_table};
use common::resolve::{resolve, ResolveError, ResolveOptions};
use common::workspace::Workspace;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use tools::registry::EXPERIMENTS;

#[derive(Parser)]
#[command(
    about = "Run every experiment on every manifest whose model is available; print a summary and the table of the manifests' claims as the runs judged them"
)]
struct Cli {
    /// Treat a skipped manifest (model not available) as a failure.
    #[arg(long)]
    strict: bool,
    /// Never download a model.
    #[arg(long)]
    offline: bool,
    /// Only these experiments (repeatable).
    #[arg(long)]
    only: Vec<String>,
    /// Exit 0 even when a manifest's claim fails (the claims table still says so).
    #[arg(long)]
    allow_failed_claims: bool,
}

enum Outcome {
    Reproduced(String),
    Skipped(String),
    Failed(String),
}

fn main() {
    tools::main(run)
}

fn run(cli: Cli) -> Result<i32> {
    let ws = Workspace::discover()?;
    let known: Vec<&str> = EXPERIMENTS.iter().map(|e| e.name()).collect();
    if let Some(unknown) = cli.only.iter().find(|o| !known.contains(&o.as_str())) {
        anyhow::bail!("--only {unknown}: no such experiment; the experiments are {}", known.join(", "));
    }
    let bin_dir: PathBuf = std::env::current_exe()?.parent().map(Into::into).unwrap_or_default();
    let manifests: Vec<_> = ws
        .experiment_manifests()?
        .into_iter()
        .filter(|(_, m)| cli.only.is_empty() || cli.only.contains(&m.experiment))
        // Benchmarks (`just bench`) are not reproduced.
        .filter(|(_, m)| EXPERIMENTS.iter().find(|e| e.name() == m.experiment).is_none_or(|e| e.reproduced()))
        .collect();
    let mut rows = Vec::new();
    for (i, (path, manifest)) in manifests.iter().enumerate() {
        let rel = ws.display_path(path);
        eprintln!("[{}/{}] {} ({rel})", i + 1, manifests.len(), manifest.experiment);
        let outcome = reproduce_one(&ws, &bin_dir, path, manifest, cli.offline);
        rows.push((manifest.experiment.clone(), common::manifest::manifest_name(path), outcome));
    }

    println!();
    println!("{:<16} {:<24} {:<11} detail", "experiment", "manifest", "result");
    let (mut ok, mut skipped, mut failed) = (0, 0, 0);
    for (experiment, manifest, outcome) in &rows {
        let (label, detail) = match outcome {
            Outcome::Reproduced(d) => {
                ok += 1;
                ("reproduced", d)
            }
            Outcome::Skipped(d) => {
                skipped += 1;
                ("skipped", d)
            }
            Outcome::Failed(d) => {
                failed += 1;
                ("FAILED", d)
            }
        };
        println!("{experiment:<16} {manifest:<24} {label:<11} {detail}");
    }
    println!("\n{ok} reproduced, {skipped} skipped, {failed} failed");

    // What the runs say of the findings their manifests state.
    let mut judged = Vec::new();
    for (experiment, manifest, outcome) in &rows {
        let Outcome::Reproduced(artifact) = outcome else { continue };
        let value: serde_json::Value = serde_json::from_slice(&std::fs::read(ws.root.join(artifact))?)?;
        let claims: Vec<ClaimResult> =
            value.get("claims").map(|c| serde_json::from_value(c.clone())).transpose()?.unwrap_or_default();
        judged.extend(claims.into_iter().map(|c| (format!("{experiment}/{manifest}"), c)));
    }
    let mut claims_failed = 0;
    if !judged.is_empty() {
        let rows: Vec<(String, &ClaimResult)> = judged.iter().map(|(m, c)| (m.clone(), c)).collect();
        println!("\nclaims\n{}", claims_table(&rows));
        let count = |v: evidence::Verdict| judged.iter().filter(|(_, c)| c.verdict == v).count();
        claims_failed = count(evidence::Verdict::Fails);
        println!(
            "{} claims hold, {claims_failed} fail, {} inconclusive{}",
            count(evidence::Verdict::Holds),
            count(evidence::Verdict::Inconclusive),
            if claims_failed > 0 && cli.allow_failed_claims {
                " (failures allowed by --allow-failed-claims)"
            } else {
                ""
            }
        );
    }
    let claims_fail_run = claims_failed > 0 && !cli.allow_failed_claims;
    Ok(if failed > 0 || (cli.strict && skipped > 0) || claims_fail_run { tools::CHECK_FAILED } else { 0 })
}

fn reproduce_one(
    ws: &Workspace,
    bin_dir: &std::path::Path,
    path: &std::path::Path,
    manifest: &common::experiment::AnyManifest,
    offline: bool,
) -> Outcome {
    let (experiment, model) = (manifest.experiment.as_str(), manifest.model.as_str());
    let Some(kind) = EXPERIMENTS.iter().find(|e| e.name() == experiment) else {
        let names: Vec<&str> = EXPERIMENTS.iter().map(|e| e.name()).collect();
        return Outcome::Failed(format!(
            "`{experiment}` is not a registered experiment ({}); add it to tools/src/registry.rs",
            names.join(", ")
        ));
    };
    if let Err(e) = kind.check_manifest(manifest).and_then(|()| check_claims(*kind, manifest)) {
        return Outcome::Failed(format!("{}: {e}", ws.display_path(path)));
    }
    let binary = bin_dir.join(experiment);
    if !binary.is_file() {
        return Outcome::Failed(format!(
            "no binary {}: build it first (`just reproduce` does)",
            ws.display_path(&binary)
        ));
    }
    let pin = match ws.model_pin(model) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let opts = ResolveOptions { offline, generate_missing: true, ..Default::default() };
    match resolve(ws, &pin, &opts) {
        Ok(_) => {}
        Err(ResolveError::NotFound { tried, .. }) => {
            return Outcome::Skipped(format!(
                "model `{model}` not available (tried {tried}); fetch it or pass --model-dir to the experiment"
            ))
        }
        Err(e) => return Outcome::Failed(e.to_string()),
    }
    // From the root, with paths relative to it: the run records its command line, and an
    // artifact should not carry where this checkout happens to sit.
    let relative =
        |p: &std::path::Path| p.strip_prefix(&ws.root).map(|r| std::path::Path::new(".").join(r)).unwrap_or(p.into());
    let mut cmd = Command::new(relative(&binary));
    cmd.current_dir(&ws.root).arg("--manifest").arg(ws.display_path(path));
    if offline {
        cmd.arg("--offline");
    }
    let label = format!("{experiment}/{}", common::manifest::manifest_name(path));
    let (status, stdout) = match streamed(&mut cmd, &label) {
        Ok(done) => done,
        Err(e) => return Outcome::Failed(format!("cannot run {}: {e}", binary.display())),
    };
    let artifact = stdout.iter().find_map(|l| l.strip_prefix("artifact: ")).unwrap_or("no artifact").to_string();
    if status.success() {
        // Every fresh artifact must pass the audit it will face later.
        let report = Audit::new(ws, EXPERIMENTS).audit_artifact(&ws.root.join(&artifact));
        match report.verdict {
            Verdict::Ok => Outcome::Reproduced(artifact),
            _ => Outcome::Failed(format!("audit: {} ({artifact})", report.first_reason())),
        }
    } else {
        Outcome::Failed(format!("exit status {} ({artifact})", status.code().unwrap_or(-1)))
    }
}

/// Runs `cmd` with each line of its stdout and stderr passed on as it comes, to ours, prefixed
/// with `label` (so a run of minutes shows its progress, and a log says which run wrote what);
/// returns its exit status and its stdout's lines, unprefixed.
fn streamed(cmd: &mut Command, label: &str) -> std::io::Result<(std::process::ExitStatus, Vec<String>)> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let prefix = format!("[{label}] ");
    let errors = {
        let prefix = prefix.clone();
        std::thread::spawn(move || for_each_line(stderr, |line| eprintln!("{prefix}{line}")))
    };
    let mut lines = Vec::new();
    for_each_line(stdout, |line| {
        println!("{prefix}{line}");
        lines.push(line.to_string());
    });
    let _ = errors.join();
    Ok((child.wait()?, lines))
}

/// Every line `pipe` gives until it closes, decoded lossily: bytes that are not UTF-8 never stop
/// the reading (a child whose pipe is no longer read blocks on it).
fn for_each_line(pipe: Option<impl std::io::Read>, mut f: impl FnMut(&str)) {
    use std::io::BufRead;
    let Some(pipe) = pipe else { return };
    let mut reader = std::io::BufReader::new(pipe);
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        f(String::from_utf8_lossy(&line).trim_end_matches(['\n', '\r']));
        line.clear();
    }
}
