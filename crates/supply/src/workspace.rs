//! Where things live: the workspace root and its `manifests/`, `artifacts/` and model folders.
//!
//! Every binary runs from anywhere inside the checkout; paths it records are made relative to
//! the root so that artifacts do not depend on (or leak) where the checkout sits.

use crate::manifest::{ExperimentManifest, ManifestError};
use crate::pin::ModelPin;
use std::path::{Path, PathBuf};

/// An experiment manifest read without knowing the experiment's own types.
pub type AnyManifest = ExperimentManifest<serde_json::Value, serde_json::Value>;

#[derive(Debug, Clone)]
pub struct Workspace {
    pub root: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(
        "no workspace found above {0}: run from inside the checkout (the folder holding Cargo.lock and manifests/)"
    )]
    NotFound(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("no model pin named `{name}` in manifests/models/ (known: {known}); add manifests/models/{name}.json or pick a known one")]
    UnknownModel { name: String, known: String },
    #[error("{path}: {cause}")]
    Path { path: String, cause: String },
    #[error("{path} is outside the workspace {root}: the audit finds manifests by their path in the workspace; copy it under manifests/<experiment>/")]
    Outside { path: String, root: String },
}

/// Environment variable that moves generated and downloaded-by-name model folders elsewhere.
pub(crate) const MODELS_DIR_ENV: &str = "LAB_MODELS_DIR";

impl Workspace {
    /// The nearest folder at or above the current directory with `Cargo.lock` and `manifests/`.
    pub fn discover() -> Result<Self, WorkspaceError> {
        let cwd = std::env::current_dir().map_err(|e| WorkspaceError::NotFound(e.to_string()))?;
        Self::discover_from(&cwd)
    }

    pub fn discover_from(start: &Path) -> Result<Self, WorkspaceError> {
        start
            .ancestors()
            .find(|d| d.join("Cargo.lock").is_file() && d.join("manifests").is_dir())
            .map(|root| Workspace { root: root.to_path_buf() })
            .ok_or_else(|| WorkspaceError::NotFound(start.display().to_string()))
    }

    pub fn manifests_dir(&self) -> PathBuf {
        self.root.join("manifests")
    }

    pub fn artifacts_dir(&self) -> PathBuf {
        self.root.join("artifacts")
    }

    /// Generated checkpoints live here (git-ignored), unless `LAB_MODELS_DIR` says otherwise.
    pub fn models_dir(&self) -> PathBuf {
        match std::env::var_os(MODELS_DIR_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => self.root.join(".models"),
        }
    }

    /// A file inside the workspace as artifacts record it: relative to the root, with forward
    /// slashes, whatever working directory (and relative form) it was given from.
    pub fn relative(&self, path: &Path) -> Result<String, WorkspaceError> {
        let canonical = |p: &Path| {
            std::fs::canonicalize(p)
                .map_err(|e| WorkspaceError::Path { path: p.display().to_string(), cause: e.to_string() })
        };
        let (file, root) = (canonical(path)?, canonical(&self.root)?);
        let rel = file.strip_prefix(&root).map_err(|_| WorkspaceError::Outside {
            path: path.display().to_string(),
            root: self.root.display().to_string(),
        })?;
        Ok(rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/"))
    }

    /// A path for the record: relative to the root when inside it, else as given.
    pub fn display_path(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| path.to_string_lossy().into_owned())
    }

    /// Every model pin under `manifests/models/`, sorted by name.
    pub fn model_pins(&self) -> Result<Vec<ModelPin>, WorkspaceError> {
        let mut pins = Vec::new();
        for path in json_files(&self.manifests_dir().join("models"))? {
            pins.push(crate::manifest::read_model_pin(&path)?);
        }
        pins.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(pins)
    }

    pub fn model_pin(&self, name: &str) -> Result<ModelPin, WorkspaceError> {
        let pins = self.model_pins()?;
        let known = pins.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
        pins.iter()
            .find(|p| p.name == name)
            .cloned()
            .ok_or_else(|| WorkspaceError::UnknownModel { name: name.to_string(), known })
    }

    /// Every experiment manifest (`manifests/<experiment>/<name>.json`), with its path, sorted.
    pub fn experiment_manifests(&self) -> Result<Vec<(PathBuf, AnyManifest)>, WorkspaceError> {
        let mut out = Vec::new();
        let dir = self.manifests_dir();
        let mut experiments: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| ManifestError::Io { path: dir.display().to_string(), cause: e })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "models"))
            .collect();
        experiments.sort();
        for exp in experiments {
            for path in json_files(&exp)? {
                let manifest = crate::manifest::read_experiment_manifest(&path)?;
                out.push((path, manifest));
            }
        }
        Ok(out)
    }
}

fn json_files(dir: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(ManifestError::Io { path: dir.display().to_string(), cause: e }),
    };
    files.sort();
    Ok(files)
}
