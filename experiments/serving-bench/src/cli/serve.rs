//! `serving-bench serve`'s flags, and the KV budget they take in positions or bytes.

use super::values::seconds;
use clap::Args;
use common::policy::Policy;
use common::qwen::KvBudget;

#[derive(Args)]
pub struct ServeArgs {
    /// Experiment manifest whose model to serve [default: manifests/serving-bench/tiny.json].
    #[arg(long, value_name = "PATH")]
    pub manifest: Option<std::path::PathBuf>,
    /// Serve this local Qwen2 checkpoint folder instead (verified when --manifest is given too).
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<std::path::PathBuf>,
    /// Never download a model.
    #[arg(long)]
    pub offline: bool,
    /// Weight matrices in f32 (the checkpoint exactly), or f16 / bf16 (half the bytes per step).
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
    #[arg(long, default_value = "batched", value_parser = Policy::parse)]
    pub policy: Policy,
    /// Requests admitted into the engine at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_active: u64,
    /// Prefill chunk size in tokens; for batched, the step's token budget (decodes included).
    /// [default: whole prompts in one step]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub chunk_size: Option<u64>,
    /// Requests waiting beyond the active ones; more are answered 503 with Retry-After.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub queue: u64,
    /// Largest request body in bytes; larger ones are answered 400.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub max_body_bytes: u64,
    /// Open connections at once; more are answered 503 and closed (lowered to fit the process's
    /// file limit).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Seconds a client has to send a request's head (and again its body); slower ones are cut.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub header_timeout: f64,
    /// Seconds a kept-alive connection may stay idle between requests before it is closed.
    #[arg(long, default_value_t = 30.0, value_parser = seconds)]
    pub idle_timeout: f64,
    /// The KV cache's budget, shared by every request: positions (`65536`), or bytes with a unit
    /// (`4GB`, `512MiB`); requests wait for blocks and the most recent are preempted when a
    /// step needs more [default: half the memory available, at most --max-active whole contexts].
    #[arg(long, value_name = "POSITIONS|BYTES", value_parser = kv_budget)]
    pub kv_budget: Option<KvBudget>,
    /// Compute every prompt whole: keep no KV blocks for later prompts with the same prefix
    /// (reuse is on by default, as in llama-server, vLLM and SGLang).
    #[arg(long)]
    pub no_prefix_cache: bool,
}

/// A `--kv-budget` that is neither a count of positions nor bytes with a unit.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a KV budget: give positions (65536) or bytes with a unit (4GB, 512MiB, 1.5GiB)")]
pub struct KvBudgetError(String);

/// A `--kv-budget`: positions (`65536`), or bytes with a unit (`4GB`, `512MiB`, `1.5GiB`).
pub fn kv_budget(s: &str) -> Result<KvBudget, KvBudgetError> {
    let bad = || KvBudgetError(s.to_string());
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return (n > 0).then_some(KvBudget::Positions(n)).ok_or_else(bad);
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).ok_or_else(bad)?;
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        _ => return Err(bad()),
    };
    let bytes = number.trim().parse::<f64>().map_err(|_| bad())? * scale;
    if !(bytes.is_finite() && (1.0..=1e15).contains(&bytes)) {
        return Err(bad());
    }
    Ok(KvBudget::Bytes(bytes as u64))
}
