//! The printed tables of a written artifact: its summary, one line per target and load, and the
//! paired comparisons between targets and between loads. Read from the artifact as written, so
//! that nothing printed holds what the artifact may not.

use crate::serving::{self, RequestRecord, ServingArtifact, SummaryRow, Tail};
use loadgen::metrics::ServerColumns;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The summary as a table: one line per target and load.
pub fn summary(a: &ServingArtifact) -> String {
    let mut out = String::new();
    let f = |v: Option<f64>, scale: f64| num(v, scale, 1);
    let w = runtime_width(a);
    let open = a.arguments.arrivals.is_some();
    // Send lateness, and in brackets the client's own part (without waits for a slot).
    let (group, late) = if open { ("rate", "late p99 (own)") } else { ("conc", "") };
    let slo = !a.arguments.slo.is_empty();
    let _ = writeln!(
        out,
        "{:<w$} {:>8} {:>5} {:>5} {:>9} {:>9} {:>9} {:>10} {:>10} {:>11} {:>7} {:>9} {:>11} {:>16} {:>8} {:>9}",
        "runtime",
        group,
        "ok",
        "fail",
        "ttft p50",
        "ttft std",
        "ttft p95",
        "total p50",
        "decode t/s",
        "aggr t/s",
        "req/s",
        "out t/s",
        "total t/s",
        late,
        if slo { "SLO met" } else { "" },
        if slo && open { "goodput/s" } else { "" }
    );
    for row in &a.summary {
        let lateness = match &row.open_loop {
            Some(o) if open => format!(
                "{} ({})ms",
                f(o.send_lateness_s.spread.p99, 1000.0),
                f(o.client_lateness_s.and_then(|t| t.spread.p99), 1000.0)
            ),
            _ => String::new(),
        };
        let group = load_cell(row, open);
        let met = if slo { format!("{}%", f(row.slo.and_then(|s| s.slo_met_share), 100.0)) } else { String::new() };
        let goodput = if slo && open { f(row.slo.and_then(|s| s.goodput_rps).flatten(), 1.0) } else { String::new() };
        let _ = writeln!(
            out,
            "{:<w$} {:>8} {:>5} {:>5} {:>7}ms {:>7}ms {:>7}ms {:>8}ms {:>10} {:>11} {:>7} {:>9} {:>11} {:>16} {:>8} {:>9}",
            row.runtime,
            group,
            row.successes,
            row.failures,
            f(row.ttft_s.p50, 1000.0),
            f(row.ttft_s.std, 1000.0),
            f(row.ttft_s.p95, 1000.0),
            f(row.total_s.p50, 1000.0),
            f(row.decode_tps.mean, 1.0),
            f(row.aggregate_output_tps.mean, 1.0),
            num(row.throughput.request_throughput_rps, 1.0, 2),
            f(row.throughput.output_throughput_tps, 1.0),
            f(row.throughput.total_token_throughput_tps, 1.0),
            lateness,
            met,
            goodput,
        );
    }
    // Conversations: a first turn against the later ones, whose histories the server has seen.
    for (row, turns) in a.summary.iter().filter_map(|r| Some((r, r.turns?))) {
        let _ = writeln!(
            out,
            "{:<w$} {:>8} turns: ttft p50 first {}ms, later {}ms",
            row.runtime,
            load_cell(row, open),
            f(turns.first.p50, 1000.0),
            f(turns.later.p50, 1000.0),
        );
    }
    // Open loops whose pacer's wakes were recorded: the client's own lateness in its two parts.
    let ms = |t: Option<Tail>| (num(t.and_then(|t| t.spread.p99), 1000.0, 2), num(t.and_then(|t| t.max), 1000.0, 2));
    for (row, o) in a.summary.iter().filter_map(|r| Some((r, r.open_loop.filter(|o| o.send_delay_s.is_some())?))) {
        let ((own, own_max), (pacer, pacer_max), (send, send_max)) =
            (ms(o.client_lateness_s), ms(o.pacer_lateness_s), ms(o.send_delay_s));
        let _ = writeln!(
            out,
            "{:<w$} {:>8} own lateness p99 {own}ms (max {own_max}ms), in two parts: the pacer woken late, the machine's, p99 {pacer}ms (max {pacer_max}ms); sending once awake, the client's, p99 {send}ms (max {send_max}ms)",
            row.runtime,
            load_cell(row, open),
        );
    }
    // Where the stall probe watched: the send delay's part the machine held, and the client's own.
    for (row, s) in a.summary.iter().filter_map(|r| Some((r, r.stalls?))) {
        let ((held, held_max), (own, own_max)) = (ms(Some(s.send_held_s)), ms(Some(s.send_own_s)));
        let _ = writeln!(
            out,
            "{:<w$} {:>8} sending once awake, held by the machine (stall probe) p99 {held}ms (max {held_max}ms); the client's own p99 {own}ms (max {own_max}ms); {} stalls, {}ms in all; the probe took {}ms of CPU",
            row.runtime,
            load_cell(row, open),
            s.machine_stalls,
            num(Some(s.machine_stalled_s), 1000.0, 1),
            num(Some(s.stall_probe_cpu_s), 1000.0, 1),
        );
    }
    out.push_str(&server_view(a));
    out
}

