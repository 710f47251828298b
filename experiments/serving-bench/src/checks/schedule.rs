//! The checks of the load a run sent: a generated workload redrawn from its seed, closed rounds
//! whole, and an open loop's schedule redrawn, its groups in order and its cap kept.

use crate::serving::{Arrivals, RequestRecord};
use common::finding::Findings;
use loadgen::load::{self, Load};
use std::collections::BTreeMap;

/// A generated workload is the one its seed draws: redrawn with the tokenizer it was counted
/// with, when that is here with the recorded digest, every prompt's digest and length must come
/// out as recorded. Without the tokenizer, a note says it was not redrawn.
pub(super) fn redrawn(a: &crate::serving::ServingArtifact, f: &mut Findings) {
    let Some(w) =
        a.workload.as_ref().filter(|w| ["synthetic", "shared-prefix", "multi-turn"].contains(&w.source.as_str()))
    else {
        return;
    };
    let recorded = w.path.as_deref().unwrap_or_default();
    let dir = match std::path::Path::new(recorded) {
        p if p.is_absolute() => p.to_path_buf(),
        p => common::workspace::Workspace::discover().map(|ws| ws.root).unwrap_or_default().join(p),
    };
    let here = std::fs::read(dir.join("tokenizer.json"))
        .ok()
        .map(|b| common::digest::bytes_digest(&b, common::digest::Algorithm::Sha256));
    if here.is_none() || here != w.file_sha256 {
        return f.note(
            "invariants",
            "workload",
            format!("not redrawn: {recorded}/tokenizer.json is not here with the recorded digest (`models generate` makes it)"),
        );
    }
    match loadgen::workload::redraw(w, a.arguments.seed, &dir) {
        Some(Err(e)) => f.wrong("invariants", "workload.lengths", e),
        Some(Ok(drawn)) if drawn.record != *w => f.wrong(
            "invariants",
            "workload",
            format!(
                "not what seed {} draws: items_sha256 {} where the draw gives {}",
                a.arguments.seed, w.items_sha256, drawn.record.items_sha256
            ),
        ),
        _ => {}
    }
}

/// Closed rounds are whole: every runtime ran every concurrency level in every round, a round at
/// concurrency c sending requests 0..c once each, and nothing else. A record deleted (a failure,
/// say) or added shows here, whatever the summary was made to say. In a multi-turn workload each
/// request is a conversation: its turns recorded 0, 1, ... in order, each sent after the one
/// before it ended, all of its item's turns or up to a failed one.
pub(super) fn closed_rounds(artifact: &crate::serving::ServingArtifact, f: &mut Findings) {
    let args = &artifact.arguments;
    let turns = artifact.workload.as_ref().map_or(&[][..], |w| &w.conversation_turns[..]);
    if artifact.workload.as_ref().is_some_and(|w| !turns.is_empty() && turns.len() != w.items) {
        return f.wrong("invariants", "workload.conversation_turns", "not one count of turns per item");
    }
    let mut seen: BTreeMap<(&str, usize, usize), BTreeMap<usize, Vec<&RequestRecord>>> = BTreeMap::new();
    for (i, r) in artifact.requests.iter().enumerate() {
        let planned = args.concurrency.contains(&r.concurrency) && r.round < args.rounds && r.index < r.concurrency;
        if !planned {
            f.wrong(
                "invariants",
                format!("requests[{i}]"),
                format!(
                    "concurrency {} round {} index {}: not a request of arguments.concurrency x arguments.rounds",
                    r.concurrency, r.round, r.index
                ),
            );
            continue;
        }
        if r.turn.is_some() == turns.is_empty() {
            return f.wrong(
                "invariants",
                format!("requests[{i}].turn"),
                "a turn is recorded for every request of a multi-turn workload, and only there",
            );
        }
        seen.entry((r.runtime.as_str(), r.concurrency, r.round)).or_default().entry(r.index).or_default().push(r);
    }
    for runtime in &artifact.runtimes {
        for &c in &args.concurrency {
            for round in 0..args.rounds {
                let sent = seen.get(&(runtime.name.as_str(), c, round));
                let indices: Vec<usize> = sent.map(|s| s.keys().copied().collect()).unwrap_or_default();
                let group = format!("{} concurrency {c} round {round}", runtime.name);
                if indices != (0..c).collect::<Vec<_>>() {
                    return f.wrong(
                        "invariants",
                        "requests",
                        format!("{group}: requests {indices:?}, but a closed round sends 0..{c} once each"),
                    );
                }
                for (&index, records) in sent.into_iter().flatten() {
                    // The item the client gave this request.
                    let item = args.closed_item(round, c, index) % turns.len().max(1);
                    let planned = turns.get(item).copied().unwrap_or(1);
                    if let Some(problem) = conversation_problem(records, planned) {
                        return f.wrong("invariants", "requests", format!("{group} request {index}: {problem}"));
                    }
                }
            }
        }
    }
}

