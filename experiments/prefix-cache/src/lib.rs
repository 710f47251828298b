//! `prefix-cache`: what reusing cached prompt prefixes saves (time to first token, prefill work,
//! throughput) over prefix length, the share of requests that share one, and the KV budget; and
//! that it changes no id. The binary (`main.rs`) runs it; this library is what the tools know of
//! it: [`PrefixCache`]'s [`Experiment`].
//!
//! A point is a workload of `requests` jobs, each a prefix of `prefix` tokens and a question of
//! its own; a `share` of them (rounded up, at least one, spread evenly from the first job on)
//! start with one shared prefix, the rest with prefixes of their own, so that under a small KV
//! budget the others' prefixes push the shared one out. Its jobs all arrive at once and run one at a time
//! (fifo), so each one's time to first token is its own prefill, not a wait. Every round runs
//! each point twice through the scheduler's stepping loop, reuse off and on, in alternating
//! order; every run starts with an empty cache, so the first sharing job computes the prefix and
//! the others find it.

use common::chart::{cell, Chart, Lines, Section};
use common::evidence::{ClaimResult, Observation};
use common::experiment::{read_as, Experiment, ExperimentError, Flags, ReportOptions};
use common::finding::Findings;
use common::manifest::Invalid;
use common::provenance::Provenance;
use common::qwen::KvPool;
use common::schedule::TimelineStep;
use common::session::StepKind;
use common::stats::{summarize, Summary};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The longest prompt a point may give (prefix and question), in tokens.
pub const MAX_TOKENS: usize = 1 << 16;

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    /// Prefix lengths in tokens, one point each.
    pub prefix_tokens: Vec<usize>,
    /// Shares of the requests that start with the shared prefix (0 < share <= 1), one point each.
    pub shares: Vec<f64>,
    /// KV budgets in positions (whole blocks of 64), one point each; `null`: room for every job.
    pub kv_budgets: Vec<Option<usize>>,
    /// Jobs per point.
    pub requests: usize,
    /// Each job's question after its prefix, in tokens.
    pub question_tokens: usize,
    pub max_new_tokens: usize,
    /// Measured rounds; each runs every point with reuse off and on.
    pub rounds: usize,
    /// Draws the prompts' ids.
    pub seed: u64,
}

/// A point's name: `p1024-s0.5`, with `-kv4096` under a KV budget.
pub fn point_label(prefix: usize, share: f64, kv_budget: Option<usize>) -> String {
    let mut label = format!("p{prefix}-s{share}");
    if let Some(b) = kv_budget {
        let _ = write!(label, "-kv{b}");
    }
    label
}

/// A run's name in claims: its point, then `-on` or `-off`.
pub fn run_label(point: &str, reuse: bool) -> String {
    format!("{point}-{}", if reuse { "on" } else { "off" })
}

impl Parameters {
    /// Every point: prefix, share and budget, in the order the lists give them.
    pub fn points(&self) -> Vec<(usize, f64, Option<usize>)> {
        let mut points = Vec::new();
        for &p in &self.prefix_tokens {
            for &s in &self.shares {
                for &b in &self.kv_budgets {
                    points.push((p, s, b));
                }
            }
        }
        points
    }

