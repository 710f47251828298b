//! `scheduler`: reproduce the seed 000 study, and set continuous batching beside it. Jobs over
//! per-request KV caches under each policy (serial forwards for fifo and interleave, one forward
//! for every admitted job for batched); every step timed on one timeline; per-request TTFT,
//! completion and largest token gap derived from it, and each run's aggregate throughput.

use anyhow::{bail, Context, Result};
use common::experiment::{claims_table, judge_claims, prepare};
use common::qwen::KvPool;
use common::qwen::WeightDtype;
use common::sample::Sampling;
use common::schedule::{self, request_metrics, Job};
use scheduler::cli::Args;
use scheduler::study::{
    arrival_policy, compare_ids, consistency, output_tokens_per_s, run_ids, summarize_runs, summarize_throughput,
    Checks, Environment, JobRecord, Parameters, RequestRecord, RunRecord, SchedulerArtifact, EXECUTION_MODE, LIMITS,
};

use scheduler::Scheduler;

fn main() {
    common::experiment::main(run)
}

fn run(args: Args) -> Result<i32> {
    let prepared = prepare(&Scheduler, &args)?;
    let params = prepared.parameters.clone();
    // Ids are pinned for the manifest's sampling: a run that samples otherwise has none to match.
    let same_sampling = prepared.manifest.as_ref().is_none_or(|m| m.manifest.parameters.sampling == params.sampling);
    let expectations = prepared.expectations().filter(|_| same_sampling).cloned();
    let model = &prepared.model.loaded;
    let weights = model.model.weight_dtype();

    let mut jobs = Vec::new();
    let mut job_records = Vec::new();
    for (i, spec) in params.jobs.iter().enumerate() {
        let mut job = Job::from_spec(model, spec).with_context(|| format!("jobs[{i}].prompt"))?;
        job.sampling = Sampling { seed: params.sampling.seed.wrapping_add(i as u64), ..params.sampling };
        let (prompt_tokens, context) = (job.prompt_ids.len(), model.config.max_position_embeddings);
        if prompt_tokens.checked_add(spec.max_new_tokens).is_none_or(|n| n > context) {
            bail!(
                "jobs[{i}].prompt: {prompt_tokens} tokens plus max_new_tokens {} exceed the model's context of {context}; shorten the prompt or lower the cap",
                spec.max_new_tokens
            );
        }
        job_records.push(JobRecord {
            id: spec.id.clone(),
            prompt: spec.prompt.clone(),
            prompt_tokens,
            max_new_tokens: spec.max_new_tokens,
            arrival_ms: spec.arrival_ms,
        });
        jobs.push(job);
    }

    check_memory(&params, &jobs, model)?;

    let total = params.runs.len() * (params.warmup + params.rounds);
    let mut done = 0;
    let mut runs = Vec::new();
    for round in 0..params.warmup + params.rounds {
        for config in &params.runs {
            done += 1;
            let warm = round < params.warmup;
            tracing::info!(
                "[{done}/{total}] {} {} max_active {}{}",
                config.policy.name(),
                scheduler::study::chunk_label(config.chunk_size),
                config.max_active,
                if warm { " (warmup)" } else { "" }
            );
            let outcome = schedule::run(model, &jobs, *config)?;
            if warm {
                continue;
            }
            let requests: Vec<RequestRecord> = request_metrics(&outcome.timeline)
                .into_iter()
                .map(|m| {
                    let job = job_records.iter().find(|j| j.id == m.id).expect("timeline jobs come from the job list");
                    let finished = outcome.finish.iter().find(|f| f.job == m.id).expect("every job finishes");
                    RequestRecord {
                        text: model.decode(&m.output_ids),
                        id: m.id,
                        prompt: job.prompt.clone(),
                        prompt_tokens: job.prompt_tokens,
                        output_ids: m.output_ids,
                        ttft_ms: m.ttft_ms,
                        completion_ms: m.completion_ms,
                        max_gap_ms: m.max_gap_ms,
                        finish_reason: finished.reason,
                        kv_cache_bytes: finished.kv_cache_bytes,
                        preemptions: finished.preemptions,
                    }
                })
                .collect();
            runs.push(RunRecord {
                policy: config.policy,
                chunk_size: config.chunk_size,
                max_active: config.max_active,
                round: round - params.warmup,
                elapsed_ms: outcome.elapsed_ms,
                scheduler_overhead_ms: outcome.overhead_ms,
                output_tokens_per_s: output_tokens_per_s(&requests, outcome.elapsed_ms),
                peak_rss_bytes: outcome.peak_rss_bytes,
                kv_budget: config.kv_budget,
                prefix_cache: config.prefix_cache,
                peak_kv_bytes: outcome.peak_kv_bytes,
                kv_pool_bytes: outcome.kv_pool_bytes,
                requests,
                timeline: outcome.timeline,
            });
        }
    }

    let (identical, differences) = consistency(&runs);
    let ours = runs.first().map(run_ids).unwrap_or_default();
    let checks = Checks {
        output_ids_identical: identical,
        differences,
        expected: expectations
            .as_ref()
            .and_then(|e| e.output_ids.as_ref())
            .map(|ids| compare_ids("manifest", &ours, ids)),
        predecessor: expectations
            .as_ref()
            .and_then(|e| e.predecessor.as_ref())
            .map(|p| compare_ids(&p.source, &ours, &p.output_ids)),
    };

    let facts = common::build_facts!();
    let provenance = prepared.provenance(facts)?;
    let pin = prepared.model.resolved.pin.as_ref();
    let mut artifact = SchedulerArtifact {
        execution_mode: EXECUTION_MODE.into(),
        environment: Environment::of(&provenance),
        model_id: prepared.model_id(),
        model_revision: pin.map(|p| p.revision.clone()),
        source_sha256: facts.source_sha256.to_string(),
        arrival_policy: arrival_policy(&params),
        summary: summarize_runs(&runs),
        throughput: summarize_throughput(&runs),
        parameters: params,
        jobs: job_records,
        runs,
        checks,
        claims: Vec::new(),
        limits: LIMITS.into(),
        provenance,
    };
    artifact.claims = judge_claims(&Scheduler, &prepared.claims, &artifact)?;
    let path = prepared.write(&artifact)?;
    print_table(&artifact);
    if !artifact.claims.is_empty() {
        let rows: Vec<_> = artifact.claims.iter().map(|c| (prepared.manifest_label(), c)).collect();
        print!("\n{}", claims_table(&rows));
    }
    println!("artifact: {}", prepared.ws.display_path(&path));

    let mut code = 0;
    if !artifact.checks.output_ids_identical {
        eprintln!("error: output ids differ across runs: {}", artifact.checks.differences.join("; "));
        code = 2;
    }
    if let Some(c) = &artifact.checks.expected {
        match (&c.first_difference, weights) {
            (Some(d), WeightDtype::F32) => {
                eprintln!("error: output ids differ from the manifest's pinned ids: {d:?}");
                code = 2;
            }
            // Reduced precision is expected to leave the F32 ids somewhere: recorded, not an error.
            (Some(d), _) => println!(
                "{} weights: ids leave the pinned F32 ids first at job {} token {}",
                weights.name(),
                d.job,
                d.index
            ),
            (None, WeightDtype::F32) => {}
            (None, _) => println!("{} weights: ids equal the pinned F32 ids", weights.name()),
        }
    }
    if let Some(c) = &artifact.checks.predecessor {
        match &c.first_difference {
            None => println!("predecessor ids ({}): matched", c.source),
            Some(d) => println!("predecessor ids ({}): differ first at job {} token {}", c.source, d.job, d.index),
        }
    }
    Ok(code)
}

