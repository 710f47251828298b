//! The serving benchmark's report section: the summary table, latency by percentile per group
//! (from the requests where kept, else the summary's percentiles, as in the seed), throughput
//! bars, and for an open-loop sweep latency against achieved throughput; and its side of
//! `report --compare`, groups paired by concurrency level and rate.

use crate::serving::{dialect_of, Gauge, ServerSeries};
use common::chart::{cell, Chart, CompareRow, Grouped, Lines, Section};
use serde_json::Value;
use std::fmt::Write;

// The report reads summary rows as JSON, by column name, because it renders the seeds' rows
// (another program's) with the same code as ours; a test holds every name it reads to a column
// of `SummaryRow`.

/// The summary table's columns: stored name, header, scale and decimals.
const SERVING_COLUMNS: [(&str, &str, f64, usize); 7] = [
    ("ttft_s_p50", "TTFT p50 ms", 1000.0, 1),
    ("ttft_s_p95", "TTFT p95 ms", 1000.0, 1),
    ("total_s_p50", "total p50 ms", 1000.0, 1),
    ("total_s_p95", "total p95 ms", 1000.0, 1),
    ("decode_tps_mean", "decode tok/s", 1.0, 1),
    ("request_tps_mean", "request tok/s", 1.0, 1),
    ("aggregate_output_tps_mean", "aggregate tok/s", 1.0, 1),
];

pub(crate) fn section(title: &str, dir: &str, a: &Value) -> Section {
    let groups = serving_groups(a);
    let mut section = Section::new(dir);
    let mut md = String::new();
    let _ = writeln!(md, "## Serving benchmark: {title}\n");
    let header: Vec<&str> = SERVING_COLUMNS.iter().map(|c| c.1).collect();
    let _ = writeln!(
        md,
        "| group | requests | failures | {} |\n|---|---|---|{}",
        header.join(" | "),
        "---|".repeat(header.len())
    );
    for (label, row) in &groups {
        let cells: Vec<String> = SERVING_COLUMNS
            .iter()
            .map(|(k, _, scale, d)| cell(row.get(*k).and_then(Value::as_f64).map(|v| v * scale), *d))
            .collect();
        let _ = writeln!(md, "| {label} | {} | {} | {} |", row["requests"], row["failures"], cells.join(" | "));
    }
    md.push('\n');
    for (metric, title) in [("ttft_s", "time to first token"), ("total_s", "total latency")] {
        let lines = groups
            .iter()
            .map(|(label, row)| {
                let points = match serving_samples(a, row, metric) {
                    Some(v) if v.len() > 1 => v
                        .iter()
                        .enumerate()
                        .map(|(i, x)| (100.0 * i as f64 / (v.len() - 1) as f64, x * 1000.0))
                        .collect(),
                    // Only the summary survives (the seeds): its percentiles are the points.
                    _ => [(50.0, "p50"), (95.0, "p95"), (99.0, "p99")]
                        .iter()
                        .filter_map(|(p, s)| {
                            row.get(format!("{metric}_{s}")).and_then(Value::as_f64).map(|v| (*p, v * 1000.0))
                        })
                        .collect(),
                };
                (label.clone(), points)
            })
            .collect();
        let chart = Lines {
            title: format!("{title} by percentile"),
            x_label: "percentile".into(),
            y_label: "milliseconds".into(),
            lines,
        };
        section.markdown.push_str(&std::mem::take(&mut md));
        section.image(&format!("percentiles-{metric}"), title, Chart::Lines(chart));
    }
    let chart = Grouped {
        title: "decode and aggregate output tokens/s (means)".into(),
        y_label: "tokens per second".into(),
        categories: groups.iter().map(|g| g.0.clone()).collect(),
        series: [("decode_tps_mean", "decode tok/s"), ("aggregate_output_tps_mean", "aggregate tok/s")]
            .iter()
            .map(|(k, name)| {
                (
                    name.to_string(),
                    groups.iter().map(|(_, r)| (r.get(*k).and_then(Value::as_f64).unwrap_or(f64::NAN), None)).collect(),
                )
            })
            .collect(),
    };
    section.markdown.push_str(&md);
    section.image("throughput", "throughput", Chart::Grouped(chart));
    sweep_curves(&groups, &mut section);
    server_view(a, &groups, &mut section);
    checked_outputs(a, &mut section);
    section
}

