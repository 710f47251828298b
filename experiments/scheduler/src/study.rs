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
use common::session::{FinishReason, StepKind};
use common::stats::{summarize, Summary};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// The invariants any honest scheduler run satisfies; a list of violations naming the field.
/// The audit applies these to our artifacts and, where the fields exist, to the seed's. `jobs`
/// are the run's jobs, which its timeline must step exactly as the engine would.
pub fn run_invariants(run_index: usize, run: &RunRecord, jobs: &[JobRecord]) -> Vec<Invalid> {
    let mut problems = timeline_invariants(run_index, run, jobs);
    let at = |field: &str| format!("runs[{run_index}].{field}");
    for (i, r) in run.requests.iter().enumerate() {
        if r.ttft_ms > r.completion_ms {
            problems.push(Invalid::new(
                at(&format!("requests[{i}]")),
                format!("ttft_ms {} > completion_ms {}", r.ttft_ms, r.completion_ms),
            ));
        }
        if r.max_gap_ms > round_ms_diff(r.completion_ms, r.ttft_ms) {
            problems.push(Invalid::new(
                at(&format!("requests[{i}]")),
                format!("max_gap_ms {} > completion_ms - ttft_ms", r.max_gap_ms),
            ));
        }
    }
    if output_tokens_per_s(&run.requests, run.elapsed_ms) != run.output_tokens_per_s {
        problems.push(Invalid::new(at("output_tokens_per_s"), "differs from the requests' tokens over elapsed_ms"));
    }
    let last = run.requests.iter().map(|r| r.completion_ms).fold(f64::NEG_INFINITY, f64::max);
    if !run.requests.is_empty() && last != run.elapsed_ms {
        problems.push(Invalid::new(at("elapsed_ms"), format!("{} but the last completion is {last}", run.elapsed_ms)));
    }
    // Steps run one forward at a time: each ends after it starts, and the next starts no earlier
    // than this one ended, unless it is another job's part of the same batched forward.
    for (i, step) in run.timeline.iter().enumerate() {
        if !(0.0 <= step.start_ms && step.start_ms <= step.end_ms) {
            problems.push(Invalid::new(
                at(&format!("timeline[{i}]")),
                format!("starts at {} and ends at {}", step.start_ms, step.end_ms),
            ));
        }
        if let Some(prev) = i.checked_sub(1).map(|p| &run.timeline[p]) {
            let same_forward = (prev.start_ms, prev.end_ms) == (step.start_ms, step.end_ms);
            if !same_forward && step.start_ms < prev.end_ms {
                problems.push(Invalid::new(
                    at(&format!("timeline[{i}].start_ms")),
                    format!("starts at {}, before the previous step ended ({})", step.start_ms, prev.end_ms),
                ));
            }
        }
    }
    if !run.timeline.is_empty() {
        let derived = request_metrics(&run.timeline);
        for (i, r) in run.requests.iter().enumerate() {
            match derived.iter().find(|d| d.id == r.id) {
                None => problems.push(Invalid::new(
                    at(&format!("requests[{i}]")),
                    format!("request `{}` has no token on the timeline", r.id),
                )),
                Some(d) => {
                    let fields = [
                        ("ttft_ms", d.ttft_ms == r.ttft_ms),
                        ("completion_ms", d.completion_ms == r.completion_ms),
                        ("max_gap_ms", d.max_gap_ms == r.max_gap_ms),
                        ("output_ids", d.output_ids == r.output_ids),
                    ];
                    for (name, ok) in fields {
                        if !ok {
                            problems
                                .push(Invalid::new(at(&format!("requests[{i}].{name}")), "differs from the timeline"));
                        }
                    }
                }
            }
        }
    }
    problems
}

