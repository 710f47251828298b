//! From artifacts to a report folder: the charts of each artifact, one Markdown page embedding
//! them with the key tables, and side-by-side comparisons of two artifacts of one experiment.

use crate::charts::{render, Grouped, Percentiles, Timeline};
use crate::view::{scheduler_runs, serving_groups, serving_samples, Artifact, Kind, Run};
use common::stats::summarize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".into(),
    }
}

/// Renders one artifact's charts into `out/<name>/` and returns its Markdown section.
pub fn section(a: &Artifact, out: &Path) -> Result<String, String> {
    let dir = out.join(&a.name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    match a.kind {
        Kind::Scheduler => scheduler_section(a, &dir),
        Kind::Serving => serving_section(a, &dir),
    }
}

fn image(md: &mut String, name: &str, file: &str, alt: &str) {
    let _ = writeln!(md, "![{alt}]({name}/{file}.svg)\n");
}

/// A per-request metric of a scheduler run.
type Metric = fn(&crate::view::Request) -> f64;

/// Run configurations, request ids, and each (configuration, request)'s values over rounds.
type ByConfig = (Vec<String>, Vec<String>, BTreeMap<(String, String), Vec<f64>>);

/// Per configuration and request: the values of one metric over rounds.
fn by_config(runs: &[Run], metric: Metric) -> ByConfig {
    let mut configs: Vec<String> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    let mut values: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for run in runs {
        if !configs.contains(&run.config) {
            configs.push(run.config.clone());
        }
        for r in &run.requests {
            if !ids.contains(&r.id) {
                ids.push(r.id.clone());
            }
            values.entry((run.config.clone(), r.id.clone())).or_default().push(metric(r));
        }
    }
    ids.sort();
    (configs, ids, values)
}

fn scheduler_section(a: &Artifact, dir: &Path) -> Result<String, String> {
    let runs = scheduler_runs(a);
    let mut md = String::new();
    let model = a.value.get("model_id").and_then(Value::as_str).unwrap_or("?");
    let _ = writeln!(md, "## Scheduler: {}\n\nModel `{model}`, {} runs.\n", a.name, runs.len());
    let _ = writeln!(md, "| run | request | rounds | TTFT ms (median) | completion ms (median) | max gap ms (median) |\n|---|---|---|---|---|---|");
    let metrics: [(&str, &str, Metric); 3] = [
        ("ttft", "time to first token", |r| r.ttft),
        ("completion", "completion", |r| r.completion),
        ("max-gap", "largest gap between tokens", |r| r.max_gap),
    ];
    let (configs, ids, ttft) = by_config(&runs, |r| r.ttft);
    let (_, _, done) = by_config(&runs, |r| r.completion);
    let (_, _, gap) = by_config(&runs, |r| r.max_gap);
    for c in &configs {
        for id in &ids {
            let key = (c.clone(), id.clone());
            let med = |m: &BTreeMap<(String, String), Vec<f64>>| num(m.get(&key).and_then(|v| summarize(v).p50), 1);
            let n = ttft.get(&key).map(|v| v.len()).unwrap_or(0);
            let _ = writeln!(md, "| {c} | {id} | {n} | {} | {} | {} |", med(&ttft), med(&done), med(&gap));
        }
    }
    md.push('\n');
    if let Some(rows) = a.value.get("throughput").and_then(Value::as_array) {
        let _ = writeln!(
            md,
            "| run | max active | rounds | elapsed ms (median) | output tokens/s (median) |\n|---|---|---|---|---|"
        );
        for row in rows {
            let p50 = |k: &str| num(row.pointer(&format!("/{k}/p50")).and_then(Value::as_f64), 1);
            let n = row.pointer("/output_tokens_per_s/n").and_then(Value::as_u64).unwrap_or(0);
            let max_active = row.get("max_active").and_then(Value::as_u64).unwrap_or(0);
            let _ = writeln!(
                md,
                "| {} | {max_active} | {n} | {} | {} |",
                crate::view::config_label(row),
                p50("elapsed_ms"),
                p50("output_tokens_per_s")
            );
        }
        md.push('\n');
    }
    for (file, title, metric) in metrics {
        let (_, _, values) = by_config(&runs, metric);
        let chart = Grouped {
            title: format!("{title} per request and policy (median, whiskers: min-max over rounds)"),
            y_label: "milliseconds".into(),
            categories: ids.clone(),
            series: configs
                .iter()
                .map(|c| {
                    let per: Vec<crate::charts::Bar> = ids
                        .iter()
                        .map(|id| match values.get(&(c.clone(), id.clone())) {
                            Some(v) => {
                                let s = summarize(v);
                                let spread =
                                    (v.len() > 1).then(|| (s.min.unwrap_or(f64::NAN), s.max.unwrap_or(f64::NAN)));
                                (s.p50.unwrap_or(f64::NAN), spread)
                            }
                            None => (f64::NAN, None),
                        })
                        .collect();
                    (c.clone(), per)
                })
                .collect(),
        };
        render(&chart, &dir.join(format!("compare-{file}")))?;
        image(&mut md, &a.name, &format!("compare-{file}"), title);
    }
    let mut drew = 0;
    for (i, run) in runs.iter().enumerate().filter(|(_, r)| !r.steps.is_empty()) {
        let lanes = ids.clone();
        let lane = |job: &str| lanes.iter().position(|l| l == job).unwrap_or(0);
        let chart = Timeline {
            title: format!(
                "{} (round {}): {} forwards, {:.1} ms",
                run.config,
                run.round,
                forwards(&run.steps),
                run.elapsed
            ),
            steps: run.steps.iter().map(|s| (lane(&s.job), s.prefill, s.start, s.end)).collect(),
            marks: run.requests.iter().map(|r| (lane(&r.id), r.ttft, r.completion)).collect(),
            end: run.elapsed,
            lanes,
        };
        let file = format!("timeline-{i:02}");
        render(&chart, &dir.join(&file))?;
        image(&mut md, &a.name, &file, &format!("timeline of {} round {}", run.config, run.round));
        drew += 1;
    }
    if drew == 0 {
        let _ = writeln!(md, "_No per-step timeline in this artifact: timelines cannot be drawn._\n");
    }
    Ok(md)
}

/// Forward passes on a timeline: the jobs of a batched forward share its times.
fn forwards(steps: &[crate::view::Step]) -> usize {
    let mut times: Vec<(u64, u64)> = steps.iter().map(|s| (s.start.to_bits(), s.end.to_bits())).collect();
    times.dedup();
    times.len()
}

const SERVING_COLUMNS: [(&str, &str, f64, usize); 7] = [
    ("ttft_s_p50", "TTFT p50 ms", 1000.0, 1),
    ("ttft_s_p95", "TTFT p95 ms", 1000.0, 1),
    ("total_s_p50", "total p50 ms", 1000.0, 1),
    ("total_s_p95", "total p95 ms", 1000.0, 1),
    ("decode_tps_mean", "decode tok/s", 1.0, 1),
    ("request_tps_mean", "request tok/s", 1.0, 1),
    ("aggregate_output_tps_mean", "aggregate tok/s", 1.0, 1),
];

fn serving_section(a: &Artifact, dir: &Path) -> Result<String, String> {
    let groups = serving_groups(a);
    let mut md = String::new();
    let _ = writeln!(md, "## Serving benchmark: {}\n", a.name);
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
            .map(|(k, _, scale, d)| num(row.get(*k).and_then(Value::as_f64).map(|v| v * scale), *d))
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
        let chart = Percentiles { title: format!("{title} by percentile"), y_label: "milliseconds".into(), lines };
        render(&chart, &dir.join(format!("percentiles-{metric}")))?;
        image(&mut md, &a.name, &format!("percentiles-{metric}"), title);
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
    render(&chart, &dir.join("throughput"))?;
    image(&mut md, &a.name, "throughput", "throughput");
    Ok(md)
}

/// Provenance facts worth comparing, as (label, JSON pointer); the seeds have an `environment`
/// or `host` block instead, read where present.
const FACTS: [(&str, &str); 12] = [
    ("CPU", "/provenance/host/cpu_model"),
    ("logical cores", "/provenance/host/logical_cores"),
    ("memory bytes", "/provenance/host/memory_bytes"),
    ("OS / kernel", "/provenance/host/kernel"),
    ("threads", "/provenance/threads"),
    ("rustc", "/provenance/build/rustc"),
    ("source sha256", "/provenance/source/sha256"),
    ("git commit", "/provenance/git/commit"),
    ("model", "/provenance/model/repo"),
    ("model revision", "/provenance/model/revision"),
    ("predecessor environment", "/environment"),
    ("predecessor host", "/host"),
];

/// Side by side: the same metrics of two artifacts with the ratio B / A, then the provenance
/// differences that may explain them.
pub fn compare(a: &Artifact, b: &Artifact) -> Result<String, String> {
    if a.kind != b.kind {
        return Err(format!(
            "{} and {} are artifacts of different experiments; compare like with like",
            a.name, b.name
        ));
    }
    let mut md = String::new();
    let _ = writeln!(md, "## Comparison: A = {}, B = {}\n", a.name, b.name);
    let _ = writeln!(md, "| what | A | B | B / A |\n|---|---|---|---|");
    let mut row = |what: String, x: Option<f64>, y: Option<f64>| {
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 && x.is_finite() && y.is_finite() => format!("{:.2}", y / x),
            _ => "-".into(),
        };
        let _ = writeln!(md, "| {what} | {} | {} | {ratio} |", num(x, 3), num(y, 3));
    };
    match a.kind {
        Kind::Scheduler => {
            let (ra, rb) = (scheduler_runs(a), scheduler_runs(b));
            let metrics: [(&str, Metric); 3] =
                [("TTFT ms", |r| r.ttft), ("completion ms", |r| r.completion), ("max gap ms", |r| r.max_gap)];
            for (name, metric) in metrics {
                let (configs, ids, va) = by_config(&ra, metric);
                let (_, _, vb) = by_config(&rb, metric);
                for c in &configs {
                    for id in &ids {
                        let key = (c.clone(), id.clone());
                        let med = |m: &BTreeMap<(String, String), Vec<f64>>| m.get(&key).and_then(|v| summarize(v).p50);
                        row(format!("{c} / {id} {name} (median)"), med(&va), med(&vb));
                    }
                }
            }
        }
        Kind::Serving => {
            let (ga, gb) = (serving_groups(a), serving_groups(b));
            // Groups pair by concurrency level, in order (runtimes differ in name across machines).
            for (la, ra) in &ga {
                let c = ra.get("concurrency");
                let Some((lb, rb)) = gb.iter().find(|(_, r)| r.get("concurrency") == c) else { continue };
                for (k, label, scale, _) in SERVING_COLUMNS {
                    row(
                        format!("{la} vs {lb}: {label}"),
                        ra.get(k).and_then(Value::as_f64).map(|v| v * scale),
                        rb.get(k).and_then(Value::as_f64).map(|v| v * scale),
                    );
                }
            }
        }
    }
    let _ = writeln!(md, "\nProvenance that differs:\n\n| fact | A | B |\n|---|---|---|");
    let show = |v: Option<&Value>| match v {
        None => "(not recorded)".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let weights = |v: &Value| -> Option<Value> {
        v.pointer("/provenance/model/files")?
            .as_array()?
            .iter()
            .find(|f| f.get("path").and_then(Value::as_str) == Some("model.safetensors"))?
            .get("digest")
            .cloned()
    };
    let derived = [("weights sha256", weights(&a.value), weights(&b.value))];
    let pointed = FACTS
        .iter()
        .map(|(label, pointer)| (*label, a.value.pointer(pointer).cloned(), b.value.pointer(pointer).cloned()));
    let mut same = true;
    for (label, x, y) in pointed.chain(derived) {
        let (x, y) = (x.as_ref(), y.as_ref());
        if x != y {
            same = false;
            let _ = writeln!(md, "| {label} | {} | {} |", show(x).replace('|', "/"), show(y).replace('|', "/"));
        }
    }
    if same {
        let _ = writeln!(md, "| (none) | | |");
    }
    md.push('\n');
    Ok(md)
}
