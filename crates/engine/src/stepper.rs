//! The one stepping loop that the scheduler and the embedded server share: the set of active
//! requests, each with its session and whatever its driver keeps beside it.
//!
//! The driver admits requests while there is room (from a job list by arrival time, or from a
//! queue of clients), then asks for a step: the policy plans which requests advance and how much
//! prompt each prefills, [`step_batch`] advances them in one forward, the driver sees each
//! stepped request's outcome, and finished requests retire and are handed back. A request that
//! joins while others decode takes part in the very next step.
//!
//! With a shared KV pool ([`Stepper::with_pool`]) the loop also keeps the memory budget: a
//! request is admitted only when the pool has the blocks for its first step ([`Stepper::fits`],
//! as vLLM admits by the blocks of the tokens it schedules), and when a step needs more blocks
//! than are free, the most recently
//! admitted requests are preempted (their blocks given back, as vLLM does by recompute) until it
//! fits; they wait, ahead of new requests, and resume with a prefill of their history when blocks
//! are free again. Each preemption reaches the driver as a step of kind `Preempt`.
//!
//! A step that fails (an engine error, or a panic inside the forward) fails only the requests
//! that cause it: when a batched step fails, each of its requests is stepped again alone from
//! where it was (the failed forward's partial cache writes are forgotten, and a row computes the
//! same alone as in company), those that fail alone are handed back with the reason, and the
//! others go on as if the step had succeeded.

use crate::policy::{Candidate, Policy};
use crate::qwen::KvPool;
use crate::session::{step_batch, EngineError, Session, StepOutcome};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

/// A test seam: called inside every step, before the forward, with the sessions the step
/// advances. Tests use it to slow a step to a known time or to make one fail, which real input
/// cannot be made to do on demand.
pub type StepHook = Arc<dyn Fn(&[&Session]) + Send + Sync>;

/// When a step ran and how many requests it advanced.
#[derive(Debug, Clone, Copy)]
pub struct StepTimes {
    pub started: Instant,
    pub ended: Instant,
    pub batch: usize,
}

/// What one step did beyond the per-request outcomes: its times, the requests that finished,
/// and those that failed (each with its reason), all removed from the loop.
pub struct Stepped<T> {
    pub times: StepTimes,
    pub finished: Vec<(T, Session)>,
    pub failed: Vec<(T, Session, EngineError)>,
}

/// The active requests and how they are stepped.
pub struct Stepper<T> {
    policy: Policy,
    chunk: Option<usize>,
    max_active: usize,
    /// In admission order.
    active: Vec<(T, Session)>,
    /// Preempted requests, oldest admission first: they resume before anything new is admitted.
    preempted: std::collections::VecDeque<(T, Session)>,
    /// The shared pool the sessions' caches take blocks from, when there is a budget to keep.
    pool: Option<Arc<KvPool>>,
    /// The round-robin cursor: the index of the request after the one stepped last.
    cursor: usize,
    hook: Option<StepHook>,
}

impl<T> Stepper<T> {
    /// Steps under `policy` with chunk size (for `batched`, the step's token budget) `chunk`,
    /// with at most `max_active` requests admitted (at least one).
    pub fn new(policy: Policy, chunk: Option<usize>, max_active: usize) -> Self {
        let max_active = max_active.max(1);
        Stepper {
            policy,
            chunk,
            max_active,
            active: Vec::with_capacity(max_active),
            preempted: Default::default(),
            pool: None,
            cursor: 0,
            hook: None,
        }
    }

    /// Keeps the budget of `pool`, which the admitted sessions' caches share
    /// ([`Session::in_pool`]).
    pub fn with_pool(mut self, pool: Arc<KvPool>) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Whether `session` may be admitted now as far as memory goes: no preempted request is
    /// waiting to resume, and the pool has the blocks for its first step.
    pub fn fits(&self, session: &Session) -> bool {
        match &self.pool {
            None => true,
            Some(pool) => self.preempted.is_empty() && session.blocks_needed(self.chunk) <= pool.free_blocks(),
        }
    }

    /// Whether `session` could ever finish under the budget: its whole length fits the pool.
    pub fn could_fit(&self, session: &Session) -> bool {
        self.pool.as_ref().is_none_or(|pool| session.blocks_at_most() <= pool.blocks())
    }

    /// Installs the test seam (see [`StepHook`]).
    pub fn with_hook(mut self, hook: Option<StepHook>) -> Self {
        self.hook = hook;
        self
    }

    /// Whether fewer than `max_active` requests are admitted (preempted ones count: they hold a
    /// place to resume in).
    pub fn has_room(&self) -> bool {
        self.active.len() + self.preempted.len() < self.max_active
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.preempted.is_empty()
    }

