//! What the servers said about themselves while the client measured them: the series scraped
//! from each target's Prometheus `/metrics` during every group (`--scrape-metrics`), and the
//! server-side columns of the summary computed from them. The binary scrapes
//! ([`crate::scrape`]); the audit checks the series and recomputes the columns with this code.
//!
//! Servers name the same quantities differently, so each known server is a [`Dialect`]: which of
//! its series give the requests running and waiting, the KV cache's use, the prefix cache's
//! tokens, the engine's steps and their tokens, and preemptions. Only the series some dialect
//! names are kept, summed over their label sets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One scrape of one replica of a target, at `t_s` on the client's clock (seconds since the run
/// began, as the requests' `start_s`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Scrape {
    pub t_s: f64,
    /// Which of the target's replicas (0 for a single server).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replica: usize,
    /// The kept series by name, each summed over its label sets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, f64>,
    /// Why the scrape gave nothing; `values` is then empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds from sending the GET to the exposition's last byte, on a good scrape: how fast
    /// the server answers `/metrics` while it serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_s: Option<f64>,
    /// Whether the GET was sent again, once, on a fresh connection: the server had closed the
    /// kept-alive one as it went out. `answer_s` times the second sending.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resent: bool,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A target's scrapes over one group's window: one closed round of one concurrency level, or one
/// open-loop group. The first scrape is taken before the group's first request is sent, the last
/// after its last one ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSeries {
    pub runtime: String,
    /// The group's load, as the summary names it (`c4`, `rate8`, ...).
    pub load: String,
    /// The closed round (0 for an open loop's group).
    pub round: usize,
    pub scrapes: Vec<Scrape>,
}

