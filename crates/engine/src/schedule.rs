//! The scheduler: admits jobs as they arrive (up to `max_active` at once) into the stepping loop
//! it shares with the embedded server ([`crate::stepper`]), where the policy plans each step (one
//! job for the serial policies, every admitted job for `batched`) and one forward runs it over
//! the jobs' own sessions; it records every job's part of every step on one timeline.
//!
//! Per-request numbers are *derived* from the timeline by [`request_metrics`], never measured on
//! the side, so the audit can recompute them exactly from the artifact.

use crate::load::LoadedModel;
use crate::policy::Policy;
use crate::qwen::KvPool;
use crate::sample::Sampling;
use crate::session::{BudgetError, EngineError, FinishReason, Session, StepKind};
use crate::stepper::Stepper;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// A job as the scheduler gets it: already templated and tokenized.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: String,
    pub prompt_ids: Vec<u32>,
    pub max_new_tokens: usize,
    /// When the job arrives, from the scheduler's start.
    pub arrival_ms: f64,
    /// How its ids are picked (greedy by default).
    pub sampling: Sampling,
}

impl Job {
    /// The job for a manifest's job spec: its prompt rendered through the checkpoint's chat
    /// template and tokenized.
    pub fn from_spec(model: &LoadedModel, spec: &JobSpec) -> Result<Self, crate::load::LoadError> {
        let (_, prompt_ids) = model.encode_user_prompt(&spec.prompt)?;
        Ok(Job {
            id: spec.id.clone(),
            prompt_ids,
            max_new_tokens: spec.max_new_tokens,
            arrival_ms: spec.arrival_ms,
            sampling: Sampling::GREEDY,
        })
    }
}

/// A job as the manifest states it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub id: String,
    /// The user message; rendered through the checkpoint's chat template.
    pub prompt: String,
    /// Cap on new tokens.
    pub max_new_tokens: usize,
    /// Arrival, in milliseconds from the scheduler's start.
    #[serde(default)]
    pub arrival_ms: f64,
}

/// The seed 000 study's workload: a long document and two interactive requests, run under fifo,
/// interleave and interleave with 64-token chunks. The transformers references were made on it,
/// and the scheduler study starts from it.
pub struct SeedWorkload {
    pub jobs: Vec<JobSpec>,
    pub runs: Vec<RunConfig>,
}

pub fn seed_workload() -> SeedWorkload {
    const LONG_SENTENCE: &str = "Source files define functions and their dependencies. ";
    let job = |id: &str, prompt: String, cap| JobSpec { id: id.into(), prompt, max_new_tokens: cap, arrival_ms: 0.0 };
    let run =
        |policy, chunk_size| RunConfig { policy, chunk_size, max_active: 2, kv_budget: None, prefix_cache: false };
    SeedWorkload {
        jobs: vec![
            job("long-document", format!("{} Summarize the use of caching.", LONG_SENTENCE.repeat(24)), 16),
            job("interactive-a", "Explain cache invalidation in one sentence.".into(), 8),
            job("interactive-b", "Name one reason to bound a request queue.".into(), 8),
        ],
        runs: vec![run(Policy::Fifo, None), run(Policy::Interleave, None), run(Policy::Interleave, Some(64))],
    }
}

/// The first `tokens` ids of one chat message holding the seed's prompts, joined and repeated
/// until long enough: a long prompt of any length (`engine-bench`'s, and the long-prompt
/// transformers reference's, which `scripts/transformers_reference.py --long` builds the same
/// way). Cut where the length says: a prefill's work does not depend on where its text ends.
pub fn long_prompt(model: &LoadedModel, tokens: usize) -> Result<Vec<u32>, crate::load::LoadError> {
    let mut text = seed_workload().jobs.iter().map(|j| j.prompt.as_str()).collect::<Vec<_>>().join("\n\n");
    loop {
        let (_, ids) = model.encode_user_prompt(&text)?;
        if ids.len() >= tokens {
            return Ok(ids[..tokens].to_vec());
        }
        text = format!("{text}\n\n{text}");
    }
}

/// One policy configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub policy: Policy,
    /// Largest prefill chunk in tokens (for `batched`: the step's token budget, decodes
    /// included); `None`: whole prompts in one step.
    pub chunk_size: Option<usize>,
    pub max_active: usize,
    /// The KV cache's budget in positions (whole blocks of [`crate::kernel::TILE`], rounded
    /// down), shared by every job: admission waits for blocks, and a step that needs more than
    /// are free preempts the most recently admitted jobs. `None`: room for every job's whole
    /// length at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_budget: Option<usize>,
    /// Whether the KV pool keeps full blocks for later prompts with the same prefix
    /// ([`crate::prefix`]): a job then prefills only past its longest cached prefix.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefix_cache: bool,
}

