//! A run's invariants: every per-request number recomputed from its timeline, and the timeline
//! held to how the engine steps (what the audit and the binary both check).

use super::{output_tokens_per_s, JobRecord, RequestRecord, RunRecord};
use common::manifest::Invalid;
use common::policy::Policy;
use common::schedule::request_metrics;
use common::session::{FinishReason, StepKind};
use std::collections::BTreeMap;

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
