//! The scheduler study (seed 000): its manifest parameters, its artifact, and the checks that
//! bind them. Shared by the binary, which writes it, and the checks the audit runs through
//! [`crate::Scheduler`].

use common::evidence::ClaimResult;
use common::manifest::Invalid;
use common::policy::Policy;
use common::provenance::Provenance;
use common::sample::Sampling;
pub use common::schedule::JobSpec;
use common::schedule::{request_metrics, RunConfig, TimelineStep};
use common::session::FinishReason;
use common::stats::{summarize, Summary};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod invariants;
pub use invariants::run_invariants;

/// The scheduler manifest's `parameters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    /// In arrival order.
    pub jobs: Vec<JobSpec>,
    pub runs: Vec<RunConfig>,
    /// Measured repetitions of every run.
    pub rounds: usize,
    /// Unrecorded repetitions before the measured ones.
    pub warmup: usize,
    /// How every job's ids are picked, in every run; job `i` draws with seed `seed + i`. Absent:
    /// greedy.
    #[serde(default, skip_serializing_if = "is_greedy")]
    pub sampling: Sampling,
}

fn is_greedy(s: &Sampling) -> bool {
    *s == Sampling::GREEDY
}

/// The scheduler manifest's `expectations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Exact greedy ids per job, where the checkpoint and the numerics are pinned.
    pub output_ids: Option<BTreeMap<String, Vec<u32>>>,
    /// Ids another implementation recorded: compared and reported, not required.
    pub predecessor: Option<Reference>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// Where the ids come from (artifact, engine, device).
    pub source: String,
    pub output_ids: BTreeMap<String, Vec<u32>>,
}

impl Parameters {
    /// The seed's workload: three jobs that arrive before the scheduler starts, and the seed's
    /// three runs. The default for runs without a manifest.
    pub fn seed() -> Self {
        let seed = common::schedule::seed_workload();
        Parameters { jobs: seed.jobs, runs: seed.runs, rounds: 1, warmup: 0, sampling: Sampling::GREEDY }
    }

    /// Checks everything that can be checked before the model is touched; one line per problem,
    /// naming the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.sampling.check().map_err(|e| Invalid::new(format!("sampling.{}", e.field), e.to_string()))?;
        if self.jobs.is_empty() {
            return Err(Invalid::new("parameters.jobs", "empty; give at least one job"));
        }
        let mut ids = std::collections::BTreeSet::new();
        for (i, job) in self.jobs.iter().enumerate() {
            if job.id.trim().is_empty() {
                return Err(Invalid::new(format!("jobs[{i}].id"), "empty; give every job a unique id"));
            }
            if !ids.insert(job.id.as_str()) {
                return Err(Invalid::new(
                    format!("jobs[{i}].id"),
                    format!("`{}` is used twice; job ids must be unique", job.id),
                ));
            }
            if job.max_new_tokens == 0 {
                return Err(Invalid::new(
                    format!("jobs[{i}].max_new_tokens"),
                    "0; a job must be allowed at least 1 new token",
                ));
            }
            if let Err(e) = common::manifest::seconds(&format!("jobs[{i}].arrival_ms"), job.arrival_ms / 1000.0) {
                return Err(Invalid::new(
                    e.field,
                    format!(
                        "{:?} ms: must be a time from 0 to {} ms (a week)",
                        job.arrival_ms,
                        common::manifest::MAX_WAIT_S * 1000.0
                    ),
                ));
            }
        }
        if self.runs.is_empty() {
            return Err(Invalid::new("parameters.runs", "empty; give at least one policy run"));
        }
        for (i, run) in self.runs.iter().enumerate() {
            if run.chunk_size == Some(0) {
                return Err(Invalid::new(
                    format!("runs[{i}].chunk_size"),
                    "0; must be at least 1 (or absent for whole-prompt prefill)",
                ));
            }
            if run.max_active == 0 {
                return Err(Invalid::new(format!("runs[{i}].max_active"), "0; must be at least 1"));
            }
        }
        if self.rounds == 0 {
            return Err(Invalid::new("parameters.rounds", "0; must be at least 1"));
        }
        if self.warmup.checked_add(self.rounds).and_then(|n| n.checked_mul(self.runs.len())).is_none() {
            return Err(Invalid::new(
                "parameters.warmup",
                format!(
                    "{} warmup plus {} measured rounds of {} runs is more than can be counted; give fewer",
                    self.warmup,
                    self.rounds,
                    self.runs.len()
                ),
            ));
        }
        Ok(())
    }
}