/// A run's timeline is the whole of what it did, stepped as the engine steps: every job of the
/// run appears on it, each job's prefill steps cover its prompt from position 0 in order, the last
/// of them and every decode step (one token, at the next position) produce a token, no job makes
/// more tokens than its cap (a `length` finish is exactly at it), no step starts before its job
/// arrived, a forward's steps carry its size in `batch`, the serial policies step one job per
/// forward (`fifo` each job to its end, in arrival order), prefill chunks keep to `chunk_size`
/// (for `batched`, the step's budget after its decodes), and no more than `max_active` jobs are
/// under way at once. An emptied or thinned timeline, or one edited to fit other request
/// numbers, shows here.
fn timeline_invariants(run_index: usize, run: &RunRecord, jobs: &[JobRecord]) -> Vec<Invalid> {
    let mut problems = Vec::new();
    let at = |field: &str| format!("runs[{run_index}].{field}");
    if run.timeline.is_empty() {
        problems.push(Invalid::new(
            at("timeline"),
            format!("empty, but the run has {} requests: every request's numbers derive from it", run.requests.len()),
        ));
        return problems;
    }
    let by_id: BTreeMap<&str, &JobRecord> = jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    let requests: BTreeMap<&str, (usize, &RequestRecord)> =
        run.requests.iter().enumerate().map(|(i, r)| (r.id.as_str(), (i, r))).collect();
    if run.requests.len() != jobs.len() || jobs.iter().any(|j| !requests.contains_key(j.id.as_str())) {
        problems.push(Invalid::new(
            at("requests"),
            format!("{} requests, but the run had {} jobs", run.requests.len(), jobs.len()),
        ));
    }
    // Per forward (steps with the same times): its steps, its decodes and the prompt tokens it
    // prefills. A preemption is no forward. Per job: where its steps stand.
    let mut forwards: BTreeMap<(u64, u64), (usize, usize, usize)> = BTreeMap::new();
    for step in run.timeline.iter().filter(|s| s.kind != StepKind::Preempt) {
        let f = forwards.entry((step.start_ms.to_bits(), step.end_ms.to_bits())).or_default();
        f.0 += 1;
        match step.kind {
            StepKind::Decode => f.1 += 1,
            _ => f.2 = f.2.saturating_add(step.tokens),
        }
    }
    struct Progress {
        /// Positions its cache holds.
        computed: usize,
        generated: usize,
        first_start: Option<f64>,
        last_end: f64,
    }
    let mut progress: BTreeMap<&str, Progress> = BTreeMap::new();
    let serial = matches!(run.policy, Policy::Fifo | Policy::Interleave);
    for (i, step) in run.timeline.iter().enumerate() {
        let field = |k: &str| at(&format!("timeline[{i}].{k}"));
        let Some(&job) = by_id.get(step.job.as_str()) else {
            problems.push(Invalid::new(field("job"), format!("`{}` is not one of the run's jobs", step.job)));
            return problems;
        };
        if step.start_ms < job.arrival_ms {
            problems.push(Invalid::new(
                field("start_ms"),
                format!("{}: before its job arrived at {} ms", step.start_ms, job.arrival_ms),
            ));
        }
        let p = progress.entry(step.job.as_str()).or_insert(Progress {
            computed: 0,
            generated: 0,
            first_start: None,
            last_end: step.end_ms,
        });
        if step.kind == StepKind::Preempt {
            // Its blocks given back: only under a budget, with nothing computed in the step.
            let honest = run.kv_budget.is_some()
                && step.position == p.computed
                && step.tokens == 0
                && step.token.is_none()
                && step.batch == 0
                && step.start_ms == step.end_ms;
            if !honest {
                problems.push(Invalid::new(
                    field("kind"),
                    "a preemption is of a run under a KV budget, at its job's cached length, computing nothing",
                ));
                return problems;
            }
            p.computed = 0;
            continue;
        }
        let size = forwards[&(step.start_ms.to_bits(), step.end_ms.to_bits())].0;
        if step.batch != size || (serial && size != 1) {
            problems.push(Invalid::new(
                field("batch"),
                format!("{}, but {size} steps share its forward under {}", step.batch, run.policy.name()),
            ));
        }
        p.first_start.get_or_insert(step.start_ms);
        p.last_end = step.end_ms;
        if step.reused > 0 {
            // Taken from the prefix cache: only with reuse on, by a prefill that starts its job
            // (or restarts it after a preemption), and where that prefill starts.
            let honest =
                run.prefix_cache && step.kind == StepKind::Prefill && p.computed == 0 && step.position == step.reused;
            if !honest {
                problems.push(Invalid::new(
                    field("reused"),
                    format!(
                        "{} positions reused: reuse is a prefix-cache run's, by a prefill at its job's start, ending where the prefill starts",
                        step.reused
                    ),
                ));
                return problems;
            }
            p.computed = step.reused;
        }
        // Before it decodes, its cache must hold its prompt, and after a preemption the tokens
        // it had generated but the last; the prefill that ends its prompt makes its first token.
        // Saturating and checked: the counts are the artifact's, whatever a forger wrote.
        let target = job.prompt_tokens.saturating_add(p.generated.saturating_sub(1));
        let (in_order, produces) = match step.kind {
            StepKind::Prefill => (
                p.computed < target && step.tokens >= 1 && step.tokens <= target - p.computed,
                p.computed.checked_add(step.tokens) == Some(target) && p.generated == 0,
            ),
            _ => (p.computed == target && p.generated >= 1 && step.tokens == 1, true),
        };
        if !in_order || step.position != p.computed {
            problems.push(Invalid::new(
                field("position"),
                format!(
                    "a {:?} step of {} tokens at {}: job `{}` had {} of {} positions cached with {} generated",
                    step.kind, step.tokens, step.position, step.job, p.computed, target, p.generated
                ),
            ));
            return problems;
        }
        if step.token.is_some() != produces {
            problems.push(Invalid::new(
                field("token"),
                "a step produces a token exactly when it ends the prompt or decodes",
            ));
        }
        p.computed += step.tokens;
        if step.token.is_some() {
            p.generated += 1;
            if p.generated > job.max_new_tokens {
                problems.push(Invalid::new(
                    field("token"),
                    format!("job `{}` past its cap of {}", step.job, job.max_new_tokens),
                ));
            }
        }
    }
    for job in jobs {
        let done = progress.get(job.id.as_str()).map_or(0, |p| p.generated);
        let request = requests.get(job.id.as_str());
        if let Some((i, _)) =
            request.filter(|(_, r)| r.finish_reason == FinishReason::Length && done != job.max_new_tokens)
        {
            problems.push(Invalid::new(
                at(&format!("requests[{i}].finish_reason")),
                format!("length, but job `{}` made {done} of its {} tokens", job.id, job.max_new_tokens),
            ));
        }
    }
    // Prefill chunks keep to the run's chunk size (for batched: its step budget after decodes).
    if let Some(chunk) = run.chunk_size {
        let over = forwards.iter().find(|(_, (_, decodes, prefilled))| {
            *prefilled > if serial { chunk } else { chunk.saturating_sub(*decodes) }
        });
        if let Some(((start, _), (_, _, prefilled))) = over {
            problems.push(Invalid::new(
                at("timeline"),
                format!(
                    "the forward at {} ms prefills {prefilled} tokens, more than chunk_size {chunk} allows",
                    f64::from_bits(*start)
                ),
            ));
        }
    }
    // At most max_active jobs under way at once (from each job's first step to its last), and
    // under fifo one at a time, in arrival order.
    let mut spans: Vec<(f64, f64, &str)> =
        progress.iter().filter_map(|(id, p)| Some((p.first_start?, p.last_end, *id))).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    if run.policy == Policy::Fifo {
        let mut arrival: Vec<&JobRecord> = jobs.iter().collect();
        arrival.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
        let ran: Vec<&str> = spans.iter().map(|s| s.2).collect();
        let arrived: Vec<&str> = arrival.iter().map(|j| j.id.as_str()).collect();
        if ran != arrived {
            problems.push(Invalid::new(at("timeline"), format!("fifo ran {ran:?}, not in arrival order {arrived:?}")));
        }
    }
    // Starts and ends in time order, an end before a start at the same instant.
    let mut events: Vec<(f64, i64)> = spans.iter().flat_map(|s| [(s.0, 1), (s.1, -1)]).collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let limit = if run.policy == Policy::Fifo { 1 } else { run.max_active as i64 };
    let mut under_way = 0i64;
    for (t, change) in events {
        under_way += change;
        if under_way > limit {
            problems.push(Invalid::new(
                at("timeline"),
                format!("{under_way} jobs under way at {t} ms, but {} allows {limit}", run.policy.name()),
            ));
            break;
        }
    }
    problems
}

fn round_ms_diff(a: f64, b: f64) -> f64 {
    // Both are microsecond-rounded; allow the rounding of their difference.
    common::schedule::round_ms(a - b) + 0.0005
}
