//! The audit: how a reviewer trusts an artifact without re-running it.
//!
//! For each artifact, in order: it parses and its seal holds; it validates against the committed
//! JSON Schema of its experiment and version; its manifest exists and is the one it ran; its
//! model pin and file digests are the manifest's; its source hash is the current code's (else it
//! is *stale*, which is not *wrong*); its `argv` is the one its recorded settings came from; its
//! parameters are the manifest's (else it is a custom run, held to its invariants alone); then
//! its experiment's own invariants and the manifest's expectations. Foreign artifacts (the Python
//! predecessor's seeds) get the checks their fields allow, and a list of what they lack.
//!
//! The audit knows no experiment: it is given the registry's list and dispatches through the
//! [`AnyExperiment`] trait. No input makes it panic: an experiment's check that panics is caught and
//! becomes a finding.

use common::artifact::{check_seal, SEAL_KEY};
use common::claim::Claim;
use common::evidence::ClaimResult;
use common::experiment::{AnyExperiment, AnyManifest};
use common::finding::{diff_values, Findings, Report, Severity};
use common::manifest::{manifest_sha256, read_experiment_manifest};
use common::workspace::Workspace;
use serde_json::Value;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use common::finding::{Finding, Verdict};

/// The audit of one workspace, with the experiments it knows (the registry's).
pub struct Audit<'a> {
    ws: &'a Workspace,
    experiments: &'a [&'a dyn AnyExperiment],
    /// Source hashes by crate folder: an experiment's linked sources are read once per audit,
    /// not once per artifact.
    hashes: Mutex<BTreeMap<String, SourceHash>>,
}

/// A crate folder's source hash and the count of files it covers, or why it could not be read.
type SourceHash = Result<(String, usize), Arc<std::io::Error>>;

impl<'a> Audit<'a> {
    /// An audit of `ws`'s artifacts by the `experiments` registered.
    pub fn new(ws: &'a Workspace, experiments: &'a [&'a dyn AnyExperiment]) -> Self {
        Audit { ws, experiments, hashes: Mutex::default() }
    }
}

/// Every JSON file under `dir` (recursively), sorted, but for serving-bench's exports in vLLM's
/// shape (`*.vllm.json`, written beside their artifact): derived files with no provenance or seal
/// of their own, which a folder's audit would otherwise call forgeries. (Named on the command
/// line, one is audited, and found to be no artifact.)
pub fn artifact_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json")
                && !p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(".vllm.json"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The file's JSON, or the report that says why it cannot be read (the audit's first finding for
/// any artifact, ours or foreign).
fn read_json(path: &Path, shown: &str) -> Result<Value, Report> {
    let value = std::fs::read(path)
        .map_err(|e| format!("cannot read: {e}"))
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| format!("does not parse as JSON: {e}")));
    value.map_err(|e| {
        let mut f = Findings::default();
        f.wrong("parse", "", e);
        f.into_report(shown.to_string(), None, None)
    })
}

