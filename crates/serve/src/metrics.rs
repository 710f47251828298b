//! `/metrics`: the server's state in Prometheus' text exposition (version 0.0.4, what every
//! scraper and the serving client read), so that a benchmark can say why a latency was what it
//! was. Names carry our prefix `serve_` and vLLM's meanings; docs/server.md maps each to vLLM's.
//!
//! Two sources: gauges and counters that `/health` already keeps ([`EngineState`], the KV pool)
//! are read when scraped, by a collector, so the two endpoints can never disagree; per-request
//! and per-step distributions are histograms the engine thread observes as it steps.

use super::EngineState;
use common::qwen::KvPool;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What the engine thread observes; cheap to update (each histogram takes one short lock).
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// From the request's arrival at the engine's queue to the end of the step that made its
    /// first token.
    pub time_to_first_token: Histogram,
    /// Between the ends of the steps that made consecutive tokens of one request.
    pub inter_token_latency: Histogram,
    /// From arrival to the end of the step that made the last token.
    pub e2e_request_latency: Histogram,
    /// Tokens one forward step carried (prefill chunks and decodes together).
    pub iteration_tokens: Histogram,
    /// Prompt tokens of admitted requests, cached ones included.
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
}

/// Bucket bounds in seconds, fine where a CPU server's first tokens and steps fall, coarse
/// beyond.
const LATENCY_BUCKETS: [f64; 20] =
    [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
const TOKEN_BUCKETS: [f64; 14] =
    [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0];

impl Metrics {
    pub fn new(engine: Arc<EngineState>, kv: Arc<KvPool>) -> Self {
        let mut r = Registry::with_prefix("serve");
        let histogram = |buckets: &[f64]| Histogram::new(buckets.iter().copied());
        let time_to_first_token = registered(
            &mut r,
            "time_to_first_token_seconds",
            "Time from a request's arrival to its first token",
            histogram(&LATENCY_BUCKETS),
        );
        let inter_token_latency = registered(
            &mut r,
            "inter_token_latency_seconds",
            "Time between consecutive tokens of a request",
            histogram(&LATENCY_BUCKETS),
        );
        let e2e_request_latency = registered(
            &mut r,
            "e2e_request_latency_seconds",
            "Time from a request's arrival to its last token",
            histogram(&LATENCY_BUCKETS),
        );
        let iteration_tokens = registered(
            &mut r,
            "iteration_tokens",
            "Tokens per engine step, prefill and decode together",
            histogram(&TOKEN_BUCKETS),
        );
        let prompt_tokens = registered(
            &mut r,
            "prompt_tokens",
            "Prompt tokens of admitted requests, cached ones included",
            Counter::default(),
        );
        let generation_tokens = registered(&mut r, "generation_tokens", "Tokens generated", Counter::default());
        r.register_collector(Box::new(StateCollector { engine, kv }));
        Metrics {
            registry: r,
            time_to_first_token,
            inter_token_latency,
            e2e_request_latency,
            iteration_tokens,
            prompt_tokens,
            generation_tokens,
        }
    }

    /// The exposition, and its content type.
    pub fn render(&self) -> (&'static str, String) {
        let mut text = String::new();
        // Writing into a String cannot fail, and every metric here encodes.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        (prometheus_client::encoding::prometheus_text::CONTENT_TYPE, text)
    }
}

/// `metric`, registered under `name` (a handle to the same series is kept and returned).
fn registered<M: prometheus_client::registry::Metric + Clone>(
    r: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    r.register(name, help, metric.clone());
    metric
}

/// Reads the engine's and the KV pool's state when scraped.
struct StateCollector {
    engine: Arc<EngineState>,
    kv: Arc<KvPool>,
}

impl std::fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateCollector").field("engine", &self.engine).finish_non_exhaustive()
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &self.engine;
        let load = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::SeqCst) as u64;
        let prefix = self.kv.prefix_stats();
        let (used, blocks) = (self.kv.used_blocks() as u64, self.kv.blocks() as u64);
        let gauges: [(&str, &str, u64); 5] = [
            ("num_requests_running", "Requests admitted into the engine's stepping loop", load(&e.active)),
            (
                "num_requests_waiting",
                "Requests queued, and the one waiting for KV blocks",
                load(&e.queued) + load(&e.waiting_for_blocks),
            ),
            ("kv_cache_blocks_used", "KV blocks held by running requests", used),
            (
                "prefix_cache_blocks",
                "KV blocks the prefix cache keeps, held by a request or free to evict",
                prefix.cached_blocks,
            ),
            ("kv_cache_blocks", "KV blocks in the budget", blocks),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value as i64);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let usage = ConstGauge::new(if blocks == 0 { 0.0 } else { used as f64 / blocks as f64 });
        usage.encode(encoder.encode_descriptor(
            "kv_cache_usage_ratio",
            "Share of the KV budget held by running requests, 0 to 1",
            None,
            usage.metric_type(),
        )?)?;
        let counters: [(&str, &str, u64); 8] = [
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache", prefix.queried_tokens),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache, so not computed", prefix.reused_tokens),
            ("prefix_cache_evictions", "Cached KV blocks taken back for other work", prefix.evictions),
            ("num_preemptions", "Requests preempted to keep the KV budget", load(&e.preemptions)),
            ("request_success", "Requests that ended with their answer", load(&e.completed)),
            ("request_failure", "Requests that failed in a step or could not start", load(&e.failed)),
            ("request_cancelled", "Requests whose client went away", load(&e.cancelled)),
            ("request_rejected", "Requests answered 503 because the queue was full", load(&e.rejected)),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
        }
        let steps = ConstCounter::new(e.steps.load(Ordering::SeqCst));
        steps.encode(encoder.encode_descriptor("engine_steps", "Engine steps taken", None, steps.metric_type())?)?;
        Ok(())
    }
}