    /// Admits a request; it takes part in the next step its policy gives it. With no room (the
    /// driver checks [`Stepper::has_room`]) it still joins: the bound is the driver's to keep.
    /// Under a budget it takes at once the blocks for its first step (so no later admission
    /// takes them from it), or, when they are not free ([`Stepper::fits`]), waits among the
    /// preempted.
    pub fn admit(&mut self, tag: T, mut session: Session) {
        if self.pool.is_some() && !session.reserve_next(self.chunk) {
            self.preempted.push_back((tag, session));
            return;
        }
        self.active.push((tag, session));
    }

    /// Removes the requests that `keep` rejects (a client that left) and hands them back; the
    /// round-robin cursor keeps pointing at the same next request.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Vec<(T, Session)> {
        let gone: Vec<usize> = (0..self.active.len()).filter(|&i| !keep(&self.active[i].0)).collect();
        let mut removed = self.remove(&gone);
        let (stay, leave): (Vec<_>, Vec<_>) = self.preempted.drain(..).partition(|(tag, _)| keep(tag));
        self.preempted = stay.into();
        removed.extend(leave);
        removed
    }

    /// Makes room in the pool for the step that `plan` gives: resumes waiting requests that fit,
    /// then preempts the most recently admitted requests while the step needs more blocks than
    /// are free (each reported through `on_step` as a `Preempt` step). Returns the plan to run.
    fn plan_within_budget(
        &mut self,
        on_step: &mut impl FnMut(&mut T, &Session, &StepOutcome, &StepTimes),
    ) -> Vec<(usize, Option<usize>)> {
        let Some(pool) = self.pool.clone() else {
            let candidates: Vec<Candidate> = self.active.iter().map(|(_, s)| s.candidate()).collect();
            return self.policy.plan(&candidates, self.cursor, self.chunk);
        };
        while self.active.len() < self.max_active
            && self.preempted.front_mut().is_some_and(|(_, s)| s.reserve_next(self.chunk))
        {
            let resumed = self.preempted.pop_front().expect("a preempted request");
            self.active.push(resumed);
        }
        loop {
            if self.active.is_empty() {
                return Vec::new();
            }
            let candidates: Vec<Candidate> = self.active.iter().map(|(_, s)| s.candidate()).collect();
            let plan = self.policy.plan(&candidates, self.cursor, self.chunk);
            let needed: usize = plan.iter().map(|&(i, chunk)| self.active[i].1.blocks_needed(chunk)).sum();
            // A request alone always fits: it is admitted only if its whole length does.
            if needed <= pool.free_blocks() || self.active.len() == 1 {
                return plan;
            }
            // The most recently admitted request that holds blocks gives them back.
            let Some(last) = (0..self.active.len()).rev().find(|&i| self.active[i].1.kv_cache_bytes() > 0) else {
                return plan;
            };
            let (mut tag, mut session) = self.remove(&[last]).pop().expect("one request removed");
            let outcome = session.preempt();
            let now = Instant::now();
            on_step(&mut tag, &session, &outcome, &StepTimes { started: now, ended: now, batch: 0 });
            self.preempted.push_front((tag, session));
        }
    }

    /// Runs one step. `on_step` sees every stepped request's outcome, in admission order, with
    /// the step's times, before the finished and failed ones are handed back.
    pub fn step(&mut self, mut on_step: impl FnMut(&mut T, &Session, &StepOutcome, &StepTimes)) -> Stepped<T> {
        let plan = self.plan_within_budget(&mut on_step);
        let started = Instant::now();
        if plan.is_empty() {
            let times = StepTimes { started, ended: started, batch: 0 };
            return Stepped { times, finished: Vec::new(), failed: Vec::new() };
        }
        debug_assert!(plan.windows(2).all(|w| w[0].0 < w[1].0), "a plan lists requests in admission order");
        let stepped: Vec<usize> = plan.iter().map(|p| p.0).collect();
        let chunks: Vec<Option<usize>> = plan.iter().map(|p| p.1).collect();
        let mut sessions: Vec<&mut Session> = self
            .active
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| stepped.binary_search(i).is_ok())
            .map(|(_, (_, s))| s)
            .collect();
        let marks: Vec<usize> = sessions.iter().map(|s| s.cache_mark()).collect();
        let hook = self.hook.as_ref();
        let outcomes: Vec<Result<StepOutcome, EngineError>> = match guarded(hook, &mut sessions, &chunks) {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(error) if sessions.len() == 1 => vec![Err(error)],
            Err(_) => sessions
                .iter_mut()
                .zip(&marks)
                .zip(&chunks)
                .map(|((session, &mark), &chunk)| {
                    session.rewind(mark);
                    guarded(hook, &mut [&mut **session], &[chunk]).map(|mut one| one.remove(0))
                })
                .collect(),
        };
        let ended = Instant::now();
        let times = StepTimes { started, ended, batch: stepped.len() };
        let mut failures = Vec::new();
        for (&i, outcome) in stepped.iter().zip(outcomes) {
            match outcome {
                Ok(outcome) => {
                    let (tag, session) = &mut self.active[i];
                    on_step(tag, session, &outcome, &times);
                }
                Err(error) => failures.push((i, error)),
            }
        }
        // The cursor moves past the last stepped request, less the ones that leave before it.
        self.cursor = stepped.last().map_or(0, |&i| i + 1);
        let leaving: Vec<usize> = stepped
            .into_iter()
            .filter(|&i| self.active[i].1.is_finished() || failures.iter().any(|(f, _)| *f == i))
            .collect();
        let mut finished = Vec::new();
        let mut failed = Vec::new();
        let mut errors = failures.into_iter().peekable();
        for (i, (tag, session)) in leaving.iter().zip(self.remove(&leaving)) {
            match errors.next_if(|(f, _)| f == i) {
                Some((_, error)) => failed.push((tag, session, error)),
                None => finished.push((tag, session)),
            }
        }
        Stepped { times, finished, failed }
    }

    /// Removes the requests at `indices` (ascending), keeping the cursor on the same request.
    fn remove(&mut self, indices: &[usize]) -> Vec<(T, Session)> {
        let before_cursor = indices.iter().filter(|&&i| i < self.cursor).count();
        self.cursor -= before_cursor;
        let mut removed: Vec<(T, Session)> = indices.iter().rev().map(|&i| self.active.remove(i)).collect();
        removed.reverse();
        removed
    }
}