impl Audit<'_> {
    fn experiment(&self, name: &str) -> Option<&dyn AnyExperiment> {
        self.experiments.iter().copied().find(|e| e.name() == name)
    }

    fn names(&self) -> String {
        self.experiments.iter().map(|e| e.name()).collect::<Vec<_>>().join(", ")
    }

    /// Audits one of our artifacts against its manifest and the current code.
    pub fn audit_artifact(&self, path: &Path) -> Report {
        let ws = self.ws;
        let shown = ws.display_path(path);
        let value = match read_json(path, &shown) {
            Ok(v) => v,
            Err(report) => return report,
        };
        let mut f = Findings::default();
        match check_seal(&value) {
            Ok(None) => {}
            Ok(Some(parts)) => f.wrong(
                "seal",
                parts[0].clone(),
                format!("edited after the run (seal mismatch in {})", parts.join(", ")),
            ),
            Err(e) => f.wrong("seal", SEAL_KEY, e.to_string()),
        }
        let mut body = value.clone();
        if let Some(map) = body.as_object_mut() {
            map.remove(SEAL_KEY);
        }
        let experiment = body.pointer("/provenance/experiment").and_then(Value::as_str).map(str::to_string);
        let version = body.pointer("/provenance/schema_version").and_then(Value::as_u64);
        let Some(experiment) = experiment else {
            f.wrong(
                "schema",
                "provenance.experiment",
                "missing: not an artifact of this project (foreign ones: --external)",
            );
            return f.into_report(shown, None, None);
        };
        let Some(kind) = self.experiment(&experiment) else {
            f.wrong(
                "schema",
                "provenance.experiment",
                format!("`{experiment}` is not a registered experiment (registered: {})", self.names()),
            );
            return f.into_report(shown, Some(experiment), None);
        };
        check_schema(ws, &experiment, version.unwrap_or(0), &body, &mut f);
        check_provenance(&body, &mut f);

        let manifest_path = body.pointer("/provenance/manifest/path").and_then(Value::as_str).map(str::to_string);
        let manifest = match &manifest_path {
            None => {
                let why = match body.pointer("/provenance/model") {
                    Some(Value::Null) | None => {
                        "a run of no model of ours (external targets only, no manifest): internal checks only"
                    }
                    Some(_) => "unpinned run (--model-dir without a manifest): internal checks only",
                };
                f.note("manifest", "provenance.manifest", why);
                None
            }
            Some(rel) => check_manifest(ws, rel, &body, &mut f),
        };
        self.check_source(&body, &mut f);
        check_argv(kind, manifest.as_ref(), &body, &mut f);
        let mut expectations = None;
        if let Some(m) = &manifest {
            check_pin(ws, m, &body, &mut f);
            let recorded = body.pointer("/provenance/settings/effective").cloned().unwrap_or(Value::Null);
            let differences = diff_values(&recorded, &m.parameters, "parameters");
            let own_folder = manifest_path.as_deref().map(|rel| own_folder(ws, &experiment, rel));
            match differences.first() {
                None => {
                    expectations = m.expectations.clone();
                }
                Some((field, msg)) if own_folder.as_deref().is_some_and(|dir| path.parent() == Some(dir)) => f.wrong(
                    "parameters",
                    field.clone(),
                    format!(
                        "{msg}: a run with other parameters than its manifest's belongs in <manifest>+custom/, \
                         not among the manifest's own"
                    ),
                ),
                Some((field, _)) => f.note(
                    "parameters",
                    field.clone(),
                    format!(
                        "custom run ({} parameters differ from the manifest's): held to its invariants, \
                         not to the manifest's expectations",
                        differences.len()
                    ),
                ),
            }
        }
        let checked = guarded(|| {
            let mut own = Findings::default();
            kind.audit(&body, expectations.as_ref(), &mut own);
            own
        });
        match checked {
            Ok(own) => f.0.extend(own.0),
            Err(panic) => f.wrong("invariants", "", format!("the {experiment} checks panicked: {panic}")),
        }
        // A run judges its manifest's claims, custom runs too (whose verdicts are recomputed on
        // their own rounds): claims that differ from the manifest's make it stale.
        let stated = manifest.as_ref().map(|m| m.claims.as_slice());
        if let Err(panic) = guarded(|| check_claims(kind, stated, &body, &mut f)) {
            f.wrong("claims", "claims", format!("recomputing the claims panicked: {panic}"));
        }
        f.settle_code();
        f.into_report(shown, Some(experiment), manifest_path)
    }

    /// Audits a foreign artifact (the Python predecessor's seeds): recognises the experiment by its
    /// fields, checks what they allow, and notes what they lack. Never fails on odd input: anything
    /// unreadable is a finding.
    pub fn audit_external(&self, path: &Path, shown: String) -> Report {
        let value = match read_json(path, &shown) {
            Ok(v) => v,
            Err(report) => return report,
        };
        let mut f = Findings::default();
        if value.get("provenance").is_none() {
            f.note(
                "lacks",
                "provenance",
                "no provenance block: code version, build, host details and model digests are unknown",
            );
        }
        let kind = self.experiments.iter().copied().find(|e| guarded(|| e.recognises(&value)).unwrap_or(false));
        match kind {
            Some(kind) => {
                if let Err(panic) = guarded(|| kind.audit_foreign(&value, &mut f)) {
                    f.wrong("invariants", "", format!("the {} checks panicked: {panic}", kind.name()));
                }
            }
            None => f.wrong(
                "schema",
                "",
                format!("not recognised as an artifact of any registered experiment ({})", self.names()),
            ),
        }
        if let Some(kind) = kind {
            // One run of each configuration: a point estimate per claim, never a verdict.
            let judged = guarded(|| common::experiment::claims_of(self.ws, kind, &value)).unwrap_or_default();
            for (i, r) in judged.iter().enumerate() {
                let ratios: Vec<String> = r
                    .pairs
                    .iter()
                    .map(|p| format!("{} / {} = {}", p.later, p.earlier, common::evidence::describe_ratio(p)))
                    .collect();
                let scope = r.scope.as_deref().map(|s| format!(" [{s}]")).unwrap_or_default();
                f.note(
                    "claims",
                    format!("claims[{i}]"),
                    format!(
                        "`{}`{scope} (expected {}): {}: {}{}",
                        r.claim.id,
                        r.claim.expect.describe(),
                        ratios.join(", "),
                        r.verdict.name(),
                        r.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
                    ),
                );
            }
        }
        let redactor = common::artifact::Redactor { home: None, secrets: Vec::new() };
        leaks(&value, String::new(), &redactor, &mut f);
        f.into_report(shown, kind.map(|k| k.name().to_string()), None)
    }

    /// The recorded source hash against the working tree's (hashed once per crate).
    fn check_source(&self, body: &Value, f: &mut Findings) {
        let ws = self.ws;
        let recorded = body.pointer("/provenance/source/sha256").and_then(Value::as_str).unwrap_or_default();
        let crate_dir = body.pointer("/provenance/source/crate_dir").and_then(Value::as_str).unwrap_or_default();
        if crate_dir.is_empty() || crate_dir.split(['/', '\\']).any(|p| p == "..") || !ws.root.join(crate_dir).is_dir()
        {
            return f.wrong(
                "source",
                "provenance.source.crate_dir",
                format!("`{crate_dir}` is not an experiment crate of this workspace"),
            );
        }
        let now = {
            let mut hashes = self.hashes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let hashed = hashes.entry(crate_dir.to_string()).or_insert_with(|| {
                source_hash::hash_crate(&ws.root, crate_dir).map(|h| (h.sha256, h.files.len())).map_err(Arc::new)
            });
            hashed.clone()
        };
        match now {
            // The same code hashes the same files and links the same locked libraries: a count or
            // a version that differs was written by hand.
            Ok((now, files)) if now == recorded => {
                let count = body.pointer("/provenance/source/files").and_then(Value::as_u64);
                if count != Some(files as u64) {
                    f.wrong(
                        "source",
                        "provenance.source.files",
                        format!("{count:?}, but the code it hashed has {files} files"),
                    );
                }
                let (candle, tokenizers) = common::provenance::LIBRARIES;
                for (field, locked) in [("candle", candle), ("tokenizers", tokenizers)] {
                    let built = body.pointer(&format!("/provenance/build/{field}")).and_then(Value::as_str);
                    if built != Some(locked) {
                        f.wrong(
                            "source",
                            format!("provenance.build.{field}"),
                            format!("{built:?}, but the code's Cargo.lock has {locked}"),
                        );
                    }
                }
            }
            Ok((now, _)) => f.add(
                Severity::Stale,
                "source",
                "provenance.source.sha256",
                format!(
                    "the code changed since the run (recorded {}, now {}); re-run it",
                    short(recorded),
                    short(&now)
                ),
            ),
            Err(e) => f.wrong("source", "provenance.source.crate_dir", format!("cannot hash the sources: {e}")),
        }
    }

    /// `just pin`: the manifest with its expectations taken from a fresh artifact. Refused unless
    /// the artifact is current and wrong in nothing but its expectations (an intended change is
    /// pinned from an honest run, never from a broken, stale or custom one). Returns the manifest's
    /// path, its old text and the new one; the caller shows the difference and writes.
    pub fn pin_from_artifact(&self, artifact_path: &Path) -> Result<(PathBuf, String, String), PinError> {
        let report = self.audit_artifact(artifact_path);
        if let Some(bad) = report.findings.iter().find(|f| {
            f.severity == Severity::Stale
                || (f.severity == Severity::Wrong && f.check != "expectations")
                || f.check == "parameters"
        }) {
            return Err(PinError::Refused {
                artifact: report.artifact,
                field: bad.field.clone(),
                message: bad.message.clone(),
            });
        }
        let artifact = report.artifact.clone();
        let rel = report.manifest.clone().ok_or_else(|| PinError::Unpinned(artifact.clone()))?;
        let kind = report
            .experiment
            .as_deref()
            .and_then(|e| self.experiment(e))
            .ok_or_else(|| PinError::Unregistered(artifact.clone()))?;
        let value = common::artifact::read_artifact::<Value>(artifact_path)?;
        let manifest_path = self.ws.root.join(&rel);
        let old = std::fs::read_to_string(&manifest_path).map_err(|cause| PinError::Read { path: rel, cause })?;
        let mut manifest: AnyManifest = read_experiment_manifest(&manifest_path)?;
        let expectations = kind
            .pin(&value, manifest.expectations.as_ref())
            .map_err(|cause| PinError::Experiment { artifact: artifact.clone(), cause })?
            .ok_or_else(|| PinError::NothingToPin { artifact, experiment: kind.name() })?;
        manifest.expectations = Some(expectations);
        manifest.source_sha256 = value.pointer("/provenance/source/sha256").and_then(Value::as_str).map(str::to_string);
        let mut new = serde_json::to_string_pretty(&manifest).map_err(PinError::Serialize)?;
        new.push('\n');
        Ok((manifest_path, old, new))
    }
}

