//! The scheduler's checks: the invariants of its artifacts (recomputed from the recorded runs),
//! the predecessor's seed artifact read for what its fields allow, and pinning a manifest's ids.

use crate::study::{self, Expectations, SchedulerArtifact};
use common::experiment::ExperimentError;
use common::finding::Findings;
use common::manifest::Invalid;
use common::qwen::KvPool;
use common::weights::WeightDtype;
use serde_json::Value;

/// The invariants of a scheduler artifact, and the manifest's pinned ids when `expectations` is given.
pub(crate) fn audit(artifact: &SchedulerArtifact, expectations: Option<&Expectations>, f: &mut Findings) {
    if artifact.runs.is_empty() {
        // What `--warmup` past every round, or a hand-edited file, leaves: nothing measured.
        return f.wrong(
            "invariants",
            "runs",
            "no measured runs: the artifact records no round (rounds >= 1 are required)",
        );
    }
    if artifact.source_sha256 != artifact.provenance.source.sha256 {
        f.wrong("invariants", "source_sha256", "differs from provenance.source.sha256");
    }
    if serde_json::to_value(&artifact.parameters).ok().as_ref() != Some(&artifact.provenance.settings.effective) {
        f.wrong("invariants", "parameters", "differs from provenance.settings.effective");
    }
    recorded_facts(artifact, f);
    for (i, run) in artifact.runs.iter().enumerate() {
        for Invalid { field, problem } in study::run_invariants(i, run, &artifact.jobs) {
            f.wrong("invariants", field, problem);
        }
        for (j, r) in run.requests.iter().enumerate() {
            match artifact.jobs.iter().find(|job| job.id == r.id) {
                Some(job) if job.prompt_tokens == r.prompt_tokens => {}
                _ => f.wrong("invariants", format!("runs[{i}].requests[{j}].prompt_tokens"), "differs from jobs[]"),
            }
        }
    }
    let (identical, differences) = study::consistency(&artifact.runs);
    if !identical {
        f.wrong("invariants", "runs", format!("output ids differ across runs: {}", differences.join("; ")));
    }
    if identical != artifact.checks.output_ids_identical || differences != artifact.checks.differences {
        f.wrong("invariants", "checks.output_ids_identical", "does not match the runs");
    }
    let summary = study::summarize_runs(&artifact.runs);
    if let Some(i) = (0..summary.len().max(artifact.summary.len())).find(|&i| summary.get(i) != artifact.summary.get(i))
    {
        f.wrong("invariants", format!("summary[{i}]"), "differs from the statistics recomputed from the runs");
    }
    if study::summarize_throughput(&artifact.runs) != artifact.throughput {
        f.wrong("invariants", "throughput", "differs from the throughput recomputed from the runs");
    }
    let ours = artifact.runs.first().map(study::run_ids).unwrap_or_default();
    if let Some(expected) = expectations.and_then(|e| e.output_ids.as_ref()) {
        let cmp = study::compare_ids("manifest", &ours, expected);
        // The manifest pins F32 ids; with reduced-precision weights leaving them is recorded in
        // checks.expected (compared below), not a failure.
        let f32_weights = artifact.provenance.model.as_ref().is_none_or(|m| m.weights == WeightDtype::F32);
        if let Some(d) = cmp.first_difference.as_ref().filter(|_| f32_weights) {
            let request = artifact.runs[0].requests.iter().position(|r| r.id == d.job).unwrap_or(0);
            f.wrong(
                "expectations",
                format!("runs[0].requests[{request}].output_ids[{}]", d.index),
                format!("job {}: {:?}, the manifest pins {:?}", d.job, d.ours, d.theirs),
            );
        }
        if artifact.checks.expected.as_ref() != Some(&cmp) {
            f.wrong("invariants", "checks.expected", "does not match a fresh comparison with the manifest");
        }
    }
}

