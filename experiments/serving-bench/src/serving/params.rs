//! The benchmark's parameters (a manifest's `parameters`, an artifact's `arguments`) and their
//! checks.

use super::record::RequestRecord;
use common::manifest::Invalid;
use common::policy::Policy;
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
    /// The embedded server's KV budget in positions. `None`: its default (half the memory
    /// available, at most `server_max_active` whole contexts), which the artifact records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_kv_budget: Option<usize>,
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

/// The sampling settings sent with every request, by their OpenAI (and vLLM) names; Ollama gets
/// them in `options` under its own. Unset ones are not sent (the server's default applies),
/// except the temperature, sent as 0 unless set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// vLLM's: -1 (or 0) keeps every id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// Texts that end an answer (OpenAI's `stop`, Ollama's `options.stop`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Fields merged into every request body as they are, for whatever else a server takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_body: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Body fields the client sets itself, which `extra_body` may not replace, with the flag to use.
pub const CLIENT_FIELDS: [(&str, &str); 14] = [
    ("model", "--model-name"),
    ("messages", "--prompts"),
    ("prompt", "--prompts"),
    ("stream", "(the client always streams)"),
    ("stream_options", "--continuous-usage"),
    ("max_tokens", "--max-tokens"),
    ("max_completion_tokens", "--max-tokens"),
    ("options", "the sampling flags"),
    ("seed", "--seed"),
    ("temperature", "--temperature"),
    ("top_p", "--top-p"),
    ("top_k", "--top-k"),
    ("min_p", "--min-p"),
    ("stop", "--stop"),
];

/// The most stop strings a request may carry (OpenAI's limit).
pub const MAX_STOPS: usize = 4;

impl Sampling {
    fn is_greedy_default(&self) -> bool {
        *self == Sampling::default()
    }

    /// One line per problem, naming the field.
    fn validate(&self) -> Result<(), Invalid> {
        let number = |name: &str, v: Option<f64>, ok: fn(f64) -> bool, want: &str| match v {
            Some(v) if !(v.is_finite() && ok(v)) => {
                Err(Invalid::new(format!("sampling.{name}"), format!("{v}; {want}")))
            }
            _ => Ok(()),
        };
        number("temperature", self.temperature, |t| t >= 0.0, "must be 0 (greedy) or above")?;
        number("top_p", self.top_p, |p| p > 0.0 && p <= 1.0, "must be above 0 and at most 1")?;
        number("min_p", self.min_p, |p| (0.0..=1.0).contains(&p), "must be from 0 to 1")?;
        if let Some(k) = self.top_k.filter(|k| *k < -1) {
            return Err(Invalid::new("sampling.top_k", format!("{k}; must be -1 (every id) or more")));
        }
        if self.stop.len() > MAX_STOPS {
            return Err(Invalid::new(
                "sampling.stop",
                format!("{} strings; give at most {MAX_STOPS}", self.stop.len()),
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(Invalid::new("sampling.stop", "an empty string; a stop string needs a character"));
        }
        if let Some((field, flag)) =
            self.extra_body.iter().flat_map(|body| body.keys()).find_map(|k| CLIENT_FIELDS.iter().find(|(f, _)| f == k))
        {
            return Err(Invalid::new(
                format!("sampling.extra_body.{field}"),
                format!("the client sets `{field}` itself; use {flag}"),
            ));
        }
        Ok(())
    }
}

/// The shortest and longest scrape intervals accepted, in seconds.
pub const SCRAPE_INTERVAL_S: (f64, f64) = (0.1, 3600.0);

/// How a metric is read from a request (seconds), `None` where it has none.
pub type Metric = fn(&RequestRecord) -> Option<f64>;

/// The metrics an SLO may bound, with how each is read from a request.
pub const SLO_METRICS: [(&str, Metric); 3] =
    [("ttft_ms", RequestRecord::ttft), ("tpot_ms", RequestRecord::tpot), ("e2e_ms", |r| Some(r.total()))];

/// Which OpenAI endpoint requests go to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`, the prompt as one user message.
    #[default]
    Chat,
    /// `/v1/completions`, the prompt as text.
    Completions,
}

impl Endpoint {
    fn is_chat(&self) -> bool {
        *self == Endpoint::Chat
    }
}

/// An open-loop load: one group per rate, each sent on its own schedule; or a sweep, whose rates
/// come from measuring the target first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arrivals {
    /// Requests per second, one group per rate, in order; `null`: unbounded (every request at
    /// once, or a closed pool under `max_concurrency`). Empty for a sweep.
    pub rates: Vec<Option<f64>>,
    /// A sweep of this many groups per target, as guidellm's: one request at a time
    /// (`synchronous`), then as many at once as `max_concurrency` allows (`rate-inf`), then the
    /// rest at rates evenly spaced between those two groups' completed request rates
    /// ([`crate::load::sweep_rates`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<usize>,
    /// Shape of the gamma distribution of the gaps between arrivals: 1 is Poisson, below 1
    /// burstier, above 1 more even.
    pub burstiness: f64,
    /// At most this many requests in flight; a slot refills as soon as a request ends.
    pub max_concurrency: Option<usize>,
    /// Requests per group (warm-up included); a group ends at this count or `duration_s`,
    /// whichever comes first.
    pub num_requests: Option<usize>,
    /// Seconds over which a group's requests are sent.
    pub duration_s: Option<f64>,
    /// The first requests of each group, sent and recorded but left out of the summary.
    pub warmup_requests: usize,
}

/// The most groups a sweep may have.
pub const MAX_SWEEP: usize = 100;

/// The fastest rate accepted, requests per second.
pub const MAX_RATE: f64 = 1e6;

fn batched() -> Policy {
    Policy::Batched
}

