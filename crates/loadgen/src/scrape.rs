//! Scraping a target's Prometheus `/metrics` while a group runs (`--scrape-metrics`): a
//! background task polls every replica at a fixed interval, parses the exposition
//! (`prom_text_format_parser`, which reads the `vllm:`-style names with colons) and keeps the series a known server names
//! ([`crate::metrics::DIALECTS`]), each summed over its label sets.
//!
//! The first scrape is taken before [`Scraper::start`] returns, so before the group's first
//! request, and the last when [`Scraper::finish`] is called after its last one ended: the
//! counters' rises cover the whole group. A replica that answers 404 or 501 has no `/metrics`;
//! it is recorded once and not asked again in that group.

use crate::metrics::Scrape;
use crate::metrics::ServerSeries;
use crate::record::Runtime;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The most of an exposition read; a server's is some kilobytes.
const MAX_BODY_BYTES: usize = 8 << 20;

/// A scrape's own deadline: the interval, within one and ten seconds.
fn deadline(interval: Duration) -> Duration {
    interval.clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// The latest a group's last scrape can be sent after its last request ended, in seconds, at
/// `interval_s`: a scrape under way then runs first (a GET and its one resend, each within
/// [`deadline`]), and a second is allowed for the client's own scheduling. The audit holds the
/// scrapes to it; an interval no duration can hold (a forged file's) is read as the longest.
pub fn last_scrape_within_s(interval_s: f64) -> f64 {
    let interval = Duration::try_from_secs_f64(interval_s).unwrap_or(Duration::MAX);
    2.0 * deadline(interval).as_secs_f64() + 1.0
}

/// A running scraper of one target.
pub struct Scraper {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<Scrape>>,
}

impl Scraper {
    /// Scrapes every replica of `target` once, then every `interval` in the background.
    pub async fn start(http: &crate::client::Http, target: &Runtime, interval: Duration, t0: Instant) -> Scraper {
        let urls: Vec<String> = if target.replicas.is_empty() {
            vec![metrics_url(&target.base_url)]
        } else {
            target.replicas.iter().map(|u| metrics_url(u)).collect()
        };
        let mut poller =
            Poller { http: http.clone(), urls, gone: vec![false; target.replicas.len().max(1)], t0, interval };
        let mut scrapes = poller.tick().await;
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticks.tick() => scrapes.extend(poller.tick().await),
                }
            }
            // The last scrape, after the group's last request.
            scrapes.extend(poller.tick().await);
            scrapes
        });
        Scraper { stop, task }
    }

    /// Takes the last scrape and returns the series of the group `load` (its closed `round`).
    pub async fn finish(self, runtime: &str, load: String, round: usize) -> ServerSeries {
        let _ = self.stop.send(());
        // The task only awaits HTTP calls bounded by their deadline; if it panicked, nothing
        // was kept.
        let scrapes = self.task.await.unwrap_or_default();
        ServerSeries { runtime: runtime.to_string(), load, round, scrapes }
    }
}

fn metrics_url(base: &str) -> String {
    format!("{}/metrics", base.trim_end_matches('/'))
}

struct Poller {
    http: crate::client::Http,
    urls: Vec<String>,
    /// Replicas that answered 404 or 501: they have no `/metrics`.
    gone: Vec<bool>,
    t0: Instant,
    interval: Duration,
}

impl Poller {
    /// One scrape of every replica still scraped, all at one moment (`t_s`, when sent).
    async fn tick(&mut self) -> Vec<Scrape> {
        let t_s = self.t0.elapsed().as_secs_f64();
        let live: Vec<usize> = (0..self.urls.len()).filter(|&i| !self.gone[i]).collect();
        let answers = futures_util::future::join_all(live.iter().map(|&i| self.scrape(&self.urls[i]))).await;
        live.into_iter()
            .zip(answers)
            .map(|(replica, (scrape, absent))| {
                self.gone[replica] |= absent;
                Scrape { t_s, replica, ..scrape }
            })
            .collect()
    }

    /// One replica's scrape: the kept series and how long the answer took, or why there are
    /// none; and whether the replica has no `/metrics` at all.
    async fn scrape(&self, url: &str) -> (Scrape, bool) {
        let mut scrape = Scrape::default();
        let outcome = loop {
            let sent = Instant::now();
            match self.get(url, scrape.resent).await {
                // The server closed the kept-alive connection as the GET went out (as requests
                // race llama-server's HTTP library): asked again once, on a new connection.
                Err(Failure::Closed(_)) if !scrape.resent => scrape.resent = true,
                // Timed to the exposition's last byte: parsing it is the client's work.
                outcome => break outcome.map(|body| (body, sent.elapsed().as_secs_f64())),
            }
        };
        let outcome = outcome.and_then(|(body, answer_s)| {
            let text = String::from_utf8_lossy(&body);
            let values = kept_series(&text).map_err(|e| {
                Failure::Other(format!("GET {}: not a Prometheus exposition: {e}", crate::client::redacted(url)))
            })?;
            Ok((values, answer_s))
        });
        let absent = matches!(outcome, Err(Failure::Absent(_)));
        match outcome {
            Ok((values, answer_s)) => (scrape.values, scrape.answer_s) = (values, Some(answer_s)),
            Err(failure) => scrape.error = Some(failure.to_string()),
        }
        (scrape, absent)
    }