    /// Which jobs start with the shared prefix: a `share` of them, rounded up, spread evenly
    /// from the first on (job `j` shares when `ceil((j + 1) * share)` passes `ceil(j * share)`).
    pub fn sharing(&self, share: f64) -> Vec<bool> {
        let up = |j: usize| (j as f64 * share).ceil() as usize;
        (0..self.requests).map(|j| up(j + 1) > up(j)).collect()
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        let tile = KvPool::BLOCK_POSITIONS;
        let bad = |field: &str, message: String| Err(Invalid::new(format!("parameters.{field}"), message));
        for (name, len) in [("prefix_tokens", self.prefix_tokens.len()), ("shares", self.shares.len())] {
            if len == 0 {
                return bad(name, "empty; give at least one".into());
            }
        }
        if self.kv_budgets.is_empty() {
            return bad("kv_budgets", "empty; give at least one (null: room for every job)".into());
        }
        if let Some(i) = self.prefix_tokens.iter().position(|&p| p == 0 || p > MAX_TOKENS) {
            return bad(
                &format!("prefix_tokens[{i}]"),
                format!("{} is not in 1..={MAX_TOKENS}", self.prefix_tokens[i]),
            );
        }
        if let Some(i) = self.shares.iter().position(|s| !(s.is_finite() && *s > 0.0 && *s <= 1.0)) {
            return bad(&format!("shares[{i}]"), format!("{} is not a share above 0 and at most 1", self.shares[i]));
        }
        if !(1..=1000).contains(&self.requests) {
            return bad("requests", format!("{} is not in 1..=1000", self.requests));
        }
        if !(1..=MAX_TOKENS).contains(&self.question_tokens) || !(1..=MAX_TOKENS).contains(&self.max_new_tokens) {
            return bad("question_tokens", format!("question_tokens and max_new_tokens must be in 1..={MAX_TOKENS}"));
        }
        if !(1..=1000).contains(&self.rounds) {
            return bad("rounds", format!("{} is not in 1..=1000", self.rounds));
        }
        let longest =
            self.prefix_tokens.iter().max().copied().unwrap_or(0) + self.question_tokens + self.max_new_tokens;
        let needs = KvPool::blocks_for(longest) * tile;
        if let Some(i) = self.kv_budgets.iter().position(|b| b.is_some_and(|b| b < needs || b > 1 << 40)) {
            return bad(
                &format!("kv_budgets[{i}]"),
                format!(
                    "{:?}: must hold the longest job's {needs} positions (whole blocks of {tile}) and at most 2^40",
                    self.kv_budgets[i]
                ),
            );
        }
        Ok(())
    }
}

/// The manifest's `expectations`: each point's ids (reuse off, which must equal reuse on), as
/// `just pin` fixes them.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    pub output_ids: Option<BTreeMap<String, BTreeMap<String, Vec<u32>>>>,
}

/// One job of one run, derived from its timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestRecord {
    pub id: String,
    /// Whether its prompt starts with the point's shared prefix.
    pub shared: bool,
    pub prompt_tokens: usize,
    /// From its first step's start to the end of the step that gave its first token: its own
    /// prefill, without the wait for the jobs before it.
    pub ttft_ms: f64,
    /// Prompt positions it computed, and those it found cached.
    pub prefill_tokens: usize,
    pub reused_tokens: usize,
    pub output_ids: Vec<u32>,
}

/// One run: a point, with reuse off or on, in one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    pub point: String,
    pub prefix_tokens: usize,
    pub share: f64,
    pub kv_budget: Option<usize>,
    pub reuse: bool,
    pub round: usize,
    pub elapsed_ms: f64,
    pub output_tokens_per_s: f64,
    /// Median TTFT of the sharing jobs after the first: with reuse, prompts found cached whole
    /// (but the tail of their last block).
    pub cached_ttft_ms: Option<f64>,
    pub prefill_tokens: usize,
    pub reused_tokens: usize,
    pub peak_kv_bytes: usize,
    pub kv_pool_bytes: usize,
    pub requests: Vec<RequestRecord>,
    pub timeline: Vec<TimelineStep>,
}

/// Spread over rounds of one point with reuse off or on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummaryRow {
    pub point: String,
    pub reuse: bool,
    pub cached_ttft_ms: Summary,
    pub output_tokens_per_s: Summary,
    pub prefill_tokens: usize,
    pub reused_tokens: usize,
}

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub run_id: String,
    pub model_id: String,
    pub parameters: Parameters,
    /// The jobs' prompts, per point (token ids; the shared prefix is each sharing job's start).
    pub prompts: BTreeMap<String, Vec<Vec<u32>>>,
    pub runs: Vec<RunRecord>,
    pub summary: Vec<SummaryRow>,
    /// Whether every run with reuse gave every job the ids it got without, in the same round.
    pub output_ids_identical: bool,
    /// The model's vocabulary (the prompts' ids are drawn below it) and the bytes of one KV
    /// block: what the audit redraws the prompts and sizes the pools with.
    pub vocab_size: usize,
    pub block_bytes: usize,
    #[serde(default)]
    pub claims: Vec<ClaimResult>,
    pub provenance: Provenance,
}

