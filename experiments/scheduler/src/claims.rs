//! What the scheduler's claims may name, and the values they are judged on: per-request TTFT,
//! completion and largest gap, and each run's throughput and wall time, round by round. Read from
//! JSON so that the predecessor's seed (runs without rounds: one round each) gives them too.

use crate::study::Parameters;
use common::claim::Vocabulary;
use common::evidence::Observation;
use serde_json::Value;

const REQUEST_METRICS: [&str; 3] = ["ttft_ms", "completion_ms", "max_gap_ms"];
const RUN_METRICS: [&str; 2] = ["output_tokens_per_s", "elapsed_ms"];

/// A run configuration's name in claims: the policy, `-chunk<N>` for chunked prefill,
/// `-active<N>` unless it admits the seed's two at a time, and `-kv<N>` under a KV budget of `N`
/// positions, `-prefix` with prefix reuse (`interleave-chunk64`, `batched-chunk64-kv320-prefix`).
pub fn run_label(
    policy: &str,
    chunk_size: Option<u64>,
    max_active: u64,
    kv_budget: Option<u64>,
    prefix_cache: bool,
) -> String {
    let mut label = policy.to_string();
    if let Some(c) = chunk_size {
        label.push_str(&format!("-chunk{c}"));
    }
    if max_active != 2 {
        label.push_str(&format!("-active{max_active}"));
    }
    if let Some(b) = kv_budget {
        label.push_str(&format!("-kv{b}"));
    }
    if prefix_cache {
        label.push_str("-prefix");
    }
    label
}

pub(crate) fn vocabulary(p: &Parameters) -> Vocabulary {
    let strings = |names: &[&str]| names.iter().map(|s| s.to_string()).collect();
    Vocabulary {
        run_metrics: strings(&RUN_METRICS),
        request_metrics: strings(&REQUEST_METRICS),
        runs: p
            .runs
            .iter()
            .map(|r| {
                run_label(
                    r.policy.name(),
                    r.chunk_size.map(|c| c as u64),
                    r.max_active as u64,
                    r.kv_budget.map(|b| b as u64),
                    r.prefix_cache,
                )
            })
            .collect(),
        requests: p.jobs.iter().map(|j| j.id.clone()).collect(),
    }
}

pub(crate) fn observations(artifact: &Value) -> Vec<Observation> {
    let mut out = Vec::new();
    for run in artifact.get("runs").and_then(Value::as_array).into_iter().flatten() {
        let Some(policy) = run.get("policy").and_then(Value::as_str) else { continue };
        let chunk = run.get("chunk_size").and_then(Value::as_u64);
        let max_active = run.get("max_active").and_then(Value::as_u64).unwrap_or(2);
        let prefix_cache = run.get("prefix_cache").and_then(Value::as_bool).unwrap_or(false);
        let label = run_label(policy, chunk, max_active, run.get("kv_budget").and_then(Value::as_u64), prefix_cache);
        // The seed records one run per configuration and no round.
        let round = run.get("round").and_then(Value::as_u64).unwrap_or(0) as usize;
        let mut push = |request: Option<&str>, metric: &str, value: Option<f64>| {
            if let Some(value) = value {
                out.push(Observation {
                    scope: None,
                    run: label.clone(),
                    request: request.map(str::to_string),
                    metric: metric.to_string(),
                    round,
                    value,
                });
            }
        };
        for metric in RUN_METRICS {
            push(None, metric, run.get(metric).and_then(Value::as_f64));
        }
        for request in run.get("requests").and_then(Value::as_array).into_iter().flatten() {
            let Some(id) = request.get("id").and_then(Value::as_str) else { continue };
            for metric in REQUEST_METRICS {
                push(Some(id), metric, request.get(metric).and_then(Value::as_f64));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_chunking_and_unusual_admission() {
        assert_eq!(run_label("fifo", None, 2, None, false), "fifo");
        assert_eq!(run_label("interleave", Some(64), 2, None, false), "interleave-chunk64");
        assert_eq!(run_label("batched", Some(64), 4, None, false), "batched-chunk64-active4");
        assert_eq!(run_label("batched", Some(64), 2, Some(320), false), "batched-chunk64-kv320");
        assert_eq!(run_label("fifo", None, 2, Some(320), true), "fifo-kv320-prefix");
    }

    #[test]
    fn the_seed_gives_one_round_per_run_and_request() {
        let seed = r#"{"runs":[{"policy":"fifo","chunk_size":null,"max_active":2,"elapsed_ms":900.0,
            "requests":[{"id":"a","ttft_ms":500.0,"completion_ms":800.0,"max_gap_ms":40.0}]}]}"#;
        let o = observations(&serde_json::from_str(seed).unwrap());
        assert_eq!(o.len(), 4);
        assert!(o.iter().all(|o| o.round == 0 && o.run == "fifo"));
        assert!(o.iter().any(|o| o.request.as_deref() == Some("a") && o.metric == "ttft_ms" && o.value == 500.0));
    }
}
