//! The scheduler's report section: per-request medians by run, grouped bars with min-max whiskers,
//! and each run's timeline; and its side of `report --compare`. Reads artifacts tolerantly (ours
//! of any version with these fields, and the predecessor's seed): what a file lacks is not drawn.

use common::chart::{cell, Bar, Chart, CompareRow, Grouped, Section, Timeline};
use common::stats::summarize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) id: String,
    pub(crate) ttft: f64,
    pub(crate) completion: f64,
    pub(crate) max_gap: f64,
}

#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) job: String,
    pub(crate) prefill: bool,
    pub(crate) start: f64,
    pub(crate) end: f64,
}

#[derive(Debug, Clone)]
pub(crate) struct Run {
    /// `fifo`, `interleave chunk 64`, ...
    pub(crate) config: String,
    pub(crate) round: u64,
    pub(crate) elapsed: f64,
    pub(crate) requests: Vec<Request>,
    pub(crate) steps: Vec<Step>,
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

pub(crate) fn config_label(run: &Value) -> String {
    let policy = run.get("policy").and_then(Value::as_str).unwrap_or("?");
    // For the batched policy the chunk size is the step's token budget.
    let chunk = if policy == "batched" { "budget" } else { "chunk" };
    match run.get("chunk_size").and_then(Value::as_u64) {
        Some(c) => format!("{policy} {chunk} {c}"),
        None => policy.to_string(),
    }
}

pub(crate) fn scheduler_runs(a: &Value) -> Vec<Run> {
    let runs = a.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    runs.iter()
        .map(|run| Run {
            config: config_label(run),
            round: run.get("round").and_then(Value::as_u64).unwrap_or(0),
            elapsed: f(run, "elapsed_ms"),
            requests: run
                .get("requests")
                .and_then(Value::as_array)
                .map(|rs| {
                    rs.iter()
                        .map(|r| Request {
                            id: r.get("id").and_then(Value::as_str).unwrap_or("?").to_string(),
                            ttft: f(r, "ttft_ms"),
                            completion: f(r, "completion_ms"),
                            max_gap: f(r, "max_gap_ms"),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            steps: run
                .get("timeline")
                .and_then(Value::as_array)
                .map(|ss| {
                    ss.iter()
                        .map(|s| Step {
                            job: s.get("job").and_then(Value::as_str).unwrap_or("?").to_string(),
                            prefill: s.get("kind").and_then(Value::as_str) == Some("prefill"),
                            start: f(s, "start_ms"),
                            end: f(s, "end_ms"),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// A per-request metric of a scheduler run.
type Metric = fn(&Request) -> f64;

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

pub(crate) fn section(title: &str, dir: &str, a: &Value, all_rounds: bool) -> Section {
    let runs = scheduler_runs(a);
    let mut section = Section::new(dir);
    let mut md = String::new();
    let model = a.get("model_id").and_then(Value::as_str).unwrap_or("?");
    let _ = writeln!(md, "## Scheduler: {}\n\nModel `{model}`, {} runs.\n", title, runs.len());
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
            let med = |m: &BTreeMap<(String, String), Vec<f64>>| cell(m.get(&key).and_then(|v| summarize(v).p50), 1);
            let n = ttft.get(&key).map(|v| v.len()).unwrap_or(0);
            let _ = writeln!(md, "| {c} | {id} | {n} | {} | {} | {} |", med(&ttft), med(&done), med(&gap));
        }
    }
    md.push('\n');
    if let Some(rows) = a.get("throughput").and_then(Value::as_array) {
        let _ = writeln!(
            md,
            "| run | max active | rounds | elapsed ms (median) | output tokens/s (median) |\n|---|---|---|---|---|"
        );
        for row in rows {
            let p50 = |k: &str| cell(row.pointer(&format!("/{k}/p50")).and_then(Value::as_f64), 1);
            let n = row.pointer("/output_tokens_per_s/n").and_then(Value::as_u64).unwrap_or(0);
            let max_active = row.get("max_active").and_then(Value::as_u64).unwrap_or(0);
            let _ = writeln!(
                md,
                "| {} | {max_active} | {n} | {} | {} |",
                config_label(row),
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
                    let per: Vec<Bar> = ids
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
        section.markdown.push_str(&std::mem::take(&mut md));
        section.image(&format!("compare-{file}"), title, Chart::Grouped(chart));
    }
    // One timeline per configuration: its round of median elapsed time (the lower of two
    // middles), so that a page shows each policy once rather than every round of it; or, when
    // asked, every round in its order, the median one still marked.
    let mut drew = 0;
    let mut shown: Vec<(usize, Option<usize>)> = Vec::new();
    for config in &configs {
        let rounds: Vec<usize> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| &r.config == config && !r.steps.is_empty())
            .map(|(i, _)| i)
            .collect();
        let mut by_time = rounds.clone();
        by_time.sort_by(|&a, &b| runs[a].elapsed.total_cmp(&runs[b].elapsed));
        let Some(&median) = by_time.get(rounds.len().saturating_sub(1) / 2) else { continue };
        if all_rounds {
            shown.extend(rounds.iter().map(|&i| (i, (i == median).then_some(rounds.len()))));
        } else {
            shown.push((median, Some(rounds.len())));
        }
    }
    for (k, (i, median_of)) in shown.into_iter().enumerate() {
        let run = &runs[i];
        let which = median_of.map_or(String::new(), |of| format!(", the median of {of}"));
        let lanes = ids.clone();
        let lane = |job: &str| lanes.iter().position(|l| l == job).unwrap_or(0);
        let chart = Timeline {
            title: format!(
                "{} (round {}{which}): {} forwards, {:.1} ms",
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
        let file = format!("timeline-{k:02}");
        section.markdown.push_str(&std::mem::take(&mut md));
        section.image(&file, &format!("timeline of {} round {}", run.config, run.round), Chart::Timeline(chart));
        drew += 1;
    }
    if drew == 0 {
        let _ = writeln!(md, "_No per-step timeline in this artifact: timelines cannot be drawn._\n");
    }
    section.markdown.push_str(&md);
    section
}

/// Forward passes on a timeline: the jobs of a batched forward share its times.
fn forwards(steps: &[Step]) -> usize {
    let mut times: Vec<(u64, u64)> = steps.iter().map(|s| (s.start.to_bits(), s.end.to_bits())).collect();
    times.dedup();
    times.len()
}

/// Per configuration and request, the median of each metric in A and in B.
pub(crate) fn compare(a: &Value, b: &Value) -> Vec<CompareRow> {
    let (ra, rb) = (scheduler_runs(a), scheduler_runs(b));
    let mut rows = Vec::new();
    let metrics: [(&str, Metric); 3] =
        [("TTFT ms", |r| r.ttft), ("completion ms", |r| r.completion), ("max gap ms", |r| r.max_gap)];
    for (name, metric) in metrics {
        let (configs, ids, va) = by_config(&ra, metric);
        let (_, _, vb) = by_config(&rb, metric);
        for c in &configs {
            for id in &ids {
                let key = (c.clone(), id.clone());
                let med = |m: &BTreeMap<(String, String), Vec<f64>>| m.get(&key).and_then(|v| summarize(v).p50);
                rows.push((format!("{c} / {id} {name} (median)"), med(&va), med(&vb)));
            }
        }
    }
    rows
}