/// Each point's prompts, ids below `vocab` drawn from the seed: the sharing jobs' common prefix,
/// the others' own prefixes, and every job's question. The run and the audit draw them alike.
pub fn draw_prompts(p: &Parameters, vocab: usize) -> BTreeMap<String, Vec<Vec<u32>>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(p.seed);
    let vocab = vocab.clamp(1, u32::MAX as usize) as u32;
    let mut draw = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..vocab)).collect() };
    let mut prompts = BTreeMap::new();
    for (prefix, share, kv_budget) in p.points() {
        let shared = draw(prefix);
        let jobs = p
            .sharing(share)
            .into_iter()
            .map(|shares| {
                let mut ids = if shares { shared.clone() } else { draw(prefix) };
                ids.extend(draw(p.question_tokens));
                ids
            })
            .collect();
        prompts.insert(point_label(prefix, share, kv_budget), jobs);
    }
    prompts
}

/// What is wrong with a run's timeline, if anything: the jobs one at a time in order (fifo, one
/// active), each a prefill of its prompt past what it reused (reuse only in a run with it) that
/// gives its first token, then one decode step per token, each in a forward
/// of its own, none overlapping.
pub fn timeline_problem(run: &RunRecord, prompts: &[Vec<u32>], max_new_tokens: usize) -> Option<String> {
    let mut job = 0;
    let mut k = 0;
    let mut last_end = 0.0;
    for (i, s) in run.timeline.iter().enumerate() {
        if s.job != job_id(job) {
            if k > 0 && s.job == job_id(job + 1) {
                (job, k) = (job + 1, 0);
            } else {
                return Some(format!("step {i}: job `{}` out of fifo order", s.job));
            }
        }
        let prompt = prompts.get(job).map_or(0, Vec::len);
        let honest = if k == 0 {
            s.kind == StepKind::Prefill
                && (s.reused == 0 || run.reuse)
                && s.position == s.reused
                && s.reused.checked_add(s.tokens) == Some(prompt)
        } else {
            s.kind == StepKind::Decode && s.reused == 0 && s.tokens == 1 && s.position == prompt + k - 1
        };
        if !honest || s.batch != 1 || s.token.is_none() || s.start_ms < last_end || s.end_ms < s.start_ms {
            return Some(format!("step {i} (job `{}`): not the step fifo gives it there", s.job));
        }
        if k >= max_new_tokens {
            return Some(format!("step {i}: job `{}` past its cap", s.job));
        }
        last_end = s.end_ms;
        k += 1;
    }
    if job + 1 != prompts.len() || k == 0 {
        return Some(format!("{} of {} jobs ran", if k == 0 { job } else { job + 1 }, prompts.len()));
    }
    (run.timeline.last().map(|s| s.end_ms) != Some(run.elapsed_ms))
        .then(|| "elapsed_ms is not its last step's end".into())
}

/// Per-job records from a run's timeline (in `prompts`' order, ids `job-0`, `job-1`, ...).
pub fn requests_of(timeline: &[TimelineStep], prompts: &[Vec<u32>], sharing: &[bool]) -> Vec<RequestRecord> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let id = job_id(i);
            let steps: Vec<&TimelineStep> = timeline.iter().filter(|s| s.job == id).collect();
            let start = steps.first().map_or(0.0, |s| s.start_ms);
            let first = steps.iter().find(|s| s.token.is_some()).map_or(start, |s| s.end_ms);
            RequestRecord {
                id,
                shared: sharing.get(i).copied().unwrap_or(false),
                prompt_tokens: prompt.len(),
                ttft_ms: common::schedule::round_ms(first - start),
                prefill_tokens: steps.iter().filter(|s| s.kind == StepKind::Prefill).map(|s| s.tokens).sum(),
                reused_tokens: steps.iter().map(|s| s.reused).sum(),
                output_ids: steps.iter().filter_map(|s| s.token).collect(),
            }
        })
        .collect()
}

pub fn job_id(i: usize) -> String {
    format!("job-{i}")
}

/// The median TTFT of the sharing jobs after the first.
pub fn cached_ttft(requests: &[RequestRecord]) -> Option<f64> {
    let ttfts: Vec<f64> = requests.iter().filter(|r| r.shared).skip(1).map(|r| r.ttft_ms).collect();
    summarize(&ttfts).p50
}

/// Generated tokens per second of wall time, to the thousandth.
pub fn tokens_per_s(requests: &[RequestRecord], elapsed_ms: f64) -> f64 {
    common::schedule::tokens_per_s(requests.iter().map(|r| r.output_ids.len()).sum(), elapsed_ms)
}