/// Why `just pin` refused.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(
        "{artifact}: cannot pin from it: {field}: {message} (re-run the experiment on its manifest, \
         then pin from the new artifact)"
    )]
    Refused { artifact: String, field: String, message: String },
    #[error("{0}: unpinned run: there is no manifest to update")]
    Unpinned(String),
    #[error("{0}: not an artifact of a registered experiment")]
    Unregistered(String),
    #[error("{artifact}: experiment `{experiment}` pins no expectations")]
    NothingToPin { artifact: String, experiment: &'static str },
    #[error("{artifact}: {cause}")]
    Experiment { artifact: String, cause: common::experiment::ExperimentError },
    #[error("{path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error("cannot write the manifest: {0}")]
    Serialize(serde_json::Error),
    #[error(transparent)]
    Artifact(#[from] common::artifact::ArtifactError),
    #[error(transparent)]
    Manifest(#[from] common::manifest::ManifestError),
}

/// `artifacts/<experiment>/<manifest name>`: where the manifest's own runs are written.
fn own_folder(ws: &Workspace, experiment: &str, manifest_rel: &str) -> PathBuf {
    ws.artifacts_dir().join(experiment).join(common::manifest::manifest_name(Path::new(manifest_rel)))
}

/// An experiment's code that panicked on an artifact, with the panic's message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Panicked(String);

/// Runs an experiment's code for the audit: a panic in it becomes its message, so that no
/// artifact can stop the audit of the others.
fn guarded<T>(work: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
        Panicked(
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into()),
        )
    })
}

