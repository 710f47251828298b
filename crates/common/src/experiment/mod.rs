//! What an experiment is to the workspace, and the shared start and end of its binary.
//!
//! Each experiment crate implements [`Experiment`] once, in its own types: its parameters,
//! expectations and artifact, its command line, its checks, its report. The tools see it as an
//! [`AnyExperiment`] (module `any`: one blanket adapter reads and writes the JSON they hold); the
//! registry (`tools/src/registry.rs`) lists them, one line each, and `reproduce`, `audit`,
//! `pin` and `report` dispatch through it. So no tool names an experiment, and no experiment
//! writes a line of JSON wiring.

mod any;
mod prepare;

pub use any::{check_claims, claims_of, rederive, AnyExperiment, Settings};
pub use prepare::{load_model, prepare, ManifestRun, Model, ModelArgs, ModelSlot, PrepareError, Prepared};

use crate::chart::{CompareRow, Section};
use crate::claim::{Claim, Vocabulary};
use crate::evidence::{ClaimResult, Observation};
use crate::finding::Findings;
use crate::manifest::Invalid;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// A manifest as the tools read it, before an experiment gives its parts their types.
pub use crate::workspace::AnyManifest;

/// Why an experiment refused what a tool gave it: a manifest, a recorded command line, an
/// artifact to pin from or to report.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// A part (`parameters`, `expectations`, an artifact) that does not read as the experiment's
    /// type; serde's message names the field.
    #[error("{part}: {cause}")]
    Read { part: String, cause: serde_json::Error },
    /// A parameter out of its range.
    #[error(transparent)]
    Invalid(#[from] crate::manifest::Invalid),
    /// A recorded `argv` that the experiment's command line refuses.
    #[error("argv does not parse: {0}")]
    Argv(clap::error::ErrorKind),
    /// An artifact without a part the request needs (e.g. no runs to pin ids from).
    #[error("the artifact has no {0}")]
    Missing(&'static str),
    /// A recorded `argv` of a command that writes no artifact (a subcommand such as `serve`).
    #[error("{0}")]
    WritesNoArtifact(&'static str),
}

impl ExperimentError {
    /// For `map_err`: `part` did not read.
    pub fn read(part: impl Into<String>) -> impl FnOnce(serde_json::Error) -> Self {
        let part = part.into();
        move |cause| ExperimentError::Read { part, cause }
    }
}

/// Reads `value` (the part `part` of a manifest or artifact) as `T`.
pub fn read_as<T: DeserializeOwned>(part: &str, value: &Value) -> Result<T, ExperimentError> {
    T::deserialize(value).map_err(ExperimentError::read(part))
}

/// An experiment's command line, as a run records it and the audit re-reads it.
pub trait CommandLine: clap::Parser {
    /// The manifest's parameters, which flags may override.
    type Parameters: DeserializeOwned + Serialize + Clone;

    /// The model and output flags ([`prepare`] reads them).
    fn model(&self) -> &ModelArgs;

    /// What the command line asked for, as `provenance.settings.requested` records it: by
    /// default the model flags, for a command line that has no others.
    fn requested(&self) -> Value {
        serde_json::to_value(self.model()).unwrap_or_default()
    }

    /// The manifest's parameters with the command line's overrides: by default none.
    fn effective(&self, base: &Self::Parameters) -> Self::Parameters {
        base.clone()
    }

    /// The command line as the artifact records it: by default as given; a command line that
    /// carries secrets (header values) redacts them.
    fn recorded_argv(&self, argv: Vec<String>) -> Vec<String> {
        argv
    }

    /// Why this command line writes no artifact (a subcommand such as `serve`), if so.
    fn writes_no_artifact(&self) -> Option<&'static str> {
        None
    }
}

/// The command line of an experiment whose only flags are the model and output ones
/// ([`ModelArgs`]), so that no flag overrides a parameter: the scaffold's, until it grows flags.
#[derive(clap::Parser)]
#[command(about = "Runs an experiment's manifest (or an unpinned --model-dir) and writes its artifact")]
pub struct Flags<P: Clone + Send + Sync + 'static> {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(skip)]
    parameters: std::marker::PhantomData<P>,
}

