//! The provenance block every artifact carries: which code, build, machine, model and manifest
//! produced the numbers, and when. It is what lets a reviewer decide whether two artifacts are
//! comparable and whether one is stale.

use chrono::{SecondsFormat, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use supply::pin::PinnedFile;
use supply::resolve::{Origin, ResolvedModel};
use supply::workspace::Workspace;

/// Bumped whenever the provenance or an artifact layout changes incompatibly.
pub(crate) const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub schema_version: u32,
    pub experiment: String,
    pub run_id: String,
    /// UTC, RFC 3339.
    pub started_at: String,
    pub finished_at: String,
    /// The command line, with home paths and secrets redacted.
    pub argv: Vec<String>,
    pub settings: Settings,
    /// `None` when the run was not inside a git checkout.
    pub git: Option<GitState>,
    pub source: SourceInfo,
    pub build: BuildInfo,
    pub host: Host,
    /// Worker threads candle computes with.
    pub threads: usize,
    /// `None` when the experiment ran no model of ours (a benchmark of external servers).
    pub model: Option<ModelRecord>,
    /// `None` for runs without a manifest (`--model-dir`).
    pub manifest: Option<ManifestRecord>,
}

/// What the user asked for and what the run actually used (defaults filled in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub requested: Value,
    pub effective: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitState {
    pub commit: String,
    /// Uncommitted changes among the hashed source paths at run time.
    pub dirty_paths: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceInfo {
    /// SHA-256 of the experiment crate + `common` + `Cargo.lock` (see the source-hash crate).
    pub sha256: String,
    pub files: usize,
    /// The experiment crate, relative to the workspace root.
    pub crate_dir: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildInfo {
    pub rustc: String,
    pub target: String,
    pub profile: String,
    pub features: Vec<String>,
    pub candle: String,
    pub tokenizers: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub os: String,
    pub os_version: String,
    pub kernel: String,
    pub arch: String,
    pub cpu_model: String,
    pub physical_cores: Option<usize>,
    pub logical_cores: usize,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelRecord {
    /// The pin's name; `None` when unpinned.
    pub name: Option<String>,
    pub repo: Option<String>,
    pub revision: Option<String>,
    /// Whether the files were verified against a pin (else only digested).
    pub pinned: bool,
    pub origin: Origin,
    /// The files as verified (pinned) or as found (unpinned).
    pub files: Vec<PinnedFile>,
    /// What the weight matrices were held in for the run: `f32` is the checkpoint exactly;
    /// results of any other dtype are not comparable with F32 references.
    #[serde(default)]
    pub weights: supply::weights::WeightDtype,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManifestRecord {
    /// Relative to the workspace root.
    pub path: String,
    pub sha256: String,
    /// The model pin file (`manifests/models/<name>.json`) and its SHA-256.
    pub model_pin_path: String,
    pub model_pin_sha256: String,
}

/// Build facts of the calling experiment binary, baked in by its `build.rs`
/// (`source_hash::build_script()`). A macro so that `env!` reads the experiment's variables.
#[macro_export]
macro_rules! build_facts {
    () => {
        $crate::provenance::BuildFacts {
            source_sha256: env!("SOURCE_SHA256"),
            source_files: env!("SOURCE_FILES"),
            crate_dir: env!("SOURCE_CRATE_DIR"),
            rustc: env!("BUILD_RUSTC"),
            target: env!("BUILD_TARGET"),
            profile: env!("BUILD_PROFILE"),
            features: env!("BUILD_FEATURES"),
        }
    };
}

/// Raw build facts as compiled into an experiment (see [`build_facts!`]).
#[derive(Debug, Clone, Copy)]
pub struct BuildFacts {
    pub source_sha256: &'static str,
    pub source_files: &'static str,
    pub crate_dir: &'static str,
    pub rustc: &'static str,
    pub target: &'static str,
    pub profile: &'static str,
    pub features: &'static str,
}

impl BuildFacts {
    pub fn source(&self) -> SourceInfo {
        SourceInfo {
            sha256: self.source_sha256.to_string(),
            files: self.source_files.parse().unwrap_or(0),
            crate_dir: self.crate_dir.to_string(),
        }
    }

    pub fn build(&self) -> BuildInfo {
        BuildInfo {
            rustc: self.rustc.to_string(),
            target: self.target.to_string(),
            profile: self.profile.to_string(),
            features: self.features.split(',').filter(|f| !f.is_empty()).map(str::to_string).collect(),
            candle: LIBRARIES.0.to_string(),
            tokenizers: LIBRARIES.1.to_string(),
        }
    }
}

/// The versions of candle and tokenizers in this workspace's `Cargo.lock`, as every build records
/// them (the same lock, and so the same versions, for any artifact whose source hash is today's).
pub const LIBRARIES: (&str, &str) = (env!("CANDLE_VERSION"), env!("TOKENIZERS_VERSION"));

/// A run in progress: fixes its id and start time when it begins.
#[derive(Debug, Clone)]
pub struct RunClock {
    pub run_id: String,
    pub started_at: String,
}

impl RunClock {
    pub fn start() -> Self {
        let now = Utc::now();
        // The seed's run id format, plus a short suffix so that two runs in one second differ.
        let suffix = (now.timestamp_subsec_nanos() ^ std::process::id().rotate_left(16)) & 0xffff;
        RunClock {
            run_id: format!("{}-{suffix:04x}", now.format("%Y%m%dT%H%M%SZ")),
            started_at: now.to_rfc3339_opts(SecondsFormat::Millis, true),
        }
    }
}

/// A time as provenance writes it (RFC 3339), read back; `None` when it is not one.
pub fn parse_time(s: &str) -> Option<chrono::DateTime<Utc>> {
    chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| t.with_timezone(&Utc))
}

impl Provenance {
    /// Seconds from the run's start to its end, as its recorded times say: every clock the run
    /// read on its way lies within them.
    pub fn wall_s(&self) -> Option<f64> {
        let (start, end) = (parse_time(&self.started_at)?, parse_time(&self.finished_at)?);
        Some((end - start).num_microseconds()? as f64 / 1e6)
    }
}

pub fn now_utc() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The model part of the record.
pub(crate) fn model_record(model: &ResolvedModel, weights: supply::weights::WeightDtype) -> ModelRecord {
    ModelRecord {
        name: model.pin.as_ref().map(|p| p.name.clone()),
        repo: model.pin.as_ref().map(|p| p.repo.clone()),
        revision: model.pin.as_ref().map(|p| p.revision.clone()),
        pinned: model.pin.is_some(),
        origin: model.origin,
        files: model.files.clone(),
        weights,
    }
}

/// The machine, as far as it matters for timings.
pub fn host() -> Host {
    use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(
        RefreshKind::nothing().with_cpu(CpuRefreshKind::nothing()).with_memory(MemoryRefreshKind::nothing().with_ram()),
    );
    Host {
        os: System::name().unwrap_or_else(|| std::env::consts::OS.to_string()),
        os_version: System::os_version().unwrap_or_default(),
        kernel: System::kernel_version().unwrap_or_default(),
        arch: std::env::consts::ARCH.to_string(),
        cpu_model: sys.cpus().first().map(|c| c.brand().trim().to_string()).unwrap_or_default(),
        physical_cores: sys.physical_core_count(),
        logical_cores: sys.cpus().len(),
        memory_bytes: sys.total_memory(),
    }
}

/// The commit and the uncommitted changes among `paths` (relative to the workspace root).
pub(crate) fn git_state(root: &Path, paths: &[String]) -> Option<GitState> {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").arg("-C").arg(root).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let commit = git(&["rev-parse", "HEAD"])?.trim().to_string();
    let mut args = vec!["status", "--porcelain=v1", "--untracked-files=all", "--"];
    args.extend(paths.iter().map(String::as_str));
    let status = git(&args)?;
    let dirty_paths = status.lines().filter(|l| l.len() > 3).map(|l| l[3..].to_string()).collect();
    Some(GitState { commit, dirty_paths })
}

/// Everything a provenance block needs that an experiment knows.
pub struct RunFacts<'a> {
    pub experiment: &'a str,
    pub clock: RunClock,
    pub facts: BuildFacts,
    pub requested: Value,
    pub effective: Value,
    pub model: Option<&'a ResolvedModel>,
    /// The dtype the model's weights were held in.
    pub weights: supply::weights::WeightDtype,
    pub manifest: Option<ManifestRecord>,
    /// The engine's worker threads.
    pub threads: usize,
    /// The command line to record ([`argv`] unless the experiment redacts flag values).
    pub argv: Vec<String>,
}

/// This process's command line, as most runs record it.
pub fn argv() -> Vec<String> {
    std::env::args().collect()
}

/// Assembles the provenance block at the end of a run.
pub fn collect(ws: &Workspace, run: RunFacts<'_>) -> Provenance {
    let source = run.facts.source();
    let git = git_state(&ws.root, &source_hash::hashed_roots(&ws.root, &source.crate_dir).unwrap_or_default());
    Provenance {
        schema_version: SCHEMA_VERSION,
        experiment: run.experiment.to_string(),
        run_id: run.clock.run_id,
        started_at: run.clock.started_at,
        finished_at: now_utc(),
        argv: run.argv,
        settings: Settings { requested: run.requested, effective: run.effective },
        git,
        source,
        build: run.facts.build(),
        host: host(),
        threads: run.threads,
        model: run.model.map(|m| model_record(m, run.weights)),
        manifest: run.manifest,
    }
}
