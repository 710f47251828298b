//! `reproduce`: run every experiment on every manifest whose model is available (its output
//! passed on as it comes, each line prefixed with the manifest, with the run's time so far and
//! the time left by its last artifact beside it), audit each fresh artifact, then
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
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(EXPERIMENTS.iter().map(|e| e.name())))]
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
        let value: serde_json::Value = common::artifact::read_artifact(&ws.root.join(artifact))?;
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
    let name = common::manifest::manifest_name(path);
    let label = format!("{experiment}/{name}");
    let (status, stdout) = match streamed(&mut cmd, &Heartbeat::new(&label, last_run_s(ws, experiment, &name))) {
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
/// returns its exit status and its stdout's lines, unprefixed. A step of an experiment may say
/// nothing for minutes (one long prefill), so the run's own progress is shown beside its lines:
/// [`Heartbeat`].
fn streamed(cmd: &mut Command, heartbeat: &Heartbeat) -> std::io::Result<(std::process::ExitStatus, Vec<String>)> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let prefix = &heartbeat.prefix;
    let mut lines = Vec::new();
    std::thread::scope(|scope| {
        scope.spawn(|| for_each_line(stderr, |line| heartbeat.say(|| eprintln!("{prefix}{line}"))));
        let beating = scope.spawn(|| heartbeat.beat_until_done());
        for_each_line(stdout, |line| {
            heartbeat.say(|| println!("{prefix}{line}"));
            lines.push(line.to_string());
        });
        heartbeat.done();
        let _ = beating.join();
    });
    Ok((child.wait()?, lines))
}

/// A running experiment's own progress, beside its output: on a terminal, a line under it with
/// the time it has run and, from the newest committed artifact of the same manifest, the time
/// left; off a terminal, the same as a plain line once the run has been silent for a while.
struct Heartbeat {
    bar: Option<indicatif::ProgressBar>,
    /// Where plain heartbeat lines go when there is no bar (stderr, but for tests).
    plain: Box<dyn Fn(String) + Send + Sync>,
    prefix: String,
    started: std::time::Instant,
    last_run_s: Option<f64>,
    /// When the run last wrote a line, and when a plain heartbeat line was last written.
    state: std::sync::Mutex<(std::time::Instant, Option<std::time::Instant>)>,
    finished: std::sync::atomic::AtomicBool,
}

/// Off a terminal: a heartbeat once the run has said nothing for this long...
const SILENT: std::time::Duration = std::time::Duration::from_secs(2);
/// ...and not again within this.
const BEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Heartbeat {
    /// For the run labelled `label`, on stderr.
    fn new(label: &str, last_run_s: Option<f64>) -> Self {
        use std::io::IsTerminal;
        Self::with(label, last_run_s, std::io::stderr().is_terminal(), Box::new(|line| eprintln!("{line}")))
    }

    fn with(label: &str, last_run_s: Option<f64>, terminal: bool, plain: Box<dyn Fn(String) + Send + Sync>) -> Self {
        let bar = terminal.then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("a valid template"));
            bar.enable_steady_tick(std::time::Duration::from_millis(250));
            bar
        });
        let now = std::time::Instant::now();
        Heartbeat {
            bar,
            plain,
            prefix: format!("[{label}] "),
            started: now,
            last_run_s,
            state: std::sync::Mutex::new((now, None)),
            finished: false.into(),
        }
    }

    /// Writes a line of the run's (through `write`) with the bar out of its way.
    fn say(&self, write: impl FnOnce()) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0 = std::time::Instant::now();
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }

    /// `running 2m 10s; about 9m 20s left (its last run took 11m 30s)`.
    fn message(&self) -> String {
        let ran = self.started.elapsed().as_secs_f64();
        let mut m = format!("running {}", duration(ran));
        if let Some(last) = self.last_run_s {
            m.push_str(&match ran < last {
                true => format!("; about {} left (its last run took {})", duration(last - ran), duration(last)),
                false => format!("; longer than its last run ({})", duration(last)),
            });
        }
        m
    }

    fn beat_until_done(&self) {
        while !self.finished.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(250));
            let message = self.message();
            match &self.bar {
                Some(bar) => bar.set_message(format!("{}{message}", self.prefix)),
                None => {
                    let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    let (last_line, last_beat) = &mut *state;
                    if last_line.elapsed() >= SILENT && last_beat.is_none_or(|t| t.elapsed() >= BEAT_EVERY) {
                        *last_beat = Some(std::time::Instant::now());
                        (self.plain)(format!("{}{message}", self.prefix));
                    }
                }
            }
        }
    }

    fn done(&self) {
        self.finished.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `1h 02m`, `9m 20s`, `35s`.
fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s:02}s"),
        (h, m, _) => format!("{h}h {m:02}m"),
    }
}

/// How long the newest committed artifact of this manifest took to make, as its provenance says.
fn last_run_s(ws: &Workspace, experiment: &str, manifest: &str) -> Option<f64> {
    let dir = ws.artifacts_dir().join(experiment).join(manifest);
    let newest = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .max()?;
    let value: serde_json::Value = common::artifact::read_artifact(&newest).ok()?;
    let provenance: common::provenance::Provenance = serde_json::from_value(value.get("provenance")?.clone()).ok()?;
    provenance.wall_s()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A run silent for three seconds gets a plain heartbeat line with its time left; its own
    /// lines are all passed on, in order.
    #[test]
    fn a_silent_run_gets_a_heartbeat_and_keeps_its_lines() {
        let beats = Arc::new(Mutex::new(Vec::new()));
        let sink = beats.clone();
        let heartbeat = Heartbeat::with("x/y", Some(600.0), false, Box::new(move |l| sink.lock().unwrap().push(l)));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo first; sleep 3; echo second >&2; echo third"]);
        let (status, lines) = streamed(&mut cmd, &heartbeat).unwrap();
        assert!(status.success());
        assert_eq!(lines, ["first", "third"]);
        let beats = beats.lock().unwrap();
        assert_eq!(beats.len(), 1, "one line within the silence: {beats:?}");
        let beat = &beats[0];
        assert!(beat.starts_with("[x/y] running ") && beat.ends_with("s left (its last run took 10m 00s)"), "{beat}");
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(
            (duration(35.4), duration(560.0), duration(3725.0)),
            ("35s".into(), "9m 20s".into(), "1h 02m".into())
        );
    }
}
