//! What an experiment is to the workspace tools, and the shared start and end of its binary.
//!
//! Each experiment crate implements [`Experiment`] once; the registry (`crates/tools/src/registry.rs`)
//! lists them, one line each, and `reproduce`, `audit`, `pin` and `report` dispatch through it. So
//! no tool names an experiment, and an experiment brings its schema, invariants, foreign-artifact
//! reading, pinning and report section with it.

mod prepare;

pub use prepare::{prepare, ManifestRun, ModelArgs, PrepareError, Prepared};

use crate::chart::{CompareRow, Section};
use crate::claim::{Claim, Vocabulary};
use crate::evidence::{ClaimResult, Observation};
use crate::finding::Findings;
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

/// What a command line gives (see [`Experiment::settings`]).
pub struct Settings {
    pub requested: Value,
    /// `None` without a manifest.
    pub effective: Option<Value>,
}

/// An experiment's command line, as a run records it and the audit re-reads it.
pub trait CommandLine: clap::Parser {
    /// The manifest's parameters, which flags may override.
    type Parameters: DeserializeOwned + Serialize;

    /// What the command line asked for, as `provenance.settings.requested` records it.
    fn requested(&self) -> Value;

    /// The manifest's parameters with the command line's overrides.
    fn effective(&self, base: &Self::Parameters) -> Self::Parameters;

    /// Why this command line writes no artifact (a subcommand such as `serve`), if so.
    fn writes_no_artifact(&self) -> Option<&'static str> {
        None
    }
}