/// How the runs computed (the seed's `execution_mode`).
pub const EXECUTION_MODE: &str =
    "fresh local model inference with real per-request cache; cooperative scheduler, serial or batched forwards";

/// What the numbers are not (the seed's `limits`).
pub const LIMITS: &str = "Model forwards on one CPU device, one per-request KV cache each; the batched policy runs every admitted request in one forward (per-request attention, shared weight reads). Wall-clock numbers are this machine's and move between runs.";

/// When the jobs arrive (the seed's `arrival_policy`), as the parameters say.
pub fn arrival_policy(p: &Parameters) -> String {
    if p.jobs.iter().all(|j| j.arrival_ms == 0.0) {
        "all jobs arrive before the scheduler starts; greedy output, explicit per-job caps".into()
    } else {
        "jobs arrive at their manifest arrival_ms from the scheduler's start; greedy output, explicit per-job caps"
            .into()
    }
}

/// The software and device the numbers were computed with (the seed's `environment`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    pub rust: String,
    pub candle: String,
    pub tokenizers: String,
    pub platform: String,
    pub device: String,
    pub dtype: String,
    pub threads: usize,
}

impl Environment {
    /// What the provenance block says of the build, the host and the weights, in the seed's terms.
    pub fn of(provenance: &Provenance) -> Self {
        let weights = provenance.model.as_ref().map(|m| m.weights).unwrap_or_default();
        Environment {
            rust: provenance.build.rustc.clone(),
            candle: provenance.build.candle.clone(),
            tokenizers: provenance.build.tokenizers.clone(),
            platform: format!("{} {} {}", provenance.host.os, provenance.host.kernel, provenance.host.arch),
            device: "cpu".into(),
            dtype: common::qwen::arithmetic(weights).into(),
            threads: provenance.threads,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRecord {
    pub id: String,
    pub prompt: String,
    pub prompt_tokens: usize,
    pub max_new_tokens: usize,
    pub arrival_ms: f64,
}

/// One request of one run, with the seed's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestRecord {
    pub id: String,
    pub prompt: String,
    pub prompt_tokens: usize,
    pub output_ids: Vec<u32>,
    pub text: String,
    pub ttft_ms: f64,
    pub completion_ms: f64,
    pub max_gap_ms: f64,
    pub finish_reason: FinishReason,
    /// Bytes of the KV cache blocks its filled positions take at its end (keys and values of
    /// every layer, F32, in whole blocks of 64 positions).
    pub kv_cache_bytes: usize,
    /// How often it was preempted under the run's KV budget (its blocks given back, its history
    /// prefilled again later).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preemptions: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    pub policy: Policy,
    pub chunk_size: Option<usize>,
    pub max_active: usize,
    /// 0-based measured round.
    pub round: usize,
    /// Wall time of the run: the end of its last step.
    pub elapsed_ms: f64,
    /// Time outside forward passes: the scheduler's own cost.
    pub scheduler_overhead_ms: f64,
    /// Tokens generated by all requests over `elapsed_ms`, per second.
    pub output_tokens_per_s: f64,
    /// Peak resident memory of the process during this run (Linux), bytes.
    pub peak_rss_bytes: Option<u64>,
    /// The run's KV budget in positions (whole blocks of 64), when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_budget: Option<usize>,
    /// Whether its KV pool reused cached prefixes (see the timeline's `reused`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefix_cache: bool,
    /// The most bytes the jobs' KV caches held at once, and the pool they shared (the budget, or
    /// room for every job's whole length).
    #[serde(default)]
    pub peak_kv_bytes: usize,
    #[serde(default)]
    pub kv_pool_bytes: usize,
    /// Sorted by id, as in the seed.
    pub requests: Vec<RequestRecord>,
    pub timeline: Vec<TimelineStep>,
}

/// Spread over rounds of one request under one run configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummaryRow {
    pub policy: Policy,
    pub chunk_size: Option<usize>,
    pub max_active: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_budget: Option<usize>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefix_cache: bool,
    pub id: String,
    pub ttft_ms: Summary,
    pub completion_ms: Summary,
    pub max_gap_ms: Summary,
}

/// Spread over rounds of one run configuration's throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThroughputRow {
    pub policy: Policy,
    pub chunk_size: Option<usize>,
    pub max_active: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_budget: Option<usize>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefix_cache: bool,
    pub output_tokens_per_s: Summary,
    pub elapsed_ms: Summary,
}

