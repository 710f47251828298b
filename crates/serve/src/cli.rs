//! The server's command line (the `serve` binary, and `serving-bench serve`, its alias): its
//! flags, with the defaults of [`ServerConfig::new`] and the KV budget in [`KvBudget`]'s one
//! syntax (positions or bytes), and [`run`], which serves until Ctrl-C.

use crate::ServerConfig;
use clap::Args;
use common::experiment::{load_model, ModelArgs, PrepareError};
use common::policy::Policy;
use common::qwen::{KvBudget, KvPool};
use common::schedule::RunConfig;
use std::io::Write;
use std::path::Path;

/// The manifest whose model is served when none is named.
const DEFAULT_MANIFEST: &str = "serving-bench/tiny.json";

#[derive(Args)]
pub struct ServeArgs {
    /// Experiment manifest (any experiment's) whose pinned model to serve
    /// [default: manifests/serving-bench/tiny.json].
    #[arg(long, value_name = "PATH")]
    pub manifest: Option<std::path::PathBuf>,
    /// Serve this local model instead: a Qwen2 checkpoint folder or a GGUF file, Qwen2 or Llama
    /// (verified when --manifest is given too).
    #[arg(long, value_name = "PATH")]
    pub model_dir: Option<std::path::PathBuf>,
    /// Never download a model.
    #[arg(long)]
    pub offline: bool,
    /// Weight matrices in f32 (the checkpoint exactly), f16 / bf16 (half the bytes per step), or
    /// native (a GGUF file's Q8_0/Q4_0/Q4_1 blocks computed on where they lie in the file).
    #[arg(long, default_value = "f32", value_parser = common::qwen::WeightDtype::parse)]
    pub dtype: common::qwen::WeightDtype,
    /// Address to bind; anything but loopback exposes the server to the network (a warning says
    /// so).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// How the engine steps admitted requests: batched (every request in each step, new ones
    /// joining as slots free), interleave (one request per step, in turn), or fifo (one request
    /// to completion at a time).
    #[arg(long, default_value = ServerConfig::DEFAULT.engine.policy.name(), value_parser = Policy::parse)]
    pub policy: Policy,
    /// Requests admitted into the engine at once.
    #[arg(long, default_value_t = ServerConfig::DEFAULT.engine.max_active as u64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_active: u64,
    /// Prefill chunk size in tokens; for batched, the step's token budget (decodes included).
    /// [default: whole prompts in one step]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub chunk_size: Option<u64>,
    /// Requests waiting beyond the active ones; more are answered 503 with Retry-After.
    #[arg(long, default_value_t = ServerConfig::DEFAULT.queue as u64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub queue: u64,
    /// Largest request body in bytes; larger ones are answered 400.
    #[arg(long, default_value_t = ServerConfig::DEFAULT.max_body_bytes as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub max_body_bytes: u64,
    /// Open connections at once; more are answered 503 and closed (lowered to fit the process's
    /// file limit).
    #[arg(long, default_value_t = ServerConfig::DEFAULT.max_connections as u64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Seconds a client has to send a request's head (and again its body); slower ones are cut.
    #[arg(long, default_value_t = ServerConfig::DEFAULT.header_timeout.as_secs_f64(), value_parser = seconds)]
    pub header_timeout: f64,
    /// Seconds a kept-alive connection may stay idle between requests before it is closed.
    #[arg(long, default_value_t = ServerConfig::DEFAULT.idle_timeout.as_secs_f64(), value_parser = seconds)]
    pub idle_timeout: f64,
    /// The KV cache's budget, shared by every request: positions (`65536`), or bytes with a unit
    /// (`4GB`, `512MiB`); requests wait for blocks and the most recent are preempted when a
    /// step needs more [default: half the memory available, at most --max-active whole contexts].
    #[arg(long, value_name = "POSITIONS|BYTES", value_parser = KvBudget::parse)]
    pub kv_budget: Option<KvBudget>,
    /// Compute every prompt whole: keep no KV blocks for later prompts with the same prefix
    /// (reuse is on by default, as in llama-server, vLLM and SGLang).
    #[arg(long)]
    pub no_prefix_cache: bool,
}

