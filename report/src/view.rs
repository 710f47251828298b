//! Reading artifacts for rendering: ours (either experiment, any version with these fields) and
//! the Python predecessor's seeds alike, tolerantly. What a file lacks is simply not drawn.

use serde_json::Value;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Scheduler,
    Serving,
}

#[derive(Debug, Clone)]
pub struct Artifact {
    /// File stem, used to name the rendered files.
    pub name: String,
    pub kind: Kind,
    pub value: Value,
}

pub fn load(path: &Path) -> Result<Artifact, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut value: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    if let Some(map) = value.as_object_mut() {
        map.remove(common::artifact::SEAL_KEY);
    }
    let experiment = value.pointer("/provenance/experiment").and_then(Value::as_str);
    let kind = match experiment {
        Some("scheduler") => Kind::Scheduler,
        Some("serving-bench") => Kind::Serving,
        _ if value.get("runs").is_some() && value.get("arrival_policy").is_some() => Kind::Scheduler,
        _ if value.get("summary").is_some() && value.get("runtimes").is_some() => Kind::Serving,
        _ => return Err(format!("{}: neither a scheduler nor a serving-bench artifact", path.display())),
    };
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "artifact".into());
    Ok(Artifact { name, kind, value })
}

#[derive(Debug, Clone)]
pub struct Request {
    pub id: String,
    pub ttft: f64,
    pub completion: f64,
    pub max_gap: f64,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub job: String,
    pub prefill: bool,
    pub start: f64,
    pub end: f64,
}

#[derive(Debug, Clone)]
pub struct Run {
    /// `fifo`, `interleave chunk 64`, ...
    pub config: String,
    pub round: u64,
    pub elapsed: f64,
    pub requests: Vec<Request>,
    pub steps: Vec<Step>,
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

pub fn config_label(run: &Value) -> String {
    let policy = run.get("policy").and_then(Value::as_str).unwrap_or("?");
    // For the batched policy the chunk size is the step's token budget.
    let chunk = if policy == "batched" { "budget" } else { "chunk" };
    match run.get("chunk_size").and_then(Value::as_u64) {
        Some(c) => format!("{policy} {chunk} {c}"),
        None => policy.to_string(),
    }
}

pub fn scheduler_runs(a: &Artifact) -> Vec<Run> {
    let runs = a.value.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
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

/// The serving summary rows, each labelled `runtime c=N`.
pub fn serving_groups(a: &Artifact) -> Vec<(String, Value)> {
    a.value
        .get("summary")
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let label = format!(
                        "{} c={}",
                        r.get("runtime").and_then(Value::as_str).unwrap_or("?"),
                        r.get("concurrency").and_then(Value::as_u64).unwrap_or(0)
                    );
                    (label, r.clone())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Per-request values of a metric for one group, when the artifact keeps its requests.
pub fn serving_samples(a: &Artifact, row: &Value, metric: &str) -> Option<Vec<f64>> {
    let requests = a.value.get("requests").and_then(Value::as_array)?;
    let runtime = row.get("runtime")?;
    let concurrency = row.get("concurrency")?;
    let mut values: Vec<f64> = requests
        .iter()
        .filter(|r| {
            r.get("runtime") == Some(runtime)
                && r.get("concurrency") == Some(concurrency)
                && r.get("error").is_some_and(Value::is_null)
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