/// Where two id lists first part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Difference {
    pub job: String,
    pub index: usize,
    pub ours: Option<u32>,
    pub theirs: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    pub source: String,
    pub matched: bool,
    pub first_difference: Option<Difference>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Checks {
    /// Output ids equal across every run and round (a policy must not change what is computed).
    pub output_ids_identical: bool,
    /// Each run whose ids differ from the first run's, with where.
    pub differences: Vec<String>,
    /// Against the manifest's pinned ids, when it pins them.
    pub expected: Option<Comparison>,
    /// Against the predecessor's recorded ids, when the manifest has them.
    pub predecessor: Option<Comparison>,
}

/// The scheduler artifact: the seed's fields, plus jobs, timelines, summary, checks, provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulerArtifact {
    pub execution_mode: String,
    pub environment: Environment,
    pub model_id: String,
    pub model_revision: Option<String>,
    pub source_sha256: String,
    pub arrival_policy: String,
    pub parameters: Parameters,
    pub jobs: Vec<JobRecord>,
    pub runs: Vec<RunRecord>,
    pub summary: Vec<SummaryRow>,
    /// Aggregate throughput per run configuration: the batched policy against the serial ones.
    pub throughput: Vec<ThroughputRow>,
    pub checks: Checks,
    /// The manifest's claims, judged on the paired rounds (the audit recomputes them).
    #[serde(default)]
    pub claims: Vec<ClaimResult>,
    pub limits: String,
    pub provenance: Provenance,
}

/// Compares per-job id lists; the first difference in job-id order.
/// A run's chunking as a reader says it in a progress line or a finding: `chunk 64`, or
/// `whole prompts` (no chunking).
pub fn chunk_label(chunk_size: Option<usize>) -> String {
    match chunk_size {
        Some(c) => format!("chunk {c}"),
        None => "whole prompts".into(),
    }
}

pub fn compare_ids(source: &str, ours: &BTreeMap<String, Vec<u32>>, theirs: &BTreeMap<String, Vec<u32>>) -> Comparison {
    let mut jobs: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    jobs.sort();
    jobs.dedup();
    let first_difference = jobs.into_iter().find_map(|job| {
        let (a, b) =
            (ours.get(job).map(Vec::as_slice).unwrap_or(&[]), theirs.get(job).map(Vec::as_slice).unwrap_or(&[]));
        let index = a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then(|| a.len().min(b.len())))?;
        Some(Difference { job: job.clone(), index, ours: a.get(index).copied(), theirs: b.get(index).copied() })
    });
    Comparison { source: source.to_string(), matched: first_difference.is_none(), first_difference }
}

/// Output ids per job of one run.
pub fn run_ids(run: &RunRecord) -> BTreeMap<String, Vec<u32>> {
    run.requests.iter().map(|r| (r.id.clone(), r.output_ids.clone())).collect()
}

/// Whether all runs computed the same ids, and where each differing run first departs.
pub fn consistency(runs: &[RunRecord]) -> (bool, Vec<String>) {
    let Some(first) = runs.first() else { return (true, Vec::new()) };
    let reference = run_ids(first);
    let differences: Vec<String> = runs
        .iter()
        .skip(1)
        .filter_map(|run| {
            let cmp = compare_ids("first run", &run_ids(run), &reference);
            cmp.first_difference.map(|d| {
                format!(
                    "{} {} round {}: job {} token {} is {:?}, first run had {:?}",
                    run.policy.name(),
                    chunk_label(run.chunk_size),
                    run.round,
                    d.job,
                    d.index,
                    d.ours,
                    d.theirs
                )
            })
        })
        .collect();
    (differences.is_empty(), differences)
}