/// One job's part of one step on the timeline. Times are milliseconds from the scheduler's
/// start, to the microsecond. A batched step appears once per job in it, all with the same
/// times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimelineStep {
    pub job: String,
    pub kind: StepKind,
    /// Input tokens processed.
    pub tokens: usize,
    /// Position of the first of them in the job's sequence.
    pub position: usize,
    pub start_ms: f64,
    pub end_ms: f64,
    /// The token this step produced, if any.
    pub token: Option<u32>,
    /// Jobs in the forward this step ran in (1 for the serial policies).
    #[serde(default = "one")]
    pub batch: usize,
    /// Positions taken from the prefix cache just before this step (its `position` first ones;
    /// only on a job's first prefill step, or its first after a preemption).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reused: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn one() -> usize {
    1
}

/// Per-request results, all derived from the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestMetrics {
    pub id: String,
    pub output_ids: Vec<u32>,
    /// From the scheduler's start to the end of the step that produced the first token.
    pub ttft_ms: f64,
    /// From the scheduler's start to the end of the step that produced the last token.
    pub completion_ms: f64,
    /// Largest gap between two consecutive tokens (0 with a single token; TTFT is not a gap).
    pub max_gap_ms: f64,
}

/// Milliseconds rounded to the microsecond, the resolution of every recorded time.
pub fn round_ms(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// `tokens` generated over `elapsed_ms`, per second, to the thousandth (0 for no time): a run's
/// throughput as the experiments record it and their audits recompute it.
pub fn tokens_per_s(tokens: usize, elapsed_ms: f64) -> f64 {
    if elapsed_ms > 0.0 {
        (tokens as f64 / elapsed_ms * 1e6).round() / 1000.0
    } else {
        0.0
    }
}

fn since(start: Instant, at: Instant) -> f64 {
    round_ms(at.duration_since(start).as_nanos() as f64 / 1e6)
}

/// Per-request metrics from a timeline, sorted by job id (the seed's order). Jobs without a
/// token on the timeline are left out.
pub fn request_metrics(timeline: &[TimelineStep]) -> Vec<RequestMetrics> {
    let mut by_job: std::collections::BTreeMap<&str, Vec<(f64, u32)>> = Default::default();
    for step in timeline {
        if let Some(t) = step.token {
            by_job.entry(step.job.as_str()).or_default().push((step.end_ms, t));
        }
    }
    by_job
        .into_iter()
        .map(|(id, tokens)| {
            let max_gap = tokens.windows(2).map(|w| round_ms(w[1].0 - w[0].0)).fold(0.0, f64::max);
            RequestMetrics {
                id: id.to_string(),
                output_ids: tokens.iter().map(|t| t.1).collect(),
                ttft_ms: tokens[0].0,
                completion_ms: tokens[tokens.len() - 1].0,
                max_gap_ms: max_gap,
            }
        })
        .collect()
}

/// How one job ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub job: String,
    pub reason: FinishReason,
    /// Bytes of the KV cache blocks its filled positions take at its end.
    pub kv_cache_bytes: usize,
    /// How often it was preempted.
    pub preemptions: usize,
}

/// The outcome of one scheduler run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub timeline: Vec<TimelineStep>,
    /// Each job's end: why it finished and the bytes of its KV cache.
    pub finish: Vec<Finished>,
    /// Wall time of the run: end of its last step.
    pub elapsed_ms: f64,
    /// Time spent outside forward passes (choosing, bookkeeping), summed over steps.
    pub overhead_ms: f64,
    /// The process's peak resident memory during the run (Linux; `None` elsewhere).
    pub peak_rss_bytes: Option<u64>,
    /// The most bytes the jobs' KV caches held at once, and the pool's size (its budget).
    pub peak_kv_bytes: usize,
    pub kv_pool_bytes: usize,
}