/// `provenance.argv` must be the command line the recorded settings came from, and with the
/// manifest's parameters it must give the recorded effective ones: an edited argv, or parameters
/// edited to look like the manifest's own (with the seal recomputed), would otherwise pass.
fn check_argv(kind: &dyn AnyExperiment, manifest: Option<&AnyManifest>, body: &Value, f: &mut Findings) {
    let argv: Option<Vec<String>> =
        body.pointer("/provenance/argv").and_then(|v| serde_json::from_value(v.clone()).ok());
    let Some(argv) = argv.filter(|a| !a.is_empty()) else {
        return f.wrong("invariants", "provenance.argv", "missing or empty");
    };
    let parameters = manifest.map(|m| &m.parameters);
    let settings = match guarded(|| kind.settings(&argv, parameters)) {
        Ok(Ok(settings)) => settings,
        Ok(Err(e)) => {
            return f.wrong(
                "invariants",
                "provenance.argv",
                format!("does not parse as a {} command line: {e}", kind.name()),
            )
        }
        Err(panic) => return f.wrong("invariants", "provenance.argv", format!("parsing it panicked: {panic}")),
    };
    let recorded = |key: &str| body.pointer(&format!("/provenance/settings/{key}")).cloned().unwrap_or(Value::Null);
    if let Some((field, msg)) =
        diff_values(&recorded("requested"), &settings.requested, "provenance.settings.requested").into_iter().next()
    {
        f.wrong(
            "invariants",
            "provenance.argv",
            format!("the command line does not give the recorded settings: {field}: {msg}"),
        );
    }
    if let Some(effective) = settings.effective {
        if let Some((field, msg)) =
            diff_values(&recorded("effective"), &effective, "provenance.settings.effective").into_iter().next()
        {
            f.wrong(
                "parameters",
                field,
                format!("not what the manifest's parameters and the command line give: {msg}"),
            );
        }
    }
}