/// Everything the binary derives from the recorded timelines, recomputed: each request's numbers
/// and ids, each run's elapsed time and throughput, the summaries and the consistency check.
pub fn rederive(a: &mut SchedulerArtifact) {
    for run in &mut a.runs {
        let derived = request_metrics(&run.timeline);
        for r in &mut run.requests {
            if let Some(d) = derived.iter().find(|d| d.id == r.id) {
                (r.ttft_ms, r.completion_ms, r.max_gap_ms) = (d.ttft_ms, d.completion_ms, d.max_gap_ms);
                r.output_ids = d.output_ids.clone();
            }
        }
        if let Some(last) = run.timeline.last() {
            run.elapsed_ms = last.end_ms;
        }
        run.output_tokens_per_s = output_tokens_per_s(&run.requests, run.elapsed_ms);
    }
    a.summary = summarize_runs(&a.runs);
    a.throughput = summarize_throughput(&a.runs);
    (a.checks.output_ids_identical, a.checks.differences) = consistency(&a.runs);
}

/// Median and spread over rounds, per run configuration and request.
pub fn summarize_runs(runs: &[RunRecord]) -> Vec<SummaryRow> {
    let requests = runs.iter().flat_map(|run| {
        run.requests.iter().map(move |req| {
            ((run.policy, run.chunk_size, run.max_active, run.kv_budget, run.prefix_cache, req.id.clone()), req)
        })
    });
    in_first_appearance_order(requests)
        .into_iter()
        .map(|((policy, chunk_size, max_active, kv_budget, prefix_cache, id), reqs)| {
            let pick = |f: fn(&RequestRecord) -> f64| summarize(&reqs.iter().map(|r| f(r)).collect::<Vec<_>>());
            SummaryRow {
                policy,
                chunk_size,
                max_active,
                kv_budget,
                prefix_cache,
                id,
                ttft_ms: pick(|r| r.ttft_ms),
                completion_ms: pick(|r| r.completion_ms),
                max_gap_ms: pick(|r| r.max_gap_ms),
            }
        })
        .collect()
}

/// Items grouped by key, the groups in the order their keys first appear.
fn in_first_appearance_order<K: PartialEq, T>(items: impl IntoIterator<Item = (K, T)>) -> Vec<(K, Vec<T>)> {
    let mut groups: Vec<(K, Vec<T>)> = Vec::new();
    for (key, item) in items {
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => g.1.push(item),
            None => groups.push((key, vec![item])),
        }
    }
    groups
}

/// A run's generated tokens per second of its wall time, rounded to the thousandth.
pub fn output_tokens_per_s(requests: &[RequestRecord], elapsed_ms: f64) -> f64 {
    common::schedule::tokens_per_s(requests.iter().map(|r| r.output_ids.len()).sum(), elapsed_ms)
}

/// Median and spread over rounds of each run configuration's throughput and wall time, in the
/// order the configurations first appear.
pub fn summarize_throughput(runs: &[RunRecord]) -> Vec<ThroughputRow> {
    let spread =
        |runs: &[&RunRecord], f: fn(&RunRecord) -> f64| summarize(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
    let key = |run: &RunRecord| (run.policy, run.chunk_size, run.max_active, run.kv_budget, run.prefix_cache);
    in_first_appearance_order(runs.iter().map(|run| (key(run), run)))
        .into_iter()
        .map(|((policy, chunk_size, max_active, kv_budget, prefix_cache), runs)| ThroughputRow {
            policy,
            chunk_size,
            max_active,
            kv_budget,
            prefix_cache,
            output_tokens_per_s: spread(&runs, |r| r.output_tokens_per_s),
            elapsed_ms: spread(&runs, |r| r.elapsed_ms),
        })
        .collect()
}
