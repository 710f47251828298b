//! The shared start and end of every experiment binary: read the manifest, make the effective
//! parameters and check them and the claims, find and verify the model, load it; at the end,
//! stamp provenance and write the artifact. An experiment's `main` is then args, [`prepare`], its
//! own measurement, [`Prepared::provenance`] and [`Prepared::write`].

use super::{CommandLine, Experiment, ExperimentError};
use crate::artifact::{self, ArtifactError};
use crate::claim::Claim;
use crate::load::{LoadError, LoadedModel};
use crate::manifest::{
    manifest_name, manifest_sha256, read_manifest_file, ExperimentManifest, ManifestError, ManifestFile,
};
use crate::provenance::{self, BuildFacts, ManifestRecord, Provenance, RunClock, RunFacts};
use crate::qwen::WeightDtype;
use crate::resolve::{resolve, resolve_unpinned, ResolveError, ResolveOptions, ResolvedModel};
use crate::workspace::{Workspace, WorkspaceError};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Model and output flags shared by every experiment.
// The field docs are the `--help` text, where `<name>` is the usual placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct ModelArgs {
    /// Experiment manifest to run [default: manifests/<experiment>/tiny.json].
    #[arg(long, value_name = "PATH")]
    pub manifest: Option<PathBuf>,
    /// A local model: a Hugging Face Qwen2 checkpoint folder, or a GGUF file (Qwen2 or Llama:
    /// an Ollama blob, a llama.cpp download) or a folder holding one. With --manifest it is
    /// verified against the manifest's pin; without, the run is unpinned and records the digests
    /// it computed.
    #[arg(long, value_name = "PATH")]
    pub model_dir: Option<PathBuf>,
    /// Write the artifact here [default: artifacts/<experiment>/<manifest>/<run_id>.json].
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// Never download a model (also `HF_HUB_OFFLINE=1`).
    #[arg(long)]
    pub offline: bool,
    /// What to hold the weight matrices in: f32 (the checkpoint exactly, comparable with the
    /// F32 references), or f16 / bf16 (half the bytes per step; F32 activations and
    /// accumulation; bf16 holds BF16-stored checkpoints exactly), or native (a GGUF file's
    /// Q8_0/Q4_0/Q4_1 blocks computed on in place, activations in 8-bit blocks; other types in
    /// f32). Reduced-precision and native artifacts go
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
    #[error("{experiment} has no parameters of its own for a run without a manifest; pass --manifest (see manifests/{experiment}/)")]
    NeedsManifest { experiment: &'static str },
    #[error(
        "no model to run on: pass --manifest (a pinned model) or --model-dir (a checkpoint folder or a GGUF file)"
    )]
    NoModel,
    /// Effective parameters out of range; `origin` is the manifest (or `parameters`).
    #[error("{origin}: {cause}")]
    Parameters { origin: String, cause: crate::manifest::Invalid },
    #[error(transparent)]
    Claims(#[from] ExperimentError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("model in {dir}: {cause}")]
    Load { dir: String, cause: LoadError },
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
}

/// The manifest a run follows.
pub struct ManifestRun<E: Experiment> {
    pub path: PathBuf,
    pub name: String,
    pub manifest: ExperimentManifest<E::Parameters, E::Expectations>,
    pub record: ManifestRecord,
    /// The manifest's parameters as written: a run whose effective parameters differ is a custom
    /// run, written beside the manifest's own (`<manifest>+custom/`).
    pub parameters: serde_json::Value,
}

/// The model a run measures: where it was found (verified), and the model loaded from there.
pub struct Model {
    pub resolved: ResolvedModel,
    /// Shared, so that a server can hold it while the run still reports on `resolved`.
    pub loaded: Arc<LoadedModel>,
}

/// What a [`Prepared`] holds in its model's place: a [`Model`] (from [`prepare`]), or an
/// `Option<Model>` for a run whose model is optional ([`Prepared::prepare_optional`]).
pub trait ModelSlot {
    fn get(&self) -> Option<&Model>;
}

