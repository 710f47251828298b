//! The embedded inference server: OpenAI-compatible (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/version`) and Ollama-compatible (`/api/chat`, `/api/generate`,
//! `/api/version`, `/api/show`, `/api/tags`) over the project's engine, streaming each token
//! when the engine makes it.
//!
//! A crate of its own above `common`, so that any experiment may serve the engine over HTTP and
//! measure it there; `serving-bench` is the first (its embedded target). The `serve` binary runs
//! the server alone ([`cli`]; `serving-bench serve` is its alias).
//!
//! - `engine`: one thread owns all computation and runs the stepping loop the scheduler study
//!   uses, under a policy (continuous batching by default); requests that arrive mid-flight join
//!   the running batch.
//! - `api`: the handlers only validate ([`request`]), tokenize, queue (bounded: a full queue is
//!   a 503 with Retry-After at once) and relay the engine's events. A client that goes away
//!   closes its event channel, and the engine drops its session (and KV cache) before the next
//!   step.
//! - `conn`: connections, with TCP_NODELAY, a bound, and header and idle timeouts.
//! - `metrics`: `/metrics`, the engine's state and latencies for Prometheus scrapers.
//! - `stop`: stop strings matched in the text as it is made, across tokens, never sent.

mod api;
pub mod cli;
mod conn;
mod engine;
mod metrics;
pub mod request;
mod stop;

pub use conn::ConnectionState;
pub use engine::EngineState;

use common::load::LoadedModel;
use common::policy::Policy;
use common::qwen::KvPool;
use common::schedule::RunConfig;
use common::stepper::StepHook;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How the server runs.
#[derive(Clone)]
pub struct ServerConfig {
    /// The name clients must use for the model.
    pub model_name: String,
    /// How the engine steps requests: the same configuration as the scheduler study's runs.
    /// Its `kv_budget` is positions (whole blocks of 64, rounded down), shared by every request:
    /// admission waits for blocks, and a step that needs more than are free preempts the most
    /// recently admitted requests; `None`: [`default_kv_budget`]. Its `prefix_cache` keeps what
    /// requests computed for later prompts with the same prefix ([`common::prefix`]); on by
    /// default, as llama-server, vLLM and SGLang reuse.
    pub engine: RunConfig,
    /// Requests waiting beyond those; more get 503.
    pub queue: usize,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Open connections at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Time a client has for a request's head (from its first byte, or from the connection's
    /// opening for the first request), and again for its body.
    pub header_timeout: Duration,
    /// Time a kept-alive connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// Test seam, see [`StepHook`]; `None` outside tests.
    pub step_hook: Option<StepHook>,
}

/// The KV budget a server takes when none is given, in positions: half the memory available
/// when it starts, and no more than `max_active` requests of the model's whole context need.
pub fn default_kv_budget(model: &LoadedModel, max_active: usize) -> usize {
    let per_position = model.model.position_bytes();
    let memory = common::budget::available_bytes() / 2 / per_position.max(1) as u64;
    let contexts = max_active.saturating_mul(model.config.max_position_embeddings);
    usize::try_from(memory).unwrap_or(usize::MAX).min(contexts)
}

impl ServerConfig {
    /// The server's defaults, written once: [`ServerConfig::new`] and the flags' defaults
    /// ([`cli::ServeArgs`]) both take them from here.
    pub const DEFAULT: ServerConfig = ServerConfig {
        model_name: String::new(),
        engine: RunConfig {
            policy: Policy::Batched,
            chunk_size: None,
            max_active: 16,
            kv_budget: None,
            prefix_cache: true,
        },
        queue: 64,
        max_body_bytes: 1 << 20,
        max_connections: 1024,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(30),
        step_hook: None,
    };

    /// The defaults for a model served as `model_name`.
    pub fn new(model_name: impl Into<String>) -> Self {
        ServerConfig { model_name: model_name.into(), ..Self::DEFAULT }
    }
}

/// What the engine thread needs of the configuration.
#[derive(Clone)]
struct Settings {
    engine: RunConfig,
    kv: Arc<KvPool>,
    metrics: Arc<metrics::Metrics>,
    step_hook: Option<StepHook>,
}

/// What the handlers share.
struct AppState {
    model: Arc<LoadedModel>,
    config: ServerConfig,
    /// The KV pool the engine's sessions share (read here for admission checks and `/health`).
    kv: Arc<KvPool>,
    jobs: mpsc::Sender<engine::Job>,
    engine: Arc<EngineState>,
    metrics: Arc<metrics::Metrics>,
    connections: Arc<ConnectionState>,
    started: chrono::DateTime<chrono::Utc>,
}

/// A server running on a background task (the benchmark's embedded target, and tests).
pub struct Running {
    pub addr: std::net::SocketAddr,
    pub engine: Arc<EngineState>,
    pub connections: Arc<ConnectionState>,
    /// The connection bound in force (lowered from the configured one to fit the process's
    /// file-descriptor limit).
    pub max_connections: usize,
    /// The KV pool its requests share: its size is the budget in force.
    pub kv: Arc<KvPool>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting, lets open answers finish, and waits.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Binds `addr` (port 0 picks a free one), starts the engine thread, and serves until
/// [`Running::stop`] (or until the [`Running`] is dropped).
pub async fn spawn(
    addr: std::net::SocketAddr,
    model: Arc<LoadedModel>,
    config: ServerConfig,
) -> std::io::Result<Running> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let max_connections = fit_to_file_limit(config.max_connections.max(1));
    let limits =
        conn::Limits { max_connections, header_timeout: config.header_timeout, idle_timeout: config.idle_timeout };
    let (jobs_tx, jobs_rx) = mpsc::channel(config.queue.max(1));
    let engine = Arc::new(EngineState::default());
    let run = RunConfig { max_active: config.engine.max_active.max(1), ..config.engine };
    let budget = run.kv_budget.unwrap_or_else(|| default_kv_budget(&model, run.max_active));
    let kv = model.model.kv_pool_within(budget, run.prefix_cache).map_err(std::io::Error::other)?;
    let metrics = Arc::new(metrics::Metrics::new(engine.clone(), kv.clone()));
    let settings =
        Settings { engine: run, kv: kv.clone(), metrics: metrics.clone(), step_hook: config.step_hook.clone() };
    let (engine_model, engine_state) = (model.clone(), engine.clone());
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || engine::run(engine_model, jobs_rx, settings, engine_state))?;
    let connections = Arc::new(ConnectionState::default());
    let state = Arc::new(AppState {
        model,
        config,
        kv: kv.clone(),
        jobs: jobs_tx,
        engine: engine.clone(),
        metrics,
        connections: connections.clone(),
        started: chrono::Utc::now(),
    });
    let router = api::router(state);
    let (shutdown, stop) = watch::channel(false);
    let task = tokio::spawn(conn::serve(listener, router, limits, connections.clone(), stop));
    Ok(Running { addr, engine, connections, max_connections, kv, shutdown, task })
}

/// File descriptors kept for everything but served connections: the model's files, the
/// runtime, the listener, and the connections being refused (at most 16 at once).
const RESERVED_FILES: usize = 32;

/// Raises the soft file-descriptor limit to the hard one (what a server may use without
/// privileges) and returns the connection bound that fits under it.
fn fit_to_file_limit(wanted: usize) -> usize {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // Safety: getrlimit and setrlimit only read and write the struct passed.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
                if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                    limit = raised;
                }
            }
            let files = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
            return wanted.min(files.saturating_sub(RESERVED_FILES).max(1));
        }
    }
    wanted
}