/// The servers' own view of each group, where their `/metrics` were scraped: requests running
/// and waiting, KV cache use (mean / peak), prefix-cache hit rate, tokens per step, preemptions,
/// and how fast `/metrics` answered.
fn server_view(a: &ServingArtifact) -> String {
    let rows: Vec<(&SummaryRow, &ServerColumns)> =
        a.summary.iter().filter_map(|r| Some((r, r.server.as_ref()?))).collect();
    if rows.is_empty() {
        return String::new();
    }
    let open = a.arguments.arrivals.is_some();
    let w = runtime_width(a);
    // Mean/peak; requests are whole at their peak, a share of the cache is not.
    let pair = |mean: Option<f64>, max: Option<f64>, scale: f64, peak_digits: usize| match (
        num(mean, scale, 1),
        num(max, scale, peak_digits),
    ) {
        (mean, max) if mean != "-" && max != "-" => format!("{mean}/{max}"),
        _ => "-".into(),
    };
    let mut out = String::from("\nserver's view (/metrics; mean/peak):\n");
    let _ = writeln!(
        out,
        "{:<w$} {:>8} {:>9} {:>9} {:>11} {:>9} {:>10} {:>8} {:>8} {:>13}",
        "runtime",
        if open { "rate" } else { "conc" },
        "running",
        "waiting",
        "KV use %",
        "prefix %",
        "tok/step",
        "preempt",
        "scrapes",
        "scrape p99"
    );
    for (row, s) in rows {
        let scrapes = match s.server_scrape_errors {
            0 => s.server_scrapes.to_string(),
            errors => format!("{}+{errors}!", s.server_scrapes),
        };
        let _ = writeln!(
            out,
            "{:<w$} {:>8} {:>9} {:>9} {:>11} {:>9} {:>10} {:>8} {:>8} {:>11}ms",
            row.runtime,
            load_cell(row, open),
            pair(s.server_running_mean, s.server_running_max, 1.0, 0),
            pair(s.server_waiting_mean, s.server_waiting_max, 1.0, 0),
            pair(s.server_kv_usage_mean, s.server_kv_usage_max, 100.0, 1),
            num(s.server_prefix_hit_rate, 100.0, 1),
            num(s.server_tokens_per_step, 1.0, 1),
            num(s.server_preemptions, 1.0, 0),
            scrapes,
            num(s.server_scrape_ms_p99, 1.0, 2),
        );
    }
    // A target whose every scrape failed, once, with the first reason.
    let mut told = std::collections::BTreeSet::new();
    for s in &a.server_metrics {
        let failed = s.scrapes.iter().all(|x| x.error.is_some());
        if let (true, Some(why)) = (failed, s.scrapes.first().and_then(|x| x.error.as_deref())) {
            if told.insert(s.runtime.as_str()) {
                let hint =
                    if why.ends_with("HTTP 501") { " (llama-server exposes it only with --metrics)" } else { "" };
                let _ = writeln!(out, "{}: no /metrics to read: {why}{hint}", s.runtime);
            }
        }
    }
    out
}

/// The output checks: the groups with inconsistent answers, then each pair of targets' agreement
/// (the share identical, where the differing answers first part, and each probe's verdict).
/// Empty when there is nothing to say.
pub fn checks(a: &ServingArtifact) -> String {
    checks_of(&a.summary, &a.agreement, a.arguments.arrivals.is_some())
}