/// Per point and reuse: the spread over rounds.
pub fn summarize_runs(runs: &[RunRecord]) -> Vec<SummaryRow> {
    let mut keys: Vec<(String, bool)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.point.clone(), r.reuse)) {
            keys.push((r.point.clone(), r.reuse));
        }
    }
    keys.into_iter()
        .map(|(point, reuse)| {
            let of: Vec<&RunRecord> = runs.iter().filter(|r| r.point == point && r.reuse == reuse).collect();
            let ttft: Vec<f64> = of.iter().filter_map(|r| r.cached_ttft_ms).collect();
            let tps: Vec<f64> = of.iter().map(|r| r.output_tokens_per_s).collect();
            SummaryRow {
                point,
                reuse,
                cached_ttft_ms: summarize(&ttft),
                output_tokens_per_s: summarize(&tps),
                prefill_tokens: of.first().map_or(0, |r| r.prefill_tokens),
                reused_tokens: of.first().map_or(0, |r| r.reused_tokens),
            }
        })
        .collect()
}

/// Whether every reuse-on run gave each job the ids of the reuse-off run of its point and round.
pub fn ids_identical(runs: &[RunRecord]) -> bool {
    runs.iter().filter(|r| r.reuse).all(|on| {
        runs.iter().find(|off| !off.reuse && off.point == on.point && off.round == on.round).is_some_and(|off| {
            off.requests.iter().zip(&on.requests).all(|(a, b)| a.output_ids == b.output_ids)
                && off.requests.len() == on.requests.len()
        })
    })
}

const RUN_METRICS: [&str; 4] = ["cached_ttft_ms", "prefill_tokens", "output_tokens_per_s", "elapsed_ms"];

pub struct PrefixCache;

impl Experiment for PrefixCache {
    const NAME: &'static str = "prefix-cache";
    type Parameters = Parameters;
    type Expectations = Expectations;
    type Artifact = Artifact;
    type Args = Flags<Parameters>;

    fn validate(&self, parameters: &Parameters) -> Result<(), Invalid> {
        parameters.validate()
    }

    fn rederive(&self, a: &mut Artifact) {
        for run in &mut a.runs {
            let Some(prompts) = a.prompts.get(&run.point) else { continue };
            run.requests = requests_of(&run.timeline, prompts, &a.parameters.sharing(run.share));
            run.cached_ttft_ms = cached_ttft(&run.requests);
            run.output_tokens_per_s = tokens_per_s(&run.requests, run.elapsed_ms);
            run.prefill_tokens = run.requests.iter().map(|r| r.prefill_tokens).sum();
            run.reused_tokens = run.requests.iter().map(|r| r.reused_tokens).sum();
        }
        a.summary = summarize_runs(&a.runs);
        a.output_ids_identical = ids_identical(&a.runs);
    }

