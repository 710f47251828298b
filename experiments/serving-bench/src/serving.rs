//! The serving benchmark (seed 001): per-request records, the metric definitions, and the
//! per-(target, concurrency) summary with the seed's field names. Shared by the binary, which
//! measures, and the checks the audit runs through [`crate::ServingBench`], which recomputes every summary from the records.
//!
//! Metric definitions (DESIGN.md): `ttft` is request start to the first chunk with non-empty
//! generated text; `total` is request start to end of stream; `decode_tps` is Ollama's
//! `eval_count / eval_duration` when the server gives it, else `output_tokens / (total - ttft)`;
//! `tpot` is `(total - ttft) / (output_tokens - 1)`; `request_tps` is `output_tokens / total`;
//! `aggregate_output_tps` is a round's successful output tokens over that round's wall time.
//! Percentiles interpolate linearly between order statistics.

use common::manifest::Invalid;
use common::policy::Policy;
use common::provenance::Provenance;
use common::stats::summarize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The TCP connection could not be made (refused, unreachable, connect timeout).
    Connect,
    /// The server answered with a non-2xx status.
    HttpStatus,
    /// No generated text within the first-token timeout.
    FirstTokenTimeout,
    /// A gap between two reads longer than the idle timeout.
    IdleTimeout,
    /// The whole request took longer than the total timeout.
    TotalTimeout,
    /// The stream ended before its final event.
    TruncatedStream,
    /// The stream ended well (its final event arrived) but carried no generated text: nothing to
    /// time a first token by, so it is no success.
    EmptyStream,
    /// The server sent an error object in the stream.
    ErrorEvent,
    /// A line or event that is not the JSON the protocol promises.
    BadJson,
    /// The server's token counts contradict the request or the stream: more generated tokens
    /// than `max_tokens` allows, or running counts that go down or past the final one. Such a
    /// count cannot be trusted, so the request enters no throughput.
    InconsistentUsage,
}

impl ErrorClass {
    /// Its name as artifacts write it (`http_status`, `inconsistent_usage`).
    pub fn name(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }
}

/// Where an output token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The OpenAI `usage.completion_tokens` of the server.
    Usage,
    /// Ollama's `eval_count`.
    OllamaCounters,
    /// The number of chunks with generated text (a lower bound when a chunk holds several tokens).
    Chunks,
}

/// One request, as the client saw it. Times are seconds on the client's monotonic clock, from
/// the start of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestRecord {
    pub runtime: String,
    pub concurrency: usize,
    /// 0-based measured round.
    pub round: usize,
    /// Position within the round.
    pub index: usize,
    /// Which prompt (`short`, `medium`, `code`).
    pub prompt: String,
    pub scheduled_s: f64,
    pub sent_s: Option<f64>,
    pub first_byte_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub end_s: f64,
    /// HTTP status, when one arrived.
    pub status: Option<u16>,
    /// `None` on success.
    pub error: Option<ErrorClass>,
    pub error_detail: Option<String>,
    pub finish_reason: Option<String>,
    /// Token counts by source, when the source gave one.
    pub usage_completion_tokens: Option<u64>,
    pub usage_prompt_tokens: Option<u64>,
    pub ollama_eval_count: Option<u64>,
    pub ollama_eval_duration_ns: Option<u64>,
    pub ollama_prompt_eval_count: Option<u64>,
    pub ollama_prompt_eval_duration_ns: Option<u64>,
    pub chunks: u64,
    /// Gaps between consecutive chunks with generated text, seconds.
    pub chunk_gaps_s: Vec<f64>,
    /// Its place in an open-loop schedule; absent in the seed's closed rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<Arrival>,
    /// Generated tokens in each chunk with text, from the server's running usage counts, when it
    /// sent one with every such chunk (vLLM's `continuous_usage_stats`); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_tokens: Vec<u64>,
    /// Which of its runtime's `replicas` served it, for a group of replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<usize>,
    /// The cap on generated tokens it was sent with (`max_tokens`, Ollama's `num_predict`): a
    /// success never counts more output tokens than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