/// [`checks`] from an artifact's summary rows and agreement (the report reads them from JSON).
pub(crate) fn checks_of(summary: &[SummaryRow], agreement: &[serving::Agreement], open: bool) -> String {
    let mut out = String::new();
    for row in summary {
        let n = row.inconsistent_outputs.unwrap_or(0);
        if n > 0 {
            let (runtime, load) = (&row.runtime, load_cell(row, open));
            let _ = writeln!(
                out,
                "inconsistent: {runtime} {load}: {n} answer(s) contradict their request (see requests[].inconsistency)"
            );
        }
    }
    for pair in agreement {
        let [x, y] = &pair.targets;
        let share = pair.share.map_or("-".into(), |s| format!("{:.1}%", 100.0 * s));
        let firsts: Vec<f64> = pair.differences.iter().map(|d| d.first_char as f64).collect();
        let firsts = common::stats::summarize(&firsts);
        let parted = match (firsts.min, firsts.p50) {
            (Some(min), Some(mid)) => format!("; they part at character {min} at the earliest, {mid} at the median"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "agreement: {x} and {y}: {} of {} answers identical ({share}){parted}",
            pair.identical, pair.compared
        );
        for e in &pair.explanations {
            let margins: Vec<String> = e.margins.iter().map(|m| m.map_or("-".into(), |m| format!("{m:.3}"))).collect();
            let verdict = match (e.token, e.near_tie) {
                (Some(t), true) => format!("a near tie at token {t} (margins {} nats)", margins.join(" and ")),
                (Some(t), false) => format!("NOT a near tie at token {t} (margins {} nats)", margins.join(" and ")),
                (None, _) => "unexplained".into(),
            };
            let note = e.note.as_deref().map(|n| format!("; {n}")).unwrap_or_default();
            let _ = writeln!(out, "  {}: {verdict}{note}", e.prompt);
        }
    }
    out
}

/// A summary column's number scaled and printed with `digits` decimals; `-` where there is none.
fn num(v: Option<f64>, scale: f64, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.*}", digits, v * scale))
}

/// The runtime column's width: its longest name (a name is never cut, and columns stay aligned).
fn runtime_width(a: &ServingArtifact) -> usize {
    a.summary.iter().map(|r| r.runtime.chars().count()).fold(18, usize::max)
}

/// A summary row's load as the tables show it: the closed rounds' concurrency, else the open
/// loop's rate (`sync`: one at a time; `inf`: as fast as the cap allows).
fn load_cell(row: &SummaryRow, open: bool) -> String {
    match (open, row.open_loop.and_then(|o| o.request_rate)) {
        (false, _) => row.concurrency.to_string(),
        (true, Some(rate)) => format!("{rate:.2}"),
        (true, None) if row.concurrency == 1 => "sync".into(),
        (true, None) => "inf".into(),
    }
}

/// Median and range of `values`, as "median (min-max)".
fn spread(values: &[f64]) -> String {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    match (common::stats::percentile_sorted(&sorted, 50.0), sorted.first(), sorted.last()) {
        (Some(m), Some(lo), Some(hi)) => format!("{m:.3} ({lo:.3}-{hi:.3})"),
        _ => "-".into(),
    }
}