/// The largest count accepted for rounds, warm-ups, tokens and streams: far beyond any run this
/// machine can make, and small enough that their products cannot overflow.
pub const MAX_COUNT: usize = 1 << 20;

/// The longest timeout accepted, in seconds (a week, the workspace's bound on any wait).
pub(crate) const MAX_TIMEOUT_S: f64 = common::manifest::MAX_WAIT_S;

impl Parameters {
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
        if let Some(b) = self.server_kv_budget.filter(|b| *b < common::kernel::TILE || *b > 1 << 40) {
            return Err(Invalid::new(
                "server_kv_budget",
                format!("{b}: must be at least one block of {} positions and at most 2^40", common::kernel::TILE),
            ));
        }
        Ok(())
    }
}

impl Arrivals {
    fn validate(&self) -> Result<(), Invalid> {
        match (self.rates.is_empty(), self.sweep) {
            (true, None) => return Err(Invalid::new("arrivals.rates", "empty; give at least one rate (or inf)")),
            (false, Some(_)) => {
                return Err(Invalid::new(
                    "arrivals.sweep",
                    "a sweep finds its own rates: give rates or a sweep, not both",
                ))
            }
            (true, Some(n)) if !(2..=MAX_SWEEP).contains(&n) => {
                return Err(Invalid::new("arrivals.sweep", format!("{n}: must be in 2..={MAX_SWEEP} groups")))
            }
            (true, Some(_)) if self.max_concurrency == Some(1) => {
                return Err(Invalid::new(
                    "arrivals.max_concurrency",
                    "1 makes a sweep's throughput group its synchronous one: allow more, or none",
                ))
            }
            _ => {}
        }
        if let Some(r) = self.rates.iter().flatten().find(|r| !(r.is_finite() && **r > 0.0 && **r <= MAX_RATE)) {
            return Err(Invalid::new(
                "arrivals.rates",
                format!("{r:?}: a rate is above 0 and at most {MAX_RATE} requests/s"),
            ));
        }
        if let Some((i, r)) = self.rates.iter().enumerate().find(|(i, r)| self.rates[..*i].contains(r)) {
            let shown = r.map_or_else(|| "inf".to_string(), |r| format!("{r:?}"));
            return Err(Invalid::new(
                format!("arrivals.rates[{i}]"),
                format!("{shown} is given twice; give each rate once (each is one group)"),
            ));
        }
        if self.burstiness != 1.0 && self.sweep.is_none() && self.rates.iter().all(Option::is_none) {
            return Err(Invalid::new(
                "arrivals.burstiness",
                "shapes the gaps between arrivals at a finite rate, and every rate is inf; give a rate (--request-rate) or leave it out",
            ));
        }
        if !(self.burstiness.is_finite() && self.burstiness >= 0.01 && self.burstiness <= 100.0) {
            return Err(Invalid::new(
                "arrivals.burstiness",
                format!("{:?}: must be in 0.01..=100 (1 is Poisson)", self.burstiness),
            ));
        }
        if self.warmup_requests > MAX_COUNT {
            return Err(Invalid::new(
                "arrivals.warmup_requests",
                format!("{} is more than {MAX_COUNT}", self.warmup_requests),
            ));
        }
        for (name, v) in
            [("arrivals.max_concurrency", self.max_concurrency), ("arrivals.num_requests", self.num_requests)]
        {
            if v.is_some_and(|v| v == 0 || v > MAX_COUNT) {
                return Err(Invalid::new(name, format!("{}: must be in 1..={MAX_COUNT}", v.unwrap_or(0))));
            }
        }
        if let Some(d) = self.duration_s {
            if !(d.is_finite() && d > 0.0 && d <= MAX_TIMEOUT_S) {
                return Err(Invalid::new(
                    "arrivals.duration_s",
                    format!("{d}: must be above 0 and at most {MAX_TIMEOUT_S}"),
                ));
            }
        }
        if let (None, Some(d)) = (self.num_requests, self.duration_s) {
            if let Some(r) = self.rates.iter().flatten().find(|r| **r * d > MAX_COUNT as f64) {
                return Err(Invalid::new(
                    "arrivals.duration_s",
                    format!("{d} s at {r} requests/s is more than {MAX_COUNT} requests; give num_requests or a shorter duration"),
                ));
            }
        }
        // Without a duration to end it, a group at a slow rate sends its last request after
        // about (n - 1) / rate seconds; past a week no run can keep that schedule.
        if let (Some(n), None) = (self.num_requests, self.duration_s) {
            if let Some(r) = self.rates.iter().flatten().find(|r| n.saturating_sub(1) as f64 / **r > MAX_TIMEOUT_S) {
                return Err(Invalid::new(
                    "arrivals.rates",
                    format!(
                        "{r:?} requests/s: {n} requests take about {:.3e} s to send, more than a week; give a higher rate, fewer requests or a duration",
                        n.saturating_sub(1) as f64 / r
                    ),
                ));
            }
        }
        if self.num_requests.is_none() && self.duration_s.is_none() {
            return Err(Invalid::new(
                "arrivals",
                "unbounded; give num_requests (--num-requests) or duration_s (--duration)",
            ));
        }
        if (self.rates.contains(&None) || self.sweep.is_some())
            && self.max_concurrency.is_none()
            && self.num_requests.is_none()
        {
            return Err(Invalid::new(
                "arrivals.num_requests",
                "an unbounded rate without max_concurrency sends every request at once: give their number (--num-requests) or a cap (--max-concurrency)",
            ));
        }
        if self.num_requests.is_some_and(|n| self.warmup_requests >= n) {
            return Err(Invalid::new(
                "arrivals.warmup_requests",
                "must be fewer than num_requests, or nothing is measured",
            ));
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
