//! The engine thread: the only place that computes. It takes jobs from the bounded queue,
//! admits them into the stepping loop it shares with the scheduler study
//! ([`common::stepper::Stepper`]) under the server's policy, and sends every client its text as
//! each step makes it. A request that arrives while others decode joins the next step; one that
//! fails inside a step fails alone (with the others in that step), and the engine goes on.

use super::metrics::Metrics;
use super::stop::StopText;
use super::Settings;
use common::load::LoadedModel;
use common::qwen::KvPool;
use common::sample::Sampling;
use common::session::{FinishReason, Session, StepKind, StepOutcome};
use common::stepper::{StepTimes, Stepper};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A request the handlers have validated and tokenized.
pub(crate) struct Job {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    /// Alternatives with each token's log-probability, when asked.
    pub logprobs: Option<usize>,
    pub tx: mpsc::UnboundedSender<Event>,
    pub received: Instant,
}

/// What the engine tells one request's handler.
#[derive(Debug)]
pub(crate) enum Event {
    /// Text made by one step (whole characters only), the tokens generated so far, and the
    /// log-probabilities of the tokens made since the last event (when asked).
    Text {
        text: String,
        tokens: usize,
        logprobs: Vec<Logprob>,
    },
    Done(Finished),
    /// The request failed inside a step, or could not start; the reason.
    Error(String),
}

/// A generated token's log-probability, with its text and its alternatives', for an answer.
#[derive(Debug, Clone)]
pub(crate) struct Logprob {
    pub token: String,
    pub logprob: f64,
    pub top: Vec<(String, f64)>,
}

#[derive(Debug, Clone)]
pub(crate) struct Finished {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache at its first prefill, so not computed.
    pub cached_tokens: usize,
    pub output_ids: Vec<u32>,
    /// Time in steps that prefilled the prompt.
    pub prompt_eval: Duration,
    /// Time in steps that produced a token (the last prefill step produces the first).
    pub eval: Duration,
    /// From the handler queueing the request to its end.
    pub total: Duration,
}

/// The engine's state as `/health` reports it.
#[derive(Debug, Default)]
pub struct EngineState {
    /// False once the engine thread has ended (it never should while the server runs).
    pub alive: AtomicBool,
    pub active: AtomicUsize,
    pub queued: AtomicUsize,
    /// Taken from the queue but not admitted: its first step's KV blocks are not free yet
    /// (0 or 1).
    pub waiting_for_blocks: AtomicUsize,
    pub completed: AtomicUsize,
    pub cancelled: AtomicUsize,
    /// Answered 503 because the queue was full.
    pub rejected: AtomicUsize,
    /// Failed inside a step, or could not start.
    pub failed: AtomicUsize,
    pub steps: AtomicU64,
    /// Requests preempted to keep the KV budget (each resumed later).
    pub preemptions: AtomicUsize,
    pub last_error: Mutex<Option<String>>,
}

/// Marks the engine dead when its thread ends, however it ends.
struct AliveGuard(Arc<EngineState>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
    }
}

/// One admitted request beside its session.
struct Active {
    job: Job,
    text: Detokenizer,
    /// The stop strings, and whether one has appeared (the answer ends at this step).
    stop: StopText,
    stopped: bool,
    /// Log-probabilities already sent.
    logged: usize,
    prompt_eval: Duration,
    eval: Duration,
    /// Prompt tokens its first prefill found cached (`None` before that step).
    cached: Option<usize>,
    /// When the step that made its latest token ended.
    last_token: Option<Instant>,
}

