//! The benchmark's parameters (a manifest's `parameters`, an artifact's `arguments`) and their
//! checks.

use super::{RequestRecord, MAX_COUNT};
use common::manifest::Invalid;
use common::policy::Policy;
use common::qwen::{KvBudget, Qwen2};
use common::schedule::RunConfig;
use loadgen::client::Timeouts;
use loadgen::load::Arrivals;
use loadgen::record::{Endpoint, Sampling};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The benchmark's parameters: the manifest's `parameters` and the artifact's `arguments` (the
/// seed's names where it had them; its single `timeout` is split into four).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    /// Unrecorded requests per target before the measured ones.
    pub warmups: usize,
    /// Rounds per concurrency level; a round at concurrency c sends c requests at once.
    pub rounds: usize,
    pub concurrency: Vec<usize>,
    pub max_tokens: usize,
    pub seed: u64,
    pub connect_timeout_s: f64,
    pub first_token_timeout_s: f64,
    pub idle_timeout_s: f64,
    pub total_timeout_s: f64,
    /// The embedded server's concurrent requests and queue length (unused for external targets).
    pub server_max_active: usize,
    pub server_queue: usize,
    /// How the embedded server steps its requests (unused for external targets).
    #[serde(default = "batched")]
    pub server_policy: Policy,
    /// The embedded server's prefill chunk size; for `batched`, its step's token budget. `None`:
    /// whole prompts in one step.
    #[serde(default)]
    pub server_chunk_size: Option<usize>,
    /// The embedded server's KV budget: positions, or bytes of the pool (as the server's own
    /// `--kv-budget` takes it). `None`: its default (half the memory available, at most
    /// `server_max_active` whole contexts). The budget in force is recorded (`embedded_kv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_kv_budget: Option<KvBudget>,
    /// Whether the embedded server reuses cached prompt prefixes (its default); recorded only
    /// when off.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub server_prefix_cache: bool,
    /// An open-loop load in place of the closed rounds (`rounds` and `concurrency` then unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrivals: Option<Arrivals>,
    /// OpenAI's endpoint: chat completions (the seed's) or text completions.
    #[serde(default, skip_serializing_if = "Endpoint::is_chat")]
    pub endpoint: Endpoint,
    /// Ask servers to ignore end-of-sequence, so every answer reaches `max_tokens`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_eos: bool,
    /// Ask OpenAI servers for usage counts with every chunk (`stream_options.continuous_usage_stats`,
    /// vLLM's), so inter-token latency is per token rather than per chunk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continuous_usage: bool,
    /// TLS certificates were not verified (`--insecure`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls_insecure: bool,
    /// Percentiles reported beside the seed's p50, p95 and p99 (e.g. 90, 99.9).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub percentiles: Vec<f64>,
    /// Service-level objectives in milliseconds, by metric (`ttft_ms`, `tpot_ms`, `e2e_ms`): a
    /// request meets them when it succeeded and is within every one; the summary gives the share
    /// that did and, for an open loop, the goodput (such requests per second).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slo: BTreeMap<String, f64>,
    /// Seconds between scrapes of each target's Prometheus `/metrics` during every group (the
    /// first before its first request, the last after its last); `None`: not scraped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_metrics_s: Option<f64>,
    /// The sampling every request asks for; none set: greedy (temperature 0), as the seed's runs.
    #[serde(default, skip_serializing_if = "Sampling::is_greedy_default")]
    pub sampling: Sampling,
    /// Compare the targets' answers request by request (they should serve the same weights,
    /// greedily), keeping every answer's text, and explain each disagreement from
    /// log-probabilities.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub check_agreement: bool,
    /// Watch every CPU for the machine's holds on the client during each open-loop group at a
    /// finite rate (a real-time probe thread per CPU), so that the part of a send delay the
    /// machine held sets apart from the client's own (`machine_stalls`, `send_own_s`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stall_probe: bool,
}