/// The run must fit in memory ([`common::budget`]): the sessions a run admits at once (each a
/// KV cache for its prompt and cap), and every measured round's records until the artifact is
/// written. A record's size is estimated per timeline step (its record, and its part of the
/// JSON tree and text that writing makes) and per generated token.
fn check_memory(params: &Parameters, jobs: &[Job], model: &common::load::LoadedModel) -> Result<()> {
    const PER_STEP: u64 = 2_000;
    const PER_REQUEST: u64 = 2_000;
    let cache = |job: &Job| model.model.cache_bytes(job.prompt_ids.len() + job.max_new_tokens) as u64;
    let steps = |job: &Job, chunk: Option<usize>| {
        let prefill = chunk.map_or(1, |c| job.prompt_ids.len().div_ceil(c.max(1)));
        (prefill + job.max_new_tokens) as u64
    };
    let mut per_round = 0u64;
    let mut caches = 0u64;
    for config in &params.runs {
        let records: u64 =
            jobs.iter().map(|j| steps(j, config.chunk_size).saturating_mul(PER_STEP).saturating_add(PER_REQUEST)).sum();
        per_round = per_round.saturating_add(records);
        // The run's KV pool: its budget, or room for every job's whole length.
        let pool = match config.kv_budget {
            Some(budget) => model.model.cache_bytes(KvPool::blocks_within(budget) * KvPool::BLOCK_POSITIONS) as u64,
            None => jobs.iter().map(cache).sum(),
        };
        caches = caches.max(pool);
    }
    common::budget::fits(
        "parameters.rounds",
        params.rounds as u64,
        per_round,
        caches,
        common::budget::available_bytes(),
    )?;
    Ok(())
}

fn print_table(a: &SchedulerArtifact) {
    let med = |s: &common::stats::Summary| s.p50.map(|v| format!("{v:.1}")).unwrap_or_default();
    let chunk = |c: Option<usize>| c.map(|c| c.to_string()).unwrap_or_else(|| "-".into());
    let request = |c: [&str; 8]| {
        println!("{:<11} {:>6} {:>4} {:<15} {:>7} {:>10} {:>14} {:>11}", c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7])
    };
    request(["policy", "chunk", "max", "request", "rounds", "ttft_ms", "completion_ms", "max_gap_ms"]);
    for row in &a.summary {
        let (max, rounds) = (row.max_active.to_string(), row.ttft_ms.n.to_string());
        let (ttft, completion, gap) = (med(&row.ttft_ms), med(&row.completion_ms), med(&row.max_gap_ms));
        request([row.policy.name(), &chunk(row.chunk_size), &max, &row.id, &rounds, &ttft, &completion, &gap]);
    }
    let run = |c: [&str; 6]| println!("{:<11} {:>6} {:>4} {:>7} {:>12} {:>14}", c[0], c[1], c[2], c[3], c[4], c[5]);
    println!();
    run(["policy", "chunk", "max", "rounds", "elapsed_ms", "output tok/s"]);
    for row in &a.throughput {
        let (max, rounds) = (row.max_active.to_string(), row.output_tokens_per_s.n.to_string());
        let (elapsed, tokens) = (med(&row.elapsed_ms), med(&row.output_tokens_per_s));
        run([row.policy.name(), &chunk(row.chunk_size), &max, &rounds, &elapsed, &tokens]);
    }
}