    fn audit(&self, a: &Artifact, expectations: Option<&Expectations>, f: &mut Findings) {
        let p = &a.parameters;
        let points: Vec<String> = p.points().into_iter().map(|(pr, s, b)| point_label(pr, s, b)).collect();
        if a.runs.len() != points.len() * 2 * p.rounds {
            f.wrong(
                "invariants",
                "runs",
                format!(
                    "{} runs, but the parameters give {} points, off and on, over {} rounds",
                    a.runs.len(),
                    points.len(),
                    p.rounds
                ),
            );
        }
        for (i, run) in a.runs.iter().enumerate() {
            let at = |field: &str| format!("runs[{i}].{field}");
            let Some((prefix, share, budget)) =
                p.points().into_iter().find(|&(pr, s, b)| point_label(pr, s, b) == run.point)
            else {
                f.wrong("invariants", at("point"), format!("`{}` is no point of the parameters", run.point));
                continue;
            };
            if (run.prefix_tokens, run.share, run.kv_budget) != (prefix, share, budget) {
                f.wrong("invariants", at("point"), "its prefix, share and budget are not its point's");
            }
            if !run.reuse && run.reused_tokens > 0 {
                f.wrong("invariants", at("reused_tokens"), "reused positions in a run without reuse");
            }
            if run.peak_kv_bytes > run.kv_pool_bytes {
                f.wrong("invariants", at("peak_kv_bytes"), "over the pool, its budget");
            }
            let Some(prompts) = a.prompts.get(&run.point) else {
                f.wrong("invariants", "prompts", format!("no prompts for point `{}`", run.point));
                continue;
            };
            let sharing = p.sharing(share);
            let shaped = prompts.len() == p.requests && prompts.iter().all(|q| q.len() == prefix + p.question_tokens);
            if !shaped || prompts.iter().zip(&sharing).any(|(q, &shares)| shares && q[..prefix] != prompts[0][..prefix])
            {
                f.wrong("invariants", "prompts", format!("point `{}`: not {} prompts of {prefix} + {} tokens, those the share picks sharing their prefix", run.point, p.requests, p.question_tokens));
            }
            // Every job: its reuse (before its last prompt token), then its prefill of the
            // rest, then its tokens; none beyond its cap.
            for r in &run.requests {
                let complete = r.reused_tokens < r.prompt_tokens
                    && r.reused_tokens.checked_add(r.prefill_tokens) == Some(r.prompt_tokens)
                    && !r.output_ids.is_empty()
                    && r.output_ids.len() <= p.max_new_tokens;
                if !complete {
                    f.wrong(
                        "invariants",
                        at(&format!("requests.{}", r.id)),
                        "its reused and prefilled positions are not its prompt, or its tokens are none or past the cap",
                    );
                }
            }
            if run.timeline.iter().any(|s| s.end_ms < s.start_ms || s.end_ms > run.elapsed_ms) {
                f.wrong("invariants", at("timeline"), "a step that ends before it starts, or after the run");
            }
        }
        let mut seen: Vec<(&str, bool, usize)> = Vec::new();
        for (i, run) in a.runs.iter().enumerate() {
            let key = (run.point.as_str(), run.reuse, run.round);
            if run.round >= p.rounds || seen.contains(&key) {
                f.wrong(
                    "invariants",
                    format!("runs[{i}].round"),
                    "past the rounds, or a second run of its point, reuse and round",
                );
            }
            seen.push(key);
            let Some(prompts) = a.prompts.get(&run.point) else { continue };
            if let Some(problem) = timeline_problem(run, prompts, p.max_new_tokens) {
                f.wrong("invariants", format!("runs[{i}].timeline"), problem);
            }
            // The pool: its budget in whole blocks, or every job whole.
            let blocks = match run.kv_budget {
                Some(b) => KvPool::blocks_within(b),
                None => prompts
                    .iter()
                    .map(|q| KvPool::blocks_for(q.len().saturating_add(p.max_new_tokens)))
                    .fold(0, usize::saturating_add),
            };
            if blocks.checked_mul(a.block_bytes) != Some(run.kv_pool_bytes)
                || a.block_bytes == 0
                || !run.peak_kv_bytes.is_multiple_of(a.block_bytes)
            {
                f.wrong(
                    "invariants",
                    format!("runs[{i}].kv_pool_bytes"),
                    format!("the pool is not {blocks} blocks of {} bytes, or its peak not whole blocks", a.block_bytes),
                );
            }
        }
        if draw_prompts(p, a.vocab_size) != a.prompts {
            f.wrong(
                "invariants",
                "prompts",
                format!("not the prompts the seed {} draws below vocab_size {}", p.seed, a.vocab_size),
            );
        }
        if !a.output_ids_identical {
            f.wrong("invariants", "output_ids_identical", "false: reuse changed some job's ids");
        }
        if let Some(pinned) = expectations.and_then(|e| e.output_ids.as_ref()) {
            for run in a.runs.iter().filter(|r| r.round == 0 && !r.reuse) {
                let ids: BTreeMap<String, Vec<u32>> =
                    run.requests.iter().map(|r| (r.id.clone(), r.output_ids.clone())).collect();
                if pinned.get(&run.point).is_some_and(|want| *want != ids) {
                    f.wrong("expectations", format!("output_ids.{}", run.point), "not the ids the manifest pins");
                }
            }
        }
    }

    fn pin(&self, a: &Artifact, _: Option<&Expectations>) -> Result<Option<Expectations>, ExperimentError> {
        let ids = a
            .runs
            .iter()
            .filter(|r| r.round == 0 && !r.reuse)
            .map(|r| (r.point.clone(), r.requests.iter().map(|q| (q.id.clone(), q.output_ids.clone())).collect()))
            .collect();
        Ok(Some(Expectations { output_ids: Some(ids) }))
    }