/// The output checks as the run printed them: inconsistent answers, and each pair of targets'
/// agreement with the probe's verdicts.
fn checked_outputs(a: &Value, section: &mut Section) {
    let read = |key: &str| a.get(key).cloned().unwrap_or_default();
    let summary: Vec<crate::serving::SummaryRow> = serde_json::from_value(read("summary")).unwrap_or_default();
    let agreement: Vec<crate::serving::Agreement> = serde_json::from_value(read("agreement")).unwrap_or_default();
    let open = a.pointer("/arguments/arrivals").is_some_and(|v| !v.is_null());
    let text = crate::table::checks_of(&summary, &agreement, open);
    if !text.is_empty() {
        let _ = write!(section.markdown, "Checked outputs:\n\n```text\n{text}```\n\n");
    }
}

/// The server's view's columns, as [`SERVING_COLUMNS`].
const SERVER_COLUMNS: [(&str, &str, f64, usize); 10] = [
    ("server_running_mean", "running mean", 1.0, 1),
    ("server_running_max", "running peak", 1.0, 0),
    ("server_waiting_mean", "waiting mean", 1.0, 1),
    ("server_waiting_max", "waiting peak", 1.0, 0),
    ("server_kv_usage_mean", "KV use mean %", 100.0, 1),
    ("server_kv_usage_max", "KV use peak %", 100.0, 1),
    ("server_prefix_hit_rate", "prefix hit %", 100.0, 1),
    ("server_tokens_per_step", "tokens/step", 1.0, 1),
    ("server_preemptions", "preemptions", 1.0, 0),
    ("server_scrape_ms_p99", "/metrics answer p99 ms", 1.0, 2),
];