impl ModelSlot for Model {
    fn get(&self) -> Option<&Model> {
        Some(self)
    }
}

impl ModelSlot for Option<Model> {
    fn get(&self) -> Option<&Model> {
        self.as_ref()
    }
}

/// Everything an experiment needs before it measures: the workspace, the run's clock, the
/// manifest, the effective parameters (checked), the manifest's claims (checked against the
/// experiment's names), and the model (`M`: see [`ModelSlot`]).
pub struct Prepared<E: Experiment, M = Model> {
    pub experiment: &'static str,
    pub ws: Workspace,
    pub clock: RunClock,
    pub manifest: Option<ManifestRun<E>>,
    /// The manifest's parameters (or, without one, the experiment's defaults) with the command
    /// line's overrides, validated.
    pub parameters: E::Parameters,
    /// The manifest's claims, to be judged on the run's rounds (none without a manifest).
    pub claims: Vec<Claim>,
    pub model: M,
    /// `--out`: where the artifact goes instead of its default path.
    pub out: Option<PathBuf>,
    requested: serde_json::Value,
    argv: Vec<String>,
    weights: WeightDtype,
}

/// Reads the manifest (unless an unpinned `--model-dir` run), makes and checks the effective
/// parameters and the claims, resolves and verifies the model, and loads it.
pub fn prepare<E: Experiment>(experiment: &E, args: &E::Args) -> Result<Prepared<E>, PrepareError> {
    let started = start(experiment, args, true)?;
    let model = prepare_model(&started.ws, args.model(), started.manifest.as_ref().map(|m| &m.manifest.model))?;
    Ok(started.with_model(model))
}

impl<E: Experiment> Prepared<E, Option<Model>> {
    /// [`prepare`] for a run whose model is optional: the model is loaded when `load` says so
    /// (with a manifest's own, or `--model-dir`); otherwise a manifest is read only when
    /// `--manifest` names one, and without one the experiment's default parameters apply.
    pub fn prepare_optional(experiment: &E, args: &E::Args, load: bool) -> Result<Self, PrepareError> {
        let started = start(experiment, args, load)?;
        let model = match load {
            true => {
                Some(prepare_model(&started.ws, args.model(), started.manifest.as_ref().map(|m| &m.manifest.model))?)
            }
            false => None,
        };
        Ok(started.with_model(model))
    }
}

/// The manifest (`manifests/<experiment>/tiny.json` when neither `--manifest` nor `--model-dir`
/// is given and `default_manifest` allows it), the effective parameters and the claims.
fn start<E: Experiment>(
    experiment: &E,
    args: &E::Args,
    default_manifest: bool,
) -> Result<Prepared<E, ()>, PrepareError> {
    let model_args = args.model();
    model_args.check_out()?;
    let clock = RunClock::start();
    let ws = Workspace::discover()?;
    let manifest = read_manifest::<E>(&ws, model_args, default_manifest)?;
    let base = match &manifest {
        Some(m) => m.manifest.parameters.clone(),
        None => experiment.default_parameters().ok_or(PrepareError::NeedsManifest { experiment: E::NAME })?,
    };
    let parameters = args.effective(&base);
    experiment.validate(&parameters).map_err(|cause| PrepareError::Parameters {
        origin: manifest.as_ref().map(|m| m.record.path.clone()).unwrap_or_else(|| "parameters".into()),
        cause,
    })?;
    let claims = match &manifest {
        Some(run) => {
            let names = experiment.claim_vocabulary(&run.manifest.parameters);
            crate::claim::check(&run.manifest.claims, &names).map_err(|e| {
                ExperimentError::Invalid(crate::manifest::Invalid::new(
                    format!("{}: {}", run.record.path, e.field),
                    e.problem,
                ))
            })?;
            run.manifest.claims.clone()
        }
        None => Vec::new(),
    };
    Ok(Prepared {
        experiment: E::NAME,
        ws,
        clock,
        manifest,
        parameters,
        claims,
        model: (),
        out: model_args.out.clone(),
        requested: args.requested(),
        argv: args.recorded_argv(provenance::argv()),
        weights: model_args.dtype,
    })
}