/// The provenance block's facts agree among themselves: the run's times read as times, in order,
/// and its id is its start's; the program is the experiment's binary; the build is of a target
/// for the host's architecture, in a profile cargo has; the commit is a commit id. A fact edited
/// by hand into a form no run writes shows here.
fn check_provenance(body: &Value, f: &mut Findings) {
    let provenance = body.get("provenance").and_then(|p| serde_json::from_value(p.clone()).ok());
    let Some(p): Option<common::provenance::Provenance> = provenance else { return };
    match (common::provenance::parse_time(&p.started_at), common::provenance::parse_time(&p.finished_at)) {
        (Some(start), Some(end)) if start <= end => {
            let id = start.format("%Y%m%dT%H%M%SZ").to_string();
            let suffix = p.run_id.strip_prefix(&id).and_then(|s| s.strip_prefix('-'));
            if !suffix
                .is_some_and(|s| s.len() == 4 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
            {
                f.wrong(
                    "invariants",
                    "provenance.run_id",
                    format!("`{}` is not the id of a run started at {}", p.run_id, p.started_at),
                );
            }
        }
        (Some(_), Some(_)) => f.wrong("invariants", "provenance.finished_at", "before the run started"),
        (None, _) => f.wrong("invariants", "provenance.started_at", "not an RFC 3339 time"),
        (_, None) => f.wrong("invariants", "provenance.finished_at", "not an RFC 3339 time"),
    }
    let program = p.argv.first().map(|a| a.rsplit(['/', '\\']).next().unwrap_or_default());
    if program != Some(p.experiment.as_str()) {
        f.wrong(
            "invariants",
            "provenance.argv[0]",
            format!("{program:?}, but the experiment's binary is `{}`", p.experiment),
        );
    }
    if p.build.target.split('-').next() != Some(p.host.arch.as_str())
        || !["debug", "release"].contains(&p.build.profile.as_str())
    {
        f.wrong(
            "invariants",
            "provenance.build",
            "not a build cargo makes for the host's architecture (target, profile)",
        );
    }
    if let Some(git) =
        p.git.as_ref().filter(|g| !(g.commit.len() == 40 && g.commit.bytes().all(|b| b.is_ascii_hexdigit())))
    {
        f.wrong("invariants", "provenance.git.commit", format!("`{}` is not a commit id", git.commit));
    }
}

fn check_schema(ws: &Workspace, experiment: &str, version: u64, body: &Value, f: &mut Findings) {
    let name = format!("{experiment}-artifact.v{version}");
    let path = ws.root.join("schemas").join(format!("{name}.json"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        return f.wrong(
            "schema",
            "provenance.schema_version",
            format!(
                "{version}: no committed schema schemas/{name}.json for it; this workspace writes no such artifact"
            ),
        );
    };
    let schema: Value = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => return f.wrong("schema", "", format!("schemas/{name}.json does not parse: {e}")),
    };
    match jsonschema::validator_for(&schema) {
        Err(e) => f.wrong("schema", "", format!("schemas/{name}.json is not a valid schema: {e}")),
        Ok(validator) => {
            if let Some(e) = validator.iter_errors(body).next() {
                let at = e.instance_path().to_string();
                f.wrong("schema", json_path(&at), format!("does not match schemas/{name}.json: {e}"));
            }
        }
    }
}

/// `/runs/0/elapsed_ms` -> `runs[0].elapsed_ms`.
fn json_path(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        if part.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(part);
        }
    }
    out
}