/// Runs until every queue sender is gone and the last admitted request has ended.
pub(crate) fn run(model: Arc<LoadedModel>, mut jobs: mpsc::Receiver<Job>, settings: Settings, state: Arc<EngineState>) {
    state.alive.store(true, Ordering::SeqCst);
    let _guard = AliveGuard(state.clone());
    let metrics = &settings.metrics;
    let mut stepper = Stepper::new(settings.engine.policy, settings.engine.chunk_size, settings.engine.max_active)
        .with_pool(settings.kv.clone())
        .with_hook(settings.step_hook.clone());
    // A request taken from the queue whose first step's KV blocks are not free yet: it waits
    // here, first in line, while the admitted ones step and give blocks back.
    let mut next: Option<(Job, Session)> = None;
    loop {
        // Wait for work when idle; otherwise take whatever is queued, up to the free slots.
        while stepper.has_room() {
            let (job, session) = match next.take() {
                Some(waiting) => waiting,
                None => {
                    let job = if stepper.is_empty() {
                        match jobs.blocking_recv() {
                            Some(job) => job,
                            None => return,
                        }
                    } else {
                        match jobs.try_recv() {
                            Ok(job) => job,
                            Err(_) => break,
                        }
                    };
                    state.queued.fetch_sub(1, Ordering::SeqCst);
                    if job.tx.is_closed() {
                        state.cancelled.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    let session = Session::in_pool(&model, &settings.kv, job.prompt_ids.clone(), job.max_tokens)
                        .and_then(|s| s.with_sampling(job.sampling))
                        .map(|s| match job.logprobs {
                            Some(top) => s.with_logprobs(top),
                            None => s,
                        });
                    match session {
                        Ok(session) if stepper.could_fit(&session) => {
                            let session = if job.ignore_eos { session.without_stop_ids() } else { session };
                            (job, session)
                        }
                        Ok(session) => {
                            state.failed.fetch_add(1, Ordering::SeqCst);
                            let reason = format!(
                                "{} positions of KV cache do not fit the server's budget of {} blocks of {}",
                                session.blocks_at_most() * KvPool::BLOCK_POSITIONS,
                                settings.kv.blocks(),
                                KvPool::BLOCK_POSITIONS
                            );
                            let _ = job.tx.send(Event::Error(reason));
                            continue;
                        }
                        Err(e) => {
                            state.failed.fetch_add(1, Ordering::SeqCst);
                            let _ = job.tx.send(Event::Error(e.to_string()));
                            continue;
                        }
                    }
                }
            };
            if !stepper.fits(&session) {
                next = Some((job, session));
                break;
            }
            state.active.fetch_add(1, Ordering::SeqCst);
            metrics.prompt_tokens.inc_by(job.prompt_ids.len() as u64);
            let stop = StopText::new(job.stop.clone());
            let active = Active {
                job,
                text: Detokenizer::default(),
                stop,
                stopped: false,
                logged: 0,
                prompt_eval: Duration::ZERO,
                eval: Duration::ZERO,
                cached: None,
                last_token: None,
            };
            stepper.admit(active, session);
        }
        // A request waiting for blocks whose client left goes now.
        if next.as_ref().is_some_and(|(job, _)| job.tx.is_closed()) {
            next = None;
            state.cancelled.fetch_add(1, Ordering::SeqCst);
        }
        state.waiting_for_blocks.store(usize::from(next.is_some()), Ordering::SeqCst);
        // A client that went away has closed its channel: free its session now.
        let gone = stepper.retain(|a| !a.job.tx.is_closed()).len();
        if gone > 0 {
            state.active.fetch_sub(gone, Ordering::SeqCst);
            state.cancelled.fetch_add(gone, Ordering::SeqCst);
        }
        if stepper.is_empty() {
            continue;
        }
        let mut step_tokens = 0;
        let stepped = stepper.step(|a, session, outcome, times| {
            if outcome.kind == StepKind::Preempt {
                state.preemptions.fetch_add(1, Ordering::SeqCst);
            }
            step_tokens += outcome.tokens;
            a.stepped(&model, metrics, session, outcome, times)
        });
        state.steps.fetch_add(1, Ordering::SeqCst);
        if step_tokens > 0 {
            metrics.iteration_tokens.observe(step_tokens as f64);
        }
        // An answer a stop string ended leaves now, like one its stop id ended.
        let stopped = stepper.retain(|a| !a.stopped);
        for (mut a, session) in stepped.finished.into_iter().chain(stopped) {
            metrics.e2e_request_latency.observe((stepped.times.ended - a.job.received).as_secs_f64());
            a.finish(&model, session);
            state.active.fetch_sub(1, Ordering::SeqCst);
            state.completed.fetch_add(1, Ordering::SeqCst);
        }
        for (a, _, error) in stepped.failed {
            let reason = error.to_string();
            tracing::error!("a request failed in a step: {reason}");
            *state.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
            let _ = a.job.tx.send(Event::Error(reason));
            state.active.fetch_sub(1, Ordering::SeqCst);
            state.failed.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Active {
    /// Books the step's time, observes its latencies, and sends the text its token completed,
    /// if any.
    fn stepped(
        &mut self,
        model: &LoadedModel,
        metrics: &Metrics,
        session: &Session,
        outcome: &StepOutcome,
        times: &StepTimes,
    ) {
        let took = times.ended - times.started;
        if outcome.kind == StepKind::Prefill {
            self.prompt_eval += took;
            self.cached.get_or_insert(outcome.reused);
        }
        if outcome.token.is_some() {
            self.eval += took;
            metrics.generation_tokens.inc();
            match self.last_token.replace(times.ended) {
                None => metrics.time_to_first_token.observe((times.ended - self.job.received).as_secs_f64()),
                Some(previous) => metrics.inter_token_latency.observe((times.ended - previous).as_secs_f64()),
            }
            if let Some(text) = self.text.next(model, session.output(), false) {
                self.send(model, text, session);
            }
        }
    }

    /// The log-probabilities of the tokens made since the last sent, rendered.
    fn new_logprobs(&mut self, model: &LoadedModel, session: &Session) -> Vec<Logprob> {
        let fresh = &session.logprobs()[self.logged.min(session.logprobs().len())..];
        self.logged = session.logprobs().len();
        let text = |id: u32| model.decode(&[id]);
        fresh
            .iter()
            .map(|t| Logprob {
                token: text(t.id),
                logprob: t.logprob,
                top: t.top.iter().map(|(id, lp)| (text(*id), *lp)).collect(),
            })
            .collect()
    }

    /// Sends `text` less any stop string and what follows it (or what could still begin one),
    /// with the log-probabilities of the tokens made since the last event.
    fn send(&mut self, model: &LoadedModel, text: String, session: &Session) {
        if self.stopped {
            return;
        }
        let fed = self.stop.feed(&text);
        self.stopped = fed.stopped;
        let logprobs = self.new_logprobs(model, session);
        if !fed.text.is_empty() || !logprobs.is_empty() {
            let _ = self.job.tx.send(Event::Text { text: fed.text, tokens: session.output().len(), logprobs });
        }
    }

    /// Sends what text is left (an incomplete character at the very end included, and what was
    /// held back for a stop string that never came), then the end, once the session (and its
    /// KV blocks) is gone: a client that reads `/health` after its answer sees them free.
    fn finish(&mut self, model: &LoadedModel, session: Session) {
        if let Some(text) = self.text.next(model, session.output(), true) {
            self.send(model, text, &session);
        }
        let held = if self.stopped { String::new() } else { self.stop.flush() };
        let logprobs = if self.stopped { Vec::new() } else { self.new_logprobs(model, &session) };
        if !held.is_empty() || !logprobs.is_empty() {
            let _ = self.job.tx.send(Event::Text { text: held, tokens: session.output().len(), logprobs });
        }
        let reason = if self.stopped { Some(FinishReason::Stop) } else { session.finish_reason() };
        let done = Finished {
            reason: reason.unwrap_or(FinishReason::Length),
            prompt_tokens: session.prompt_len(),
            cached_tokens: self.cached.unwrap_or(0),
            output_ids: session.output().to_vec(),
            prompt_eval: self.prompt_eval,
            eval: self.eval,
            total: self.job.received.elapsed(),
        };
        drop(session);
        let _ = self.job.tx.send(Event::Done(done));
    }
}

/// Incremental detokenization. Decoding a token alone can split a character (byte-level tokens)
/// or drop a space, so each step decodes the window since the last text sent, and sends only
/// the new text, and only whole characters: a trailing partial UTF-8 sequence waits for its
/// next token. The window stays a few tokens long, so a step costs the same late in a long
/// answer as early.
#[derive(Debug, Default)]
struct Detokenizer {
    /// Ids before `from` are sent and need no decoding; `from..to` is the text already sent of
    /// the current window.
    from: usize,
    to: usize,
}

impl Detokenizer {
    fn next(&mut self, model: &LoadedModel, ids: &[u32], flush: bool) -> Option<String> {
        let sent = model.decode(&ids[self.from..self.to]);
        let text = model.decode(&ids[self.from..]);
        let ready = text.len() > sent.len() && text.starts_with(&sent) && (flush || !text.ends_with('\u{fffd}'));
        if !ready {
            return None;
        }
        self.from = self.to;
        self.to = ids.len();
        Some(text[sent.len()..].to_string())
    }
}