/// Where a run's prompts came from, and enough about them to tell whether two runs sent the
/// same requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadRecord {
    /// `builtin` (the seed's three prompts), `jsonl`, `sharegpt` or `synthetic`.
    pub source: String,
    /// The file, as given (for synthetic prompts, the tokenizer's folder).
    pub path: Option<String>,
    /// SHA-256 of the file's bytes (for synthetic prompts, of `tokenizer.json`).
    pub file_sha256: Option<String>,
    /// SHA-256 of the items read from it (prompt, messages, max_tokens): equal for the same
    /// requests whatever the file's formatting.
    pub items_sha256: String,
    pub items: usize,
    pub prompt_chars_min: Option<f64>,
    pub prompt_chars_p50: Option<f64>,
    pub prompt_chars_mean: Option<f64>,
    pub prompt_chars_max: Option<f64>,
    /// Items with their own `max_tokens`.
    pub items_with_max_tokens: usize,
    /// For synthetic prompts: the distributions their lengths were drawn from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths: Option<String>,
    /// For synthetic prompts: their lengths in tokens, as the tokenizer counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_max: Option<f64>,
}

/// An open-loop request's group and window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arrival {
    /// The group's rate, requests per second; `null`: unbounded (all at once, or a closed pool
    /// under `max_concurrency`).
    pub rate_rps: Option<f64>,
    /// Sent before the measured window: recorded, left out of the summary.
    pub warmup: bool,
    /// When it could first be sent: its scheduled time, or, when every slot under
    /// `max_concurrency` was taken then, the instant one was freed (in a closed pool, always
    /// that instant). From here to `sent_s` is the client's own lateness; before it, the cap's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_s: Option<f64>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Output tokens and where the count came from: server usage, then Ollama, then chunks.
    pub fn output_tokens(&self) -> (u64, TokenSource) {
        if let Some(n) = self.usage_completion_tokens {
            (n, TokenSource::Usage)
        } else if let Some(n) = self.ollama_eval_count {
            (n, TokenSource::OllamaCounters)
        } else {
            (self.chunks, TokenSource::Chunks)
        }
    }

    /// The gaps between its tokens: each gap between two chunks split evenly over the second
    /// chunk's tokens (from `chunk_tokens`; a chunk without a new token keeps its gap whole).
    pub fn token_gaps(&self) -> Vec<f64> {
        let counts = self.chunk_tokens.iter().skip(1);
        self.chunk_gaps_s
            .iter()
            .zip(counts)
            .flat_map(|(gap, &k)| {
                let k = k.clamp(1, 1 << 16);
                std::iter::repeat_n(gap / k as f64, k as usize)
            })
            .collect()
    }

    /// How late the client sent it: from when the schedule wanted it sent to when it was.
    pub fn lateness(&self) -> Option<f64> {
        self.sent_s.map(|s| s - self.scheduled_s)
    }

    /// The part of its lateness that was the client's own: from when it could first be sent (a
    /// slot free, its time come) to when it was.
    pub fn client_lateness(&self) -> Option<f64> {
        Some(self.sent_s? - self.arrival?.admitted_s?)
    }

    /// Whether it could not be sent at its time because every slot under `max_concurrency` was
    /// taken (admitted later than scheduled; a microsecond allowed for the seconds' rounding).
    pub fn waited_for_slot(&self) -> bool {
        self.arrival.and_then(|a| a.admitted_s).is_some_and(|t| t - self.scheduled_s > 1e-6)
    }

    pub fn ttft(&self) -> Option<f64> {
        self.first_token_s.map(|t| t - self.scheduled_s)
    }

    pub fn total(&self) -> f64 {
        self.end_s - self.scheduled_s
    }

    pub fn decode_tps(&self) -> Option<f64> {
        if let (Some(n), Some(ns)) = (self.ollama_eval_count, self.ollama_eval_duration_ns) {
            return (ns > 0).then(|| n as f64 / (ns as f64 / 1e9));
        }
        let (n, _) = self.output_tokens();
        let decode = self.total() - self.ttft()?;
        (decode > 0.0).then(|| n as f64 / decode)
    }

    pub fn tpot(&self) -> Option<f64> {
        let (n, _) = self.output_tokens();
        (n > 1).then(|| (self.total() - self.ttft().unwrap_or(0.0)) / (n - 1) as f64).filter(|_| self.ttft().is_some())
    }

    pub(crate) fn request_tps(&self) -> Option<f64> {
        let total = self.total();
        (total > 0.0).then(|| self.output_tokens().0 as f64 / total)
    }

    /// Prefill tokens per second, where the server says how long prefill took (Ollama's
    /// `prompt_eval_count / prompt_eval_duration`); `None` otherwise.
    pub fn prompt_tps(&self) -> Option<f64> {
        match (self.ollama_prompt_eval_count, self.ollama_prompt_eval_duration_ns) {
            (Some(n), Some(ns)) if ns > 0 => Some(n as f64 / (ns as f64 / 1e9)),
            _ => None,
        }
    }
}