/// What the artifact states twice, or derives from its parameters, agrees: the jobs are the
/// parameters' jobs, the environment and model are the provenance's, the descriptions are the
/// code's, and every request's KV cache is the same number of bytes per position (one model's
/// layout, for its prompt plus cap in whole tiles), the same for a job in every run.
fn recorded_facts(a: &SchedulerArtifact, f: &mut Findings) {
    let jobs_ok = a.jobs.len() == a.parameters.jobs.len()
        && a.jobs.iter().zip(&a.parameters.jobs).all(|(j, spec)| {
            j.id == spec.id
                && j.prompt == spec.prompt
                && j.max_new_tokens == spec.max_new_tokens
                && j.arrival_ms == spec.arrival_ms
        });
    if !jobs_ok {
        f.wrong("invariants", "jobs", "differ from parameters.jobs (id, prompt, cap and arrival, in order)");
    }
    if a.environment != study::Environment::of(&a.provenance) {
        f.wrong("invariants", "environment", "differs from what provenance records of the build, host and weights");
    }
    if a.model_revision != a.provenance.model.as_ref().and_then(|m| m.revision.clone()) {
        f.wrong("invariants", "model_revision", "differs from provenance.model.revision");
    }
    for (field, recorded, code) in [
        ("execution_mode", a.execution_mode.as_str(), study::EXECUTION_MODE),
        ("limits", a.limits.as_str(), study::LIMITS),
        ("arrival_policy", a.arrival_policy.as_str(), study::arrival_policy(&a.parameters).as_str()),
    ] {
        if recorded != code {
            f.differs_from_code(field, format!("`{recorded}` is not what the code writes for these parameters"));
        }
    }
    // Every configuration ran once per round, in the parameters' order, round after round.
    let n = a.parameters.runs.len().max(1);
    if a.runs.len() != a.parameters.runs.len().saturating_mul(a.parameters.rounds) {
        f.wrong(
            "invariants",
            "runs",
            format!(
                "{} runs, but {} configurations over {} rounds make {}",
                a.runs.len(),
                a.parameters.runs.len(),
                a.parameters.rounds,
                a.parameters.runs.len().saturating_mul(a.parameters.rounds)
            ),
        );
    }
    for (i, run) in a.runs.iter().enumerate() {
        let Some(config) = a.parameters.runs.get(i % n) else {
            return f.wrong("invariants", "parameters.runs", "empty, but the artifact records runs");
        };
        let planned = (config.policy, config.chunk_size, config.max_active, i / n);
        if (run.policy, run.chunk_size, run.max_active, run.round) != planned {
            return f.wrong(
                "invariants",
                format!("runs[{i}]"),
                format!(
                    "{} {} max {} round {}: the parameters' order gives {planned:?} here",
                    run.policy.name(),
                    study::chunk_label(run.chunk_size),
                    run.max_active,
                    run.round
                ),
            );
        }
        if let Some(j) = run.requests.iter().position(|r| jobs_prompt(a, &r.id) != Some(r.prompt.as_str())) {
            f.wrong("invariants", format!("runs[{i}].requests[{j}].prompt"), "is not its job's prompt");
        }
    }
    // The runs ran one after another within the run's recorded start and end.
    let elapsed_s: f64 = a.runs.iter().map(|r| r.elapsed_ms).sum::<f64>() / 1000.0;
    if let Some(wall) = a.provenance.wall_s() {
        // Both clocks are read to the millisecond or better; the slack covers their rounding.
        if elapsed_s > wall + 0.01 {
            f.wrong(
                "invariants",
                "runs",
                format!("the runs' elapsed times add up to {elapsed_s:.3} s, more than the {wall:.3} s from provenance.started_at to finished_at"),
            );
        }
    }
    // KV bytes are one model's blocks: every request's the blocks of the positions it filled
    // (its prompt and all its tokens but the last), each run's pool its budget (or room for every
    // job's whole length), its peak within the pool and above any one request's; a request's
    // preemptions are those its run's timeline records.
    let mut per_block: Option<usize> = None;
    let jobs: std::collections::BTreeMap<&str, &study::JobRecord> = a.jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    for (i, run) in a.runs.iter().enumerate() {
        for (j, r) in run.requests.iter().enumerate() {
            let Some(job) = jobs.get(r.id.as_str()) else { continue };
            let blocks =
                KvPool::blocks_for(job.prompt_tokens.saturating_add(r.output_ids.len().saturating_sub(1))).max(1);
            let each = *per_block.get_or_insert(r.kv_cache_bytes / blocks);
            if each.checked_mul(blocks) != Some(r.kv_cache_bytes) || each == 0 {
                return f.wrong(
                    "invariants",
                    format!("runs[{i}].requests[{j}].kv_cache_bytes"),
                    format!("{} bytes is not {blocks} blocks of the run's model ({each} bytes each)", r.kv_cache_bytes),
                );
            }
            let preempted =
                run.timeline.iter().filter(|s| s.job == r.id && s.kind == common::session::StepKind::Preempt).count();
            if r.preemptions != preempted {
                f.wrong(
                    "invariants",
                    format!("runs[{i}].requests[{j}].preemptions"),
                    format!("{}, but the timeline preempts it {preempted} times", r.preemptions),
                );
            }
        }
        let Some(each) = per_block else { continue };
        let pool_blocks = match run.kv_budget {
            Some(budget) => KvPool::blocks_within(budget),
            None => a
                .jobs
                .iter()
                .map(|j| KvPool::blocks_for(j.prompt_tokens.saturating_add(j.max_new_tokens)))
                .fold(0, usize::saturating_add),
        };
        let largest = run.requests.iter().map(|r| r.kv_cache_bytes).max().unwrap_or(0);
        if pool_blocks.checked_mul(each) != Some(run.kv_pool_bytes)
            || !run.peak_kv_bytes.is_multiple_of(each)
            || run.peak_kv_bytes > run.kv_pool_bytes
            || run.peak_kv_bytes < largest
        {
            f.wrong(
                "invariants",
                format!("runs[{i}].peak_kv_bytes"),
                format!(
                    "peak {} bytes in a pool of {} bytes: the pool is {pool_blocks} blocks of {each} bytes, the peak whole blocks within it and at least the largest request's {largest}",
                    run.peak_kv_bytes, run.kv_pool_bytes
                ),
            );
        }
    }
}

