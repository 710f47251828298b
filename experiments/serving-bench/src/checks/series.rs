//! The checks of what was recorded beside the requests: the series scraped from the targets'
//! `/metrics` and the stall probe's record, each spanning the group it watched.

use common::finding::Findings;
use std::collections::BTreeMap;

/// The series scraped from the targets' `/metrics`: each sound ([`crate::serving::series_problem`]),
/// one per target per group window (a closed round, or an open loop's group) exactly when the run
/// asked for them, and spanning its window: the first scrape sent before the window's first
/// request was scheduled, the last after its last one ended, soon enough after it
/// ([`loadgen::scrape::last_scrape_within_s`]) and answered before the next window's first request
/// (groups run one after another). (A series whose one scrape failed, a target without
/// `/metrics`, spans nothing.)
pub(super) fn server_series(a: &crate::serving::ServingArtifact, f: &mut Findings) {
    let open = a.arguments.arrivals.is_some();
    let mut windows: BTreeMap<(&str, String, usize), (f64, f64)> = BTreeMap::new();
    for r in &a.requests {
        let key = (
            r.runtime.as_str(),
            crate::serving::load_label(r.concurrency, r.arrival.map(|x| x.rate_rps)),
            if open { 0 } else { r.round },
        );
        let w = windows.entry(key).or_insert((f64::INFINITY, f64::NEG_INFINITY));
        *w = (w.0.min(r.scheduled_s), w.1.max(r.end_s));
    }
    if a.arguments.scrape_metrics_s.is_none() && !a.server_metrics.is_empty() {
        f.wrong("invariants", "server_metrics", "recorded, but the run asked for no scraping (scrape_metrics_s)");
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, s) in a.server_metrics.iter().enumerate() {
        let at = format!("server_metrics[{i}]");
        if let Some(problem) = crate::serving::series_problem(s) {
            f.wrong("invariants", &at, problem);
        }
        let key = (s.runtime.as_str(), s.load.clone(), s.round);
        let Some(&(first, last)) = windows.get(&key) else {
            f.wrong(
                "invariants",
                &at,
                format!("{} {} round {}: no request of the run was sent there", s.runtime, s.load, s.round),
            );
            continue;
        };
        if !seen.insert(key) {
            f.wrong("invariants", &at, format!("{} {} round {} has a series already", s.runtime, s.load, s.round));
        }
        let span = s.scrapes.first().zip(s.scrapes.last()).map(|(a, b)| (a.t_s, b.t_s));
        let unreachable = s.scrapes.len() == 1 && s.scrapes[0].error.is_some();
        if !unreachable && !span.is_some_and(|(from, to)| from <= first && to >= last) {
            let shown = span.map_or("none".to_string(), |(from, to)| format!("{from} to {to}"));
            f.wrong(
                "invariants",
                &at,
                format!("its scrapes ({shown}) do not span its requests' window ({first} to {last})"),
            );
        }
        // Every scrape done before the next window began, and the last soon after its own ended
        // (a microsecond allowed for the seconds' rounding).
        let next = windows.values().map(|w| w.0).filter(|&start| start > last).reduce(f64::min);
        let within = a.arguments.scrape_metrics_s.map(|i| last + loadgen::scrape::last_scrape_within_s(i));
        let done = |s: &crate::serving::Scrape| s.t_s + s.answer_s.unwrap_or(0.0);
        if let Some(s) = s
            .scrapes
            .iter()
            .find(|s| next.is_some_and(|n| !(done(s) <= n + 1e-6)) || within.is_some_and(|w| !(s.t_s <= w)))
        {
            let next = next.map_or("none".to_string(), |n| format!("{n} s"));
            let within = a.arguments.scrape_metrics_s.map_or(0.0, loadgen::scrape::last_scrape_within_s);
            f.wrong(
                "invariants",
                &at,
                format!(
                    "a scrape at {} s lies outside its window: answered after the next window began ({next}) or sent more than {within} s after its last request ended ({last} s)",
                    s.t_s
                ),
            );
        }
    }
    if a.arguments.scrape_metrics_s.is_some() {
        for (runtime, load, round) in windows.keys().filter(|k| !seen.contains(*k)) {
            f.wrong("invariants", "server_metrics", format!("{runtime} {load} round {round} was not scraped"));
        }
    }
}