/// Resets the kernel's resident-memory high-water mark, so the next reading covers what follows
/// (Linux; elsewhere nothing happens and readings cover the whole process).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The resident-memory high-water mark (`VmHWM`), in bytes.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Runs `jobs` (in arrival order) to completion under `config`: each job is admitted once it
/// has arrived and a slot is free, and the shared stepping loop ([`Stepper`]) steps it.
pub fn run(model: &LoadedModel, jobs: &[Job], config: RunConfig) -> Result<RunOutcome, EngineError> {
    let tile = KvPool::BLOCK_POSITIONS;
    let whole = |j: &Job| KvPool::blocks_for(j.prompt_ids.len() + j.max_new_tokens);
    let blocks = match config.kv_budget {
        Some(budget) => {
            let blocks = KvPool::blocks_within(budget);
            if let Some(job) = jobs.iter().find(|j| whole(j) > blocks) {
                let needs = whole(job);
                return Err(BudgetError { budget, blocks, tile, job: job.id.clone(), needs }.into());
            }
            blocks
        }
        None => jobs.iter().map(whole).sum(),
    };
    let pool = model.model.kv_pool(blocks, config.prefix_cache)?;
    let mut order: Vec<&Job> = jobs.iter().collect();
    order.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    let mut pending = order.into_iter().peekable();
    let mut stepper: Stepper<&Job> =
        Stepper::new(config.policy, config.chunk_size, config.max_active).with_pool(pool.clone());
    let mut timeline = Vec::new();
    let mut finish = Vec::new();
    let mut in_forward = Duration::ZERO;
    reset_peak_rss();
    let start = Instant::now();

    loop {
        let now_ms = since(start, Instant::now());
        // Admitted in arrival order, each once it has arrived and its prompt's blocks are free.
        while stepper.has_room() {
            let Some(&job) = pending.peek().filter(|j| j.arrival_ms <= now_ms) else { break };
            let session = Session::in_pool(model, &pool, job.prompt_ids.clone(), job.max_new_tokens)?
                .with_sampling(job.sampling)?;
            if !stepper.fits(&session) {
                break;
            }
            pending.next();
            stepper.admit(job, session);
        }
        if stepper.is_empty() {
            match pending.peek() {
                Some(next) => {
                    let wait = (next.arrival_ms - now_ms).max(0.0) / 1000.0;
                    std::thread::sleep(supply::manifest::seconds(&format!("job `{}` arrival_ms", next.id), wait)?);
                    continue;
                }
                None => break,
            }
        }
        let stepped = stepper.step(|job, _, outcome, times| {
            timeline.push(TimelineStep {
                job: job.id.clone(),
                kind: outcome.kind,
                tokens: outcome.tokens,
                position: outcome.position,
                start_ms: since(start, times.started),
                end_ms: since(start, times.ended),
                token: outcome.token,
                batch: times.batch,
                reused: outcome.reused,
            })
        });
        if let Some((_, _, error)) = stepped.failed.into_iter().next() {
            return Err(error);
        }
        in_forward += stepped.times.ended - stepped.times.started;
        for (job, session) in stepped.finished {
            let reason = session.finish_reason().expect("a retired session has finished");
            let (kv_cache_bytes, preemptions) = (session.kv_filled_bytes(), session.preemptions());
            finish.push(Finished { job: job.id.clone(), reason, kv_cache_bytes, preemptions });
        }
    }
    let total = start.elapsed();
    let elapsed_ms = timeline.last().map(|s| s.end_ms).unwrap_or(0.0);
    Ok(RunOutcome {
        timeline,
        finish,
        elapsed_ms,
        overhead_ms: round_ms((total - in_forward.min(total)).as_nanos() as f64 / 1e6),
        peak_rss_bytes: peak_rss(),
        peak_kv_bytes: pool.peak_bytes(),
        kv_pool_bytes: pool.blocks() * pool.block_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(job: &str, end: f64, token: Option<u32>) -> TimelineStep {
        TimelineStep {
            job: job.into(),
            kind: StepKind::Decode,
            tokens: 1,
            position: 0,
            start_ms: end - 1.0,
            end_ms: end,
            token,
            batch: 1,
            reused: 0,
        }
    }

    #[test]
    fn metrics_follow_from_the_timeline() {
        let t = vec![
            step("b", 10.0, None),
            step("b", 20.5, Some(7)),
            step("a", 30.0, Some(1)),
            step("b", 40.25, Some(8)),
            step("b", 41.0, Some(9)),
        ];
        let m = request_metrics(&t);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].id.as_str(), m[0].ttft_ms, m[0].completion_ms, m[0].max_gap_ms), ("a", 30.0, 30.0, 0.0));
        assert_eq!(m[1].output_ids, vec![7, 8, 9]);
        assert_eq!((m[1].ttft_ms, m[1].completion_ms, m[1].max_gap_ms), (20.5, 41.0, 19.75));
    }

    #[test]
    fn rounding_is_to_the_microsecond() {
        assert_eq!(round_ms(1.23456789), 1.235);
        assert_eq!(round_ms(28.159000000000006), 28.159);
    }
}