impl<P: DeserializeOwned + Serialize + Clone + Send + Sync + 'static> CommandLine for Flags<P> {
    type Parameters = P;

    fn model(&self) -> &ModelArgs {
        &self.model
    }
}

/// What a reader asked of the report page (`report`'s flags), for every experiment's section.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReportOptions {
    /// Every round's chart where a section draws one round per configuration (its median).
    pub all_rounds: bool,
}

/// One experiment, in its own types: what its crate implements, once. The tools reach it as an
/// [`AnyExperiment`], which every `Experiment` is.
pub trait Experiment: Sync + 'static {
    /// Its name: the binary, `manifests/<name>/`, `artifacts/<name>/` and `provenance.experiment`.
    const NAME: &'static str;

    /// Whether `just reproduce` runs its manifests (`false` for benchmarks that `just bench`
    /// runs, whose artifacts go to `artifacts/bench/`).
    const REPRODUCED: bool = true;

    /// A manifest's `parameters` (and an artifact's record of the effective ones).
    type Parameters: DeserializeOwned + Serialize + JsonSchema + Clone;
    /// A manifest's `expectations` (`serde_json::Value` for an experiment that pins nothing).
    type Expectations: DeserializeOwned + Serialize + JsonSchema + Clone;
    /// What a run writes.
    type Artifact: DeserializeOwned + Serialize + JsonSchema;
    /// Its command line.
    type Args: CommandLine<Parameters = Self::Parameters>;

    /// The parameters of a run without a manifest (`--model-dir`); `None`: it needs one.
    fn default_parameters(&self) -> Option<Self::Parameters> {
        None
    }

    /// Checks parameters past their types (ranges, consistency); the error names the field.
    fn validate(&self, _parameters: &Self::Parameters) -> Result<(), Invalid> {
        Ok(())
    }

    /// The invariants of one of its artifacts, and the expectations of the manifest it ran when
    /// its parameters were the manifest's (`None` for unpinned and custom runs, which are held to
    /// their invariants alone).
    fn audit(&self, artifact: &Self::Artifact, expectations: Option<&Self::Expectations>, findings: &mut Findings);

    /// Recomputes every part of an artifact its binary derives from what it recorded (summaries,
    /// ratios, per-request numbers from a timeline), the way the binary computes them. The audit
    /// holds the stored parts to these computations, and the forgery tests redo them as a forger
    /// would after editing a recorded value. Nothing is derived by default.
    fn rederive(&self, _artifact: &mut Self::Artifact) {}

    /// New expectations for the manifest from a fresh, audited artifact (`current`: the
    /// manifest's present ones); `None`: this experiment pins nothing.
    fn pin(
        &self,
        _artifact: &Self::Artifact,
        _current: Option<&Self::Expectations>,
    ) -> Result<Option<Self::Expectations>, ExperimentError> {
        Ok(None)
    }

    /// Whether a foreign artifact (one without our provenance, e.g. the Python predecessor's) is
    /// of this experiment.
    fn recognises(&self, _foreign: &Value) -> bool {
        false
    }

    /// The checks a foreign artifact's fields allow, and notes of what it lacks.
    fn audit_foreign(&self, _foreign: &Value, _findings: &mut Findings) {}

    /// Its section of the report page for one artifact (ours, or a foreign one it recognises,
    /// hence JSON); `dir` is the folder, relative to the page, its charts are written to.
    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        options: &ReportOptions,
    ) -> Result<Section, ExperimentError>;

    /// The metrics of two of its artifacts side by side (A, B), for `report --compare`; none by
    /// default, so the comparison shows only what every artifact has (provenance, claims).
    fn compare(&self, _a: &Value, _b: &Value) -> Vec<CompareRow> {
        Vec::new()
    }

    /// The names a manifest's claims may use, given its parameters: metrics (of whole runs, of
    /// one request), runs and requests. None by default, so any claim is an error naming its
    /// metric.
    fn claim_vocabulary(&self, _parameters: &Self::Parameters) -> Vocabulary {
        Vocabulary::default()
    }

    /// The values claims are judged on, one per run, request, metric and round, read from one of
    /// its artifacts or a foreign one it recognises (whose single run gives one round). Names as
    /// in [`Experiment::claim_vocabulary`].
    fn observations(&self, _artifact: &Value) -> Vec<Observation> {
        Vec::new()
    }
}