/// What the stall probe saw (`stall_probe`): one record per open-loop group at a finite rate
/// exactly when the run asked for it, each spanning its group (watched from before its first
/// request was scheduled to after its last ended), every stall of a watched CPU within that
/// span, at least as long as the probe's threshold, and each CPU's stalls in order without
/// overlapping; a request of a probed group sent from a CPU it watched.
pub(super) fn machine_stalls(a: &crate::serving::ServingArtifact, f: &mut Findings) {
    let probe = a.arguments.stall_probe;
    if !probe && !a.machine_stalls.is_empty() {
        f.wrong("invariants", "machine_stalls", "recorded, but the run asked for no stall probe (stall_probe)");
    }
    let groups = crate::serving::groups(&a.requests);
    let mut seen = std::collections::BTreeSet::new();
    for (i, m) in a.machine_stalls.iter().enumerate() {
        let at = format!("machine_stalls[{i}]");
        let Some(g) =
            groups.iter().find(|g| g.runtime == m.runtime && g.load == m.load && matches!(g.rate, Some(Some(_))))
        else {
            f.wrong(
                "invariants",
                &at,
                format!("{} {}: no open-loop group at a finite rate ran there", m.runtime, m.load),
            );
            continue;
        };
        if !seen.insert((m.runtime.as_str(), m.load.as_str())) {
            f.wrong("invariants", &at, format!("{} {} has a probe's record already", m.runtime, m.load));
        }
        let first = g.records.iter().map(|r| r.scheduled_s).fold(f64::INFINITY, f64::min);
        let last = g.records.iter().map(|r| r.end_s).fold(f64::NEG_INFINITY, f64::max);
        if !(m.from_s <= first && last <= m.to_s) {
            f.wrong(
                "invariants",
                &at,
                format!("watched {} to {} s, which does not span its requests ({first} to {last} s)", m.from_s, m.to_s),
            );
        }
        let cpus: std::collections::BTreeSet<usize> = m.cpus.iter().copied().collect();
        if cpus.is_empty() || cpus.len() != m.cpus.len() {
            f.wrong("invariants", format!("{at}.cpus"), "must name each watched CPU once");
        }
        // The probe's period and threshold are the code's; a record that says otherwise was not
        // made by the code the source hash names.
        let (period, min_stall) = (loadgen::probe::PERIOD.as_secs_f64(), loadgen::probe::MIN_STALL.as_secs_f64());
        if m.period_s != period || m.min_stall_s != min_stall {
            f.wrong(
                "invariants",
                &at,
                format!("period_s and min_stall_s must be the probe's {period} and {min_stall} s"),
            );
        }
        if !(m.cpu_time_s >= 0.0 && m.cpu_time_s.is_finite()) || m.wakes < m.stalls.len() as u64 {
            f.wrong("invariants", &at, "cpu_time_s must be at least 0, and every stall is a wake");
        }
        // A microsecond allowed for the seconds' rounding.
        let mut until: BTreeMap<usize, f64> = BTreeMap::new();
        for (k, s) in m.stalls.iter().enumerate() {
            let inside = m.from_s <= s.from_s && s.to_s <= m.to_s;
            let long_enough = s.to_s - s.from_s >= m.min_stall_s - 1e-6;
            let after = until.get(&s.cpu).is_none_or(|&end| s.from_s >= end);
            if !(cpus.contains(&s.cpu) && inside && long_enough && after) {
                f.wrong(
                    "invariants",
                    format!("{at}.stalls[{k}]"),
                    format!(
                        "CPU {} from {} to {} s: must be a watched CPU's, within the span watched, at least min_stall_s long, and after that CPU's last stall",
                        s.cpu, s.from_s, s.to_s
                    ),
                );
            }
            until.insert(s.cpu, s.to_s);
        }
        if let Some(r) = g.records.iter().find(|r| r.sent_cpu.is_some_and(|c| !cpus.contains(&c))) {
            f.wrong(
                "invariants",
                &at,
                format!("request {} was sent from CPU {:?}, which the probe did not watch", r.index, r.sent_cpu),
            );
        }
    }
    if probe {
        for g in groups.iter().filter(|g| matches!(g.rate, Some(Some(_)))) {
            if !seen.contains(&(g.runtime, g.load.as_str())) {
                f.wrong("invariants", "machine_stalls", format!("{} {} was not probed", g.runtime, g.load));
            }
        }
    }
}