/// mean / p50 / p95 / p99 and n of one metric, flattened into the seed's `<metric>_<stat>` names.
fn put(row: &mut BTreeMap<String, serde_json::Value>, metric: &str, values: &[f64]) {
    let s = summarize(values);
    for (stat, v) in [("mean", s.mean), ("p50", s.p50), ("p95", s.p95), ("p99", s.p99)] {
        row.insert(format!("{metric}_{stat}"), serde_json::json!(v));
    }
    row.insert(format!("{metric}_n"), serde_json::json!(s.n));
}

/// The summary of one (runtime, concurrency) group. Keys follow the seed (`ttft_s_mean`, ...)
/// plus `_p99` and `_n` for every metric, TPOT and chunk gaps, failure counts by class, the token
/// count sources used, and why `prompt_tps` is null when it is.
pub(crate) fn summarize_group(
    runtime: &str,
    model: &str,
    concurrency: usize,
    records: &[&RequestRecord],
) -> BTreeMap<String, serde_json::Value> {
    let ok: Vec<&&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let mut row = BTreeMap::new();
    row.insert("runtime".into(), serde_json::json!(runtime));
    row.insert("model".into(), serde_json::json!(model));
    row.insert("concurrency".into(), serde_json::json!(concurrency));
    row.insert("requests".into(), serde_json::json!(records.len()));
    row.insert("successes".into(), serde_json::json!(ok.len()));
    row.insert("failures".into(), serde_json::json!(records.len() - ok.len()));
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter_map(|r| r.error) {
        *classes.entry(r.name()).or_default() += 1;
    }
    row.insert("failures_by_class".into(), serde_json::json!(classes));
    let collect = |f: fn(&RequestRecord) -> Option<f64>| ok.iter().filter_map(|r| f(r)).collect::<Vec<f64>>();
    put(&mut row, "ttft_s", &collect(RequestRecord::ttft));
    put(&mut row, "total_s", &collect(|r| Some(r.total())));
    let prompt = collect(RequestRecord::prompt_tps);
    put(&mut row, "prompt_tps", &prompt);
    row.insert(
        "prompt_tps_note".into(),
        serde_json::json!(if prompt.is_empty() && !ok.is_empty() {
            Some("the server reported no prefill duration (OpenAI-compatible APIs do not); only Ollama's prompt_eval counters give it")
        } else {
            None
        }),
    );
    put(&mut row, "decode_tps", &collect(RequestRecord::decode_tps));
    put(&mut row, "tpot_s", &collect(RequestRecord::tpot));
    put(&mut row, "request_tps", &collect(RequestRecord::request_tps));
    let gaps: Vec<f64> = ok.iter().flat_map(|r| r.chunk_gaps_s.iter().copied()).collect();
    put(&mut row, "chunk_gap_s", &gaps);
    // Inter-token latency: per token where every request's chunks carry their token counts,
    // else per chunk (the same numbers as the chunk gaps), and the row says which.
    let per_token = !ok.is_empty() && ok.iter().all(|r| r.chunk_tokens.len() as u64 == r.chunks);
    let itl: Vec<f64> = if per_token { ok.iter().flat_map(|r| r.token_gaps()).collect() } else { gaps };
    put(&mut row, "itl_s", &itl);
    row.insert("itl_source".into(), serde_json::json!(if per_token { "usage" } else { "chunks" }));
    // Aggregate throughput: per round, successful output tokens over the round's wall time.
    let mut rounds: BTreeMap<usize, Vec<&RequestRecord>> = BTreeMap::new();
    for r in records {
        rounds.entry(r.round).or_default().push(r);
    }
    let aggregate: Vec<f64> = rounds.values().filter_map(|rs| aggregate_tps(rs)).collect();
    put(&mut row, "aggregate_output_tps", &aggregate);
    let mut sources: Vec<String> = ok.iter().map(|r| format!("{:?}", r.output_tokens().1).to_lowercase()).collect();
    sources.sort();
    sources.dedup();
    row.insert("output_token_sources".into(), serde_json::json!(sources));
    row
}

