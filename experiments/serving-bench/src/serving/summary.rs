//! The summary arithmetic: requests grouped by target and load, each group's row under the seed's
//! field names, and the notes printed beside it. The binary and the audit both call it, so a
//! stored summary is recomputed by the same code that wrote it.

use super::params::{Parameters, SLO_METRICS};
use super::row::{OpenLoop, Slo, Spread, Stalls, SummaryRow, Tail, Throughput, Turns, PERCENTILE_METRICS};
use super::{groups, ErrorClass, RequestRecord, Runtime};
use common::stats::summarize;
use loadgen::group::window_s;
use std::collections::BTreeMap;

/// mean / std / p50 / p95 / p99 and n of one metric. The standard deviation is the
/// population's (as vLLM's printout gives it), over the values the mean is taken over.
fn spread(values: &[f64]) -> Spread {
    let s = summarize(values);
    let std = s.mean.map(|mean| {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        (finite.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / finite.len() as f64).sqrt()
    });
    Spread { mean: s.mean, std, p50: s.p50, p95: s.p95, p99: s.p99, n: s.n }
}

/// [`spread`], and the metric's largest value.
fn tail(values: &[f64]) -> Tail {
    Tail { spread: spread(values), max: values.iter().copied().reduce(f64::max) }
}

/// The summary of one (runtime, concurrency) group: the seed's columns (`ttft_s_mean`, ...) plus
/// `_p99` and `_n` for every metric, TPOT and chunk gaps, failure counts by class, the token
/// count sources used, and why `prompt_tps` is null when it is.
pub(crate) fn summarize_group(
    runtime: &str,
    model: &str,
    concurrency: usize,
    records: &[&RequestRecord],
) -> SummaryRow {
    let ok: Vec<&&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let mut failures_by_class: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter_map(|r| r.error) {
        *failures_by_class.entry(r.name()).or_default() += 1;
    }
    let collect = |f: fn(&RequestRecord) -> Option<f64>| ok.iter().filter_map(|r| f(r)).collect::<Vec<f64>>();
    // Multi-turn conversations: a first turn's TTFT beside the later turns', whose histories
    // the server has seen (all but the newest question, with a prefix cache).
    let turns = records.iter().any(|r| r.turn.is_some()).then(|| {
        let ttft_of = |later: bool| {
            ok.iter()
                .filter(|r| r.turn.is_some_and(|t| (t > 0) == later))
                .filter_map(|r| r.ttft())
                .collect::<Vec<f64>>()
        };
        Turns { first: spread(&ttft_of(false)), later: spread(&ttft_of(true)) }
    });
    let prompt = collect(RequestRecord::prompt_tps);
    let prompt_tps_note = (prompt.is_empty() && !ok.is_empty()).then(|| {
        "the server reported no prefill duration (OpenAI-compatible APIs do not); only Ollama's prompt_eval counters give it".to_string()
    });
    let gaps: Vec<f64> = ok.iter().flat_map(|r| r.chunk_gaps_s.iter().copied()).collect();
    // Inter-token latency: per token where every request's chunks carry their token counts,
    // else per chunk (the same numbers as the chunk gaps), and the row says which.
    let per_token = !ok.is_empty() && ok.iter().all(|r| r.chunk_tokens.len() as u64 == r.chunks);
    let itl_s =
        if per_token { spread(&ok.iter().flat_map(|r| r.token_gaps()).collect::<Vec<f64>>()) } else { spread(&gaps) };
    // Aggregate throughput: per round, successful output tokens over the round's wall time.
    let mut rounds: BTreeMap<usize, Vec<&RequestRecord>> = BTreeMap::new();
    for r in records {
        rounds.entry(r.round).or_default().push(r);
    }
    let aggregate: Vec<f64> = rounds.values().filter_map(|rs| aggregate_tps(rs)).collect();
    let mut output_token_sources: Vec<String> =
        ok.iter().map(|r| format!("{:?}", r.output_tokens().1).to_lowercase()).collect();
    output_token_sources.sort();
    output_token_sources.dedup();
    SummaryRow {
        runtime: runtime.to_string(),
        model: model.to_string(),
        concurrency,
        requests: records.len(),
        successes: ok.len(),
        failures: records.len() - ok.len(),
        failures_by_class,
        ttft_s: spread(&collect(RequestRecord::ttft)),
        turns,
        total_s: spread(&collect(|r| Some(r.total()))),
        prompt_tps: spread(&prompt),
        prompt_tps_note,
        decode_tps: spread(&collect(RequestRecord::decode_tps)),
        tpot_s: spread(&collect(RequestRecord::tpot)),
        request_tps: spread(&collect(RequestRecord::request_tps)),
        chunk_gap_s: spread(&gaps),
        itl_s,
        itl_source: if per_token { "usage" } else { "chunks" }.to_string(),
        aggregate_output_tps: spread(&aggregate),
        throughput: throughput(records),
        output_token_sources,
        // Checked outputs, in a run whose answers carry digests (an artifact from before has none).
        inconsistent_outputs: records
            .iter()
            .any(|r| r.text_sha256.is_some())
            .then(|| ok.iter().filter(|r| r.inconsistency.is_some()).count()),
        ..SummaryRow::default()
    }
}

