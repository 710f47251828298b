//! The shared start and end of every experiment binary: read the manifest, find and verify the
//! model, load it; at the end, stamp provenance and write the artifact. An experiment's `main`
//! is then args, [`prepare`], its own measurement, [`Prepared::provenance`] and [`Prepared::write`].

use crate::artifact::{self, ArtifactError};
use crate::load::{LoadError, LoadedModel};
use crate::manifest::{
    manifest_name, manifest_sha256, read_manifest_file, ExperimentManifest, ManifestError, ManifestFile,
};
use crate::provenance::{self, BuildFacts, ManifestRecord, Provenance, RunClock, RunFacts};
use crate::qwen::WeightDtype;
use crate::resolve::{resolve, resolve_unpinned, ResolveError, ResolveOptions, ResolvedModel};
use crate::workspace::{Workspace, WorkspaceError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

/// Model and output flags shared by every experiment.
// The field docs are the `--help` text, where `<name>` is the usual placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct ModelArgs {
    /// Experiment manifest to run [default: manifests/<experiment>/tiny.json].
    #[arg(long, value_name = "PATH")]
    pub manifest: Option<PathBuf>,
    /// A local Hugging Face Qwen2 checkpoint folder. With --manifest it is verified against the
    /// manifest's pin; without, the run is unpinned and records the digests it computed.
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<PathBuf>,
    /// Write the artifact here [default: artifacts/<experiment>/<manifest>/<run_id>.json].
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// Never download a model (also `HF_HUB_OFFLINE=1`).
    #[arg(long)]
    pub offline: bool,
    /// What to hold the weight matrices in: f32 (the checkpoint exactly, comparable with the
    /// F32 references), or f16 / bf16 (half the bytes per step; F32 activations and
    /// accumulation; bf16 holds BF16-stored checkpoints exactly). Reduced-precision artifacts go
    /// to a separate `<manifest>-<dtype>` folder and record where their ids leave the F32 ones.
    #[arg(long, default_value = "f32", value_parser = WeightDtype::parse)]
    pub dtype: WeightDtype,
}