/// The wall time of a round or group: from its first scheduled request to its last end.
fn window_s(group: &[&RequestRecord]) -> Option<f64> {
    let start = group.iter().map(|r| r.scheduled_s).fold(f64::INFINITY, f64::min);
    let end = group.iter().map(|r| r.end_s).fold(f64::NEG_INFINITY, f64::max);
    (end > start).then_some(end - start)
}

/// One round's successful output tokens over its wall time.
pub fn aggregate_tps(round: &[&RequestRecord]) -> Option<f64> {
    // Saturating: the counts may come from a file the audit reads.
    let tokens = round.iter().filter(|r| r.ok()).fold(0u64, |sum, r| sum.saturating_add(r.output_tokens().0));
    window_s(round).map(|w| tokens as f64 / w)
}

/// A group's successful requests per second of its wall time: the rate the server sustained.
pub fn completed_rate(group: &[&RequestRecord]) -> Option<f64> {
    let ok = group.iter().filter(|r| r.ok()).count();
    window_s(group).map(|w| ok as f64 / w).filter(|r| *r > 0.0)
}

/// A group's load as claims, exports and tables name it: `c4` (closed groups of 4), `rate8` or
/// `rate-inf` (an open loop's rate), `synchronous` (an unbounded rate under a cap of one).
pub fn load_label(concurrency: usize, open_loop_rate: Option<Option<f64>>) -> String {
    match open_loop_rate {
        None => format!("c{concurrency}"),
        Some(Some(rate)) => format!("rate{rate}"),
        // A closed pool of one: a request at a time.
        Some(None) if concurrency == 1 => "synchronous".into(),
        Some(None) => "rate-inf".into(),
    }
}

/// One group of measured requests: one target under one load.
pub struct Group<'a> {
    pub runtime: &'a str,
    /// [`load_label`].
    pub load: String,
    pub concurrency: usize,
    /// The open loop's rate (`Some(None)`: as fast as allowed); `None` for a closed group.
    pub rate: Option<Option<f64>>,
    pub records: Vec<&'a RequestRecord>,
}

/// The measured requests (an open loop's warm-ups left out) by target and load, the groups in the
/// order they first appear. Every summary, export and claim groups requests through this.
pub fn groups(records: &[RequestRecord]) -> Vec<Group<'_>> {
    let mut index: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut out: Vec<Group> = Vec::new();
    for r in records.iter().filter(|r| !r.arrival.is_some_and(|a| a.warmup)) {
        let rate = r.arrival.map(|a| a.rate_rps);
        let load = load_label(r.concurrency, rate);
        let i = *index.entry((r.runtime.as_str(), load.clone())).or_insert_with(|| {
            out.push(Group { runtime: &r.runtime, load, concurrency: r.concurrency, rate, records: Vec::new() });
            out.len() - 1
        });
        out[i].records.push(r);
    }
    out
}

/// Where a successful record's token counts contradict its request or its stream (the
/// [`ErrorClass::InconsistentUsage`] the client gives such a request): more output tokens than
/// its cap, or running per-chunk counts that add up past the total. `None` when they agree.
pub fn usage_contradiction(r: &RequestRecord) -> Option<String> {
    let (tokens, source) = r.output_tokens();
    let source = match source {
        TokenSource::Usage => "usage.completion_tokens",
        TokenSource::OllamaCounters => "eval_count",
        TokenSource::Chunks => "chunks with text",
    };
    if let Some(cap) = r.max_tokens.filter(|cap| tokens > *cap) {
        return Some(format!("{source} {tokens} is more than the {cap} tokens max_tokens allows"));
    }
    let per_chunk = r.chunk_tokens.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
    (r.usage_completion_tokens.is_some_and(|total| per_chunk > total))
        .then(|| format!("the running counts add up to {per_chunk}, more than the final {source} {tokens}"))
}