/// The manifest `--manifest` names (or, when neither it nor `--model-dir` is given and
/// `default_manifest` allows it, `manifests/<experiment>/tiny.json`), checked to be the
/// experiment's, with the record provenance keeps of it and its model pin.
fn read_manifest<E: Experiment>(
    ws: &Workspace,
    args: &ModelArgs,
    default_manifest: bool,
) -> Result<Option<ManifestRun<E>>, PrepareError> {
    let path = match (&args.manifest, &args.model_dir) {
        (Some(path), _) => path.clone(),
        (None, None) if default_manifest => ws.manifests_dir().join(E::NAME).join("tiny.json"),
        (None, _) => return Ok(None),
    };
    let ManifestFile { manifest, parameters, sha256 } = read_manifest_file::<E::Parameters, E::Expectations>(&path)?;
    if manifest.experiment != E::NAME {
        return Err(PrepareError::WrongExperiment {
            path: path.display().to_string(),
            found: manifest.experiment,
            expected: E::NAME.to_string(),
        });
    }
    let pin = ws.model_pin(&manifest.model)?;
    let pin_path = ws.manifests_dir().join("models").join(format!("{}.json", pin.name));
    let record = ManifestRecord {
        path: ws.relative(&path)?,
        sha256,
        model_pin_path: ws.display_path(&pin_path),
        model_pin_sha256: manifest_sha256(&pin_path)?,
    };
    let name = manifest_name(&path);
    Ok(Some(ManifestRun { path, name, manifest, record, parameters }))
}

/// The model alone, for a command that measures nothing (a server): the pinned model of the
/// manifest given (any experiment's), of `default_manifest` (under `manifests/`) without
/// `--manifest` or `--model-dir`, or an unpinned `--model-dir`.
pub fn load_model(args: &ModelArgs, default_manifest: &Path) -> Result<Model, PrepareError> {
    let ws = Workspace::discover()?;
    let path = match (&args.manifest, &args.model_dir) {
        (Some(path), _) => Some(path.clone()),
        (None, None) => Some(ws.manifests_dir().join(default_manifest)),
        (None, Some(_)) => None,
    };
    let model = match path {
        Some(path) => Some(read_manifest_file::<serde_json::Value, serde_json::Value>(&path)?.manifest.model),
        None => None,
    };
    prepare_model(&ws, args, model.as_ref())
}

impl Model {
    /// The name clients use for the model: its pin's, or its folder's when unpinned.
    pub fn name(&self) -> String {
        self.resolved.pin.as_ref().map(|p| p.name.clone()).unwrap_or_else(|| {
            self.resolved.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
        })
    }
}

impl<E: Experiment> Prepared<E, ()> {
    fn with_model<M: ModelSlot>(self, model: M) -> Prepared<E, M> {
        let weights = model.get().map_or(self.weights, |m| m.loaded.model.weight_dtype());
        let Prepared { experiment, ws, clock, manifest, parameters, claims, out, requested, argv, .. } = self;
        Prepared { experiment, ws, clock, manifest, parameters, claims, model, out, requested, argv, weights }
    }
}

/// The model of a run: the manifest's pinned model (`pinned`, the manifest's `model`), found and
/// verified, or an unpinned `--model-dir` (its digests computed); then loaded in the weight
/// dtype asked for.
fn prepare_model(ws: &Workspace, args: &ModelArgs, pinned: Option<&String>) -> Result<Model, PrepareError> {
    let resolved = match pinned {
        Some(name) => {
            let pin = ws.model_pin(name)?;
            let opts = ResolveOptions {
                model_dir: args.model_dir.clone(),
                offline: args.offline,
                generate_missing: true,
                hub_cache: None,
            };
            resolve(ws, &pin, &opts)?
        }
        None => match &args.model_dir {
            Some(dir) => resolve_unpinned(dir)?,
            None => return Err(PrepareError::NoModel),
        },
    };
    tracing::info!(dir = %ws.display_path(&resolved.dir), "loading model");
    let model = LoadedModel::load_as(&resolved.dir, args.dtype)
        .map_err(|cause| PrepareError::Load { dir: ws.display_path(&resolved.dir), cause })?;
    Ok(Model { resolved, loaded: Arc::new(model) })
}