/// The shortest and longest scrape intervals accepted, in seconds.
pub const SCRAPE_INTERVAL_S: (f64, f64) = (0.1, 3600.0);

/// How a metric is read from a request (seconds), `None` where it has none.
pub type Metric = fn(&RequestRecord) -> Option<f64>;

/// The metrics an SLO may bound, with how each is read from a request.
pub const SLO_METRICS: [(&str, Metric); 3] =
    [("ttft_ms", RequestRecord::ttft), ("tpot_ms", RequestRecord::tpot), ("e2e_ms", |r| Some(r.total()))];

/// The longest timeout accepted, in seconds (a week, the workspace's bound on any wait).
pub(crate) const MAX_TIMEOUT_S: f64 = common::manifest::MAX_WAIT_S;

fn batched() -> Policy {
    Policy::Batched
}

impl Parameters {
    /// The embedded server's engine configuration, its KV budget in `model`'s positions.
    pub fn server_engine(&self, model: &Qwen2) -> RunConfig {
        RunConfig {
            policy: self.server_policy,
            chunk_size: self.server_chunk_size,
            max_active: self.server_max_active,
            kv_budget: self.server_kv_budget.map(|b| model.budget_positions(b)),
            prefix_cache: self.server_prefix_cache,
        }
    }

    /// The run's timeouts, each through the one checked conversion.
    pub fn timeouts(&self) -> Result<Timeouts, Invalid> {
        use common::manifest::seconds;
        Ok(Timeouts {
            connect: seconds("connect_timeout_s", self.connect_timeout_s)?,
            first_token: seconds("first_token_timeout_s", self.first_token_timeout_s)?,
            idle: seconds("idle_timeout_s", self.idle_timeout_s)?,
            total: seconds("total_timeout_s", self.total_timeout_s)?,
        })
    }

    /// Which of the workload's items (counted on, before wrapping around them) request `index`
    /// of closed round `round` at `concurrency` sends: the warm-ups take the first, then each
    /// group in run order (rounds, then concurrency levels) the next. Every target sends the
    /// same item there, and no request repeats an earlier one's prompt while the workload has
    /// items left: a repeat would find its whole prompt in a prefix cache, which is not the
    /// traffic a workload of distinct questions describes.
    pub fn closed_item(&self, round: usize, concurrency: usize, index: usize) -> usize {
        let per_round: usize = self.concurrency.iter().fold(0, |n, &c| n.saturating_add(c));
        let before: usize =
            self.concurrency.iter().take_while(|&&c| c != concurrency).fold(0, |n, &c| n.saturating_add(c));
        self.warmups.saturating_add(round.saturating_mul(per_round)).saturating_add(before).saturating_add(index)
    }

    /// Whether every answer's text is kept beside its digest: for comparing answers between
    /// targets, or where stop strings were sent (so that the audit can find one in a text).
    pub fn keeps_text(&self) -> bool {
        self.check_agreement || !self.sampling.stop.is_empty()
    }