/// Each group (target and load) in which no measured request succeeded, as `runtime load
/// (N requests: class: first detail)`: a run that measured nothing there.
pub fn failed_groups(records: &[RequestRecord]) -> Vec<String> {
    groups(records)
        .into_iter()
        .filter(|g| !g.records.is_empty() && g.records.iter().all(|r| !r.ok()))
        .map(|g| {
            let first = g.records[0];
            let class = first.error.map(ErrorClass::name).unwrap_or_default();
            let detail = first.error_detail.as_deref().unwrap_or_default().chars().take(160).collect::<String>();
            format!("{} {} ({} requests; the first: {class}: {detail})", g.runtime, g.load, g.records.len())
        })
        .collect()
}

/// About what one recorded request holds in memory until the artifact is written: its record,
/// and its part of the JSON tree and text serialising makes, a fixed part and one per generated
/// token (its gap and its running count). An estimate for [`common::budget`], not a measurement.
pub fn bytes_per_request(max_tokens: usize) -> u64 {
    4_000u64.saturating_add(100u64.saturating_mul(max_tokens as u64))
}

/// One line per open-loop group at a finite rate whose measured requests waited for a slot under
/// `max_concurrency`: the server fell behind the schedule, and the send lateness of those
/// requests is its backlog rather than the client's (the client's own part stays in
/// `client_lateness`). Printed after the table, so that a reader does not take one for the other.
pub fn backlog_notes(records: &[RequestRecord]) -> Vec<String> {
    groups(records)
        .into_iter()
        .filter_map(|g| {
            let Some(Some(rate)) = g.rate else { return None };
            let waited = g.records.iter().filter(|r| r.waited_for_slot()).count();
            (waited > 0).then(|| {
                format!(
                    "{} at {rate} requests/s: {waited} of {} measured requests waited for one of the {} slots (the server fell behind the schedule); their send lateness includes that wait, the client's own is in brackets",
                    g.runtime,
                    g.records.len(),
                    g.concurrency
                )
            })
        })
        .collect()
}

/// Summaries of every group ([`groups`]). `params` adds the percentiles and SLOs it asks for.
pub fn summarize_all(
    params: &Parameters,
    runtimes: &[Runtime],
    records: &[RequestRecord],
) -> Vec<BTreeMap<String, serde_json::Value>> {
    groups(records)
        .into_iter()
        .map(|g| {
            let group = &g.records;
            let model = runtimes.iter().find(|t| t.name == g.runtime).map(|t| t.model.as_str()).unwrap_or_default();
            let mut row = summarize_group(g.runtime, model, g.concurrency, group);
            extra_percentiles(&mut row, &params.percentiles, group);
            if !params.slo.is_empty() {
                slo_columns(&mut row, &params.slo, group, g.rate.is_some());
            }
            if let Some(rate) = g.rate {
                open_loop_columns(&mut row, rate, group);
            }
            row
        })
        .collect()
}

/// `<metric>_p<P>` for each percentile asked beyond the seed's p50, p95 and p99, of the
/// successful requests' TTFT, TPOT, total latency and chunk gaps.
fn extra_percentiles(row: &mut BTreeMap<String, serde_json::Value>, percentiles: &[f64], group: &[&RequestRecord]) {
    let ok: Vec<&&RequestRecord> = group.iter().filter(|r| r.ok()).collect();
    let sorted = |mut v: Vec<f64>| {
        v.retain(|x| x.is_finite());
        v.sort_by(f64::total_cmp);
        v
    };
    let metrics = [
        ("ttft_s", sorted(ok.iter().filter_map(|r| r.ttft()).collect())),
        ("tpot_s", sorted(ok.iter().filter_map(|r| r.tpot()).collect())),
        ("total_s", sorted(ok.iter().map(|r| r.total()).collect())),
        ("chunk_gap_s", sorted(ok.iter().flat_map(|r| r.chunk_gaps_s.iter().copied()).collect())),
    ];
    for p in percentiles.iter().filter(|p| ![50.0, 95.0, 99.0].contains(*p)) {
        for (metric, values) in &metrics {
            let value = common::stats::percentile_sorted(values, *p);
            row.insert(format!("{metric}_p{p}"), serde_json::json!(value));
        }
    }
}

