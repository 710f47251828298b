//! What the serving benchmark's claims may name, and the values they are judged on: per target
//! (each judged apart) and per group (a concurrency level `c4`, or an open-loop rate `rate8`,
//! `rate-inf`), each round's aggregate output tokens/s and its median TTFT, TPOT and total time.
//! The predecessor's seed keeps only summaries: its group means give one round each.

use crate::serving::{aggregate_tps, groups, load_label, Parameters, RequestRecord};
use common::claim::Vocabulary;
use common::evidence::Observation;
use serde_json::Value;
use std::collections::BTreeMap;

const METRICS: [&str; 4] = ["aggregate_output_tps", "ttft_s_p50", "tpot_s_p50", "total_s_p50"];

pub(crate) fn vocabulary(p: &Parameters) -> Vocabulary {
    let runs = match &p.arrivals {
        // A sweep's later rates are measured, not known: claims name its first two groups.
        Some(a) => loadgen::load::Load::planned(a).iter().map(|l| l.label()).collect(),
        None => p.concurrency.iter().map(|c| load_label(*c, None)).collect(),
    };
    Vocabulary { run_metrics: METRICS.iter().map(|m| m.to_string()).collect(), runs, ..Vocabulary::default() }
}

pub(crate) fn observations(artifact: &Value) -> Vec<Observation> {
    let records: Vec<RequestRecord> =
        artifact.get("requests").and_then(|r| serde_json::from_value(r.clone()).ok()).unwrap_or_default();
    if records.is_empty() {
        return from_summary(artifact);
    }
    let median = |v: Vec<f64>| common::stats::summarize(&v).p50;
    let mut out = Vec::new();
    for g in groups(&records) {
        let mut rounds: BTreeMap<usize, Vec<&RequestRecord>> = BTreeMap::new();
        for r in &g.records {
            rounds.entry(r.round).or_default().push(r);
        }
        for (round, group) in rounds {
            let ok: Vec<&&RequestRecord> = group.iter().filter(|r| r.ok()).collect();
            let values = [
                aggregate_tps(&group),
                median(ok.iter().filter_map(|r| r.ttft()).collect()),
                median(ok.iter().filter_map(|r| r.tpot()).collect()),
                median(ok.iter().map(|r| r.total()).collect()),
            ];
            for (metric, value) in METRICS.iter().zip(values) {
                if let Some(value) = value {
                    out.push(Observation {
                        scope: Some(g.runtime.to_string()),
                        run: g.load.clone(),
                        request: None,
                        metric: metric.to_string(),
                        round,
                        value,
                    });
                }
            }
        }
    }
    out
}

/// The seed's summary rows: each group's mean aggregate tokens/s and its p50s, as one round.
fn from_summary(artifact: &Value) -> Vec<Observation> {
    let mut out = Vec::new();
    for row in artifact.get("summary").and_then(Value::as_array).into_iter().flatten() {
        let (Some(runtime), Some(c)) =
            (row.get("runtime").and_then(Value::as_str), row.get("concurrency").and_then(Value::as_u64))
        else {
            continue;
        };
        for (metric, field) in
            METRICS.iter().zip(["aggregate_output_tps_mean", "ttft_s_p50", "tpot_s_p50", "total_s_p50"])
        {
            if let Some(value) = row.get(field).and_then(Value::as_f64) {
                out.push(Observation {
                    scope: Some(runtime.to_string()),
                    run: load_label(c as usize, None),
                    request: None,
                    metric: metric.to_string(),
                    round: 0,
                    value,
                });
            }
        }
    }
    out
}