/// What is wrong with one closed-round request's records, a conversation of `planned` turns (a
/// single request: one, without a turn number), if anything.
fn conversation_problem(records: &[&RequestRecord], planned: usize) -> Option<String> {
    let numbered = records.iter().enumerate().all(|(k, r)| r.turn.unwrap_or(0) == k);
    if !numbered || records.len() > planned {
        return Some(format!(
            "{} records, turns {:?}, but it is {planned} turns sent 0, 1, ... once each",
            records.len(),
            records.iter().map(|r| r.turn).collect::<Vec<_>>()
        ));
    }
    if records.len() < planned && records.last().is_some_and(|r| r.error.is_none()) {
        return Some(format!(
            "{} of its {planned} turns, the last a success: a conversation stops only at a failed turn",
            records.len()
        ));
    }
    if let Some(other) = records.iter().find(|r| r.prompt != records[0].prompt) {
        return Some(format!(
            "its turns name prompts `{}` and `{}`, but a conversation is one item's",
            records[0].prompt, other.prompt
        ));
    }
    // Each turn resends the turn before with its reply and a new message, so the prompt grows
    // (counted where the server said, on the turns that succeeded).
    let counts: Vec<u64> = records.iter().filter(|r| r.error.is_none()).filter_map(|r| r.usage_prompt_tokens).collect();
    if counts.windows(2).any(|w| w[1] <= w[0]) {
        return Some(format!("prompt tokens {counts:?} turn by turn, but each turn resends the one before and more"));
    }
    records
        .windows(2)
        .any(|w| w[1].scheduled_s < w[0].end_s || w[1].sent_s.is_some_and(|s| s < w[0].end_s))
        .then(|| "a turn sent before the turn before it ended".into())
}

/// An open loop kept its promises: it ran the groups planned (for a sweep, at the rates that its
/// first two groups' records give), each group's requests are numbered from 0 without a gap, the
/// warm-up ones are the first `warmup_requests`, a group at a finite rate was sent on the
/// schedule its seed draws (every `scheduled_s`, relative to the group's first, within a
/// microsecond), no group sent more requests than asked, a request waited past its time for a
/// slot only under a cap, and under `max_concurrency` no more requests were in flight at once.
pub(super) fn open_loop(arrivals: &Arrivals, seed: u64, requests: &[RequestRecord], f: &mut Findings) {
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
        // Only a schedule has a pacer to wake its requests.
        if rate.is_none() {
            if let Some((i, _)) = group.iter().find(|(_, r)| r.arrival.is_some_and(|a| a.woken_s.is_some())) {
                f.wrong("invariants", at(*i, "arrival.woken_s"), "a pacer's wake-up in a group without a schedule");
            }
        }
        if let Some(rate) = rate {
            let offsets = loadgen::load::schedule(seed, rate, arrivals.burstiness, planned, arrivals.duration_s);
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