/// The whole `main` of an experiment binary: logging, the command line `A`, then `run`; an error
/// is printed on one line (`{:#}`, so an `anyhow` error shows its causes, with any URL's
/// credentials redacted, since such lines end up in logs) with exit status 1, and otherwise the
/// process exits with the status `run` gives.
pub fn main<A: clap::Parser, T: ExitStatus, E: std::fmt::Display>(run: impl FnOnce(A) -> Result<T, E>) -> ! {
    main_with(1, run)
}

/// [`main`], with `error_status` the status an error exits with (the workspace tools keep 1 for
/// a check that found something, and exit 2 when they cannot do their job).
pub fn main_with<A: clap::Parser, T: ExitStatus, E: std::fmt::Display>(
    error_status: i32,
    run: impl FnOnce(A) -> Result<T, E>,
) -> ! {
    crate::init_tracing();
    let args = A::try_parse().unwrap_or_else(|e| {
        // clap quotes the offending value, which may be a URL with a password.
        let text = crate::artifact::redact_url_credentials(&e.render().to_string());
        match e.use_stderr() {
            true => eprint!("{text}"),
            false => print!("{text}"),
        }
        std::process::exit(e.exit_code())
    });
    match run(args) {
        Ok(status) => std::process::exit(status.code()),
        Err(e) => {
            eprintln!("error: {}", crate::artifact::redact_url_credentials(&format!("{e:#}")));
            std::process::exit(error_status)
        }
    }
}

/// What a binary's `run` returns on success: nothing (status 0) or its own exit status.
pub trait ExitStatus {
    fn code(self) -> i32;
}

impl ExitStatus for () {
    fn code(self) -> i32 {
        0
    }
}

impl ExitStatus for i32 {
    fn code(self) -> i32 {
        self
    }
}

/// For a binary before it writes: `claims` judged on the rounds its artifact records (the audit
/// repeats this from the written file).
pub fn judge_claims<E: Experiment>(
    experiment: &E,
    claims: &[Claim],
    artifact: &E::Artifact,
) -> Result<Vec<ClaimResult>, ExperimentError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let value = serde_json::to_value(artifact).map_err(ExperimentError::read("artifact"))?;
    Ok(crate::evidence::judge(claims, &experiment.observations(&value)))
}

/// The claims table a binary and `just reproduce` print: one line per claim (and target) and pair
/// of runs, columns as wide as their contents.
pub fn claims_table(rows: &[(String, &ClaimResult)]) -> String {
    let mut lines: Vec<[String; 7]> =
        vec![["manifest", "claim", "expected", "runs (later / earlier)", "rounds", "ratio [interval]", "verdict"]
            .map(String::from)];
    for (label, result) in rows {
        for (i, line) in result.lines().into_iter().enumerate() {
            let first = |s: String| if i == 0 { s } else { String::new() };
            lines.push([
                first(label.clone()),
                first(result.label()),
                first(result.claim.expect.describe()),
                line.runs,
                line.rounds.to_string(),
                line.ratio,
                line.verdict,
            ]);
        }
    }
    let widths: Vec<usize> = (0..7).map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