fn check_manifest(ws: &Workspace, rel: &str, body: &Value, f: &mut Findings) -> Option<AnyManifest> {
    let path = ws.root.join(rel);
    if !path.is_file() {
        f.wrong("manifest", "provenance.manifest.path", format!("{rel} does not exist"));
        return None;
    }
    let manifest = match read_experiment_manifest::<Value, Value>(&path) {
        Ok(m) => m,
        Err(e) => {
            f.wrong("manifest", "provenance.manifest.path", e.to_string());
            return None;
        }
    };
    let recorded = body.pointer("/provenance/manifest/sha256").and_then(Value::as_str).unwrap_or_default();
    match manifest_sha256(&path) {
        Ok(now) if now != recorded => f.add(
            Severity::Stale,
            "manifest",
            "provenance.manifest.sha256",
            format!("{rel} changed since the run (recorded {}, now {})", short(recorded), short(&now)),
        ),
        Ok(_) => {}
        Err(e) => f.wrong("manifest", "provenance.manifest.path", e.to_string()),
    }
    if body.pointer("/provenance/experiment").and_then(Value::as_str) != Some(manifest.experiment.as_str()) {
        f.wrong("manifest", "provenance.experiment", format!("the manifest is for `{}`", manifest.experiment));
    }
    Some(manifest)
}

/// The stored verdicts against the ones the recorded rounds give, and (for a run with its
/// manifest's parameters) the claims judged against the ones the manifest states.
fn check_claims(kind: &dyn AnyExperiment, stated: Option<&[Claim]>, body: &Value, f: &mut Findings) {
    let stored: Vec<ClaimResult> = match body.get("claims") {
        None => Vec::new(),
        Some(v) => match serde_json::from_value(v.clone()) {
            Ok(s) => s,
            Err(e) => return f.wrong("claims", "claims", format!("does not read as judged claims: {e}")),
        },
    };
    let mut judged: Vec<Claim> = Vec::new();
    for r in &stored {
        if !judged.iter().any(|c| c.id == r.claim.id) {
            judged.push(r.claim.clone());
        }
    }
    let recomputed = common::evidence::judge(&judged, &kind.observations(body));
    for i in 0..stored.len().max(recomputed.len()) {
        let (s, r) = (stored.get(i), recomputed.get(i));
        if s != r {
            let json = |x: Option<&ClaimResult>| x.and_then(|x| serde_json::to_value(x).ok()).unwrap_or(Value::Null);
            let (field, stored_value, given) = first_difference(&json(s), &json(r), format!("claims[{i}]"))
                .unwrap_or_else(|| (format!("claims[{i}]"), json(s), json(r)));
            f.wrong("claims", field, format!("stored {stored_value}, but the recorded rounds give {given}"));
        }
    }
    if let Some(stated) = stated {
        if stated != judged.as_slice() {
            f.add(
                Severity::Stale,
                "claims",
                "claims",
                "the run judged other claims than its manifest states now: re-run to judge the manifest's",
            );
        }
    }
}

/// The first place where two JSON values differ, as its path and the two values there: what a
/// finding names, rather than two whole objects that look alike.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<(String, Value, Value)> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x
            .iter()
            .map(|(k, v)| (k, v, y.get(k).unwrap_or(&Value::Null)))
            .chain(y.iter().filter(|(k, _)| !x.contains_key(*k)).map(|(k, w)| (k, &Value::Null, w)))
            .find_map(|(k, v, w)| first_difference(v, w, format!("{path}.{k}"))),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (v, w))| first_difference(v, w, format!("{path}[{i}]")))
        }
        (a, b) if a == b => None,
        (a, b) => Some((path, a.clone(), b.clone())),
    }
}

fn short(hex: &str) -> &str {
    &hex[..hex.len().min(12)]
}

