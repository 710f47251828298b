//! `serving-bench serve`: the embedded server alone, on a port of the user's, until Ctrl-C.

use crate::cli::ServeArgs;
use crate::measure::model_name;
use crate::ServingBench;
use anyhow::{Context, Result};
use common::experiment::{load_model, ModelArgs};
use common::qwen::KvPool;
use serve::ServerConfig;
use std::io::Write;

/// Loads the model, starts the server, says where and how it serves, and stops it cleanly
/// (open streams finished) on Ctrl-C.
pub async fn serve(args: ServeArgs) -> Result<()> {
    let model_args = ModelArgs {
        manifest: args.manifest,
        model_dir: args.model_dir,
        out: None,
        offline: args.offline,
        dtype: args.dtype,
    };
    let model = load_model(&ServingBench, &model_args)?;
    let name = model_name(&model.resolved);
    let config = ServerConfig {
        policy: args.policy,
        max_active: args.max_active as usize,
        chunk_size: args.chunk_size.map(|c| c as usize),
        queue: args.queue as usize,
        max_body_bytes: args.max_body_bytes as usize,
        max_connections: args.max_connections as usize,
        header_timeout: common::manifest::seconds("--header-timeout", args.header_timeout)?,
        idle_timeout: common::manifest::seconds("--idle-timeout", args.idle_timeout)?,
        kv_budget: args.kv_budget.map(|b| model.loaded.model.budget_positions(b)),
        prefix_cache: !args.no_prefix_cache,
        ..ServerConfig::new(name.clone())
    };
    if !args.host.is_loopback() {
        eprintln!(
            "warning: binding {}: the server is reachable from the network, without authentication; use --host 127.0.0.1 to keep it local",
            args.host
        );
    }
    let running = serve::spawn((args.host, args.port).into(), model.loaded, config)
        .await
        .with_context(|| format!("cannot bind {}:{}; pick another --port", args.host, args.port))?;
    // Listen for Ctrl-C before announcing the address: an interrupt sent as soon as the address
    // is known must stop the server cleanly, not kill it before the handler exists.
    #[cfg(unix)]
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
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
    tokio::signal::ctrl_c().await?;
    // Whoever started us may have stopped reading our output; that is no reason to fail.
    let _ = writeln!(std::io::stdout(), "stopping: finishing open streams");
    running.stop().await;
    Ok(())
}
