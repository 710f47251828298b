//! The serving benchmark's checks: the invariants of its artifacts (request times in order, every
//! summary recomputed from the per-request records), and the predecessor's seed read for what its
//! summary allows.

use crate::load::{self, Load};
use crate::serving::{Arrivals, RequestRecord};
use common::finding::Findings;
use serde_json::Value;
use std::collections::BTreeMap;

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// The invariants of a serving-bench artifact; every summary is recomputed from the requests.
/// (The manifest pins no expectations: serving numbers are this machine's.)
pub(crate) fn audit(body: &Value, f: &mut Findings) {
    let artifact: crate::serving::ServingArtifact = match serde_json::from_value(body.clone()) {
        Ok(a) => a,
        Err(e) => return f.wrong("schema", "", format!("does not read as a serving-bench artifact: {e}")),
    };
    if serde_json::to_value(&artifact.arguments).ok().as_ref() != Some(&artifact.provenance.settings.effective) {
        f.wrong("invariants", "arguments", "differs from provenance.settings.effective");
    }
    for (i, r) in artifact.requests.iter().enumerate() {
        let at = |k: &str| format!("requests[{i}].{k}");
        let admitted = r.arrival.and_then(|a| a.admitted_s);
        let mut times = vec![
            ("scheduled_s", Some(r.scheduled_s)),
            ("arrival.admitted_s", admitted),
            ("sent_s", r.sent_s),
            ("first_byte_s", r.first_byte_s),
        ];
        if r.ok() {
            times.push(("first_token_s", r.first_token_s));
        }
        times.push(("end_s", Some(r.end_s)));
        let present: Vec<(&str, f64)> = times.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        if let Some(w) = present.windows(2).find(|w| w[0].1 > w[1].1) {
            f.wrong("invariants", at(w[1].0), format!("{} is before {} {}", w[1].1, w[0].0, w[0].1));
        }
        if r.ok() && (r.first_token_s.is_none() || r.status.is_none()) {
            f.wrong("invariants", at("first_token_s"), "a successful request must have a status and a first token");
        }
        if r.ok() != r.error_detail.is_none() {
            f.wrong("invariants", at("error_detail"), "an error class and its detail come together");
        }
        if r.ok() && r.chunk_gaps_s.len() as u64 != r.chunks.saturating_sub(1) {
            f.wrong("invariants", at("chunk_gaps_s"), format!("{} gaps for {} chunks", r.chunk_gaps_s.len(), r.chunks));
        }
        match artifact.runtimes.iter().find(|t| t.name == r.runtime) {
            None => f.wrong("invariants", at("runtime"), format!("`{}` is not among the runtimes", r.runtime)),
            Some(t) => match (r.replica, t.replicas.len()) {
                (None, 0) => {}
                (Some(i), n) if i < n => {}
                (Some(i), n) => f.wrong("invariants", at("replica"), format!("{i}, but `{}` has {n} replicas", t.name)),
                (None, _) => {
                    f.wrong("invariants", at("replica"), format!("missing: `{}` is a group of replicas", t.name))
                }
            },
        }
    }
    match &artifact.arguments.arrivals {
        Some(arrivals) => open_loop(arrivals, artifact.arguments.seed, &artifact.requests, f),
        None => {
            if let Some(i) = artifact.requests.iter().position(|r| r.arrival.is_some()) {
                f.wrong(
                    "invariants",
                    format!("requests[{i}].arrival"),
                    "an open-loop record in a run of closed rounds",
                );
            }
        }
    }
    let fresh = crate::serving::summarize_all(&artifact.arguments, &artifact.runtimes, &artifact.requests);
    for i in 0..fresh.len().max(artifact.summary.len()) {
        match (fresh.get(i), artifact.summary.get(i)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                let key = a.keys().chain(b.keys()).find(|k| a.get(*k) != b.get(*k)).cloned().unwrap_or_default();
                f.wrong(
                    "invariants",
                    format!("summary[{i}].{key}"),
                    format!(
                        "recorded {}, recomputed from the requests {}",
                        b.get(&key).unwrap_or(&Value::Null),
                        a.get(&key).unwrap_or(&Value::Null)
                    ),
                );
            }
            _ => f.wrong("invariants", format!("summary[{i}]"), "the groups differ from those of the requests"),
        }
    }
}