/// Paired ratios, round by round (targets and levels took turns, so each round's pair ran side
/// by side): every target's aggregate tokens/s and TTFT median against the first target's at
/// each concurrency, and each target's aggregate tokens/s at its highest concurrency over its
/// lowest.
pub fn comparison(a: &ServingArtifact) -> String {
    if a.arguments.arrivals.is_some() {
        return open_comparison(a); // an open loop has no rounds to pair
    }
    let mut out = String::new();
    // Per (runtime, concurrency, round): the round's aggregate tokens/s and its median TTFT.
    let mut rounds: BTreeMap<(&str, usize, usize), Vec<&RequestRecord>> = BTreeMap::new();
    for r in &a.requests {
        rounds.entry((r.runtime.as_str(), r.concurrency, r.round)).or_default().push(r);
    }
    let aggregate =
        |t: &str, c: usize, round: usize| rounds.get(&(t, c, round)).and_then(|rs| serving::aggregate_tps(rs));
    let ttft = |t: &str, c: usize, round: usize| {
        let mut v: Vec<f64> = rounds.get(&(t, c, round))?.iter().filter_map(|r| r.ttft()).collect();
        v.sort_by(f64::total_cmp);
        common::stats::percentile_sorted(&v, 50.0)
    };
    let pairs = |f: &dyn Fn(usize) -> Option<(f64, f64)>| -> Vec<f64> {
        (0..a.arguments.rounds).filter_map(f).filter(|(_, b)| *b > 0.0).map(|(x, b)| x / b).collect()
    };
    let Some(first) = a.runtimes.first() else { return out };
    let levels = &a.arguments.concurrency;
    let others = &a.runtimes[1..];
    if !others.is_empty() {
        let _ = writeln!(
            out,
            "\nper-round ratios against {} (median (min-max) over {} rounds)",
            first.name, a.arguments.rounds
        );
        for t in others {
            for &c in levels {
                let tps = pairs(&|r| Some((aggregate(&t.name, c, r)?, aggregate(&first.name, c, r)?)));
                let first_token = pairs(&|r| Some((ttft(&t.name, c, r)?, ttft(&first.name, c, r)?)));
                let _ = writeln!(
                    out,
                    "  {:<18} concurrency {c:<3} aggregate tokens/s {}x, TTFT median {}x",
                    t.name,
                    spread(&tps),
                    spread(&first_token)
                );
            }
        }
    }
    if let (Some(&low), Some(&high)) = (levels.iter().min(), levels.iter().max()) {
        if high > low {
            let _ = writeln!(out, "\naggregate tokens/s at concurrency {high} over {low}, round by round");
            for t in &a.runtimes {
                let scaling = pairs(&|r| Some((aggregate(&t.name, high, r)?, aggregate(&t.name, low, r)?)));
                let _ = writeln!(out, "  {:<18} {}x", t.name, spread(&scaling));
            }
        }
    }
    out
}

/// An open loop's groups beside the first target's group under the same load (rate and cap):
/// each figure over the first target's. A sweep's rates are each target's own (found from its
/// own saturation), so there only the synchronous and throughput groups pair; its curves in the
/// report compare the rest.
fn open_comparison(a: &ServingArtifact) -> String {
    let Some(first) = a.runtimes.first().filter(|_| a.runtimes.len() > 1) else { return String::new() };
    let load = |row: &SummaryRow| (row.concurrency, row.open_loop.map(|o| o.request_rate));
    type Column = (fn(&SummaryRow) -> Option<f64>, &'static str);
    let mut columns: Vec<Column> = vec![
        (|r| r.ttft_s.p99, "TTFT p99"),
        (|r| r.total_s.p50, "total p50"),
        (|r| r.aggregate_output_tps.mean, "output tok/s"),
    ];
    if !a.arguments.slo.is_empty() {
        columns.push((|r| r.slo.and_then(|s| s.goodput_rps).flatten(), "goodput"));
    }
    let mut lines = Vec::new();
    for row in a.summary.iter().filter(|r| r.runtime != first.name) {
        let Some(base) = a.summary.iter().find(|b| b.runtime == first.name && load(b) == load(row)) else { continue };
        let ratios: Vec<String> = columns
            .iter()
            .map(|(value, name)| match (value(row), value(base)) {
                (Some(x), Some(b)) if b > 0.0 => format!("{name} {}x", ratio(x / b)),
                _ => format!("{name} -"),
            })
            .collect();
        lines.push(format!("  {:<18} {:>8}  {}", row.runtime, load_cell(row, true), ratios.join(", ")));
    }
    if lines.is_empty() {
        return String::new();
    }
    format!("\neach target over {} under the same load\n{}\n", first.name, lines.join("\n"))
}

/// A ratio to three significant digits, so that a small one (one target far behind another)
/// does not print as 0.00.
fn ratio(r: f64) -> String {
    let decimals = if r >= 1.0 || r == 0.0 { 2 } else { (2 - r.log10().floor() as i32).clamp(2, 12) as usize };
    format!("{r:.decimals$}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_ratio_keeps_three_significant_digits() {
        let cases = [(2.269, "2.27"), (1.0, "1.00"), (0.343, "0.343"), (0.0042, "0.00420"), (0.0, "0.00")];
        for (r, shown) in cases {
            assert_eq!(super::ratio(r), shown, "{r}");
        }
    }
}
