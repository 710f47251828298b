//! The command line: its flags, how they override a manifest's parameters, and what a run records
//! of them. In the library so that the audit can re-read a recorded `argv`.

use crate::study::Parameters;
use clap::Parser;
use common::experiment::{CommandLine, ModelArgs};
use common::policy::Policy;
use common::schedule::RunConfig;
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Scheduler study: serial and batched policies over per-request KV caches, timed step by step")]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Policies to run (repeatable): fifo, interleave, batched. With --chunk-size, every policy
    /// runs with every chunk size. [default: the manifest's runs]
    #[arg(long, value_parser = Policy::parse)]
    pub policy: Vec<Policy>,
    /// Prefill chunk sizes in tokens (repeatable, >= 1) for the --policy runs; for batched, the
    /// step's token budget (decodes included).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub chunk_size: Vec<u64>,
    /// Requests admitted at once, for every run [default: the manifest's].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_active: Option<u64>,
    /// Measured repetitions of every run [default: the manifest's].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: Option<u64>,
    /// Unrecorded repetitions before the measured ones [default: the manifest's].
    #[arg(long)]
    pub warmup: Option<u64>,
    /// The KV cache's budget in positions, for every run (whole blocks of 64): jobs wait for
    /// blocks and are preempted when a step needs more than are free [default: the manifest's].
    #[arg(long, value_name = "POSITIONS", value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub kv_budget: Option<u64>,
    /// Keep full KV blocks for later jobs whose prompts start with the same tokens, in every run
    /// (each run starts with an empty cache) [default: the manifest's].
    #[arg(long)]
    pub prefix_cache: bool,
    /// Sample every job's ids at this temperature instead of greedily (0 is greedy), in every
    /// run [default: the manifest's, else greedy].
    #[arg(long, value_name = "T")]
    pub temperature: Option<f64>,
    /// Keep the K largest logits when sampling (0 keeps all) [default: the manifest's].
    #[arg(long, value_name = "K")]
    pub top_k: Option<u32>,
    /// Keep the fewest most likely ids whose probability reaches P when sampling [default: the
    /// manifest's, else 1].
    #[arg(long, value_name = "P")]
    pub top_p: Option<f64>,
    /// Drop ids less likely than P times the most likely when sampling [default: the manifest's].
    #[arg(long, value_name = "P")]
    pub min_p: Option<f64>,
    /// Divide the logits of ids already in the sequence by this when sampling [default: the
    /// manifest's, else 1].
    #[arg(long, value_name = "R")]
    pub repetition_penalty: Option<f64>,
    /// The sampling seed; job `i` draws with seed + i [default: the manifest's, else 0].
    #[arg(long, value_name = "SEED")]
    pub sampling_seed: Option<u64>,
}

/// Applies the command-line overrides to the manifest's parameters.
impl CommandLine for Args {
    type Parameters = Parameters;

    fn model(&self) -> &ModelArgs {
        &self.model
    }

    fn effective(&self, base: &Parameters) -> Parameters {
        let args = self;
        let mut p = base.clone();
        if !args.policy.is_empty() || !args.chunk_size.is_empty() {
            let policies = if args.policy.is_empty() { Policy::ALL.to_vec() } else { args.policy.clone() };
            let chunks: Vec<Option<usize>> = if args.chunk_size.is_empty() {
                vec![None]
            } else {
                args.chunk_size.iter().map(|c| Some(*c as usize)).collect()
            };
            let max_active = base.runs.first().map(|r| r.max_active).unwrap_or(2);
            let kv_budget = base.runs.first().and_then(|r| r.kv_budget);
            let prefix_cache = base.runs.first().is_some_and(|r| r.prefix_cache);
            p.runs = policies
                .iter()
                .flat_map(|&policy| {
                    chunks.iter().map(move |&chunk_size| RunConfig {
                        policy,
                        chunk_size,
                        max_active,
                        kv_budget,
                        prefix_cache,
                    })
                })
                .collect();
        }
        if let Some(b) = args.kv_budget {
            p.runs.iter_mut().for_each(|r| r.kv_budget = Some(b as usize));
        }
        if args.prefix_cache {
            p.runs.iter_mut().for_each(|r| r.prefix_cache = true);
        }
        if let Some(m) = args.max_active {
            p.runs.iter_mut().for_each(|r| r.max_active = m as usize);
        }
        if let Some(r) = args.rounds {
            p.rounds = r as usize;
        }
        if let Some(w) = args.warmup {
            p.warmup = w as usize;
        }
        let s = &mut p.sampling;
        s.temperature = args.temperature.unwrap_or(s.temperature);
        s.top_k = args.top_k.unwrap_or(s.top_k);
        s.top_p = args.top_p.unwrap_or(s.top_p);
        s.min_p = args.min_p.unwrap_or(s.min_p);
        s.repetition_penalty = args.repetition_penalty.unwrap_or(s.repetition_penalty);
        s.seed = args.sampling_seed.unwrap_or(s.seed);
        p
    }

    /// What the command line asked for, as `provenance.settings.requested` records it.
    fn requested(&self) -> Value {
        let mut requested = json!({
            "policy": self.policy.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "chunk_size": self.chunk_size, "max_active": self.max_active,
            "rounds": self.rounds, "warmup": self.warmup, "model": self.model,
        });
        // Named only when given, so that runs from before the flag read back as they were made.
        if let Some(b) = self.kv_budget {
            requested["kv_budget"] = json!(b);
        }
        if self.prefix_cache {
            requested["prefix_cache"] = json!(true);
        }
        for (name, value) in [
            ("temperature", self.temperature.map(|v| json!(v))),
            ("top_k", self.top_k.map(|v| json!(v))),
            ("top_p", self.top_p.map(|v| json!(v))),
            ("min_p", self.min_p.map(|v| json!(v))),
            ("repetition_penalty", self.repetition_penalty.map(|v| json!(v))),
            ("sampling_seed", self.sampling_seed.map(|v| json!(v))),
        ] {
            if let Some(value) = value {
                requested[name] = value;
            }
        }
        requested
    }
}