/// An open loop kept its promises: it ran the groups planned (for a sweep, at the rates that its
/// first two groups' records give), each group's requests are numbered from 0 without a gap, the
/// warm-up ones are the first `warmup_requests`, a group at a finite rate was sent on the
/// schedule its seed draws (every `scheduled_s`, relative to the group's first, within a
/// microsecond), no group sent more requests than asked, a request waited past its time for a
/// slot only under a cap, and under `max_concurrency` no more requests were in flight at once.
fn open_loop(arrivals: &Arrivals, seed: u64, requests: &[RequestRecord], f: &mut Findings) {
    // Each runtime's loads as the run planned them: one per rate, or a sweep's first two and
    // then the rates that those two groups' records give.
    let mut planned_loads: BTreeMap<&str, Vec<Load>> = BTreeMap::new();
    for r in requests {
        planned_loads.entry(r.runtime.as_str()).or_insert_with(|| {
            let mut loads = Load::planned(arrivals);
            if let Some(n) = arrivals.sweep {
                let cap = arrivals.max_concurrency;
                let swept = load::sweep_rates(requests, &r.runtime, n);
                loads.extend(swept.into_iter().map(|rate| Load { rate: Some(rate), cap }));
            }
            loads
        });
    }
    // By runtime, rate (as bits) and cap: each request with its position in the artifact.
    type Group<'a> = Vec<(usize, &'a RequestRecord)>;
    let mut groups: BTreeMap<(&str, Option<u64>, Option<usize>), Group> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        let Some(a) = r.arrival else {
            f.wrong("invariants", format!("requests[{i}].arrival"), "missing in an open-loop run");
            continue;
        };
        let load = Load { rate: a.rate_rps, cap: (r.concurrency > 0).then_some(r.concurrency) };
        if !planned_loads[r.runtime.as_str()].contains(&load) {
            let planned = if arrivals.sweep.is_some() {
                "the sweep's groups (its first two, then the rates they give)"
            } else {
                "arguments.arrivals.rates under arguments.arrivals.max_concurrency"
            };
            f.wrong(
                "invariants",
                format!("requests[{i}].arrival.rate_rps"),
                format!("{}: not among {planned}", load.label()),
            );
            continue;
        }
        groups.entry((r.runtime.as_str(), a.rate_rps.map(f64::to_bits), load.cap)).or_default().push((i, r));
    }
    for (runtime, loads) in &planned_loads {
        let present = |l: &Load| groups.contains_key(&(*runtime, l.rate.map(f64::to_bits), l.cap));
        if let Some(missing) = loads.iter().find(|l| !present(l)) {
            f.wrong("invariants", "requests", format!("{runtime}: no requests of its group {}", missing.label()));
        }
    }
    let planned = arrivals.num_requests.unwrap_or(crate::serving::MAX_COUNT);
    for ((runtime, rate, cap), group) in groups {
        let rate = rate.map(f64::from_bits);
        let at = |i: usize, k: &str| format!("requests[{i}].{k}");
        if group.len() > planned {
            f.wrong(
                "invariants",
                at(group[0].0, "runtime"),
                format!("{runtime}: {} requests, more than {planned}", group.len()),
            );
        }
        if let Some((i, r)) = group.iter().enumerate().find(|(n, (_, r))| r.index != *n).map(|(_, g)| *g) {
            f.wrong(
                "invariants",
                at(i, "index"),
                format!("{}: the group's requests are not numbered 0, 1, ... in order", r.index),
            );
            continue;
        }
        if let Some((i, r)) =
            group.iter().find(|(_, r)| r.arrival.is_some_and(|a| a.warmup != (r.index < arrivals.warmup_requests)))
        {
            f.wrong(
                "invariants",
                at(*i, "arrival.warmup"),
                format!("request {} of its group; warm-ups are the first {}", r.index, arrivals.warmup_requests),
            );
        }
        // Only a cap on a schedule makes a request wait past its time for a slot; a closed pool
        // schedules each request at the instant its slot was freed.
        if cap.is_none() || rate.is_none() {
            if let Some((i, r)) = group.iter().find(|(_, r)| r.waited_for_slot()) {
                f.wrong(
                    "invariants",
                    at(*i, "arrival.admitted_s"),
                    format!("later than its scheduled {} s, with no cap on a schedule to wait for", r.scheduled_s),
                );
            }
        }
        if let Some(rate) = rate {
            let offsets = crate::load::schedule(seed, rate, arrivals.burstiness, planned, arrivals.duration_s);
            let origin = group[0].1.scheduled_s;
            let drawn = offsets.len() == group.len();
            match group.iter().zip(&offsets).find(|((_, r), o)| ((r.scheduled_s - origin) - **o).abs() > 1e-6) {
                Some(((i, r), o)) => f.wrong(
                    "invariants",
                    at(*i, "scheduled_s"),
                    format!("{} after the group's first, but its seed's schedule says {o}", r.scheduled_s - origin),
                ),
                None if !drawn => f.wrong(
                    "invariants",
                    at(group[0].0, "runtime"),
                    format!(
                        "{runtime}: {} requests, but the schedule within the duration has {}",
                        group.len(),
                        offsets.len()
                    ),
                ),
                None => {}
            }
        }
        if let Some(cap) = cap {
            // Sweep the sends and ends in time order (an end before a send at the same instant).
            let mut events: Vec<(f64, i32)> =
                group.iter().filter_map(|(_, r)| Some([(r.sent_s?, 1), (r.end_s, -1)])).flatten().collect();
            events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut open = 0i64;
            if let Some((t, _)) = events.iter().find(|(_, d)| {
                open += i64::from(*d);
                open > cap as i64
            }) {
                f.wrong(
                    "invariants",
                    at(group[0].0, "sent_s"),
                    format!("{runtime}: more than {cap} requests in flight at {t} s"),
                );
            }
        }
    }
}