fn check_pin(ws: &Workspace, manifest: &AnyManifest, body: &Value, f: &mut Findings) {
    let pin = match ws.model_pin(&manifest.model) {
        Ok(p) => p,
        Err(e) => return f.wrong("pin", "provenance.model.name", e.to_string()),
    };
    let model = body.pointer("/provenance/model").cloned().unwrap_or(Value::Null);
    let expect = [
        ("name", Some(pin.name.as_str())),
        ("repo", Some(pin.repo.as_str())),
        ("revision", Some(pin.revision.as_str())),
    ];
    for (key, want) in expect {
        let got = model.get(key).and_then(Value::as_str);
        if got != want {
            f.wrong("pin", format!("provenance.model.{key}"), format!("recorded {got:?}, the pin says {want:?}"));
        }
    }
    if model.get("pinned") != Some(&Value::Bool(true)) {
        f.wrong("pin", "provenance.model.pinned", "the files were not verified against the pin");
    }
    let files = model.get("files").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, want) in pin.files.iter().enumerate() {
        let got = files.iter().find(|v| v.get("path").and_then(Value::as_str) == Some(want.path.as_str()));
        match got {
            None => f.wrong("pin", format!("provenance.model.files[{i}]"), format!("{} is not recorded", want.path)),
            Some(g)
                if g.get("digest").and_then(Value::as_str) != Some(want.digest.as_str())
                    || g.get("size").and_then(Value::as_u64) != Some(want.size) =>
            {
                f.wrong(
                    "pin",
                    format!("provenance.model.files[{i}].digest"),
                    format!(
                        "{}: recorded {} differs from the pin's {}",
                        want.path,
                        g.get("digest").unwrap_or(&Value::Null),
                        want.digest
                    ),
                )
            }
            Some(_) => {}
        }
    }
    if files.len() != pin.files.len() {
        f.wrong(
            "pin",
            "provenance.model.files",
            format!("{} files recorded, the pin has {}", files.len(), pin.files.len()),
        );
    }
    let pin_path = ws.manifests_dir().join("models").join(format!("{}.json", pin.name));
    let recorded_path = body.pointer("/provenance/manifest/model_pin_path").and_then(Value::as_str);
    if recorded_path != Some(ws.display_path(&pin_path).as_str()) {
        f.wrong(
            "pin",
            "provenance.manifest.model_pin_path",
            format!("{recorded_path:?}, but the manifest's model is pinned in {}", ws.display_path(&pin_path)),
        );
    }
    let recorded = body.pointer("/provenance/manifest/model_pin_sha256").and_then(Value::as_str).unwrap_or_default();
    if let Ok(now) = manifest_sha256(&pin_path) {
        if now != recorded {
            f.add(
                Severity::Stale,
                "pin",
                "provenance.manifest.model_pin_sha256",
                format!("the pin file changed since the run (recorded {}, now {})", short(recorded), short(&now)),
            );
        }
    }
}

/// Notes strings holding a home path (ours never do; the seeds may).
fn leaks(value: &Value, path: String, redactor: &common::artifact::Redactor, f: &mut Findings) {
    match value {
        Value::String(s) if redactor.redact_str(s) != *s => {
            f.add(Severity::Note, "lacks", path, "holds an absolute home path (this project's artifacts never do)")
        }
        Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| leaks(v, if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, redactor, f)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| leaks(v, format!("{path}[{i}]"), redactor, f)),
        _ => {}
    }
}

/// Manifests under `manifests/<experiment>/` that no audited artifact ran.
pub fn unreproduced(ws: &Workspace, reports: &[Report]) -> Vec<String> {
    // A custom run (other parameters than its manifest's) does not reproduce the manifest.
    let custom = |r: &&Report| r.findings.iter().any(|f| f.check == "parameters");
    let ran: std::collections::BTreeSet<&str> =
        reports.iter().filter(|r| !custom(r)).filter_map(|r| r.manifest.as_deref()).collect();
    ws.experiment_manifests()
        .map(|list| list.into_iter().map(|(p, _)| ws.display_path(&p)).filter(|p| !ran.contains(p.as_str())).collect())
        .unwrap_or_default()
}

/// Lines of `new` not in `old` and vice versa, in order: a small review diff.
pub fn line_diff(old: &str, new: &str) -> Vec<String> {
    let old_lines: std::collections::BTreeSet<&str> = old.lines().collect();
    let new_lines: std::collections::BTreeSet<&str> = new.lines().collect();
    old.lines()
        .filter(|l| !new_lines.contains(l))
        .map(|l| format!("- {l}"))
        .chain(new.lines().filter(|l| !old_lines.contains(l)).map(|l| format!("+ {l}")))
        .collect()
}