/// The whole `main` of an experiment binary: logging, the command line `A`, then `run`; an error
/// is printed on one line (`{:#}`, so an `anyhow` error shows its causes, with any URL's
/// credentials redacted, since such lines end up in logs) with exit status 1, and otherwise the
/// process exits with the status `run` gives.
pub fn main<A: clap::Parser, T: ExitStatus, E: std::fmt::Display>(run: impl FnOnce(A) -> Result<T, E>) -> ! {
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
            std::process::exit(1)
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

/// For an experiment's checks: an artifact's `model_id` is the pinned model's repository when the
/// run was pinned (unpinned runs name their folder, which nothing else records).
pub fn check_model_id(model_id: &str, provenance: &crate::provenance::Provenance, f: &mut Findings) {
    let repo = provenance.model.as_ref().and_then(|m| m.repo.as_deref());
    if repo.is_some_and(|repo| repo != model_id) {
        f.wrong("invariants", "model_id", format!("`{model_id}`, but provenance.model says {repo:?}"));
    }
}

/// [`Experiment::schemas`] for an experiment whose manifest holds `P` and `E` and whose artifact
/// is `A`: `<name>-manifest.v1` and `<name>-artifact.v1`.
pub fn schemas_of<P: schemars::JsonSchema, E: schemars::JsonSchema, A: schemars::JsonSchema>(
    name: &str,
) -> Vec<(String, Value)> {
    use crate::schema::schema_of;
    vec![
        (format!("{name}-manifest.v1"), schema_of::<crate::manifest::ExperimentManifest<P, E>>()),
        (format!("{name}-artifact.v1"), schema_of::<A>()),
    ]
}

/// For [`Experiment::audit`]: reads `artifact` as `A` and runs `check` on it; one that does not
/// read is a schema finding.
pub fn audit_as<A: DeserializeOwned>(
    name: &str,
    artifact: &Value,
    f: &mut Findings,
    check: impl FnOnce(&A, &mut Findings),
) {
    match serde_json::from_value::<A>(artifact.clone()) {
        Ok(a) => check(&a, f),
        Err(e) => f.wrong("schema", "", format!("does not read as a {name} artifact: {e}")),
    }
}

/// [`Experiment::settings`] for an experiment whose command line is `A`.
pub fn settings<A: CommandLine>(
    argv: &[String],
    manifest_parameters: Option<&Value>,
) -> Result<Settings, ExperimentError> {
    let args = A::try_parse_from(argv).map_err(|e| ExperimentError::Argv(e.kind()))?;
    if let Some(why) = args.writes_no_artifact() {
        return Err(ExperimentError::WritesNoArtifact(why));
    }
    let effective = match manifest_parameters {
        None => None,
        Some(base) => {
            let base: A::Parameters = read_as("parameters", base)?;
            Some(serde_json::to_value(args.effective(&base)).map_err(ExperimentError::read("effective parameters"))?)
        }
    };
    Ok(Settings { requested: args.requested(), effective })
}

/// One experiment, as the tools see it. Everything takes JSON: the tools read artifacts and
/// manifests of every experiment, and each experiment reads its own with its own types.
pub trait Experiment: Sync {
    /// Its name: the binary, `manifests/<name>/`, `artifacts/<name>/` and `provenance.experiment`.
    fn name(&self) -> &'static str;

    /// Whether `just reproduce` runs its manifests (`false` for benchmarks that `just bench`
    /// runs, whose artifacts go to `artifacts/bench/`).
    fn reproduced(&self) -> bool {
        true
    }

    /// Reads a manifest's parameters and expectations as this experiment's types and checks them;
    /// the error names the field and the fix.
    fn check_manifest(&self, manifest: &AnyManifest) -> Result<(), ExperimentError>;

    /// Its JSON Schemas, as `(name, schema)`: `<name>-manifest.v1` and `<name>-artifact.v<N>`,
    /// committed under `schemas/` (a test of the registry keeps them in sync).
    fn schemas(&self) -> Vec<(String, Value)>;

    /// The settings a recorded command line gives: what `argv` asks for
    /// (`provenance.settings.requested`) and, given the manifest's parameters, the effective ones
    /// its overrides make of them (`provenance.settings.effective`). So the audit tells an edited
    /// `argv` or edited parameters from the run's own; the error says why `argv` does not parse.
    fn settings(&self, argv: &[String], manifest_parameters: Option<&Value>) -> Result<Settings, ExperimentError>;

    /// The invariants of one of its artifacts (the body, seal removed), and the expectations of
    /// the manifest it ran when its parameters were the manifest's (`None` for unpinned and custom
    /// runs, which are held to their invariants alone).
    fn audit(&self, artifact: &Value, expectations: Option<&Value>, findings: &mut Findings);

    /// Whether a foreign artifact (one without our provenance, e.g. the Python predecessor's) is
    /// of this experiment.
    fn recognises(&self, _foreign: &Value) -> bool {
        false
    }

    /// The checks a foreign artifact's fields allow, and notes of what it lacks.
    fn audit_foreign(&self, _foreign: &Value, _findings: &mut Findings) {}

    /// New expectations for the manifest from a fresh, audited artifact (`current`: the
    /// manifest's present ones); `Ok(None)`: this experiment pins nothing.
    fn pin(&self, _artifact: &Value, _current: Option<&Value>) -> Result<Option<Value>, ExperimentError> {
        Ok(None)
    }

    /// Its section of the report page for one artifact (ours or foreign); `dir` is the folder,
    /// relative to the page, its charts are written to.
    fn report(&self, title: &str, dir: &str, artifact: &Value) -> Result<Section, ExperimentError>;

    /// The metrics of two of its artifacts side by side (A, B), for `report --compare`.
    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow>;

    /// Recomputes in `artifact` every part its binary derives from what it recorded (summaries,
    /// ratios, per-request numbers from a timeline), the way the binary computes them; one that
    /// does not read as this experiment's artifact is left as it is. The audit holds the stored
    /// parts to these computations, and the forgery tests redo them as a forger would after
    /// editing a recorded value. Nothing is derived by default.
    fn rederive(&self, _artifact: &mut Value) {}

    /// The names a manifest's claims may use, given its parameters: metrics (of whole runs, of
    /// one request), runs and requests. None by default, so any claim is an error naming its
    /// metric.
    fn claim_vocabulary(&self, _parameters: &Value) -> Result<Vocabulary, ExperimentError> {
        Ok(Vocabulary::default())
    }

    /// The values claims are judged on, one per run, request, metric and round, read from one of
    /// its artifacts or a foreign one it recognises (whose single run gives one round). Names as
    /// in [`Experiment::claim_vocabulary`].
    fn observations(&self, _artifact: &Value) -> Vec<Observation> {
        Vec::new()
    }
}

/// The claims of a manifest, checked against the names the experiment gives for its
/// parameters; the error names the claim's field.
pub fn check_claims(experiment: &dyn Experiment, manifest: &AnyManifest) -> Result<(), ExperimentError> {
    let names = experiment.claim_vocabulary(&manifest.parameters)?;
    crate::claim::check(&manifest.claims, &names)?;
    Ok(())
}

/// For a binary before it measures: its manifest's claims, checked (none for an unpinned run).
pub fn claims_to_judge<P, E>(
    experiment: &dyn Experiment,
    prepared: &Prepared<P, E>,
) -> Result<Vec<Claim>, ExperimentError> {
    let Some(run) = &prepared.manifest else { return Ok(Vec::new()) };
    let names = experiment.claim_vocabulary(&run.parameters)?;
    crate::claim::check(&run.manifest.claims, &names)
        .map_err(|e| crate::manifest::Invalid::new(format!("{}: {}", run.record.path, e.field), e.problem))?;
    Ok(run.manifest.claims.clone())
}

/// For a binary before it writes: `claims` judged on the rounds its artifact records (the audit
/// repeats this from the written file).
pub fn judge_claims(
    experiment: &dyn Experiment,
    claims: &[Claim],
    artifact: &impl Serialize,
) -> Result<Vec<ClaimResult>, ExperimentError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let value = serde_json::to_value(artifact).map_err(ExperimentError::read("artifact"))?;
    Ok(crate::evidence::judge(claims, &experiment.observations(&value)))
}

