//! Reading artifacts for rendering: ours (any experiment, any version) and foreign ones (the
//! Python predecessor's seeds) alike; the experiment is the one the artifact names, or the one
//! that recognises a foreign file.

use crate::ReportError;
use common::evidence::ClaimResult;
use common::experiment::AnyExperiment;
use common::workspace::Workspace;
use serde_json::Value;
use std::path::Path;

/// One artifact to report, with the experiment that reads it.
pub struct Artifact<'a> {
    /// File stem, used to name the rendered files.
    pub name: String,
    pub kind: &'a dyn AnyExperiment,
    pub value: Value,
    /// Its claims as judged: stored in ours, judged on the manifests' claims for a foreign one.
    pub claims: Vec<ClaimResult>,
    /// What the audit found against it, when the page must say so above its numbers (an
    /// artifact found wrong, or stale); set by whoever audited it.
    pub warning: Option<String>,
}

/// Reads the artifact at `path` (ours or foreign) and finds its experiment among `experiments`;
/// `ws`'s manifests give a foreign one its claims.
pub fn load<'a>(
    ws: &Workspace,
    path: &Path,
    experiments: &[&'a dyn AnyExperiment],
) -> Result<Artifact<'a>, ReportError> {
    let shown = || path.display().to_string();
    let bytes = std::fs::read(path).map_err(|cause| ReportError::Io { path: shown(), cause })?;
    let stored: Value =
        serde_json::from_slice(&bytes).map_err(|cause| ReportError::NotJson { path: shown(), cause })?;
    let value = common::artifact::body(stored).map_err(|cause| ReportError::Unpack { path: shown(), cause })?;
    let kind = match value.pointer("/provenance/experiment").and_then(Value::as_str) {
        Some(name) => experiments.iter().copied().find(|e| e.name() == name),
        None => experiments.iter().copied().find(|e| e.recognises(&value)),
    };
    let kind = kind.ok_or_else(|| ReportError::Unknown {
        path: shown(),
        known: experiments.iter().map(|e| e.name()).collect::<Vec<_>>().join(", "),
    })?;
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "artifact".into());
    let claims = common::experiment::claims_of(ws, kind, &value);
    Ok(Artifact { name, kind, value, claims, warning: None })
}
