//! The artifact in other tools' shapes, written beside it: one CSV row per request, and per
//! summary group a JSON file in the shape of vLLM's `bench serve --save-result`, so results can
//! go where those tools' results go. The artifact stays the record; exports are derived from it
//! and carry no provenance of their own.

use crate::serving::{RequestRecord, ServingArtifact};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One row per request (`<artifact>.csv`).
    Csv,
    /// vLLM's `--save-result` JSON, one file per group (`<artifact>.<group>.vllm.json`).
    Vllm,
}

/// Why an export was not written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{path}: exists; an export never overwrites a file (the artifact is written): move it, or export to another --out")]
    Exists { path: String },
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("{path}: {cause}")]
    Csv { path: String, cause: csv::Error },
}

/// Writes `artifact` (at `path`) as `format` beside it; returns the files written.
pub fn write(artifact: &ServingArtifact, path: &Path, format: Format) -> Result<Vec<PathBuf>, ExportError> {
    match format {
        Format::Csv => {
            let out = path.with_extension("csv");
            write_csv(&artifact.requests, &out)?;
            Ok(vec![out])
        }
        Format::Vllm => {
            let mut written = Vec::new();
            for (i, (label, group)) in groups(artifact).into_iter().enumerate() {
                let out = path.with_extension(format!("{i}-{label}.vllm.json"));
                let text = format!("{:#}\n", vllm(artifact, &group));
                std::io::Write::write_all(&mut create_new(&out)?, text.as_bytes())
                    .map_err(|cause| ExportError::Io { path: out.display().to_string(), cause })?;
                written.push(out);
            }
            Ok(written)
        }
    }
}

/// `path` made anew: an existing file (the artifact itself, when `--out` ends in an export's
/// extension) is never written over.
fn create_new(path: &Path) -> Result<std::fs::File, ExportError> {
    std::fs::File::create_new(path).map_err(|cause| match cause.kind() {
        std::io::ErrorKind::AlreadyExists => ExportError::Exists { path: path.display().to_string() },
        _ => ExportError::Io { path: path.display().to_string(), cause },
    })
}

fn write_csv(requests: &[RequestRecord], out: &Path) -> Result<(), ExportError> {
    let csv_error = |cause| ExportError::Csv { path: out.display().to_string(), cause };
    let mut w = csv::Writer::from_writer(create_new(out)?);
    w.write_record([
        "runtime",
        "concurrency",
        "rate_rps",
        "warmup",
        "round",
        "index",
        "turn",
        "prompt",
        "scheduled_s",
        "admitted_s",
        "woken_s",
        "sent_s",
        "sent_cpu",
        "first_byte_s",
        "first_token_s",
        "end_s",
        "status",
        "error",
        "finish_reason",
        "output_tokens",
        "output_token_source",
        "prompt_tokens",
        "ttft_s",
        "tpot_s",
        "total_s",
        "chunks",
    ])
    .map_err(csv_error)?;
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in requests {
        let (tokens, source) = r.output_tokens();
        let error = r.error.and_then(|e| serde_json::to_value(e).ok()).and_then(|v| v.as_str().map(str::to_string));
        w.write_record([
            r.runtime.clone(),
            r.concurrency.to_string(),
            r.arrival.map(|a| a.rate_rps.map_or("inf".into(), |v| v.to_string())).unwrap_or_default(),
            r.arrival.map(|a| a.warmup.to_string()).unwrap_or_default(),
            r.round.to_string(),
            r.index.to_string(),
            r.turn.map(|t| t.to_string()).unwrap_or_default(),
            r.prompt.clone(),
            r.scheduled_s.to_string(),
            opt(r.arrival.and_then(|a| a.admitted_s)),
            opt(r.arrival.and_then(|a| a.woken_s)),
            opt(r.sent_s),
            r.sent_cpu.map(|c| c.to_string()).unwrap_or_default(),
            opt(r.first_byte_s),
            opt(r.first_token_s),
            r.end_s.to_string(),
            r.status.map(|s| s.to_string()).unwrap_or_default(),
            error.unwrap_or_default(),
            r.finish_reason.clone().unwrap_or_default(),
            tokens.to_string(),
            format!("{source:?}").to_lowercase(),
            r.usage_prompt_tokens.or(r.ollama_prompt_eval_count).map(|n| n.to_string()).unwrap_or_default(),
            opt(r.ttft()),
            opt(r.tpot()),
            r.total().to_string(),
            r.chunks.to_string(),
        ])
        .map_err(csv_error)?;
    }
    w.flush().map_err(|cause| ExportError::Io { path: out.display().to_string(), cause })
}

/// The measured requests of each summary group, in the summary's order, with a file-name label.
fn groups(a: &ServingArtifact) -> Vec<(String, Vec<&RequestRecord>)> {
    crate::serving::groups(&a.requests)
        .into_iter()
        .map(|g| {
            let label = format!("{}-{}", g.runtime, g.load)
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' })
                .collect();
            (label, g.records)
        })
        .collect()
}

