//! Manifests: the committed, hand-reviewed statement of what a run must be.
//!
//! Two kinds live under `manifests/`: model pins (`models/<name>.json`, see [`crate::pin`]) and
//! experiment manifests (`<experiment>/<name>.json`), which name a model pin, the experiment's
//! parameters and the expectations an audit holds its artifacts to. Unknown fields are errors so
//! that a typo never silently falls back to a default.

use crate::pin::{ModelPin, PinError};
use schemars::JsonSchema;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::Path;

/// An experiment manifest, generic over the experiment's own parameter and expectation types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentManifest<P, E> {
    /// The experiment binary's name, e.g. `scheduler`.
    pub experiment: String,
    /// The model pin's name (`manifests/models/<model>.json`).
    pub model: String,
    pub parameters: P,
    /// What any artifact of this manifest must show; `null` when nothing is pinned yet.
    pub expectations: Option<E>,
    /// The source hash the expectations were pinned at (`just pin` updates it).
    pub source_sha256: Option<String>,
    /// What the runs are expected to show, judged on their rounds (see [`crate::claim`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<crate::claim::Claim>,
}

/// A parameter out of its range (its own module, so that [`crate::claim`] uses it without
/// importing the manifest that holds claims).
pub use crate::invalid::Invalid;

/// The longest wait a manifest or a flag may ask for, in seconds (a week): beyond it a timeout or
/// an arrival is no longer a plan for a run, and far beyond it the clock's arithmetic overflows.
pub const MAX_WAIT_S: f64 = 7.0 * 86_400.0;

/// A number of seconds that a manifest or a flag gives (`field` names it) as a [`Duration`]: the
/// one conversion every such float goes through, so that NaN, a negative, an infinite or an
/// astronomically large value is an error naming the field, never a panic or a wrapped wait.
///
/// [`Duration`]: std::time::Duration
pub fn seconds(field: &str, secs: f64) -> Result<std::time::Duration, Invalid> {
    if !(secs.is_finite() && (0.0..=MAX_WAIT_S).contains(&secs)) {
        return Err(Invalid::new(field, format!("{secs} s: must be a time from 0 to {MAX_WAIT_S} seconds (a week)")));
    }
    // In range, so the conversion cannot fail; the fallback only keeps this function panic-free.
    std::time::Duration::try_from_secs_f64(secs).map_err(|e| Invalid::new(field, format!("{secs} s: {e}")))
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: cannot read: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("{path}: {field}: {cause}")]
    Parse { path: String, field: String, cause: serde_json::Error },
    #[error("{path}: {cause}")]
    Pin { path: String, cause: PinError },
    #[error("{path}: file name must be `{expected}.json` to match its `name` field")]
    Name { path: String, expected: String },
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<(T, Vec<u8>), ManifestError> {
    let bytes = std::fs::read(path).map_err(|cause| ManifestError::Io { path: path.display().to_string(), cause })?;
    Ok((parse_json(path, &bytes)?, bytes))
}

fn parse_json<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, ManifestError> {
    // The path to the offending field makes the error say which field to fix.
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes)).map_err(|e| {
        let field = e.path().to_string();
        ManifestError::Parse {
            path: path.display().to_string(),
            field: if field == "." { "(top level)".into() } else { field },
            cause: e.into_inner(),
        }
    })
}

pub fn read_model_pin(path: &Path) -> Result<ModelPin, ManifestError> {
    let (pin, _): (ModelPin, _) = read_json(path)?;
    pin.validate().map_err(|cause| ManifestError::Pin { path: path.display().to_string(), cause })?;
    if path.file_stem().and_then(|s| s.to_str()) != Some(pin.name.as_str()) {
        return Err(ManifestError::Name { path: path.display().to_string(), expected: pin.name });
    }
    Ok(pin)
}

pub fn read_experiment_manifest<P: DeserializeOwned, E: DeserializeOwned>(
    path: &Path,
) -> Result<ExperimentManifest<P, E>, ManifestError> {
    read_json(path).map(|(m, _)| m)
}

/// An experiment manifest as a run reads it, from one read of its bytes.
pub struct ManifestFile<P, E> {
    pub manifest: ExperimentManifest<P, E>,
    /// The parameters as written, for telling a run's effective parameters from the manifest's.
    pub parameters: serde_json::Value,
    /// SHA-256 of the bytes read (what artifacts record).
    pub sha256: String,
}

/// Reads an experiment manifest once: typed, its parameters as JSON, and its digest.
pub fn read_manifest_file<P: DeserializeOwned, E: DeserializeOwned>(
    path: &Path,
) -> Result<ManifestFile<P, E>, ManifestError> {
    let (raw, bytes): (ExperimentManifest<serde_json::Value, serde_json::Value>, _) = read_json(path)?;
    Ok(ManifestFile {
        manifest: parse_json(path, &bytes)?,
        parameters: raw.parameters,
        sha256: crate::digest::bytes_digest(&bytes, crate::digest::Algorithm::Sha256),
    })
}

/// The manifest's SHA-256 as recorded in artifacts: of the exact bytes on disk.
pub fn manifest_sha256(path: &Path) -> Result<String, ManifestError> {
    crate::digest::file_digest(path, crate::digest::Algorithm::Sha256)
        .map(|(_, hex)| hex)
        .map_err(|cause| ManifestError::Io { path: path.display().to_string(), cause })
}

/// The manifest's short name: its file stem, used in artifact paths.
pub fn manifest_name(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_errors_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        std::fs::write(&path, r#"{"experiment":"x","model":"tiny","parameters":{},"colour":"red"}"#).unwrap();
        let err = read_experiment_manifest::<serde_json::Value, serde_json::Value>(&path).unwrap_err().to_string();
        assert!(err.contains("unknown field `colour`"), "{err}");
    }

    #[test]
    fn every_float_of_seconds_converts_or_names_its_field() {
        assert_eq!(seconds("t", 1.5), Ok(std::time::Duration::from_millis(1500)));
        assert_eq!(seconds("t", 0.0), Ok(std::time::Duration::ZERO));
        assert_eq!(seconds("t", MAX_WAIT_S).map(|d| d.as_secs()), Ok(604_800));
        for bad in [f64::NAN, -1e-9, f64::INFINITY, 1e300, MAX_WAIT_S * 1.000001, f64::MAX] {
            let e = seconds("arrival_ms", bad).unwrap_err();
            assert_eq!(e.field, "arrival_ms");
            assert!(e.problem.contains("from 0 to 604800"), "{e}");
        }
    }
}