/// The SLO columns: how many requests met every objective (a failure meets none), their share,
/// and for an open loop the goodput, those requests per second of the group's window (from its
/// first scheduled request to its last end).
fn slo_columns(
    row: &mut BTreeMap<String, serde_json::Value>,
    slo: &BTreeMap<String, f64>,
    group: &[&RequestRecord],
    open: bool,
) {
    let meets = |r: &RequestRecord| {
        r.ok()
            && slo.iter().all(|(name, bound_ms)| {
                let read = SLO_METRICS.iter().find(|(m, _)| m == name).map(|(_, read)| read);
                read.and_then(|read| read(r)).is_some_and(|v| v * 1000.0 <= *bound_ms)
            })
    };
    let met = group.iter().filter(|r| meets(r)).count();
    row.insert("slo_met".into(), serde_json::json!(met));
    row.insert("slo_met_share".into(), serde_json::json!((!group.is_empty()).then(|| met as f64 / group.len() as f64)));
    if open {
        row.insert("goodput_rps".into(), serde_json::json!(window_s(group).map(|w| met as f64 / w)));
    }
}

/// An open-loop group's own columns: its rate, the rate it achieved (measured requests over the
/// time from the first scheduled to the last sent), and the send lateness: all of it, and the
/// client's own part (without waits for a slot under the cap).
fn open_loop_columns(row: &mut BTreeMap<String, serde_json::Value>, rate: Option<f64>, group: &[&RequestRecord]) {
    row.insert("request_rate".into(), rate.map_or(serde_json::json!("inf"), |r| serde_json::json!(r)));
    let first = group.iter().map(|r| r.scheduled_s).fold(f64::INFINITY, f64::min);
    let last = group.iter().filter_map(|r| r.sent_s).fold(f64::NEG_INFINITY, f64::max);
    let achieved = (group.len() > 1 && last > first).then(|| (group.len() - 1) as f64 / (last - first));
    row.insert("achieved_request_rate".into(), serde_json::json!(achieved));
    let lateness: Vec<f64> = group.iter().filter_map(|r| r.lateness()).collect();
    put(row, "send_lateness_s", &lateness);
    row.insert("send_lateness_s_max".into(), serde_json::json!(lateness.iter().copied().reduce(f64::max)));
    let own: Vec<f64> = group.iter().filter_map(|r| r.client_lateness()).collect();
    if !own.is_empty() {
        put(row, "client_lateness_s", &own);
        row.insert("client_lateness_s_max".into(), serde_json::json!(own.iter().copied().reduce(f64::max)));
    }
}

/// A server under test (the seed's `runtimes` entries).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    pub name: String,
    /// `openai` or `ollama`.
    pub kind: String,
    pub base_url: String,
    pub model: String,
    /// The replicas measured as this one runtime (`--target KIND=URL@group`), requests spread in
    /// turn; absent for a single server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,
}

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
}

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
    /// One line per problem, naming the field.
    pub fn validate(&self) -> Result<(), Invalid> {
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
                "an unbounded rate without max_concurrency sends every request at once: give their number",
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

/// The machine of the client (the seed's `host`; provenance has the details).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientHost {
    pub platform: String,
    pub machine: String,
    pub rust: String,
}

/// The serving-benchmark artifact: the seed's fields plus every request and provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServingArtifact {
    pub run_id: String,
    pub created_at: String,
    pub host: ClientHost,
    pub arguments: Parameters,
    pub runtimes: Vec<Runtime>,
    /// Server versions as each reported it.
    pub versions: BTreeMap<String, serde_json::Value>,
    /// What each server said about its model.
    pub model_metadata: BTreeMap<String, serde_json::Value>,
    pub prompts: BTreeMap<String, String>,
    pub measurement_notes: BTreeMap<String, String>,
    pub completed_at: String,
    pub summary: Vec<BTreeMap<String, serde_json::Value>>,
    pub requests: Vec<RequestRecord>,
    /// What was sent: the workload's source, digests and prompt lengths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRecord>,
    /// The names of the headers added to every request (`authorization` when an API key was
    /// sent); never their values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sent_headers: Vec<String>,
    /// The manifest's claims, judged on the paired rounds (the audit recomputes them).
    #[serde(default)]
    pub claims: Vec<common::evidence::ClaimResult>,
    /// The embedded server's KV cache, when it served: its budget, the most it held, and how
    /// often it preempted a request to keep the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedded_kv: Option<EmbeddedKv>,
    pub provenance: Provenance,
}