/// A timeout flag: a positive number of seconds, at most a week.
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    match common::manifest::seconds("seconds", v) {
        Ok(_) if v > 0.0 => Ok(v),
        _ => Err(format!("{v}: must be above 0 and at most {} seconds (a week)", common::manifest::MAX_WAIT_S)),
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Model(#[from] PrepareError),
    #[error("{0}")]
    Flag(#[from] common::manifest::Invalid),
    #[error("cannot bind {addr}: {cause}; pick another --port")]
    Bind { addr: String, cause: std::io::Error },
    #[error("cannot listen for Ctrl-C: {0}")]
    Signal(std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Loads the model, starts the server, says where and how it serves, and stops it cleanly
/// (open streams finished) on Ctrl-C.
pub async fn run(args: ServeArgs) -> Result<(), ServeError> {
    let model_args = ModelArgs {
        manifest: args.manifest,
        model_dir: args.model_dir,
        out: None,
        offline: args.offline,
        dtype: args.dtype,
    };
    let model = load_model(&model_args, Path::new(DEFAULT_MANIFEST))?;
    let name = model.name();
    let config = ServerConfig {
        engine: RunConfig {
            policy: args.policy,
            chunk_size: args.chunk_size.map(|c| c as usize),
            max_active: args.max_active as usize,
            kv_budget: args.kv_budget.map(|b| model.loaded.model.budget_positions(b)),
            prefix_cache: !args.no_prefix_cache,
        },
        queue: args.queue as usize,
        max_body_bytes: args.max_body_bytes as usize,
        max_connections: args.max_connections as usize,
        header_timeout: common::manifest::seconds("--header-timeout", args.header_timeout)?,
        idle_timeout: common::manifest::seconds("--idle-timeout", args.idle_timeout)?,
        ..ServerConfig::new(name.clone())
    };
    if !args.host.is_loopback() {
        eprintln!(
            "warning: binding {}: the server is reachable from the network, without authentication; use --host 127.0.0.1 to keep it local",
            args.host
        );
    }
    let running = crate::spawn((args.host, args.port).into(), model.loaded, config)
        .await
        .map_err(|cause| ServeError::Bind { addr: format!("{}:{}", args.host, args.port), cause })?;
    // Listen for Ctrl-C before announcing the address: an interrupt sent as soon as the address
    // is known must stop the server cleanly, not kill it before the handler exists.
    #[cfg(unix)]
    let mut interrupt =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(ServeError::Signal)?;
    println!(
        "serving `{name}` on http://{} (OpenAI /v1/chat/completions and /v1/completions, Ollama /api/chat and /api/generate); policy {}, up to {} active, {} connections; Ctrl-C stops",
        running.addr,
        args.policy.name(),
        args.max_active,
        running.max_connections
    );
    let kv = &running.kv;
    println!(
        "KV cache: {} positions in {} blocks of {} ({}), {}",
        kv.positions(),
        kv.blocks(),
        KvPool::BLOCK_POSITIONS,
        common::budget::human((kv.blocks() * kv.block_bytes()) as u128),
        if args.kv_budget.is_some() { "from --kv-budget" } else { "half the memory available (--kv-budget sets it)" }
    );
    println!(
        "prefix cache: {}",
        if kv.reuses_prefixes() {
            "on: every prompt's and answer's positions are kept and reused by later prompts that start the same (--no-prefix-cache turns it off)"
        } else {
            "off (--no-prefix-cache)"
        }
    );
    #[cfg(unix)]
    interrupt.recv().await;
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await.map_err(ServeError::Signal)?;
    // Whoever started us may have stopped reading our output; that is no reason to fail.
    let _ = writeln!(std::io::stdout(), "stopping: finishing open streams");
    running.stop().await;
    Ok(())
}