/// Where the targets' `/metrics` were scraped: the server's view of each group beside the
/// client's, and over the run, on one time axis, the client's TTFT of each request by when it
/// was sent above the requests each server had running and waiting (and its KV cache's use).
fn server_view(a: &Value, groups: &[(String, Value)], section: &mut Section) {
    let Ok(series) = serde_json::from_value::<Vec<ServerSeries>>(a.get("server_metrics").cloned().unwrap_or_default())
    else {
        return;
    };
    if series.is_empty() {
        return;
    }
    let mut md = String::from("What the servers' `/metrics` said over each group (scraped by the client):\n\n");
    let header: Vec<&str> = SERVER_COLUMNS.iter().map(|c| c.1).collect();
    let _ = writeln!(md, "| group | server | {} |\n|---|---|{}", header.join(" | "), "---|".repeat(header.len()));
    for (label, row) in groups.iter().filter(|(_, r)| r.get("server_scrapes").is_some()) {
        let cells: Vec<String> = SERVER_COLUMNS
            .iter()
            .map(|(k, _, scale, d)| cell(row.get(*k).and_then(Value::as_f64).map(|v| v * scale), *d))
            .collect();
        let server = row.get("server_dialect").and_then(Value::as_str).unwrap_or("none read");
        let _ = writeln!(md, "| {label} | {server} | {} |", cells.join(" | "));
    }
    md.push('\n');
    section.markdown.push_str(&md);

    let mut runtimes: Vec<&str> = Vec::new();
    for s in &series {
        if !runtimes.contains(&s.runtime.as_str()) {
            runtimes.push(&s.runtime);
        }
    }
    let requests = a.get("requests").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let ttft = runtimes
        .iter()
        .map(|name| {
            let mut points: Vec<(f64, f64)> = requests
                .iter()
                .filter(|r| r.get("runtime").and_then(Value::as_str) == Some(name))
                .filter(|r| r.get("error").is_none_or(Value::is_null))
                .filter_map(|r| {
                    // TTFT as the summary takes it: from the request's scheduled start.
                    let start = r.get("scheduled_s").and_then(Value::as_f64)?;
                    Some((start, (r.get("first_token_s").and_then(Value::as_f64)? - start) * 1000.0))
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            (format!("{name} TTFT"), points)
        })
        .collect();
    let x_label = "seconds since the run began (the client's clock)";
    let chart = Lines {
        title: "TTFT of each request, by when it was sent".into(),
        x_label: x_label.into(),
        y_label: "milliseconds".into(),
        lines: ttft,
    };
    section.image("server-ttft-over-time", "TTFT over the run", Chart::Lines(chart));
    let over_time = |gauge: Gauge, what: &str, scale: f64| -> Vec<(String, Vec<(f64, f64)>)> {
        runtimes
            .iter()
            .filter_map(|name| {
                let mine: Vec<&ServerSeries> = series.iter().filter(|s| s.runtime == *name).collect();
                let points: Vec<(f64, f64)> =
                    gauge.over_time(dialect_of(&mine)?, &mine).into_iter().map(|(t, v)| (t, v * scale)).collect();
                (!points.is_empty()).then(|| (format!("{name} {what}"), points))
            })
            .collect()
    };
    let lines: Vec<_> = over_time(Gauge::Running, "running", 1.0)
        .into_iter()
        .chain(over_time(Gauge::Waiting, "waiting", 1.0))
        .collect();
    if !lines.is_empty() {
        let chart = Lines {
            title: "requests the servers had running and waiting".into(),
            x_label: x_label.into(),
            y_label: "requests".into(),
            lines,
        };
        section.image("server-requests-over-time", "server requests over the run", Chart::Lines(chart));
    }
    let kv = over_time(Gauge::KvUsage, "KV use", 100.0);
    if !kv.is_empty() {
        let chart = Lines {
            title: "the servers' KV cache in use".into(),
            x_label: x_label.into(),
            y_label: "percent of the budget".into(),
            lines: kv,
        };
        section.image("server-kv-over-time", "server KV use over the run", Chart::Lines(chart));
    }
}

/// For an open-loop sweep: latency against the throughput each rate achieved, one line per
/// runtime (where the curve bends upward is where the server saturates).
fn sweep_curves(groups: &[(String, Value)], section: &mut Section) {
    let open: Vec<&Value> = groups.iter().map(|(_, r)| r).filter(|r| r.get("request_rate").is_some()).collect();
    if open.len() < 2 {
        return;
    }
    let mut runtimes: Vec<&str> = Vec::new();
    for name in open.iter().filter_map(|r| r.get("runtime").and_then(Value::as_str)) {
        if !runtimes.contains(&name) {
            runtimes.push(name);
        }
    }
    for (key, what) in [("ttft_s_p50", "TTFT p50"), ("ttft_s_p99", "TTFT p99"), ("tpot_s_p50", "TPOT p50")] {
        let lines = runtimes
            .iter()
            .map(|name| {
                let mut points: Vec<(f64, f64)> = open
                    .iter()
                    .filter(|r| r.get("runtime").and_then(Value::as_str) == Some(name))
                    .filter_map(|r| {
                        let x = r.get("aggregate_output_tps_mean").and_then(Value::as_f64)?;
                        Some((x, r.get(key).and_then(Value::as_f64)? * 1000.0))
                    })
                    .collect();
                // Left to right: a sweep runs its slowest and fastest groups first.
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                (name.to_string(), points)
            })
            .collect();
        let chart = Lines {
            title: format!("{what} against achieved output tokens/s, one point per request rate"),
            x_label: "output tokens per second".into(),
            y_label: "milliseconds".into(),
            lines,
        };
        section.image(&format!("sweep-{key}"), &format!("{what} against throughput"), Chart::Lines(chart));
    }
}

/// Per concurrency level, each summary column of A's group beside B's.
pub(crate) fn compare(a: &Value, b: &Value) -> Vec<CompareRow> {
    let (ga, gb) = (serving_groups(a), serving_groups(b));
    let mut rows = Vec::new();
    // Groups pair by concurrency level and rate, in order (runtimes differ in name across machines).
    for (la, ra) in &ga {
        let c = (ra.get("concurrency"), ra.get("request_rate"));
        let Some((lb, rb)) = gb.iter().find(|(_, r)| (r.get("concurrency"), r.get("request_rate")) == c) else {
            continue;
        };
        for (k, label, scale, _) in SERVING_COLUMNS {
            rows.push((
                format!("{la} vs {lb}: {label}"),
                ra.get(k).and_then(Value::as_f64).map(|v| v * scale),
                rb.get(k).and_then(Value::as_f64).map(|v| v * scale),
            ));
        }
    }
    rows
}

/// The serving summary rows, each labelled `runtime c=N` (closed rounds) or `runtime rate=R`
/// (open loop; `max=N` with a cap on requests in flight; `synchronous` for one at a time).
fn serving_groups(a: &Value) -> Vec<(String, Value)> {
    a.get("summary")
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let runtime = r.get("runtime").and_then(Value::as_str).unwrap_or("?");
                    let c = r.get("concurrency").and_then(Value::as_u64).unwrap_or(0);
                    let label = match r.get("request_rate") {
                        Some(rate) => {
                            // A sweep's measured rates to the thousandth; a given rate as given.
                            let rate = match rate.as_f64() {
                                Some(r) if (r * 1000.0).fract() != 0.0 => format!("{r:.3}"),
                                _ => rate.as_str().map_or_else(|| rate.to_string(), str::to_string),
                            };
                            if c == 1 && rate == "inf" {
                                format!("{runtime} synchronous")
                            } else if c > 0 {
                                format!("{runtime} rate={rate} max={c}")
                            } else {
                                format!("{runtime} rate={rate}")
                            }
                        }
                        None => format!("{runtime} c={c}"),
                    };
                    (label, r.clone())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Per-request values of a metric for one group, when the artifact keeps its requests.
fn serving_samples(a: &Value, row: &Value, metric: &str) -> Option<Vec<f64>> {
    let requests = a.get("requests").and_then(Value::as_array)?;
    let runtime = row.get("runtime")?;
    let concurrency = row.get("concurrency")?;
    // An open-loop row's requests: its rate's (`null` in a record is the row's "inf"), warm-ups left out.
    let rate = row.get("request_rate").map(|r| if r.is_string() { &Value::Null } else { r });
    let mut values: Vec<f64> = requests
        .iter()
        .filter(|r| {
            r.get("runtime") == Some(runtime)
                && r.get("concurrency") == Some(concurrency)
                && r.get("error").is_some_and(Value::is_null)
                && r.pointer("/arrival/rate_rps") == rate
                && r.pointer("/arrival/warmup") != Some(&Value::Bool(true))
        })
        .filter_map(|r| {
            let start = r.get("scheduled_s")?.as_f64()?;
            match metric {
                "ttft_s" => Some(r.get("first_token_s")?.as_f64()? - start),
                _ => Some(r.get("end_s")?.as_f64()? - start),
            }
        })
        .collect();
    values.sort_by(f64::total_cmp);
    Some(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every summary column the report reads by name is one a row stores: a misspelt name would
    /// print `-` in every report, silently.
    #[test]
    fn every_column_the_report_reads_is_a_summary_rows() {
        let schema = schemars::schema_for!(crate::serving::SummaryRow).to_value();
        let stored = |name: &str| schema.pointer(&format!("/properties/{name}")).is_some();
        let percentiles = ["ttft_s", "total_s"].iter().flat_map(|m| ["p50", "p95", "p99"].map(|s| format!("{m}_{s}")));
        let named =
            ["requests", "failures", "runtime", "concurrency", "request_rate", "server_scrapes", "server_dialect"];
        let read: Vec<String> = SERVING_COLUMNS
            .iter()
            .chain(&SERVER_COLUMNS)
            .map(|c| c.0.to_string())
            .chain(named.map(str::to_string))
            .chain(percentiles)
            .collect();
        let missing: Vec<&String> = read.iter().filter(|name| !stored(name)).collect();
        assert!(missing.is_empty(), "the report reads columns no summary row has: {missing:?}");
        assert!(!stored("ttft_s_p51"), "the check itself tells a stored column from another");
    }
}
