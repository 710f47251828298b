//! The scheduler study (seed 000): its manifest parameters, its artifact, and the checks that
//! bind them. Shared by the binary, which writes it, and the checks the audit runs through
//! [`crate::Scheduler`].

use common::evidence::ClaimResult;
use common::manifest::Invalid;
use common::policy::Policy;
use common::provenance::Provenance;
pub use common::schedule::JobSpec;
use common::schedule::{request_metrics, RunConfig, TimelineStep};
use common::session::FinishReason;
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
        Parameters { jobs: seed.jobs, runs: seed.runs, rounds: 1, warmup: 0 }
    }

    /// Checks everything that can be checked before the model is touched; one line per problem,
    /// naming the field.
    pub fn validate(&self) -> Result<(), Invalid> {
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
            if !(job.arrival_ms.is_finite() && job.arrival_ms >= 0.0) {
                return Err(Invalid::new(
                    format!("jobs[{i}].arrival_ms"),
                    format!("{}; must be a time >= 0", job.arrival_ms),
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
    /// Exact bytes of the request's KV cache (keys and values of every layer, F32, allocated for
    /// its prompt plus cap, rounded up to whole tiles of 64 positions).
    pub kv_cache_bytes: usize,
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
                    "{} chunk {:?} round {}: job {} token {} is {:?}, first run had {:?}",
                    run.policy.name(),
                    run.chunk_size,
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

/// Median and spread over rounds, per run configuration and request.
pub fn summarize_runs(runs: &[RunRecord]) -> Vec<SummaryRow> {
    let requests = runs.iter().flat_map(|run| {
        run.requests.iter().map(move |req| ((run.policy, run.chunk_size, run.max_active, req.id.clone()), req))
    });
    in_first_appearance_order(requests)
        .into_iter()
        .map(|((policy, chunk_size, max_active, id), reqs)| {
            let pick = |f: fn(&RequestRecord) -> f64| summarize(&reqs.iter().map(|r| f(r)).collect::<Vec<_>>());
            SummaryRow {
                policy,
                chunk_size,
                max_active,
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
    let tokens: usize = requests.iter().map(|r| r.output_ids.len()).sum();
    if elapsed_ms > 0.0 {
        (tokens as f64 / elapsed_ms * 1e6).round() / 1000.0
    } else {
        0.0
    }
}

/// Median and spread over rounds of each run configuration's throughput and wall time, in the
/// order the configurations first appear.
pub fn summarize_throughput(runs: &[RunRecord]) -> Vec<ThroughputRow> {
    let spread =
        |runs: &[&RunRecord], f: fn(&RunRecord) -> f64| summarize(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
    in_first_appearance_order(runs.iter().map(|run| ((run.policy, run.chunk_size, run.max_active), run)))
        .into_iter()
        .map(|((policy, chunk_size, max_active), runs)| ThroughputRow {
            policy,
            chunk_size,
            max_active,
            output_tokens_per_s: spread(&runs, |r| r.output_tokens_per_s),
            elapsed_ms: spread(&runs, |r| r.elapsed_ms),
        })
        .collect()
}

/// The invariants any honest scheduler run satisfies; a list of violations naming the field.
/// The audit applies these to our artifacts and, where the fields exist, to the seed's.
pub fn run_invariants(run_index: usize, run: &RunRecord) -> Vec<Invalid> {
    let mut problems = Vec::new();
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

fn round_ms_diff(a: f64, b: f64) -> f64 {
    // Both are microsecond-rounded; allow the rounding of their difference.
    common::schedule::round_ms(a - b) + 0.0005
}