/// A foreign artifact of the serving benchmark: a `summary` and `runtimes`.
pub(crate) fn recognises(value: &Value) -> bool {
    value.get("summary").is_some() && value.get("runtimes").is_some()
}

pub(crate) fn audit_foreign(value: &Value, f: &mut Findings) {
    let rows = value.get("summary").and_then(Value::as_array).cloned().unwrap_or_default();
    f.note("lacks", "requests", "no per-request records: summary statistics cannot be recomputed");
    let rounds = value.pointer("/arguments/rounds").and_then(Value::as_f64);
    for (i, row) in rows.iter().enumerate() {
        let at = |k: &str| format!("summary[{i}].{k}");
        let (req, ok, failed) = (num(row, "requests"), num(row, "successes"), num(row, "failures"));
        match (req, ok, failed) {
            (Some(r), Some(s), Some(x)) if r != s + x => {
                f.wrong("invariants", at("requests"), format!("{r} != successes {s} + failures {x}"))
            }
            (Some(_), Some(_), Some(_)) => {}
            _ => f.wrong("invariants", at("requests"), "requests, successes or failures missing"),
        }
        if let (Some(r), Some(rounds), Some(c)) = (req, rounds, num(row, "concurrency")) {
            if r != rounds * c {
                f.wrong("invariants", at("requests"), format!("{r} != rounds {rounds} x concurrency {c}"));
            }
        }
        for metric in ["ttft_s", "total_s", "prompt_tps", "decode_tps", "request_tps", "aggregate_output_tps"] {
            let (mean, p50, p95) = (
                num(row, &format!("{metric}_mean")),
                num(row, &format!("{metric}_p50")),
                num(row, &format!("{metric}_p95")),
            );
            match (mean, p50, p95) {
                (None, None, None) => f.note("lacks", at(&format!("{metric}_*")), "null: never measured"),
                (Some(_), Some(p50), Some(p95)) if p50 > p95 => {
                    f.wrong("invariants", at(&format!("{metric}_p50")), format!("{p50} > {metric}_p95 {p95}"))
                }
                (Some(m), Some(_), Some(_)) if !(m.is_finite() && m >= 0.0) => {
                    f.wrong("invariants", at(&format!("{metric}_mean")), format!("{m} is not a non-negative number"))
                }
                (Some(_), Some(_), Some(_)) => {}
                _ => f.wrong("invariants", at(metric), "mean, p50 and p95 must all be present or all null"),
            }
        }
        if let (Some(t), Some(total)) = (num(row, "ttft_s_p50"), num(row, "total_s_p50")) {
            if t > total {
                f.wrong("invariants", at("ttft_s_p50"), format!("{t} > total_s_p50 {total}"));
            }
        }
        f.note("lacks", at("ttft_s_p99"), "no p99, no sample count n, no TPOT or inter-chunk gaps");
    }
}