/// Which series of one server give each quantity. Each quantity lists alternatives, the first
/// one present wins (servers rename series across versions); an alternative of several names
/// is their sum.
pub struct Dialect {
    pub server: &'static str,
    running: &'static [&'static [&'static str]],
    waiting: &'static [&'static [&'static str]],
    /// Share of the KV cache held, 0 to 1.
    kv_usage: &'static [&'static [&'static str]],
    /// Counters: prompt tokens looked up in the prefix cache, and found there.
    prefix_queries: &'static [&'static [&'static str]],
    prefix_hits: &'static [&'static [&'static str]],
    /// Counters: engine steps, and the tokens they carried.
    steps: &'static [&'static [&'static str]],
    step_tokens: &'static [&'static [&'static str]],
    preemptions: &'static [&'static [&'static str]],
    prompt_tokens: &'static [&'static [&'static str]],
    generation_tokens: &'static [&'static [&'static str]],
}

/// The servers whose `/metrics` the client reads: the embedded server, vLLM (V1; the older
/// `gpu_` names too), llama.cpp's `llama-server --metrics`, and SGLang.
///
/// llama-server counts only the prompt tokens it computed in `prompt_tokens_total` and the
/// cached ones in `prompt_tokens_cached_total`, so a lookup is their sum; its steps are its
/// `llama_decode` calls, and their tokens are counted as every computed prompt token plus every
/// generated one (one more per request than the steps carried).
pub const DIALECTS: [Dialect; 4] = [
    Dialect {
        server: "embedded",
        running: &[&["serve_num_requests_running"]],
        waiting: &[&["serve_num_requests_waiting"]],
        kv_usage: &[&["serve_kv_cache_usage_ratio"]],
        prefix_queries: &[&["serve_prefix_cache_queries_total"]],
        prefix_hits: &[&["serve_prefix_cache_hits_total"]],
        steps: &[&["serve_iteration_tokens_count"]],
        step_tokens: &[&["serve_iteration_tokens_sum"]],
        preemptions: &[&["serve_num_preemptions_total"]],
        prompt_tokens: &[&["serve_prompt_tokens_total"]],
        generation_tokens: &[&["serve_generation_tokens_total"]],
    },
    Dialect {
        server: "vllm",
        running: &[&["vllm:num_requests_running"]],
        waiting: &[&["vllm:num_requests_waiting"]],
        kv_usage: &[&["vllm:kv_cache_usage_perc"], &["vllm:gpu_cache_usage_perc"]],
        prefix_queries: &[&["vllm:prefix_cache_queries_total"], &["vllm:gpu_prefix_cache_queries_total"]],
        prefix_hits: &[&["vllm:prefix_cache_hits_total"], &["vllm:gpu_prefix_cache_hits_total"]],
        steps: &[&["vllm:iteration_tokens_total_count"]],
        step_tokens: &[&["vllm:iteration_tokens_total_sum"]],
        preemptions: &[&["vllm:num_preemptions_total"]],
        prompt_tokens: &[&["vllm:prompt_tokens_total"]],
        generation_tokens: &[&["vllm:generation_tokens_total"]],
    },
    Dialect {
        server: "llama.cpp",
        running: &[&["llamacpp:requests_processing"]],
        waiting: &[&["llamacpp:requests_deferred"]],
        kv_usage: &[],
        prefix_queries: &[&["llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"]],
        prefix_hits: &[&["llamacpp:prompt_tokens_cached_total"]],
        steps: &[&["llamacpp:n_decode_total"]],
        step_tokens: &[&["llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"]],
        preemptions: &[],
        prompt_tokens: &[&["llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"]],
        generation_tokens: &[&["llamacpp:tokens_predicted_total"]],
    },
    Dialect {
        server: "sglang",
        running: &[&["sglang:num_running_reqs"]],
        waiting: &[&["sglang:num_queue_reqs"]],
        kv_usage: &[&["sglang:token_usage"]],
        prefix_queries: &[],
        prefix_hits: &[],
        steps: &[],
        step_tokens: &[],
        preemptions: &[],
        prompt_tokens: &[&["sglang:prompt_tokens_total"]],
        generation_tokens: &[&["sglang:generation_tokens_total"]],
    },
];

impl Dialect {
    fn quantities(&self) -> [&'static [&'static [&'static str]]; 10] {
        [
            self.running,
            self.waiting,
            self.kv_usage,
            self.prefix_queries,
            self.prefix_hits,
            self.steps,
            self.step_tokens,
            self.preemptions,
            self.prompt_tokens,
            self.generation_tokens,
        ]
    }

    /// Every series name it reads.
    fn names(&self) -> impl Iterator<Item = &'static str> {
        self.quantities().into_iter().flatten().flat_map(|alternative| alternative.iter().copied())
    }

    /// The server whose series a scrape holds.
    pub fn of(values: &BTreeMap<String, f64>) -> Option<&'static Dialect> {
        DIALECTS.iter().find(|d| d.names().any(|n| values.contains_key(n)))
    }
}

/// Whether the client keeps a series of this name.
pub fn kept(name: &str) -> bool {
    DIALECTS.iter().flat_map(Dialect::names).any(|n| n == name)
}

/// Whether a series only grows: a counter, or a histogram's count or sum (of observations that
/// are never negative), by the exposition format's naming rules.
pub fn is_counter(name: &str) -> bool {
    name.ends_with("_total") || name.ends_with("_count") || name.ends_with("_sum")
}

/// A quantity's value in one scrape: the first alternative whose every name is present.
fn value(values: &BTreeMap<String, f64>, alternatives: &[&[&str]]) -> Option<f64> {
    alternatives.iter().find_map(|names| names.iter().map(|n| values.get(*n)).sum::<Option<f64>>())
}

/// The server-side columns of one group's summary row, under their stored names, where the
/// target exposed them (a column the server gave nothing for is absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerColumns {
    /// Good scrapes, and failed ones.
    pub server_scrapes: usize,
    pub server_scrape_errors: usize,
    /// How long the good scrapes took to answer, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_scrape_ms_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_scrape_ms_p99: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_scrape_ms_max: Option<f64>,
    /// The server whose names the series had ([`Dialect::server`]); without one, nothing below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_dialect: Option<String>,
    /// The requests a scrape saw, summed over replicas scraped at one moment, then over the scrapes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_running_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_running_max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_waiting_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_waiting_max: Option<f64>,
    /// The KV cache's share in use, replicas averaged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_kv_usage_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_kv_usage_max: Option<f64>,
    /// Prompt tokens found cached over those looked up, within the group's windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_prefix_hit_rate: Option<f64>,
    /// The tokens the engine's steps carried, per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_tokens_per_step: Option<f64>,
    /// What the counters rose by over the windows, beside the client's own counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_preemptions: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_prompt_tokens: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_generation_tokens: Option<f64>,
}

impl ServerColumns {
    /// A gauge's mean and peak columns.
    fn gauge(&mut self, gauge: Gauge) -> (&mut Option<f64>, &mut Option<f64>) {
        match gauge {
            Gauge::Running => (&mut self.server_running_mean, &mut self.server_running_max),
            Gauge::Waiting => (&mut self.server_waiting_mean, &mut self.server_waiting_max),
            Gauge::KvUsage => (&mut self.server_kv_usage_mean, &mut self.server_kv_usage_max),
        }
    }
}

/// One group's [`ServerColumns`] from its series (every round's). Counters' rises are taken per
/// series and replica from its first to its last good scrape.
pub fn columns(series: &[&ServerSeries]) -> ServerColumns {
    let scrapes = || series.iter().flat_map(|s| s.scrapes.iter());
    let good = scrapes().filter(|s| s.error.is_none()).count();
    let mut answers: Vec<f64> = scrapes().filter_map(|s| s.answer_s).map(|s| s * 1000.0).collect();
    answers.sort_by(f64::total_cmp);
    let answer = |p| records::stats::percentile_sorted(&answers, p);
    let mut row = ServerColumns {
        server_scrapes: good,
        server_scrape_errors: scrapes().count() - good,
        server_scrape_ms_p50: answer(50.0),
        server_scrape_ms_p99: answer(99.0),
        server_scrape_ms_max: answer(100.0),
        ..ServerColumns::default()
    };
    let Some(dialect) = dialect_of(series) else { return row };
    row.server_dialect = Some(dialect.server.to_string());

    for gauge in Gauge::ALL {
        let v: Vec<f64> = gauge.over_time(dialect, series).into_iter().map(|(_, v)| v).collect();
        if !v.is_empty() {
            let (mean, max) = row.gauge(gauge);
            *mean = Some(v.iter().sum::<f64>() / v.len() as f64);
            *max = Some(v.iter().copied().fold(f64::MIN, f64::max));
        }
    }

    // Counters: rises per series and replica, summed.
    let rise = |alternatives: &[&[&str]]| -> Option<f64> {
        let mut total = None;
        for s in series {
            let mut by_replica: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
            for scrape in s.scrapes.iter().filter(|s| s.error.is_none()) {
                if let Some(v) = value(&scrape.values, alternatives) {
                    by_replica.entry(scrape.replica).or_default().push(v);
                }
            }
            for v in by_replica.values().filter(|v| v.len() >= 2) {
                *total.get_or_insert(0.0) += v[v.len() - 1] - v[0];
            }
        }
        total
    };
    let ratio = |num: Option<f64>, den: Option<f64>| match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    };
    row.server_prefix_hit_rate = ratio(rise(dialect.prefix_hits), rise(dialect.prefix_queries));
    row.server_tokens_per_step = ratio(rise(dialect.step_tokens), rise(dialect.steps));
    row.server_preemptions = rise(dialect.preemptions);
    row.server_prompt_tokens = rise(dialect.prompt_tokens);
    row.server_generation_tokens = rise(dialect.generation_tokens);
    row
}

/// A quantity a scrape sees at one moment.
#[derive(Debug, Clone, Copy)]
pub enum Gauge {
    Running,
    Waiting,
    /// The KV cache's share in use, 0 to 1.
    KvUsage,
}

impl Gauge {
    /// Every gauge, in the order of their summary columns ([`ServerColumns`]).
    pub const ALL: [Gauge; 3] = [Gauge::Running, Gauge::Waiting, Gauge::KvUsage];

    /// The gauge at each moment of the series (one series' good scrapes at one `t_s`, its
    /// replicas scraped together), in time order: requests summed over replicas, the KV cache's
    /// share averaged over them.
    pub fn over_time(self, dialect: &Dialect, series: &[&ServerSeries]) -> Vec<(f64, f64)> {
        let (alternatives, average) = match self {
            Gauge::Running => (dialect.running, false),
            Gauge::Waiting => (dialect.waiting, false),
            Gauge::KvUsage => (dialect.kv_usage, true),
        };
        let mut moments: BTreeMap<(u64, usize), (f64, Vec<f64>)> = BTreeMap::new();
        for (i, s) in series.iter().enumerate() {
            for scrape in s.scrapes.iter().filter(|s| s.error.is_none()) {
                if let Some(v) = value(&scrape.values, alternatives) {
                    // Keyed by time first (non-negative floats order as their bits do).
                    moments.entry((scrape.t_s.to_bits(), i)).or_insert((scrape.t_s, Vec::new())).1.push(v);
                }
            }
        }
        moments
            .into_values()
            .map(|(t, v)| {
                let sum: f64 = v.iter().sum();
                (t, if average { sum / v.len() as f64 } else { sum })
            })
            .collect()
    }
}

/// The dialect of the first scrape that has one.
pub fn dialect_of(series: &[&ServerSeries]) -> Option<&'static Dialect> {
    series.iter().flat_map(|s| s.scrapes.iter()).find_map(|s| Dialect::of(&s.values))
}

/// Rounding between a scrape's two clock readings.
const CLOCK_SLACK_S: f64 = 1e-6;

/// Where a series breaks what scraping guarantees: scrapes out of time order (per replica), a
/// value that is not a finite number, an answered scrape without its answer time, a series no
/// dialect keeps, or a counter that fell between two scrapes of one replica. `None` when it holds.
pub fn series_problem(s: &ServerSeries) -> Option<String> {
    let mut last: BTreeMap<usize, &Scrape> = BTreeMap::new();
    for (i, scrape) in s.scrapes.iter().enumerate() {
        if !(scrape.t_s.is_finite() && scrape.t_s >= 0.0) {
            return Some(format!("scrape {i}: t_s {} is not a time on the client's clock", scrape.t_s));
        }
        if scrape.error.is_some() && (!scrape.values.is_empty() || scrape.answer_s.is_some()) {
            return Some(format!("scrape {i}: failed yet holds values or an answer time"));
        }
        if scrape.error.is_none() && scrape.answer_s.is_none() {
            return Some(format!("scrape {i}: answered, yet records no answer_s"));
        }
        if let Some(a) = scrape.answer_s.filter(|a| !(a.is_finite() && *a >= 0.0)) {
            return Some(format!("scrape {i}: answer_s {a} is not a duration"));
        }
        if let Some((name, v)) = scrape.values.iter().find(|(n, v)| !kept(n) || !v.is_finite()) {
            return Some(format!("scrape {i}: {name} = {v} is not a series the client keeps, as a finite number"));
        }
        if scrape.error.is_some() {
            continue;
        }
        if let Some(previous) = last.insert(scrape.replica, scrape) {
            // Scrapes are taken one after another: the next is sent after the last answered.
            let answered = previous.t_s + previous.answer_s.unwrap_or(0.0);
            if scrape.t_s < answered - CLOCK_SLACK_S {
                return Some(format!(
                    "scrape {i}: t_s {} comes before the replica's previous one was answered ({answered})",
                    scrape.t_s
                ));
            }
            for (name, v) in scrape.values.iter().filter(|(n, _)| is_counter(n)) {
                if let Some(before) = previous.values.get(name).filter(|before| v < *before) {
                    return Some(format!("scrape {i}: counter {name} fell from {before} to {v}"));
                }
            }
        }
    }
    None
}