    fn claim_vocabulary(&self, p: &Parameters) -> common::claim::Vocabulary {
        let runs = p
            .points()
            .into_iter()
            .flat_map(|(pr, s, b)| [false, true].map(|reuse| run_label(&point_label(pr, s, b), reuse)))
            .collect();
        common::claim::Vocabulary {
            run_metrics: RUN_METRICS.iter().map(|m| m.to_string()).collect(),
            request_metrics: vec!["ttft_ms".into()],
            runs,
            requests: (0..p.requests).map(job_id).collect(),
        }
    }

    fn observations(&self, artifact: &Value) -> Vec<Observation> {
        let Ok(runs) = serde_json::from_value::<Vec<RunRecord>>(artifact.get("runs").cloned().unwrap_or_default())
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for run in &runs {
            let label = run_label(&run.point, run.reuse);
            let obs = |request: Option<String>, metric: &str, value: f64| Observation {
                scope: None,
                run: label.clone(),
                request,
                metric: metric.to_string(),
                round: run.round,
                value,
            };
            if let Some(t) = run.cached_ttft_ms {
                out.push(obs(None, "cached_ttft_ms", t));
            }
            out.push(obs(None, "prefill_tokens", run.prefill_tokens as f64));
            out.push(obs(None, "output_tokens_per_s", run.output_tokens_per_s));
            out.push(obs(None, "elapsed_ms", run.elapsed_ms));
            for r in &run.requests {
                out.push(obs(Some(r.id.clone()), "ttft_ms", r.ttft_ms));
            }
        }
        out
    }

    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        _options: &ReportOptions,
    ) -> Result<Section, ExperimentError> {
        let a: Artifact = read_as(title, artifact)?;
        let p = &a.parameters;
        let mut section = Section::new(dir);
        let mut md = format!(
            "## Prefix cache: {title}\n\nModel `{}`, {} jobs per point, {} rounds, medians over rounds. Cached TTFT: the \
             median time to first token of the jobs that find the shared prefix (all but the first sharing job). \
             Reuse changed no id: {}.\n\n| point | TTFT off ms | TTFT on ms | on / off | prefill tokens off | on | tok/s off | on |\n|---|---|---|---|---|---|---|---|\n",
            a.model_id, p.requests, p.rounds, a.output_ids_identical
        );
        let row = |point: &str, reuse: bool| a.summary.iter().find(|r| r.point == point && r.reuse == reuse);
        for (pr, s, b) in p.points() {
            let point = point_label(pr, s, b);
            let (off, on) = (row(&point, false), row(&point, true));
            let ttft = |r: Option<&SummaryRow>| r.and_then(|r| r.cached_ttft_ms.p50);
            let ratio = ttft(on).zip(ttft(off)).filter(|(_, off)| *off > 0.0).map(|(on, off)| on / off);
            let _ = writeln!(
                md,
                "| {point} | {} | {} | {} | {} | {} | {} | {} |",
                cell(ttft(off), 2),
                cell(ttft(on), 2),
                cell(ratio, 3),
                off.map_or(0, |r| r.prefill_tokens),
                on.map_or(0, |r| r.prefill_tokens),
                cell(off.and_then(|r| r.output_tokens_per_s.p50), 1),
                cell(on.and_then(|r| r.output_tokens_per_s.p50), 1),
            );
        }
        md.push('\n');
        section.markdown = md;
        // Cached TTFT against prefix length, reuse off and on, per share and budget.
        let mut lines = Vec::new();
        for &s in &p.shares {
            for &b in &p.kv_budgets {
                for reuse in [false, true] {
                    let pts = p
                        .prefix_tokens
                        .iter()
                        .filter_map(|&pr| {
                            row(&point_label(pr, s, b), reuse)?.cached_ttft_ms.p50.map(|t| (pr as f64, t))
                        })
                        .collect();
                    let budget = b.map_or(String::new(), |b| format!(" kv{b}"));
                    lines.push((format!("share {s}{budget} {}", if reuse { "on" } else { "off" }), pts));
                }
            }
        }
        let chart_title = "cached prompts' time to first token against prefix length";
        let chart = Lines {
            title: chart_title.into(),
            x_label: "prefix (tokens)".into(),
            y_label: "milliseconds".into(),
            lines,
        };
        section.image("ttft", chart_title, Chart::Lines(chart));
        Ok(section)
    }
}

#[cfg(test)]
mod tests;