impl<E: Experiment, M: ModelSlot> Prepared<E, M> {
    /// `<experiment>/<manifest>` (`unpinned` without one), as tables name a run.
    pub fn manifest_label(&self) -> String {
        format!("{}/{}", self.experiment, self.manifest.as_ref().map(|m| m.name.as_str()).unwrap_or("unpinned"))
    }

    /// The manifest's expectations, when it has them.
    pub fn expectations(&self) -> Option<&E::Expectations> {
        self.manifest.as_ref().and_then(|m| m.manifest.expectations.as_ref())
    }

    /// The model's folder as artifacts name an unpinned model, or the pinned repository.
    pub fn model_id(&self) -> String {
        match self.model.get() {
            Some(m) => {
                m.resolved.pin.as_ref().map(|p| p.repo.clone()).unwrap_or_else(|| self.ws.display_path(&m.resolved.dir))
            }
            None => String::new(),
        }
    }

    /// The provenance block for this run, to be embedded in the artifact: what the command line
    /// asked for, the effective parameters, the model, the manifest, the build.
    pub fn provenance(&self, facts: BuildFacts) -> Result<Provenance, PrepareError> {
        let effective =
            serde_json::to_value(&self.parameters).map_err(|e| PrepareError::Artifact(ArtifactError::from(e)))?;
        Ok(provenance::collect(
            &self.ws,
            RunFacts {
                experiment: self.experiment,
                clock: self.clock.clone(),
                facts,
                requested: self.requested.clone(),
                effective,
                model: self.model.get().map(|m| &m.resolved),
                weights: self.weights,
                manifest: self.manifest.as_ref().map(|m| m.record.clone()),
                threads: crate::engine_threads(),
                argv: self.argv.clone(),
            },
        ))
    }

    /// Where the artifact goes: `--out`, or `artifacts/<experiment>/<manifest>/<run_id>.json`
    /// (`unpinned` in place of the manifest for `--model-dir` runs, `external` for a run with
    /// neither a manifest nor a model; `<manifest>-<dtype>` with half-precision weights, so
    /// reduced-precision results never sit among the F32 ones; `<manifest>+custom` when
    /// `effective` parameters differ from the manifest's, so a run with overrides never sits
    /// among the manifest's own).
    fn artifact_path(&self, effective: Option<&serde_json::Value>) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            let mut folder = match (&self.manifest, self.model.get()) {
                (Some(m), _) => m.name.clone(),
                (None, Some(_)) => "unpinned".into(),
                (None, None) => "external".into(),
            };
            if self.model.get().is_some() && self.weights != WeightDtype::F32 {
                folder = format!("{folder}-{}", self.weights.name());
            }
            let differs = |m: &ManifestRun<E>| {
                effective.is_none_or(|e| !crate::finding::diff_values(e, &m.parameters, "parameters").is_empty())
            };
            if self.manifest.as_ref().is_some_and(differs) {
                folder.push_str("+custom");
            }
            artifact::default_path(&self.ws.artifacts_dir(), self.experiment, &folder, &self.clock.run_id)
        })
    }

    /// Writes the finished artifact atomically (to `--out` when given); returns its path.
    pub fn write(&self, artifact: &E::Artifact) -> Result<PathBuf, PrepareError> {
        let value = serde_json::to_value(artifact).map_err(|e| PrepareError::Artifact(ArtifactError::from(e)))?;
        let path = self.artifact_path(value.pointer("/provenance/settings/effective"));
        artifact::write_new(&path, artifact)?;
        Ok(path)
    }
}