    /// The exposition's bytes.
    async fn get(&self, url: &str, again: bool) -> Result<Vec<u8>, Failure> {
        let shown = crate::client::redacted(url);
        let failed = |e: &reqwest::Error| match crate::client::closed_before_an_answer(e) {
            true => Failure::Closed(format!("GET {shown}: {}", crate::client::describe(e))),
            false => Failure::Other(format!("GET {shown}: {}", crate::client::describe(e))),
        };
        let mut response =
            self.http.sending(again).get(url).timeout(deadline(self.interval)).send().await.map_err(|e| failed(&e))?;
        let status = response.status();
        if !status.is_success() {
            let why = format!("GET {shown}: HTTP {}", status.as_u16());
            // 404, or 501 as llama-server answers without --metrics: there is nothing to scrape.
            return Err(match status {
                reqwest::StatusCode::NOT_FOUND | reqwest::StatusCode::NOT_IMPLEMENTED => Failure::Absent(why),
                _ => Failure::Other(why),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| Failure::Other(failed(&e).to_string()))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(Failure::Other(format!("GET {shown}: more than {MAX_BODY_BYTES} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// Why a scrape gave nothing.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The replica has no `/metrics`: not asked again in the group.
    #[error("{0}")]
    Absent(String),
    /// The connection closed before any answer.
    #[error("{0}")]
    Closed(String),
    #[error("{0}")]
    Other(String),
}

/// The series a known server names, each summed over its label sets (a histogram's as its
/// `_sum` and `_count`); values that are not finite numbers are left out (JSON has none). An
/// exposition with a line that is not the format's is refused whole, with the first such line.
pub fn kept_series(exposition: &str) -> Result<BTreeMap<String, f64>, String> {
    use prom_text_format_parser::{Type, ValueType};
    let (metrics, error) = prom_text_format_parser::parse_scrape(exposition);
    if let Some(e) = error {
        let first = match e {
            prom_text_format_parser::ScrapeParseError::Parse(why) => why,
            prom_text_format_parser::ScrapeParseError::Collect(errors) => {
                errors.first().map(|m| format!("line {}: {}", m.line_no.start + 1, m.error)).unwrap_or_default()
            }
        };
        return Err(crate::one_line(&first, 200));
    }
    let mut kept = BTreeMap::new();
    for metric in metrics {
        for sample in metric.samples {
            let name = match (metric.kind, sample.value.value_type) {
                (Type::Histogram | Type::Summary, ValueType::Sum) => format!("{}_sum", metric.name),
                (Type::Histogram | Type::Summary, ValueType::Count) => format!("{}_count", metric.name),
                // Buckets and quantiles: not kept.
                (Type::Histogram | Type::Summary, ValueType::Sample) => continue,
                _ => metric.name.clone(),
            };
            let v = sample.value.value.as_f64();
            if v.is_finite() && crate::metrics::kept(&name) {
                *kept.entry(name).or_insert(0.0) += v;
            }
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ServerSeries;

    /// What `llama-server --metrics` (the build `scripts/build-llama-server.sh` makes) answered
    /// after one request of 53 prompt tokens and 4 generated, then the same request again (52
    /// of its tokens cached), HELP lines left out.
    const LLAMA_FIRST: &str = "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 53\n# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total 0\nllamacpp:tokens_predicted_total 4\nllamacpp:n_decode_total 4\nllamacpp:prompt_tokens_seconds 157.409\n# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\nllamacpp:requests_deferred 0\nllamacpp:n_busy_slots_per_decode 1\n";
    const LLAMA_AGAIN: &str = "llamacpp:prompt_tokens_total 54\nllamacpp:prompt_tokens_cached_total 52\nllamacpp:tokens_predicted_total 8\nllamacpp:n_decode_total 8\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n";

    #[test]
    fn llama_servers_series_are_read_in_its_dialect() {
        let first = kept_series(LLAMA_FIRST).unwrap();
        assert_eq!(first.get("llamacpp:prompt_tokens_total"), Some(&53.0));
        assert!(!first.contains_key("llamacpp:prompt_tokens_seconds"), "only the series a dialect names are kept");
        let scrape =
            |t_s, text| Scrape { t_s, values: kept_series(text).unwrap(), answer_s: Some(0.01), ..Scrape::default() };
        let series = ServerSeries {
            runtime: "llama-server".into(),
            load: "c1".into(),
            round: 0,
            scrapes: vec![scrape(0.0, LLAMA_FIRST), scrape(1.0, LLAMA_AGAIN)],
        };
        assert_eq!(crate::metrics::series_problem(&series), None);
        let row = crate::metrics::columns(&[&series]);
        assert_eq!(row.server_dialect.as_deref(), Some("llama.cpp"));
        // The second request: 1 token computed, 52 found cached, of 53 looked up.
        assert_eq!(row.server_prefix_hit_rate, Some(52.0 / 53.0));
        assert_eq!(row.server_prompt_tokens, Some(53.0));
        assert_eq!(row.server_generation_tokens, Some(4.0));
        assert_eq!((row.server_running_max, row.server_waiting_mean), (Some(1.0), Some(1.0)));
        assert_eq!(row.server_kv_usage_mean, None, "llama-server exposes no KV use");
    }

    #[test]
    fn labelled_series_are_summed_and_odd_values_left_out() {
        let text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\nvllm:num_requests_running{engine=\"1\",model_name=\"m\"} 3\nvllm:kv_cache_usage_perc{engine=\"0\"} NaN\nvllm:generation_tokens_total 7 1700000000000\n# TYPE vllm:iteration_tokens_total histogram\nvllm:iteration_tokens_total_bucket{le=\"1.0\"} 3\nvllm:iteration_tokens_total_bucket{le=\"+Inf\"} 4\nvllm:iteration_tokens_total_sum 40\nvllm:iteration_tokens_total_count 4\n";
        let kept = kept_series(text).unwrap();
        assert_eq!(kept.get("vllm:iteration_tokens_total_sum"), Some(&40.0));
        assert_eq!(kept.get("vllm:iteration_tokens_total_count"), Some(&4.0));
        assert!(kept_series("vllm:num_requests_running 1\ngarbage line\n").is_err(), "a line not in the format");
        assert_eq!(kept.get("vllm:num_requests_running"), Some(&5.0));
        assert_eq!(kept.get("vllm:generation_tokens_total"), Some(&7.0));
        assert!(!kept.contains_key("vllm:kv_cache_usage_perc"), "{kept:?}");
    }

    #[test]
    fn a_falling_counter_or_a_scrape_out_of_order_is_a_problem() {
        let at = |t_s, v: f64| Scrape {
            t_s,
            values: [("serve_generation_tokens_total".to_string(), v)].into(),
            answer_s: Some(0.25),
            ..Scrape::default()
        };
        let series = |scrapes| ServerSeries { runtime: "x".into(), load: "c1".into(), round: 0, scrapes };
        let problem = |scrapes| crate::metrics::series_problem(&series(scrapes));
        assert_eq!(problem(vec![at(0.0, 1.0), at(1.0, 2.0)]), None);
        assert!(problem(vec![at(0.0, 2.0), at(1.0, 1.0)]).unwrap().contains("fell"));
        assert!(problem(vec![at(1.0, 1.0), at(0.5, 2.0)]).unwrap().contains("before"));
        // Sent while the previous scrape (answered after 0.25 s) was still being answered.
        assert!(problem(vec![at(1.0, 1.0), at(1.2, 2.0)]).unwrap().contains("answered"));
        let failed = Scrape { t_s: 2.0, error: Some("GET: HTTP 500".into()), answer_s: Some(0.1), ..Scrape::default() };
        assert!(problem(vec![at(1.0, 1.0), failed]).unwrap().contains("answer time"));
        assert!(problem(vec![Scrape { answer_s: Some(-1.0), ..at(0.0, 1.0) }]).unwrap().contains("duration"));
        assert!(problem(vec![Scrape { answer_s: None, ..at(0.0, 1.0) }]).unwrap().contains("no answer_s"));
    }

    #[test]
    fn the_answer_times_of_good_scrapes_give_the_percentiles() {
        let at = |t_s, ms: f64| Scrape {
            t_s,
            values: [("serve_num_requests_running".to_string(), 1.0)].into(),
            answer_s: Some(ms / 1000.0),
            ..Scrape::default()
        };
        let scrapes = (0..100).map(|i| at(i as f64, if i == 99 { 50.0 } else { 1.0 })).collect();
        let series = ServerSeries { runtime: "x".into(), load: "c1".into(), round: 0, scrapes };
        let row = crate::metrics::columns(&[&series]);
        assert_eq!(row.server_scrape_ms_p50, Some(1.0));
        assert_eq!(row.server_scrape_ms_max, Some(50.0));
        let p99 = row.server_scrape_ms_p99.unwrap();
        assert!(p99 > 1.0 && p99 < 50.0, "interpolated between the 99th and 100th: {p99}");
    }
}