/// [`Experiment::rederive`], then the stored claims judged again on the artifact's rounds: every
/// part of an artifact that follows from its recorded events, recomputed.
pub fn rederive(experiment: &dyn Experiment, artifact: &mut Value) {
    experiment.rederive(artifact);
    let Some(stored) = artifact.get("claims").and_then(|c| serde_json::from_value::<Vec<ClaimResult>>(c.clone()).ok())
    else {
        return;
    };
    let mut claims: Vec<Claim> = Vec::new();
    for r in stored {
        if !claims.iter().any(|c| c.id == r.claim.id) {
            claims.push(r.claim);
        }
    }
    let judged = crate::evidence::judge(&claims, &experiment.observations(artifact));
    if let Ok(judged) = serde_json::to_value(judged) {
        artifact["claims"] = judged;
    }
}

/// For [`Experiment::rederive`]: reads `artifact` as `A`, lets `derive` recompute its derived
/// parts, and writes it back; one that does not read as `A` is left as it is.
pub fn rederive_as<A: DeserializeOwned + Serialize>(artifact: &mut Value, derive: impl FnOnce(&mut A)) {
    let Ok(mut typed) = serde_json::from_value::<A>(artifact.clone()) else { return };
    derive(&mut typed);
    if let Ok(value) = serde_json::to_value(&typed) {
        *artifact = value;
    }
}

/// The claims judged on an artifact. Ours carry theirs, judged when the run was made; a foreign
/// one (the predecessor's) is judged here on the claims its experiment's manifests state, those
/// of manifests pinning the artifact's model first, each claim id once.
pub fn claims_of(ws: &crate::workspace::Workspace, experiment: &dyn Experiment, artifact: &Value) -> Vec<ClaimResult> {
    if artifact.get("provenance").is_some() {
        return artifact.get("claims").and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or_default();
    }
    let model = artifact.get("model_id").and_then(Value::as_str);
    let mut manifests: Vec<(bool, AnyManifest)> = ws
        .experiment_manifests()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, m)| m.experiment == experiment.name())
        .map(|(_, m)| (ws.model_pin(&m.model).is_ok_and(|pin| Some(pin.repo.as_str()) == model), m))
        .collect();
    manifests.sort_by_key(|(same_model, _)| !*same_model);
    let mut claims: Vec<Claim> = Vec::new();
    for claim in manifests.into_iter().flat_map(|(_, m)| m.claims) {
        if !claims.iter().any(|c| c.id == claim.id) {
            claims.push(claim);
        }
    }
    crate::evidence::judge(&claims, &experiment.observations(artifact))
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