/// One forward through [`step_batch`], with the hook first; a panic inside becomes an error
/// (the sessions it touched are rewound or dropped by the caller, the shared weights are only
/// ever read).
fn guarded(
    hook: Option<&StepHook>,
    sessions: &mut [&mut Session],
    chunks: &[Option<usize>],
) -> Result<Vec<StepOutcome>, EngineError> {
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        if let Some(hook) = hook {
            let view: Vec<&Session> = sessions.iter().map(|s| &**s).collect();
            hook(&view);
        }
        step_batch(sessions, chunks)
    }))
    .unwrap_or_else(|panic| {
        let reason = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        Err(EngineError::Panicked(reason))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::load::LoadedModel;
    use crate::session::StepKind;

    /// The generated `tiny` checkpoint, loaded (the folder lives as long as the guard).
    pub(crate) fn tiny() -> (tempfile::TempDir, LoadedModel) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny");
        supply::generate::generate_into(&supply::generate::shape("tiny").unwrap(), &dir, false).unwrap();
        let model = LoadedModel::load(&dir).unwrap();
        (tmp, model)
    }

    /// Which requests each step advanced, by tag.
    fn trace(stepper: &mut Stepper<&'static str>) -> Vec<Vec<&'static str>> {
        let mut steps = Vec::new();
        while !stepper.is_empty() {
            let mut this = Vec::new();
            stepper.step(|tag, _, _, _| this.push(*tag));
            steps.push(this);
        }
        steps
    }

    #[test]
    fn interleave_takes_turns_and_a_freed_slot_keeps_the_turn_order() {
        let (_tmp, model) = tiny();
        let mut s = Stepper::new(Policy::Interleave, None, 3);
        // Whole-prompt prefill yields the first token: caps of 1, 3 and 2 tokens.
        for (tag, cap) in [("a", 1), ("b", 3), ("c", 2)] {
            s.admit(tag, Session::new(&model, vec![1, 2, 3], cap).unwrap());
        }
        assert_eq!(trace(&mut s), [vec!["a"], vec!["b"], vec!["c"], vec!["b"], vec!["c"], vec!["b"]]);
    }

    #[test]
    fn batched_steps_everyone_and_a_request_admitted_mid_flight_joins_the_next_step() {
        let (_tmp, model) = tiny();
        let mut s = Stepper::new(Policy::Batched, None, 4);
        s.admit("a", Session::new(&model, vec![1, 2, 3], 4).unwrap());
        let mut first = Vec::new();
        s.step(|tag, _, outcome, times| first.push((*tag, outcome.token.is_some(), times.batch)));
        assert_eq!(first, [("a", true, 1)]);
        s.admit("b", Session::new(&model, vec![4, 5], 2).unwrap());
        let mut second = Vec::new();
        s.step(|tag, _, _, times| second.push((*tag, times.batch)));
        assert_eq!(second, [("a", 2), ("b", 2)]);
    }

    /// Runs `a` (prompt 1, 2, 3) and `bad` (prompt 4, 5) batched to the end; with `fault`, the
    /// hook panics in any forward that advances `bad`. Returns a's output, the steps' batch
    /// sizes, and what failed.
    fn batched_pair(model: &LoadedModel, fault: bool) -> (Vec<u32>, Vec<usize>, Vec<(&'static str, String)>) {
        let hook: StepHook = Arc::new(move |sessions: &[&Session]| {
            if fault && sessions.iter().any(|s| s.prompt() == [4, 5]) {
                panic!("injected fault");
            }
        });
        let mut s = Stepper::new(Policy::Batched, None, 2).with_hook(Some(hook));
        s.admit("a", Session::new(model, vec![1, 2, 3], 4).unwrap());
        s.admit("bad", Session::new(model, vec![4, 5], 4).unwrap());
        let (mut batches, mut failed, mut output) = (Vec::new(), Vec::new(), Vec::new());
        while !s.is_empty() {
            let stepped = s.step(|_, _, _, _| {});
            batches.push(stepped.times.batch);
            failed.extend(stepped.failed.into_iter().map(|(tag, _, e)| (tag, e.to_string())));
            output.extend(stepped.finished.into_iter().filter(|f| f.0 == "a").map(|f| f.1.output().to_vec()));
        }
        (output.concat(), batches, failed)
    }

    #[test]
    fn a_failing_request_fails_alone_and_its_batch_mate_computes_the_same() {
        let (_tmp, model) = tiny();
        let (clean, _, none) = batched_pair(&model, false);
        assert!(none.is_empty());
        let (output, batches, failed) = batched_pair(&model, true);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, "bad");
        assert!(failed[0].1.contains("injected fault"), "{}", failed[0].1);
        // The first step held both; `a` went on alone, with the ids it computes without the fault.
        assert_eq!(batches, [2, 1, 1, 1]);
        assert_eq!(output, clean);
    }

    #[test]
    fn under_a_budget_the_latest_request_is_preempted_resumes_and_computes_the_same_ids() {
        let (_tmp, model) = tiny();
        let prompts: Vec<Vec<u32>> = (0..3u32).map(|i| (1..=70 + 5 * i).collect()).collect();
        // Each job: a prompt past one block and a cap that crosses into a third.
        let run = |pool: Option<usize>| {
            let mut s = Stepper::new(Policy::Batched, Some(16), 3);
            let kv = pool.map(|blocks| model.model.kv_pool(blocks, false).unwrap());
            if let Some(kv) = &kv {
                s = s.with_pool(kv.clone());
            }
            for (i, p) in prompts.iter().enumerate() {
                let session = match &kv {
                    Some(kv) => Session::in_pool(&model, kv, p.clone(), 70).unwrap(),
                    None => Session::new(&model, p.clone(), 70).unwrap(),
                }
                .without_stop_ids();
                assert!(s.could_fit(&session) && s.has_room());
                s.admit(i, session);
            }
            let (mut preempted, mut outputs) = (Vec::new(), vec![Vec::new(); 3]);
            while !s.is_empty() {
                let stepped = s.step(|tag, _, outcome, times| {
                    if outcome.kind == StepKind::Preempt {
                        assert_eq!(times.batch, 0);
                        preempted.push(*tag);
                    }
                });
                if let Some(kv) = &kv {
                    assert!(kv.used_blocks() <= kv.blocks());
                }
                for (tag, session) in stepped.finished {
                    outputs[tag] = session.output().to_vec();
                }
            }
            (outputs, preempted, kv.map(|kv| kv.peak_bytes()))
        };
        let (free, none, _) = run(None);
        assert!(none.is_empty());
        // Six blocks: the three together need nine at the end.
        let (tight, preempted, peak) = run(Some(6));
        assert_eq!(tight, free, "preemption changes no id");
        assert!(!preempted.is_empty(), "some request was preempted");
        assert!(preempted.iter().all(|&t| t > 0), "the first admitted is never the one preempted: {preempted:?}");
        assert!(peak.unwrap() <= 6 * model.model.block_bytes());
    }

    #[test]
    fn retain_keeps_the_cursor_on_the_same_request() {
        let (_tmp, model) = tiny();
        let mut s = Stepper::new(Policy::Interleave, None, 3);
        for tag in ["a", "b", "c"] {
            s.admit(tag, Session::new(&model, vec![1, 2], 3).unwrap());
        }
        s.step(|_, _, _, _| {}); // a; next is b
        let gone = s.retain(|tag| *tag != "a");
        assert_eq!(gone.len(), 1);
        let mut next = Vec::new();
        s.step(|tag, _, _, _| next.push(*tag));
        assert_eq!(next, ["b"]);
    }
}