fn jobs_prompt<'a>(a: &'a SchedulerArtifact, id: &str) -> Option<&'a str> {
    a.jobs.iter().find(|j| j.id == id).map(|j| j.prompt.as_str())
}

/// A foreign artifact of the scheduler study: `runs` and an `arrival_policy`.
pub(crate) fn recognises(value: &Value) -> bool {
    value.get("runs").is_some() && value.get("arrival_policy").is_some()
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

pub(crate) fn audit_foreign(value: &Value, f: &mut Findings) {
    let runs = value.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    if runs.is_empty() {
        return f.wrong("invariants", "runs", "no runs");
    }
    f.note("lacks", "runs[].timeline", "no per-step timeline: per-request numbers cannot be recomputed");
    f.note("lacks", "runs[].requests[].prompt_tokens", "no prompt token counts");
    let mut first_ids: Option<Vec<(String, Value)>> = None;
    for (i, run) in runs.iter().enumerate() {
        let requests = run.get("requests").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut last = f64::NEG_INFINITY;
        for (j, r) in requests.iter().enumerate() {
            let at = format!("runs[{i}].requests[{j}]");
            let (Some(ttft), Some(done), Some(gap)) =
                (num(r, "ttft_ms"), num(r, "completion_ms"), num(r, "max_gap_ms"))
            else {
                f.wrong("invariants", at, "lacks ttft_ms, completion_ms or max_gap_ms");
                continue;
            };
            if ttft > done {
                f.wrong("invariants", format!("{at}.ttft_ms"), format!("{ttft} > completion_ms {done}"));
            }
            if gap > done - ttft + 1e-9 {
                f.wrong(
                    "invariants",
                    format!("{at}.max_gap_ms"),
                    format!("{gap} > completion_ms - ttft_ms = {}", done - ttft),
                );
            }
            last = last.max(done);
        }
        // The predecessor read its clock once more after the last token, so its elapsed time may
        // exceed the last completion slightly; it may never fall short of it.
        match num(run, "elapsed_ms") {
            Some(e) if e + 1e-9 < last => f.wrong(
                "invariants",
                format!("runs[{i}].elapsed_ms"),
                format!("{e} is before the last completion {last}"),
            ),
            None => f.wrong("invariants", format!("runs[{i}].elapsed_ms"), "missing"),
            _ => {}
        }
        let mut ids: Vec<(String, Value)> = requests
            .iter()
            .map(|r| {
                (
                    r.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                    r.get("output_ids").cloned().unwrap_or(Value::Null),
                )
            })
            .collect();
        ids.sort_by(|a, b| a.0.cmp(&b.0));
        match &first_ids {
            None => first_ids = Some(ids),
            Some(first) if *first != ids => {
                f.wrong("invariants", format!("runs[{i}].requests"), "output ids differ from the first run's")
            }
            Some(_) => {}
        }
    }
}

/// The manifest's expectations with the fresh artifact's ids pinned (the predecessor's ids kept).
pub(crate) fn pin(
    artifact: &SchedulerArtifact,
    current: Option<&Expectations>,
) -> Result<Expectations, ExperimentError> {
    let ids = artifact.runs.first().map(study::run_ids).ok_or(ExperimentError::Missing("runs"))?;
    let predecessor = current.and_then(|e| e.predecessor.clone());
    Ok(Expectations { output_ids: Some(ids), predecessor })
}