    /// One line per problem, naming the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.check_agreement && self.sampling.temperature.is_some_and(|t| t > 0.0) {
            return Err(Invalid::new(
                "check_agreement",
                "compares greedy answers, which sampling makes differ by design; drop the temperature (or set it to 0)",
            ));
        }
        let paced = self.arrivals.as_ref().is_some_and(|a| a.sweep.is_some() || a.rates.iter().any(Option::is_some));
        if self.stall_probe && !paced {
            return Err(Invalid::new(
                "stall_probe",
                "watches the machine under open-loop sends at a finite rate; give --request-rate RATE (or drop --stall-probe)",
            ));
        }
        if self.rounds == 0 {
            return Err(Invalid::new("rounds", "0; must be at least 1"));
        }
        if self.concurrency.is_empty() || self.concurrency.contains(&0) {
            return Err(Invalid::new("concurrency", "every level must be at least 1"));
        }
        let mut levels = std::collections::BTreeSet::new();
        if let Some((i, c)) = self.concurrency.iter().enumerate().find(|(_, c)| !levels.insert(**c)) {
            return Err(Invalid::new(format!("concurrency[{i}]"), format!("level {c} is given twice; give each once")));
        }
        for (name, v, max) in [
            ("rounds", self.rounds, MAX_COUNT),
            ("warmups", self.warmups, MAX_COUNT),
            ("max_tokens", self.max_tokens, MAX_COUNT),
            ("concurrency", self.concurrency.iter().copied().max().unwrap_or(0), MAX_COUNT),
        ] {
            if v > max {
                return Err(Invalid::new(name, format!("{v} is more than {max}; give fewer")));
            }
        }
        if self.max_tokens == 0 {
            return Err(Invalid::new("max_tokens", "0; must be at least 1"));
        }
        for (name, v) in [
            ("connect_timeout_s", self.connect_timeout_s),
            ("first_token_timeout_s", self.first_token_timeout_s),
            ("idle_timeout_s", self.idle_timeout_s),
            ("total_timeout_s", self.total_timeout_s),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_TIMEOUT_S) {
                return Err(Invalid::new(
                    name,
                    format!("{v}; must be a number of seconds above 0 and at most {MAX_TIMEOUT_S}"),
                ));
            }
        }
        if self.server_max_active == 0 {
            return Err(Invalid::new("server_max_active", "0; must be at least 1"));
        }
        if let Some(a) = &self.arrivals {
            a.validate()?;
        }
        if let Some(s) = self.scrape_metrics_s.filter(|s| !(SCRAPE_INTERVAL_S.0..=SCRAPE_INTERVAL_S.1).contains(s)) {
            let (low, high) = SCRAPE_INTERVAL_S;
            return Err(Invalid::new(
                "scrape_metrics_s",
                format!("{s}; must be a number of seconds from {low} to {high}"),
            ));
        }
        if let Some(p) = self.percentiles.iter().find(|p| !(p.is_finite() && **p > 0.0 && **p <= 100.0)) {
            return Err(Invalid::new("percentiles", format!("{p}: a percentile is above 0 and at most 100")));
        }
        for (name, bound) in &self.slo {
            if !SLO_METRICS.iter().any(|(m, _)| m == name) {
                let known: Vec<&str> = SLO_METRICS.iter().map(|(m, _)| *m).collect();
                return Err(Invalid::new(
                    format!("slo.{name}"),
                    format!("not a metric with an SLO; known: {}", known.join(", ")),
                ));
            }
            if !(bound.is_finite() && *bound > 0.0 && *bound <= MAX_TIMEOUT_S * 1000.0) {
                return Err(Invalid::new(format!("slo.{name}"), format!("{bound}: milliseconds above 0")));
            }
        }
        self.sampling.validate()?;
        if self.server_chunk_size == Some(0) {
            return Err(Invalid::new("server_chunk_size", "0; must be at least 1 (or absent for whole prompts)"));
        }
        let block = common::qwen::KvPool::BLOCK_POSITIONS as u64;
        if let Some(KvBudget::Positions(b)) = self.server_kv_budget {
            if b < block || b > 1 << 40 {
                return Err(Invalid::new(
                    "server_kv_budget",
                    format!("{b}: must be at least one block of {block} positions and at most 2^40 (or bytes with a unit: 512MiB)"),
                ));
            }
        }
        Ok(())
    }
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

#[cfg(test)]
mod tests {
    #[test]
    fn closed_rounds_take_items_after_the_warmups_in_run_order_without_repeats() {
        let p = super::super::Parameters {
            warmups: 1,
            rounds: 2,
            concurrency: vec![1, 4],
            ..crate::cli::seed_parameters()
        };
        let sent: Vec<usize> = (0..2)
            .flat_map(|round| [1, 4].into_iter().flat_map(move |c| (0..c).map(move |i| (round, c, i))))
            .map(|(round, c, i)| p.closed_item(round, c, i))
            .collect();
        assert_eq!(sent, (1..11).collect::<Vec<_>>(), "item 0 went to the warm-up; the rest once each");
    }
}