/// What the embedded server's KV pool did over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedKv {
    pub budget_bytes: usize,
    pub peak_bytes: usize,
    pub preemptions: usize,
}

/// The seed's prompts: the defaults.
pub fn default_prompts() -> BTreeMap<String, String> {
    [
        ("short", "In exactly four concise bullet points, explain why database transactions are useful. Do not use a heading."),
        ("medium", "You are reviewing a Laravel service that transfers money between two accounts. Explain the failure modes involving concurrency, partial writes, retries, and audit logs. Then provide a robust implementation plan. Keep the response technical and concise."),
        ("code", "Write a Python 3.12 function named merge_intervals that accepts a list of integer pairs, validates each pair, merges overlapping or adjacent intervals, and returns sorted tuples. Include type hints, a short docstring, and five assert-based examples. Output only code."),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The definitions, as recorded in every artifact.
pub fn measurement_notes() -> BTreeMap<String, String> {
    [
        ("ttft", "Client wall time from request start until the first chunk with non-empty generated text (role-only and usage-only chunks do not count)."),
        ("total", "Client wall time from request start until the end of the stream."),
        ("decode_tps", "Ollama's eval_count / eval_duration when the server gives them; otherwise output tokens / (total - ttft)."),
        ("tpot", "(total - ttft) / (output tokens - 1)."),
        ("request_tps", "Output tokens / total."),
        ("aggregate_output_tps", "Per round: successful output tokens of the concurrency group / the round's wall time (first request start to last end)."),
        ("output_tokens", "Server usage.completion_tokens, else Ollama eval_count, else the number of chunks with generated text; each summary lists the sources used."),
        ("send_lateness", "Open loops: sent_s - scheduled_s, how late the client sent a request; client_lateness leaves out any wait for a slot under max_concurrency (sent_s - arrival.admitted_s), the part that was the client's own."),
        ("percentiles", "Linear interpolation between order statistics; every metric carries its sample count _n."),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(round: usize, start: f64, first: f64, end: f64, tokens: u64) -> RequestRecord {
        RequestRecord {
            runtime: "r".into(),
            concurrency: 2,
            round,
            index: 0,
            prompt: "short".into(),
            scheduled_s: start,
            sent_s: Some(start),
            first_byte_s: Some(first),
            first_token_s: Some(first),
            end_s: end,
            status: Some(200),
            error: None,
            error_detail: None,
            finish_reason: Some("length".into()),
            usage_completion_tokens: Some(tokens),
            usage_prompt_tokens: Some(10),
            ollama_eval_count: None,
            ollama_eval_duration_ns: None,
            ollama_prompt_eval_count: None,
            ollama_prompt_eval_duration_ns: None,
            chunks: tokens,
            chunk_gaps_s: vec![0.1; tokens as usize - 1],
            arrival: None,
            chunk_tokens: Vec::new(),
            replica: None,
            max_tokens: None,
        }
    }

    #[test]
    fn a_backlog_is_noted_only_where_requests_on_a_schedule_waited_for_a_slot() {
        let open = |index: usize, scheduled: f64, admitted: f64, rate: Option<f64>, warmup: bool| {
            let mut r = rec(0, scheduled, scheduled + 0.5, scheduled + 1.0, 4);
            r.index = index;
            r.arrival = Some(Arrival { rate_rps: rate, warmup, admitted_s: Some(admitted) });
            r
        };
        // On time, and admitted when its time came: no note.
        let on_time = vec![open(0, 0.0, 0.0, Some(8.0), false), open(1, 0.1, 0.1, Some(8.0), false)];
        assert!(backlog_notes(&on_time).is_empty());
        // A warm-up that waited is outside the measured window; a measured one that waited is named.
        let mut behind = on_time.clone();
        behind.push(open(2, 0.2, 0.7, Some(8.0), true));
        assert!(backlog_notes(&behind).is_empty());
        behind.push(open(3, 0.3, 0.9, Some(8.0), false));
        assert_eq!(
            backlog_notes(&behind),
            vec!["r at 8 requests/s: 1 of 3 measured requests waited for one of the 2 slots (the server fell behind the schedule); their send lateness includes that wait, the client's own is in brackets"]
        );
        // A closed pool's requests are due when their slot is freed: never a backlog.
        assert!(backlog_notes(&[open(0, 0.0, 0.0, None, false), open(1, 0.4, 0.4, None, false)]).is_empty());
    }

    #[test]
    fn slos_count_the_requests_within_every_bound_and_goodput_is_those_per_second() {
        // TTFT 0.5 s and TPOT 0.2 s; TTFT 0.1 s and TPOT 0.39 s; TTFT 0.2 s, failed.
        let a = rec(0, 0.0, 0.5, 2.5, 11);
        let b = rec(0, 1.0, 1.1, 5.0, 11);
        let mut c = rec(0, 2.0, 2.2, 4.0, 11);
        c.error = Some(ErrorClass::TruncatedStream);
        let slo = |pairs: &[(&str, f64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let mut row = BTreeMap::new();
        slo_columns(&mut row, &slo(&[("ttft_ms", 300.0)]), &[&a, &b, &c], true);
        assert_eq!((row["slo_met"].as_u64(), row["slo_met_share"].as_f64()), (Some(1), Some(1.0 / 3.0)));
        // One good request over the window from 0 s to 5 s.
        assert_eq!(row["goodput_rps"].as_f64(), Some(0.2));
        slo_columns(&mut row, &slo(&[("ttft_ms", 600.0), ("tpot_ms", 250.0)]), &[&a, &b, &c], false);
        assert_eq!(row["slo_met"].as_u64(), Some(1));
        slo_columns(&mut row, &slo(&[("e2e_ms", 10_000.0)]), &[&a, &b, &c], false);
        assert_eq!(row["slo_met"].as_u64(), Some(2));
        // Extra percentiles beside the seed's.
        let mut row = BTreeMap::new();
        extra_percentiles(&mut row, &[90.0, 99.0], &[&a, &b]);
        // TTFTs 0.1 s and 0.5 s: p90 interpolates to 0.46 s.
        assert!(row["ttft_s_p90"].as_f64().is_some_and(|p| (p - 0.46).abs() < 1e-12), "{row:?}");
        assert!(!row.contains_key("ttft_s_p99"), "p99 is among the seed's columns already");
    }

    #[test]
    fn metrics_follow_the_definitions() {
        let r = rec(0, 1.0, 1.5, 3.5, 11);
        assert_eq!(r.ttft(), Some(0.5));
        assert_eq!(r.total(), 2.5);
        assert_eq!(r.decode_tps(), Some(11.0 / 2.0));
        assert_eq!(r.tpot(), Some(0.2));
        assert_eq!(r.request_tps(), Some(11.0 / 2.5));
        assert_eq!(r.prompt_tps(), None);
        let mut o = r.clone();
        o.usage_completion_tokens = None;
        o.ollama_eval_count = Some(8);
        o.ollama_eval_duration_ns = Some(2_000_000_000);
        o.ollama_prompt_eval_count = Some(30);
        o.ollama_prompt_eval_duration_ns = Some(500_000_000);
        assert_eq!(o.output_tokens(), (8, TokenSource::OllamaCounters));
        assert_eq!((o.decode_tps(), o.prompt_tps()), (Some(4.0), Some(60.0)));
    }

    #[test]
    fn group_summary_counts_failures_and_aggregates_per_round() {
        let a = rec(0, 0.0, 0.5, 2.0, 10);
        let b = rec(0, 0.0, 0.7, 4.0, 20);
        let mut c = rec(1, 5.0, 5.5, 6.0, 5);
        c.error = Some(ErrorClass::TruncatedStream);
        let d = rec(1, 5.0, 5.2, 7.0, 6);
        let row = summarize_group("r", "m", 2, &[&a, &b, &c, &d]);
        assert_eq!(
            (row["requests"].as_u64(), row["successes"].as_u64(), row["failures"].as_u64()),
            (Some(4), Some(3), Some(1))
        );
        assert_eq!(row["failures_by_class"]["truncated_stream"], 1);
        // Round 0: 30 tokens over 4 s; round 1: 6 successful tokens over 2 s.
        assert_eq!(row["aggregate_output_tps_n"], 2);
        assert_eq!(row["aggregate_output_tps_mean"].as_f64(), Some((7.5 + 3.0) / 2.0));
        assert_eq!(row["ttft_s_n"], 3);
        assert!(row["prompt_tps_note"].is_string());
        assert!(row["prompt_tps_mean"].is_null());
    }
}
