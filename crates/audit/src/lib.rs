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
use common::experiment::{AnyExperiment, AnyManifest};
use common::finding::{diff_values, Findings, Report, Severity};
use common::manifest::read_experiment_manifest;
use common::workspace::Workspace;
use serde_json::Value;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use common::finding::{Finding, Verdict};

mod checks;
use checks::{check_argv, check_claims, check_manifest, check_pin, check_provenance, check_schema, leaks, short};

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
        let body = match common::artifact::body(value) {
            Ok(body) => body,
            Err(e) => {
                f.wrong("format", e.field(), e.to_string());
                return f.into_report(shown, None, None);
            }
        };
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