impl ModelArgs {
    /// Refuses an `--out` that already exists, before any work: artifacts are never overwritten,
    /// and a run that finds out only when it writes would throw its measurements away.
    pub fn check_out(&self) -> Result<(), ArtifactError> {
        match &self.out {
            Some(path) if path.exists() => Err(ArtifactError::Exists(path.display().to_string())),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{path}: this manifest is for experiment `{found}`, not `{expected}`; pass a manifest from manifests/{expected}/")]
    WrongExperiment { path: String, found: String, expected: String },
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("model in {dir}: {cause}")]
    Load { dir: String, cause: LoadError },
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
}

/// The manifest a run follows.
pub struct ManifestRun<P, E> {
    pub path: PathBuf,
    pub name: String,
    pub manifest: ExperimentManifest<P, E>,
    pub record: ManifestRecord,
    /// The manifest's parameters as written: a run whose effective parameters differ is a custom
    /// run, written beside the manifest's own (`<manifest>+custom/`).
    pub parameters: serde_json::Value,
}

/// Everything an experiment needs before it measures.
pub struct Prepared<P, E> {
    pub experiment: &'static str,
    pub ws: Workspace,
    pub clock: RunClock,
    pub manifest: Option<ManifestRun<P, E>>,
    pub resolved: ResolvedModel,
    /// Shared, so that a server can hold it while the run still reports on `resolved`.
    pub model: Arc<LoadedModel>,
}

/// Reads the manifest (unless an unpinned `--model-dir` run), resolves and verifies the model,
/// and loads it.
pub fn prepare<P: DeserializeOwned, E: DeserializeOwned>(
    experiment: &'static str,
    args: &ModelArgs,
) -> Result<Prepared<P, E>, PrepareError> {
    args.check_out()?;
    let clock = RunClock::start();
    let ws = Workspace::discover()?;
    let manifest_path = match (&args.manifest, &args.model_dir) {
        (Some(path), _) => Some(path.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(ws.manifests_dir().join(experiment).join("tiny.json")),
    };
    let (manifest, resolved) = match manifest_path {
        Some(path) => {
            let ManifestFile { manifest, parameters, sha256 } = read_manifest_file::<P, E>(&path)?;
            if manifest.experiment != experiment {
                return Err(PrepareError::WrongExperiment {
                    path: path.display().to_string(),
                    found: manifest.experiment,
                    expected: experiment.to_string(),
                });
            }
            let pin = ws.model_pin(&manifest.model)?;
            let pin_path = ws.manifests_dir().join("models").join(format!("{}.json", pin.name));
            let opts = ResolveOptions {
                model_dir: args.model_dir.clone(),
                offline: args.offline,
                generate_missing: true,
                hub_cache: None,
            };
            let resolved = resolve(&ws, &pin, &opts)?;
            let record = ManifestRecord {
                path: ws.relative(&path)?,
                sha256,
                model_pin_path: ws.display_path(&pin_path),
                model_pin_sha256: manifest_sha256(&pin_path)?,
            };
            let name = manifest_name(&path);
            (Some(ManifestRun { path, name, manifest, record, parameters }), resolved)
        }
        None => {
            let dir = args.model_dir.as_ref().expect("no manifest means --model-dir was given");
            (None, resolve_unpinned(dir)?)
        }
    };
    tracing::info!(dir = %ws.display_path(&resolved.dir), "loading model");
    let model = LoadedModel::load_as(&resolved.dir, args.dtype)
        .map_err(|cause| PrepareError::Load { dir: ws.display_path(&resolved.dir), cause })?;
    let model = Arc::new(model);
    Ok(Prepared { experiment, ws, clock, manifest, resolved, model })
}

impl<P, E> Prepared<P, E> {
    /// `<experiment>/<manifest>` (`unpinned` without one), as tables name a run.
    pub fn manifest_label(&self) -> String {
        format!("{}/{}", self.experiment, self.manifest.as_ref().map(|m| m.name.as_str()).unwrap_or("unpinned"))
    }

    /// The provenance block for this run, to be embedded in the artifact.
    pub fn provenance(
        &self,
        facts: BuildFacts,
        requested: serde_json::Value,
        effective: serde_json::Value,
    ) -> Provenance {
        provenance::collect(
            &self.ws,
            RunFacts {
                experiment: self.experiment,
                clock: self.clock.clone(),
                facts,
                requested,
                effective,
                model: Some(&self.resolved),
                weights: self.model.model.weight_dtype(),
                manifest: self.manifest.as_ref().map(|m| m.record.clone()),
                threads: crate::engine_threads(),
                argv: provenance::argv(),
            },
        )
    }

    /// Where the artifact goes: `--out`, or `artifacts/<experiment>/<manifest>/<run_id>.json`
    /// (`unpinned` in place of the manifest for `--model-dir` runs; `<manifest>-<dtype>` with
    /// half-precision weights, so reduced-precision results never sit among the F32 ones;
    /// `<manifest>+custom` when `effective` parameters differ from the manifest's, so a run with
    /// overrides never sits among the manifest's own).
    pub fn artifact_path(&self, out: Option<&PathBuf>, effective: Option<&serde_json::Value>) -> PathBuf {
        out.cloned().unwrap_or_else(|| {
            let mut folder = self.manifest.as_ref().map(|m| m.name.clone()).unwrap_or_else(|| "unpinned".into());
            let weights = self.model.model.weight_dtype();
            if weights != WeightDtype::F32 {
                folder = format!("{folder}-{}", weights.name());
            }
            let differs = |m: &ManifestRun<P, E>| {
                effective.is_none_or(|e| !crate::finding::diff_values(e, &m.parameters, "parameters").is_empty())
            };
            if self.manifest.as_ref().is_some_and(differs) {
                folder.push_str("+custom");
            }
            artifact::default_path(&self.ws.artifacts_dir(), self.experiment, &folder, &self.clock.run_id)
        })
    }

    /// Writes the finished artifact atomically; returns its path.
    pub fn write<T: Serialize>(&self, out: Option<&PathBuf>, artifact: &T) -> Result<PathBuf, PrepareError> {
        let value = serde_json::to_value(artifact).map_err(|e| PrepareError::Artifact(ArtifactError::from(e)))?;
        let path = self.artifact_path(out, value.pointer("/provenance/settings/effective"));
        artifact::write_new(&path, artifact)?;
        Ok(path)
    }
}
