//! The one stepping loop that the scheduler and the embedded server share: the set of active
//! requests, each with its session and whatever its driver keeps beside it.
//!
//! The driver admits requests while there is room (from a job list by arrival time, or from a
//! queue of clients), then asks for a step: the policy plans which requests advance and how much
//! prompt each prefills, [`step_batch`] advances them in one forward, the driver sees each
//! stepped request's outcome, and finished requests retire and are handed back. A request that
//! joins while others decode takes part in the very next step.
//!
//! A step that fails (an engine error, or a panic inside the forward) fails only the requests
//! that cause it: when a batched step fails, each of its requests is stepped again alone from
//! where it was (the failed forward's partial cache writes are forgotten, and a row computes the
//! same alone as in company), those that fail alone are handed back with the reason, and the
//! others go on as if the step had succeeded.

use crate::policy::{Candidate, Policy};
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
    /// The round-robin cursor: the index of the request after the one stepped last.
    cursor: usize,
    hook: Option<StepHook>,
}

impl<T> Stepper<T> {
    /// Steps under `policy` with chunk size (for `batched`, the step's token budget) `chunk`,
    /// with at most `max_active` requests admitted (at least one).
    pub fn new(policy: Policy, chunk: Option<usize>, max_active: usize) -> Self {
        let max_active = max_active.max(1);
        Stepper { policy, chunk, max_active, active: Vec::with_capacity(max_active), cursor: 0, hook: None }
    }

    /// Installs the test seam (see [`StepHook`]).
    pub fn with_hook(mut self, hook: Option<StepHook>) -> Self {
        self.hook = hook;
        self
    }

    pub fn has_room(&self) -> bool {
        self.active.len() < self.max_active
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Admits a request; it takes part in the next step its policy gives it. With no room (the
    /// driver checks [`Stepper::has_room`]) it still joins: the bound is the driver's to keep.
    pub fn admit(&mut self, tag: T, session: Session) {
        self.active.push((tag, session));
    }

    /// Removes the requests that `keep` rejects (a client that left) and hands them back; the
    /// round-robin cursor keeps pointing at the same next request.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Vec<(T, Session)> {
        let gone: Vec<usize> = (0..self.active.len()).filter(|&i| !keep(&self.active[i].0)).collect();
        self.remove(&gone)
    }

    /// Runs one step. `on_step` sees every stepped request's outcome, in admission order, with
    /// the step's times, before the finished and failed ones are handed back.
    pub fn step(&mut self, mut on_step: impl FnMut(&mut T, &Session, &StepOutcome, &StepTimes)) -> Stepped<T> {
        let started = Instant::now();
        if self.active.is_empty() {
            let times = StepTimes { started, ended: started, batch: 0 };
            return Stepped { times, finished: Vec::new(), failed: Vec::new() };
        }
        let candidates: Vec<Candidate> = self.active.iter().map(|(_, s)| s.candidate()).collect();
        let plan = self.policy.plan(&candidates, self.cursor, self.chunk);
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
mod tests {
    use super::*;
    use crate::load::LoadedModel;

    fn tiny() -> (tempfile::TempDir, LoadedModel) {
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