/// Throughput over the group's window ([`window_s`]: its first scheduled request to its last
/// end, rounds and the gaps between them included), the one window goodput is taken over too:
/// successful requests per second, their output tokens per second, and their prompt and output
/// tokens per second (prompt tokens as the server counted them; requests without a count add
/// none, and `total_token_throughput_counted` says how many had one).
fn throughput(group: &[&RequestRecord]) -> Throughput {
    let window = window_s(group);
    let ok = || group.iter().filter(|r| r.ok());
    let output = ok().fold(0u64, |sum, r| sum.saturating_add(r.output_tokens().0));
    let prompts: Vec<u64> = ok().filter_map(|r| r.usage_prompt_tokens.or(r.ollama_prompt_eval_count)).collect();
    let prompt = prompts.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
    let per_second = |n: f64| window.map(|w| n / w);
    Throughput {
        request_throughput_rps: per_second(ok().count() as f64),
        output_throughput_tps: per_second(output as f64),
        total_token_throughput_tps: per_second(output.saturating_add(prompt) as f64),
        total_token_throughput_counted: prompts.len(),
    }
}

/// One round's successful output tokens over its wall time.
pub fn aggregate_tps(round: &[&RequestRecord]) -> Option<f64> {
    // Saturating: the counts may come from a file the audit reads.
    let tokens = round.iter().filter(|r| r.ok()).fold(0u64, |sum, r| sum.saturating_add(r.output_tokens().0));
    window_s(round).map(|w| tokens as f64 / w)
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
            let detail = super::one_line(first.error_detail.as_deref().unwrap_or_default(), 160);
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

/// One line per runtime and concurrency level of a closed-round run of conversations where a
/// failed turn ended conversations early: how many, and how many turns they left unsent (which
/// no record holds, so no rate or latency counts them). Printed after the table.
pub fn unsent_turns_notes(artifact: &super::ServingArtifact) -> Vec<String> {
    let turns = artifact.workload.as_ref().map_or(&[][..], |w| &w.conversation_turns[..]);
    if turns.is_empty() || artifact.arguments.arrivals.is_some() {
        return Vec::new();
    }
    let mut sent: BTreeMap<(&str, usize, usize, usize), usize> = BTreeMap::new();
    for r in &artifact.requests {
        *sent.entry((r.runtime.as_str(), r.concurrency, r.round, r.index)).or_default() += 1;
    }
    // Per runtime and level: conversations cut short, and their turns not sent.
    let mut cut: BTreeMap<(&str, usize), (usize, usize)> = BTreeMap::new();
    for (&(runtime, c, round, index), &n) in &sent {
        let planned = turns[artifact.arguments.closed_item(round, c, index) % turns.len()];
        if n < planned {
            let entry = cut.entry((runtime, c)).or_default();
            entry.0 += 1;
            entry.1 += planned - n;
        }
    }
    cut.into_iter()
        .map(|((runtime, c), (conversations, unsent))| {
            format!("{runtime} concurrency {c}: {conversations} conversations ended at a failed turn, leaving {unsent} turns unsent (not in any rate or latency)")
        })
        .collect()
}

/// An artifact's summary: [`summarize_all`] of its requests, each group's server-side columns
/// ([`super::server::columns`]) where its targets' `/metrics` were scraped, and its send delay's
/// held and own parts ([`stall_columns`]) where the stall probe watched it.
pub fn summarize_artifact(a: &super::ServingArtifact) -> Vec<SummaryRow> {
    let mut rows = summarize_all(&a.arguments, &a.runtimes, &a.requests);
    for (row, g) in rows.iter_mut().zip(groups(&a.requests)) {
        let series: Vec<_> = a.server_metrics.iter().filter(|s| s.runtime == g.runtime && s.load == g.load).collect();
        if !series.is_empty() {
            row.server = Some(super::server_columns(&series));
        }
        if let Some(probed) = a.machine_stalls.iter().find(|s| s.runtime == g.runtime && s.load == g.load) {
            row.stalls = Some(stalls(probed, &g.records));
        }
    }
    rows
}

/// A probed group's columns: how much of each send delay the machine held (`send_held_s`) and
/// what is left, the client's own (`send_own_s`), and what the probe saw and cost.
fn stalls(probed: &super::MachineStalls, group: &[&RequestRecord]) -> Stalls {
    let split: Vec<super::SendSplit> = group.iter().filter_map(|r| super::split_send(r, &probed.stalls)).collect();
    Stalls {
        send_held_s: tail(&split.iter().map(|s| s.held).collect::<Vec<f64>>()),
        send_own_s: tail(&split.iter().map(|s| s.own).collect::<Vec<f64>>()),
        machine_stalls: probed.stalls.len(),
        machine_stalled_s: probed.stalls.iter().map(|s| s.to_s - s.from_s).sum(),
        stall_probe_cpu_s: probed.cpu_time_s,
    }
}

/// Summaries of every group ([`groups`]). `params` adds the percentiles and SLOs it asks for.
pub fn summarize_all(params: &Parameters, runtimes: &[Runtime], records: &[RequestRecord]) -> Vec<SummaryRow> {
    groups(records)
        .into_iter()
        .map(|g| {
            let group = &g.records;
            let model = runtimes.iter().find(|t| t.name == g.runtime).map(|t| t.model.as_str()).unwrap_or_default();
            let mut row = summarize_group(g.runtime, model, g.concurrency, group);
            row.percentiles = extra_percentiles(&params.percentiles, group);
            if !params.slo.is_empty() {
                row.slo = Some(slo_of(&params.slo, group, g.rate.is_some()));
            }
            if let Some(rate) = g.rate {
                row.open_loop = Some(open_loop(rate, group));
            }
            row
        })
        .collect()
}

/// `<metric>_p<P>` for each percentile asked beyond the seed's p50, p95 and p99, of the
/// successful requests' TTFT, TPOT, total latency and chunk gaps.
fn extra_percentiles(percentiles: &[f64], group: &[&RequestRecord]) -> BTreeMap<String, Option<f64>> {
    let ok: Vec<&&RequestRecord> = group.iter().filter(|r| r.ok()).collect();
    let sorted = |mut v: Vec<f64>| {
        v.retain(|x| x.is_finite());
        v.sort_by(f64::total_cmp);
        v
    };
    let metrics: [Vec<f64>; 4] = [
        sorted(ok.iter().filter_map(|r| r.ttft()).collect()),
        sorted(ok.iter().filter_map(|r| r.tpot()).collect()),
        sorted(ok.iter().map(|r| r.total()).collect()),
        sorted(ok.iter().flat_map(|r| r.chunk_gaps_s.iter().copied()).collect()),
    ];
    let mut columns = BTreeMap::new();
    for p in percentiles.iter().filter(|p| ![50.0, 95.0, 99.0].contains(*p)) {
        for (metric, values) in PERCENTILE_METRICS.iter().zip(&metrics) {
            columns.insert(format!("{metric}_p{p}"), common::stats::percentile_sorted(values, *p));
        }
    }
    columns
}

/// The SLO columns: how many requests met every objective (a failure meets none), their share,
/// and for an open loop the goodput, those requests per second of the group's window (from its
/// first scheduled request to its last end).
fn slo_of(slo: &BTreeMap<String, f64>, group: &[&RequestRecord], open: bool) -> Slo {
    let meets = |r: &RequestRecord| {
        r.ok()
            && slo.iter().all(|(name, bound_ms)| {
                let read = SLO_METRICS.iter().find(|(m, _)| m == name).map(|(_, read)| read);
                read.and_then(|read| read(r)).is_some_and(|v| v * 1000.0 <= *bound_ms)
            })
    };
    let met = group.iter().filter(|r| meets(r)).count();
    Slo {
        slo_met: met,
        slo_met_share: (!group.is_empty()).then(|| met as f64 / group.len() as f64),
        goodput_rps: open.then(|| window_s(group).map(|w| met as f64 / w)),
    }
}

/// An open-loop group's own columns: its rate, the rate it achieved (measured requests over the
/// time from the first scheduled to the last sent), and the send lateness: all of it, the
/// client's own part (without waits for a slot under the cap), and that part's two pieces.
fn open_loop(rate: Option<f64>, group: &[&RequestRecord]) -> OpenLoop {
    let first = group.iter().map(|r| r.scheduled_s).fold(f64::INFINITY, f64::min);
    let last = group.iter().filter_map(|r| r.sent_s).fold(f64::NEG_INFINITY, f64::max);
    // Where the admissions were recorded, the client's own part; where the pacer's wakes were
    // too, that part splits in two: the machine's hold on the pacer, and the client's delay
    // once it was awake.
    let part = |read: fn(&RequestRecord) -> Option<f64>| {
        let values: Vec<f64> = group.iter().filter_map(|r| read(r)).collect();
        (!values.is_empty()).then(|| tail(&values))
    };
    OpenLoop {
        request_rate: rate,
        achieved_request_rate: (group.len() > 1 && last > first).then(|| (group.len() - 1) as f64 / (last - first)),
        send_lateness_s: tail(&group.iter().filter_map(|r| r.lateness()).collect::<Vec<f64>>()),
        client_lateness_s: part(RequestRecord::client_lateness),
        pacer_lateness_s: part(RequestRecord::pacer_lateness),
        send_delay_s: part(RequestRecord::send_delay),
    }
}

#[cfg(test)]
pub(in crate::serving) mod tests {
    use super::super::{Arrival, Stall, TokenSource};
    use super::*;

    /// A successful record of `tokens` tokens, finished by length.
    pub(in crate::serving) fn rec(round: usize, start: f64, first: f64, end: f64, tokens: u64) -> RequestRecord {
        RequestRecord {
            runtime: "r".into(),
            concurrency: 2,
            round,
            index: 0,
            prompt: "short".into(),
            scheduled_s: start,
            sent_s: Some(start),
            sent_cpu: None,
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
            turn: None,
            resent: false,
            text_sha256: None,
            text: None,
            inconsistency: None,
        }
    }

    #[test]
    fn a_backlog_is_noted_only_where_requests_on_a_schedule_waited_for_a_slot() {
        let open = |index: usize, scheduled: f64, admitted: f64, rate: Option<f64>, warmup: bool| {
            let mut r = rec(0, scheduled, scheduled + 0.5, scheduled + 1.0, 4);
            r.index = index;
            r.arrival = Some(Arrival { rate_rps: rate, warmup, admitted_s: Some(admitted), woken_s: None });
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
    fn the_clients_own_lateness_splits_into_the_pacers_wake_and_the_send_after_it() {
        let open_at = |scheduled: f64, admitted: f64, woken: Option<f64>, sent: f64| {
            let mut r = rec(0, scheduled, sent + 0.5, sent + 1.0, 4);
            r.sent_s = Some(sent);
            r.arrival =
                Some(Arrival { rate_rps: Some(8.0), warmup: false, admitted_s: Some(admitted), woken_s: woken });
            r
        };
        // Woken 10 ms late, sent 0.25 ms later; woken on time, then 0.5 s waiting for a slot.
        let (a, b) = (open_at(1.0, 1.0, Some(1.01), 1.01025), open_at(2.0, 2.5, Some(2.0), 2.5005));
        let open = open_loop(Some(8.0), &[&a, &b]);
        let close = |part: Option<Tail>, want: f64| {
            assert!(part.and_then(|t| t.max).is_some_and(|v| (v - want).abs() < 1e-9), "{want}: {open:?}")
        };
        close(open.client_lateness_s, 0.01025);
        close(open.pacer_lateness_s, 0.01);
        close(open.send_delay_s, 0.0005);
        // The two parts make each request's own lateness whole; a wake before the slot was free
        // made none of it.
        for r in [&a, &b] {
            let whole = r.pacer_lateness().unwrap() + r.send_delay().unwrap();
            assert!((whole - r.client_lateness().unwrap()).abs() < 1e-12, "{r:?}");
        }
        assert_eq!(b.pacer_lateness(), Some(0.0));
        assert_eq!(open.send_delay_s.map(|t| t.spread.n), Some(2));
        // A run that did not record its pacer's wakes has neither part, and stores neither.
        let unwoken = open_loop(Some(8.0), &[&open_at(1.0, 1.0, None, 1.001)]);
        assert!(unwoken.client_lateness_s.is_some() && unwoken.send_delay_s.is_none(), "{unwoken:?}");
        let row = SummaryRow { open_loop: Some(unwoken), ..SummaryRow::default() };
        let columns = row.columns();
        assert!(
            columns.contains_key("client_lateness_s_p99") && !columns.keys().any(|k| k.starts_with("send_delay")),
            "{columns:?}"
        );
    }

    #[test]
    fn slos_count_the_requests_within_every_bound_and_goodput_is_those_per_second() {
        // TTFT 0.5 s and TPOT 0.2 s; TTFT 0.1 s and TPOT 0.39 s; TTFT 0.2 s, failed.
        let a = rec(0, 0.0, 0.5, 2.5, 11);
        let b = rec(0, 1.0, 1.1, 5.0, 11);
        let mut c = rec(0, 2.0, 2.2, 4.0, 11);
        c.error = Some(ErrorClass::TruncatedStream);
        let slo = |pairs: &[(&str, f64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let met = slo_of(&slo(&[("ttft_ms", 300.0)]), &[&a, &b, &c], true);
        assert_eq!((met.slo_met, met.slo_met_share), (1, Some(1.0 / 3.0)));
        // One good request over the window from 0 s to 5 s.
        assert_eq!(met.goodput_rps, Some(Some(0.2)));
        assert_eq!(slo_of(&slo(&[("ttft_ms", 600.0), ("tpot_ms", 250.0)]), &[&a, &b, &c], false).slo_met, 1);
        let closed = slo_of(&slo(&[("e2e_ms", 10_000.0)]), &[&a, &b, &c], false);
        assert_eq!((closed.slo_met, closed.goodput_rps), (2, None), "a closed loop has no goodput");
        // Extra percentiles beside the seed's.
        let extra = extra_percentiles(&[90.0, 99.0], &[&a, &b]);
        // TTFTs 0.1 s and 0.5 s: p90 interpolates to 0.46 s.
        assert!(extra["ttft_s_p90"].is_some_and(|p| (p - 0.46).abs() < 1e-12), "{extra:?}");
        assert!(!extra.contains_key("ttft_s_p99"), "p99 is among the seed's columns already");
    }

    /// Throughput and goodput share one window, so goodput never exceeds the request
    /// throughput; standard deviations are the population's.
    #[test]
    fn throughput_and_goodput_are_taken_over_one_window() {
        let a = rec(0, 0.0, 0.5, 2.5, 11);
        let b = rec(0, 1.0, 1.1, 5.0, 11);
        let mut c = rec(0, 2.0, 2.2, 4.0, 11);
        c.error = Some(ErrorClass::TruncatedStream);
        let row = summarize_group("r", "m", 2, &[&a, &b, &c]);
        let slo = [("ttft_ms".to_string(), 1000.0)].into_iter().collect();
        let met = slo_of(&slo, &[&a, &b, &c], true);
        // Two successes over 0 s to 5 s, 11 output and 10 prompt tokens each.
        let t = row.throughput;
        assert_eq!(t.request_throughput_rps, Some(0.4));
        assert_eq!(t.output_throughput_tps, Some(22.0 / 5.0));
        assert_eq!(t.total_token_throughput_tps, Some(42.0 / 5.0));
        assert_eq!(met.goodput_rps, Some(t.request_throughput_rps), "both met the SLO");
        // TTFTs 0.5 s and 0.1 s: mean 0.3, population deviation 0.2.
        assert!(row.ttft_s.std.is_some_and(|s| (s - 0.2).abs() < 1e-12), "{row:?}");
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
        assert_eq!((row.requests, row.successes, row.failures), (4, 3, 1));
        assert_eq!(row.failures_by_class["truncated_stream"], 1);
        // Round 0: 30 tokens over 4 s; round 1: 6 successful tokens over 2 s.
        assert_eq!(row.aggregate_output_tps.n, 2);
        assert_eq!(row.aggregate_output_tps.mean, Some((7.5 + 3.0) / 2.0));
        assert_eq!(row.ttft_s.n, 3);
        assert!(row.prompt_tps_note.is_some());
        assert_eq!(row.prompt_tps.mean, None);
        // Stored under the seed's names, and read back whole.
        let columns = row.columns();
        assert_eq!(columns["aggregate_output_tps_n"], 2);
        assert!(columns["prompt_tps_mean"].is_null() && columns["prompt_tps_note"].is_string());
        assert_eq!(SummaryRow::from_columns(columns), Ok(row));
    }

    fn probed(stalls: Vec<Stall>) -> super::super::MachineStalls {
        super::super::MachineStalls {
            runtime: "r".into(),
            load: "rate8".into(),
            cpus: vec![0, 1],
            period_s: 0.001,
            min_stall_s: 0.0001,
            from_s: 0.0,
            to_s: 10.0,
            wakes: 20_000,
            cpu_time_s: 0.1,
            stalls,
        }
    }

    /// Admitted at 1 s, woken at `woken`, sent at `sent` from `cpu`.
    fn sent_at(woken: f64, sent: f64, cpu: usize) -> RequestRecord {
        let mut r = rec(0, 1.0, sent + 0.01, sent + 0.1, 4);
        r.sent_s = Some(sent);
        r.sent_cpu = Some(cpu);
        r.arrival = Some(Arrival { rate_rps: Some(8.0), warmup: false, admitted_s: Some(1.0), woken_s: Some(woken) });
        r
    }

    #[test]
    fn a_send_delay_is_held_where_a_stall_of_its_cpu_overlaps_it() {
        let stalls = [
            Stall { cpu: 0, from_s: 1.001, to_s: 1.004 },
            Stall { cpu: 1, from_s: 1.000, to_s: 1.010 },
            Stall { cpu: 0, from_s: 1.009, to_s: 1.020 },
        ];
        // Ready at 1.000 (woken on time), sent at 1.010 from CPU 0: held 1.001-1.004 and
        // 1.009-1.010; CPU 1's stall is not its own.
        let r = sent_at(1.0, 1.010, 0);
        let split = super::super::split_send(&r, &stalls).unwrap();
        assert!((split.held - 0.004).abs() < 1e-9 && (split.own - 0.006).abs() < 1e-9, "{split:?}");
        let held = |r: &RequestRecord, stalls: &[Stall]| super::super::split_send(r, stalls).unwrap().held;
        // The same send from CPU 1 was held throughout.
        assert!((held(&sent_at(1.0, 1.010, 1), &stalls) - 0.010).abs() < 1e-9);
        // Woken late at 1.005: only from then on is it the send's.
        assert!((held(&sent_at(1.005, 1.010, 0), &stalls) - 0.001).abs() < 1e-9);
        // Without a recorded CPU nothing is held, and nothing counts as the client's own either.
        let mut unknown = sent_at(1.0, 1.010, 0);
        unknown.sent_cpu = None;
        assert_eq!(super::super::split_send(&unknown, &stalls), None);
        // Overlapping spans (a forged file) never make the held part exceed the delay.
        let forged = [Stall { cpu: 0, from_s: 0.9, to_s: 1.1 }, Stall { cpu: 0, from_s: 0.9, to_s: 1.1 }];
        let split = super::super::split_send(&r, &forged).unwrap();
        assert!((split.held - 0.010).abs() < 1e-9 && split.own == 0.0, "{split:?}");
    }

    #[test]
    fn held_and_own_parts_make_each_send_delay_whole() {
        let group = [sent_at(1.0, 1.010, 0), sent_at(1.0, 1.0005, 1), sent_at(1.002, 1.003, 0)];
        let refs: Vec<&RequestRecord> = group.iter().collect();
        let row = stalls(&probed(vec![Stall { cpu: 0, from_s: 1.001, to_s: 1.004 }]), &refs);
        // Held 3 ms, 0 and 1 ms; own 7 ms, 0.5 ms and 0.
        let v = |x: Option<f64>| x.unwrap();
        assert!((v(row.send_held_s.max) - 0.003).abs() < 1e-9);
        assert!((v(row.send_own_s.max) - 0.007).abs() < 1e-9);
        let means = v(row.send_held_s.spread.mean) + v(row.send_own_s.spread.mean);
        assert!((means - (0.010 + 0.0005 + 0.001) / 3.0).abs() < 1e-9);
        assert_eq!(row.machine_stalls, 1);
        assert!((row.machine_stalled_s - 0.003).abs() < 1e-9);
    }
}