/// One group in vLLM's result shape: the run's totals and rates, mean/median/std/p99 of TTFT,
/// TPOT, ITL and end-to-end latency in milliseconds, and the per-request lists. Our inter-token
/// latencies are the gaps between chunks with text; texts are not kept, so `generated_texts` holds
/// empty strings.
fn vllm(a: &ServingArtifact, group: &[&RequestRecord]) -> Value {
    let ok: Vec<&&RequestRecord> = group.iter().filter(|r| r.ok()).collect();
    let start = group.iter().map(|r| r.scheduled_s).fold(f64::INFINITY, f64::min);
    let end = group.iter().map(|r| r.end_s).fold(f64::NEG_INFINITY, f64::max);
    let duration = if end > start { end - start } else { 0.0 };
    let input: u64 = ok.iter().map(|r| r.usage_prompt_tokens.or(r.ollama_prompt_eval_count).unwrap_or(0)).sum();
    let output: u64 = ok.iter().map(|r| r.output_tokens().0).sum();
    let per_s = |n: f64| if duration > 0.0 { n / duration } else { 0.0 };
    let first = group.first();
    let mut v = json!({
        "date": a.created_at,
        "backend": first.map(|r| r.runtime.clone()),
        "model_id": a.runtimes.iter().find(|t| Some(&t.name) == first.map(|r| &r.runtime)).map(|t| t.model.clone()),
        "tokenizer_id": Value::Null,
        "num_prompts": group.len(),
        "request_rate": first.and_then(|r| r.arrival).map_or(json!("inf"), |a| a.rate_rps.map_or(json!("inf"), |r| json!(r))),
        "burstiness": a.arguments.arrivals.as_ref().map_or(1.0, |x| x.burstiness),
        "max_concurrency": first.map(|r| r.concurrency).filter(|c| *c > 0),
        "duration": duration,
        "completed": ok.len(),
        "total_input_tokens": input,
        "total_output_tokens": output,
        "request_throughput": per_s(ok.len() as f64),
        "output_throughput": per_s(output as f64),
        "total_token_throughput": per_s((input + output) as f64),
        "input_lens": group.iter().map(|r| r.usage_prompt_tokens.or(r.ollama_prompt_eval_count).unwrap_or(0)).collect::<Vec<_>>(),
        "output_lens": group.iter().map(|r| if r.ok() { r.output_tokens().0 } else { 0 }).collect::<Vec<_>>(),
        "ttfts": group.iter().map(|r| if r.ok() { r.ttft().unwrap_or(0.0) } else { 0.0 }).collect::<Vec<_>>(),
        "itls": group.iter().map(|r| r.chunk_gaps_s.clone()).collect::<Vec<_>>(),
        "generated_texts": group.iter().map(|_| "").collect::<Vec<_>>(),
        "errors": group.iter().map(|r| r.error_detail.clone().unwrap_or_default()).collect::<Vec<_>>(),
    });
    let metrics: [(&str, Vec<f64>); 4] = [
        ("ttft", ok.iter().filter_map(|r| r.ttft()).collect()),
        ("tpot", ok.iter().filter_map(|r| r.tpot()).collect()),
        ("itl", ok.iter().flat_map(|r| r.chunk_gaps_s.iter().copied()).collect()),
        ("e2el", ok.iter().map(|r| r.total()).collect()),
    ];
    let mut percentiles = vec![99.0];
    percentiles.extend(a.arguments.percentiles.iter().copied().filter(|p| *p != 99.0));
    for (name, mut values) in metrics {
        values.sort_by(f64::total_cmp);
        let ms = |x: Option<f64>| x.map_or(0.0, |x| x * 1000.0);
        let n = values.len() as f64;
        let mean = (n > 0.0).then(|| values.iter().sum::<f64>() / n);
        let std = mean.map(|m| (values.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n).sqrt());
        v[format!("mean_{name}_ms")] = json!(ms(mean));
        v[format!("median_{name}_ms")] = json!(ms(common::stats::percentile_sorted(&values, 50.0)));
        v[format!("std_{name}_ms")] = json!(ms(std));
        for p in &percentiles {
            v[format!("p{p}_{name}_ms")] = json!(ms(common::stats::percentile_sorted(&values, *p)));
        }
    }
    // The group's summary row, for the goodput the SLOs gave.
    let rate = first.and_then(|r| r.arrival).map(|a| a.rate_rps);
    let row = a.summary.iter().find(|row| {
        Some(row.runtime.as_str()) == first.map(|r| r.runtime.as_str())
            && Some(row.concurrency) == first.map(|r| r.concurrency)
            && row.open_loop.map(|o| o.request_rate) == rate
    });
    if let Some(goodput) = row.and_then(|row| row.slo?.goodput_rps?) {
        v["request_goodput"] = json!(goodput);
    }
    v
}
