//! Open-loop load: requests arrive on a schedule drawn before the run (Poisson, or gamma with a
//! chosen burstiness), whatever the server's answers, with an optional cap on the requests in
//! flight; or, at an unbounded rate with a cap, a closed pool whose slot refills as soon as a
//! request ends. (The seed's closed rounds, `c` requests at once per round, are the caller's: they
//! stay serving-bench's default, in its `measure::run`.)
//!
//! Each request records when the schedule wanted it sent (`scheduled_s`) and when the client
//! sent it (`sent_s`): their difference is the client's lateness, which the summary reports and
//! the audit recomputes, and the audit redraws the schedule from the seed to check that it was
//! the one promised.

use crate::client::{measure, RequestOptions, Spec, Timeouts};
use crate::group::completed_rate;
use crate::group::load_label;
use crate::os::{realtime_priority, Workers};
use crate::record::Arrival;
use crate::record::RequestRecord;
use crate::record::Runtime;
use crate::workload::Item;
use crate::MAX_COUNT;
use rand::SeedableRng;
use rand_distr::Distribution;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use supply::manifest::Invalid;
use supply::manifest::MAX_WAIT_S;

/// The arrival offsets (seconds from the group's start) of an open loop at `rate` requests/s:
/// the first at 0, then gaps drawn from a gamma distribution of shape `burstiness` and mean
/// `1 / rate` (shape 1 is Poisson arrivals; below 1 burstier, above 1 more even), from a
/// generator seeded by `seed`, so the audit can draw the same schedule again. At most
/// `max_requests` arrivals (and never more than [`MAX_COUNT`], whatever a file asks), and none
/// after `duration_s`.
pub fn schedule(seed: u64, rate: f64, burstiness: f64, max_requests: usize, duration_s: Option<f64>) -> Vec<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Validated parameters make the distribution valid; an invalid one draws no gaps.
    let Ok(gaps) = rand_distr::Gamma::new(burstiness, 1.0 / (burstiness * rate)) else { return vec![0.0] };
    let mut at = 0.0;
    let mut out = Vec::new();
    while out.len() < max_requests.min(MAX_COUNT) && duration_s.is_none_or(|d| at <= d) {
        out.push(at);
        at += gaps.sample(&mut rng);
    }
    out
}

/// A group's send times at `rate` (offsets from its start, [`schedule`]'s draw for this run's
/// `seed` and `arrivals`), each through the one checked conversion: a rate so slow that a
/// request would wait past a week is an error naming it, found before anything is sent.
pub fn offsets(seed: u64, rate: f64, arrivals: &Arrivals) -> Result<Vec<Duration>, Invalid> {
    let planned = arrivals.num_requests.unwrap_or(MAX_COUNT);
    schedule(seed, rate, arrivals.burstiness, planned, arrivals.duration_s)
        .into_iter()
        .enumerate()
        .map(|(i, offset)| {
            supply::manifest::seconds("arrivals.rates", offset).map_err(|_| {
                Invalid::new(
                    "arrivals.rates",
                    format!(
                        "{rate:?} requests/s: request {} of the group would be sent {offset:.3e} s after its start, more than a week; give a higher rate or fewer requests",
                        i + 1
                    ),
                )
            })
        })
        .collect()
}

/// One open-loop group's load: its rate (`None`: each request as soon as the cap allows, every
/// one at once without a cap) and its cap on requests in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub rate: Option<f64>,
    pub cap: Option<usize>,
}

impl Load {
    /// The groups that `arrivals` asks for up front: one per rate, or a sweep's first two
    /// (one request at a time, then as many as the cap allows).
    pub fn planned(arrivals: &Arrivals) -> Vec<Load> {
        match arrivals.sweep {
            Some(_) => vec![Load { rate: None, cap: Some(1) }, Load { rate: None, cap: arrivals.max_concurrency }],
            None => arrivals.rates.iter().map(|&rate| Load { rate, cap: arrivals.max_concurrency }).collect(),
        }
    }

    /// How tables and the progress bar name it.
    pub fn label(&self) -> String {
        load_label(self.cap.unwrap_or(0), Some(self.rate))
    }
}

/// A sweep's remaining rates for `runtime`, from its first two groups among `records`: `groups -
/// 2` rates evenly spaced between the completed request rates of its `synchronous` and
/// `rate-inf` groups, neither end included (guidellm's sweep). Empty when either group has no
/// success to measure a rate by. The audit recomputes them from the artifact's records.
pub fn sweep_rates(records: &[RequestRecord], runtime: &str, groups: usize) -> Vec<f64> {
    let all = crate::group::groups(records);
    let rate_of = |load: &str| {
        all.iter().find(|g| g.runtime == runtime && g.load == load).and_then(|g| completed_rate(&g.records))
    };
    let (Some(low), Some(high)) = (rate_of("synchronous"), rate_of("rate-inf")) else { return Vec::new() };
    let steps = groups.saturating_sub(1).max(1) as f64;
    (1..groups.saturating_sub(1)).map(|k| low + (high - low) * k as f64 / steps).collect()
}

/// One open-loop group's requests, warm-up ones included (marked).
pub struct GroupRun {
    pub records: Vec<RequestRecord>,
    /// At a finite rate: whether its pacer ran at real-time priority.
    pub realtime_pacer: Option<bool>,
}

/// One open-loop group of `arrivals` under `load` against `target`, items taken in turn from
/// `items`. Fails before sending anything when its schedule cannot be kept ([`offsets`]).
#[allow(clippy::too_many_arguments)] // one group's whole description, named at the one caller
pub async fn run_group(
    http: &crate::client::Http,
    target: &Runtime,
    options: RequestOptions,
    arrivals: &Arrivals,
    load: Load,
    items: &[Item],
    max_tokens: usize,
    seed: u64,
    timeouts: &Timeouts,
    t0: Instant,
    progress: &crate::progress::Progress,
) -> Result<GroupRun, Invalid> {
    let Load { rate, cap } = load;
    let planned = arrivals.num_requests.unwrap_or(MAX_COUNT);
    let offsets = rate.map(|r| offsets(seed, r, arrivals)).transpose()?;
    let duration = arrivals.duration_s.map(|d| supply::manifest::seconds("arrivals.duration_s", d)).transpose()?;
    let start = Instant::now();
    let slots = cap.map(|n| Slots::new(n, start));
    let stop = duration.map(|d| start + d);
    let pacer = offsets.as_ref().map(|_| Pacer::start());
    let mut tasks = tokio::task::JoinSet::new();
    let mut index = 0usize;
    loop {
        let (scheduled, slot, go) = match &offsets {
            Some(offsets) => {
                let Some(&offset) = offsets.get(index) else { break };
                let at = start + offset;
                // The task starts ahead of its time and the pacer wakes it at the instant, so
                // that then it is ready to send rather than waiting to be spawned.
                if let Some(ahead) = at.checked_sub(LEAD) {
                    tokio::time::sleep_until(ahead.into()).await;
                }
                (at, None, pacer.as_ref().map(|p| p.wake_at(at)))
            }
            // Unbounded rate: each request as soon as a slot is free (all at once without a cap),
            // due from the instant its slot was freed.
            None => {
                if index >= planned || stop.is_some_and(|s| Instant::now() >= s) {
                    break;
                }
                match &slots {
                    Some(slots) => {
                        let slot = slots.take().await;
                        (slot.freed, Some(slot), None)
                    }
                    None => (Instant::now(), None, None),
                }
            }
        };
        let item = items[index % items.len()].clone();
        let spec = Spec {
            concurrency: cap.unwrap_or(0),
            round: 0,
            index,
            prompt_name: "",
            prompt: "",
            messages: None,
            max_tokens: item.max_tokens.unwrap_or(max_tokens),
            seed,
            options: options.clone(),
        };
        let (http, target, timeouts, slots) = (http.clone(), target.clone(), *timeouts, slots.clone());
        let warmup = index < arrivals.warmup_requests;
        tasks.spawn(async move {
            // With a cap and a finite rate, a request whose time came while every slot was busy
            // waits here, and the wait shows as lateness: the schedule is the users', not ours.
            // The pacer only ends after every wake-up it was given.
            let woken = match go {
                Some(go) => go.await.ok(),
                None => None,
            };
            let slot = match (slot, slots) {
                (Some(slot), _) => Some(slot),
                (None, Some(slots)) => Some(slots.take().await),
                (None, None) => None,
            };
            let admitted = slot.as_ref().map_or(scheduled, |s| s.freed.max(scheduled));
            let spec = Spec { prompt_name: &item.name, prompt: &item.prompt, messages: item.messages.as_ref(), ..spec };
            let mut record = measure(&http, &target, &spec, &timeouts, t0, Some(scheduled)).await;
            drop(slot);
            let secs = |at: Instant| at.duration_since(t0).as_secs_f64();
            let (admitted_s, woken_s) = (Some(secs(admitted)), woken.map(secs));
            record.arrival = Some(Arrival { rate_rps: rate, warmup, admitted_s, woken_s });
            record
        });
        index += 1;
    }
    let mut records = Vec::with_capacity(index);
    while let Some(done) = tasks.join_next().await {
        // A measuring task does not panic (every failure is a record); if one did, its record is
        // lost and the count below says so.
        if let Ok(record) = done {
            match record.arrival.is_some_and(|a| a.warmup) {
                true => progress.unmeasured(),
                false => progress.done(&record),
            }
            records.push(record);
        }
    }
    records.sort_by_key(|r| r.index);
    Ok(GroupRun { records, realtime_pacer: pacer.map(|p| p.realtime) })
}

/// The `max_concurrency` slots, each carrying the instant it was last freed, so that a request
/// that waited for one knows from when it could have been sent: its wait up to then is the
/// cap's, after it the client's own.
struct Slots {
    permits: Arc<tokio::sync::Semaphore>,
    /// One instant per permit not yet taken, oldest first: pushed before the permit is returned
    /// and popped after one is taken, so a taker always finds one no later than its permit.
    freed: std::sync::Mutex<std::collections::VecDeque<Instant>>,
}

/// A taken slot; dropping it frees it, stamped with the instant.
struct Slot {
    slots: Arc<Slots>,
    /// When the slot this request holds was freed (the group's start for a slot never used).
    freed: Instant,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Slots {
    fn new(n: usize, start: Instant) -> Arc<Self> {
        Arc::new(Slots {
            permits: Arc::new(tokio::sync::Semaphore::new(n)),
            freed: std::sync::Mutex::new(std::iter::repeat_n(start, n).collect()),
        })
    }

    /// Waits for a free slot (first come, first served).
    async fn take(self: &Arc<Self>) -> Slot {
        let permit = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        let freed = self.freed.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        Slot { slots: self.clone(), freed: freed.unwrap_or_else(Instant::now), _permit: permit }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Runs before the permit (a field) is returned.
        self.slots.freed.lock().unwrap_or_else(|e| e.into_inner()).push_back(Instant::now());
    }
}

/// How long before its time an open-loop request's task starts: long enough that the thread
/// spawning it, which a server busy on every core can keep off the CPU for a scheduler slice or
/// more, still spawns it ahead of its time.
const LEAD: Duration = Duration::from_millis(20);

/// Wakes tasks at their instants from a thread of its own, which sleeps with the operating
/// system's fine timer and spins the last stretch: the runtime's timer ticks in milliseconds,
/// and tasks spinning on the runtime's workers would take the CPU from the streams they share it
/// with.
///
/// Each wake-up carries the instant the pacer woke the request. The pacer runs above the client's
/// workers, so nothing of the client's delays it: a wake later than its instant tells that the
/// machine held the client (the kernel, or the host pausing a virtual CPU), apart from what the
/// client then took to send; a hold after the wake shows to the stall probe ([`crate::probe`]).
struct Pacer {
    queue: std::sync::mpsc::Sender<(Instant, tokio::sync::oneshot::Sender<Instant>)>,
    /// Whether its thread runs at real-time priority.
    realtime: bool,
}

impl Pacer {
    fn start() -> Self {
        let (queue, wake_ups) = std::sync::mpsc::channel::<(Instant, tokio::sync::oneshot::Sender<Instant>)>();
        let (told, priority) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let realtime = realtime_priority(PACER_PRIORITY);
            let _ = told.send(realtime);
            // A thread at normal priority may be woken late while the server keeps the cores
            // busy, so it wakes earlier and spins longer.
            let spin = Duration::from_micros(if realtime { 100 } else { 200 });
            // In schedule order; the thread ends when the group drops its sender.
            for (at, wake) in wake_ups {
                if let Some(rest) = at.checked_duration_since(Instant::now()).and_then(|d| d.checked_sub(spin)) {
                    std::thread::sleep(rest);
                }
                let mut now = Instant::now();
                while now < at {
                    std::hint::spin_loop();
                    now = Instant::now();
                }
                let _ = wake.send(now);
            }
        });
        Pacer { queue, realtime: priority.recv().unwrap_or(false) }
    }

    /// A future that completes at `at` with the instant the pacer woke it (at once, with an
    /// error, if the pacer is gone).
    fn wake_at(&self, at: Instant) -> tokio::sync::oneshot::Receiver<Instant> {
        let (wake, woken) = tokio::sync::oneshot::channel();
        let _ = self.queue.send((at, wake));
        woken
    }
}

/// The pacer's real-time priority, above the workers' ([`crate::os::WORKER_PRIORITY`]): a worker busy on
/// every core cannot then hold a wake-up back, and a late wake is the machine's alone.
const PACER_PRIORITY: i32 = 2;

/// What the artifact says of the pacer: whether it ran at real-time priority, and if not, how
/// to let it.
pub fn pacer_note(realtime: bool, workers: Option<Workers>) -> String {
    let pacer = if realtime {
        "Open-loop sends were woken by a thread at real-time priority (SCHED_FIFO 2, above the client's workers, so a late wake is the machine's: arrival.woken_s)"
    } else {
        "Open-loop sends were woken by a thread at normal priority (real-time was refused; CAP_SYS_NICE or an RLIMIT_RTPRIO of 2 or more allows it)"
    };
    compose_pacer_note(pacer, realtime, workers)
}

/// The pacer's part of [`pacer_note`] in runs before it ran above the workers (real-time, then
/// refused), whose notes still audit as made.
const EARLIER_PACER: [&str; 2] = [
    "Open-loop sends were woken by a thread at real-time priority (SCHED_FIFO 1)",
    "Open-loop sends were woken by a thread at normal priority (real-time was refused; CAP_SYS_NICE or an RLIMIT_RTPRIO above 0 allows it)",
];

fn compose_pacer_note(pacer: &str, realtime: bool, workers: Option<Workers>) -> String {
    let sent = match workers {
        Some(Workers::Realtime) => "and sent by workers at real-time priority too",
        Some(Workers::Nice) => "and sent by workers at nice -10",
        Some(Workers::Normal) => {
            "and sent by workers at normal priority (nice -10 was refused; CAP_SYS_NICE allows it)"
        }
        None => "and sent by workers at normal priority (the embedded server in the client's process shares them)",
    };
    let tail = match (realtime, workers) {
        (true, Some(Workers::Realtime | Workers::Nice)) => "",
        _ => ": with the server on the same cores, expect more send lateness",
    };
    format!("{pacer}, {sent}{tail}.")
}

/// Every note [`pacer_note`] can write, and those of earlier runs, each with the workers'
/// priority it tells of (so that the audit can hold it to the `client_workers` note of the same
/// run).
pub fn pacer_notes() -> Vec<(String, Option<Workers>)> {
    let workers = [Some(Workers::Realtime), Some(Workers::Nice), Some(Workers::Normal), None];
    let earlier = [true, false]
        .into_iter()
        .zip(EARLIER_PACER)
        .flat_map(|(realtime, pacer)| workers.map(|w| (compose_pacer_note(pacer, realtime, w), w)));
    [true, false]
        .into_iter()
        .flat_map(|realtime| workers.map(|w| (pacer_note(realtime, w), w)))
        .chain(earlier)
        .collect()
}

/// What the artifact says of the client's workers when they asked for a raised priority (every
/// target a server of its own), in closed rounds as in open loops; `None` when none asked, as
/// with an embedded target: they then ran at normal priority, the default nothing needs to say.
pub fn workers_note(workers: Option<Workers>) -> Option<String> {
    workers.map(|w| match w {
        Workers::Realtime => "The client's workers ran at real-time priority (SCHED_FIFO 1; every target a server of its own), ahead of the servers' threads on the same cores.".to_owned(),
        Workers::Nice => "The client's workers ran at nice -10 (every target a server of its own), ahead of the servers' threads on the same cores.".to_owned(),
        Workers::Normal => "The client's workers asked for nice -10 (every target a server of its own) and were refused (CAP_SYS_NICE allows it): they ran at normal priority.".to_owned(),
    })
}

/// Every note [`workers_note`] can write.
pub fn workers_notes() -> Vec<String> {
    [Workers::Realtime, Workers::Nice, Workers::Normal].into_iter().filter_map(|w| workers_note(Some(w))).collect()
}

/// An open-loop load: one group per rate, each sent on its own schedule; or a sweep, whose rates
/// come from measuring the target first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arrivals {
    /// Requests per second, one group per rate, in order; `null`: unbounded (every request at
    /// once, or a closed pool under `max_concurrency`). Empty for a sweep.
    pub rates: Vec<Option<f64>>,
    /// A sweep of this many groups per target, as guidellm's: one request at a time
    /// (`synchronous`), then as many at once as `max_concurrency` allows (`rate-inf`), then the
    /// rest at rates evenly spaced between those two groups' completed request rates
    /// ([`crate::load::sweep_rates`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<usize>,
    /// Shape of the gamma distribution of the gaps between arrivals: 1 is Poisson, below 1
    /// burstier, above 1 more even.
    pub burstiness: f64,
    /// At most this many requests in flight; a slot refills as soon as a request ends.
    pub max_concurrency: Option<usize>,
    /// Requests per group (warm-up included); a group ends at this count or `duration_s`,
    /// whichever comes first.
    pub num_requests: Option<usize>,
    /// Seconds over which a group's requests are sent.
    pub duration_s: Option<f64>,
    /// The first requests of each group, sent and recorded but left out of the summary.
    pub warmup_requests: usize,
}

/// The most groups a sweep may have.
pub const MAX_SWEEP: usize = 100;

/// The fastest rate accepted, requests per second.
pub const MAX_RATE: f64 = 1e6;

impl Arrivals {
    pub fn validate(&self) -> Result<(), Invalid> {
        match (self.rates.is_empty(), self.sweep) {
            (true, None) => return Err(Invalid::new("arrivals.rates", "empty; give at least one rate (or inf)")),
            (false, Some(_)) => {
                return Err(Invalid::new(
                    "arrivals.sweep",
                    "a sweep finds its own rates: give rates or a sweep, not both",
                ))
            }
            (true, Some(n)) if !(2..=MAX_SWEEP).contains(&n) => {
                return Err(Invalid::new("arrivals.sweep", format!("{n}: must be in 2..={MAX_SWEEP} groups")))
            }
            (true, Some(_)) if self.max_concurrency == Some(1) => {
                return Err(Invalid::new(
                    "arrivals.max_concurrency",
                    "1 makes a sweep's throughput group its synchronous one: allow more, or none",
                ))
            }
            _ => {}
        }
        if let Some(r) = self.rates.iter().flatten().find(|r| !(r.is_finite() && **r > 0.0 && **r <= MAX_RATE)) {
            return Err(Invalid::new(
                "arrivals.rates",
                format!("{r:?}: a rate is above 0 and at most {MAX_RATE} requests/s"),
            ));
        }
        if let Some((i, r)) = self.rates.iter().enumerate().find(|(i, r)| self.rates[..*i].contains(r)) {
            let shown = r.map_or_else(|| "inf".to_string(), |r| format!("{r:?}"));
            return Err(Invalid::new(
                format!("arrivals.rates[{i}]"),
                format!("{shown} is given twice; give each rate once (each is one group)"),
            ));
        }
        if self.burstiness != 1.0 && self.sweep.is_none() && self.rates.iter().all(Option::is_none) {
            return Err(Invalid::new(
                "arrivals.burstiness",
                "shapes the gaps between arrivals at a finite rate, and every rate is inf; give a rate (--request-rate) or leave it out",
            ));
        }
        if !(self.burstiness.is_finite() && self.burstiness >= 0.01 && self.burstiness <= 100.0) {
            return Err(Invalid::new(
                "arrivals.burstiness",
                format!("{:?}: must be in 0.01..=100 (1 is Poisson)", self.burstiness),
            ));
        }
        if self.warmup_requests > MAX_COUNT {
            return Err(Invalid::new(
                "arrivals.warmup_requests",
                format!("{} is more than {MAX_COUNT}", self.warmup_requests),
            ));
        }
        for (name, v) in
            [("arrivals.max_concurrency", self.max_concurrency), ("arrivals.num_requests", self.num_requests)]
        {
            if v.is_some_and(|v| v == 0 || v > MAX_COUNT) {
                return Err(Invalid::new(name, format!("{}: must be in 1..={MAX_COUNT}", v.unwrap_or(0))));
            }
        }
        if let Some(d) = self.duration_s {
            if !(d.is_finite() && d > 0.0 && d <= MAX_WAIT_S) {
                return Err(Invalid::new(
                    "arrivals.duration_s",
                    format!("{d}: must be above 0 and at most {MAX_WAIT_S}"),
                ));
            }
        }
        if let (None, Some(d)) = (self.num_requests, self.duration_s) {
            if let Some(r) = self.rates.iter().flatten().find(|r| **r * d > MAX_COUNT as f64) {
                return Err(Invalid::new(
                    "arrivals.duration_s",
                    format!("{d} s at {r} requests/s is more than {MAX_COUNT} requests; give num_requests or a shorter duration"),
                ));
            }
        }
        // Without a duration to end it, a group at a slow rate sends its last request after
        // about (n - 1) / rate seconds; past a week no run can keep that schedule.
        if let (Some(n), None) = (self.num_requests, self.duration_s) {
            if let Some(r) = self.rates.iter().flatten().find(|r| n.saturating_sub(1) as f64 / **r > MAX_WAIT_S) {
                return Err(Invalid::new(
                    "arrivals.rates",
                    format!(
                        "{r:?} requests/s: {n} requests take about {:.3e} s to send, more than a week; give a higher rate, fewer requests or a duration",
                        n.saturating_sub(1) as f64 / r
                    ),
                ));
            }
        }
        if self.num_requests.is_none() && self.duration_s.is_none() {
            return Err(Invalid::new(
                "arrivals",
                "unbounded; give num_requests (--num-requests) or duration_s (--duration)",
            ));
        }
        if (self.rates.contains(&None) || self.sweep.is_some())
            && self.max_concurrency.is_none()
            && self.num_requests.is_none()
        {
            return Err(Invalid::new(
                "arrivals.num_requests",
                "an unbounded rate without max_concurrency sends every request at once: give their number (--num-requests) or a cap (--max-concurrency)",
            ));
        }
        if self.num_requests.is_some_and(|n| self.warmup_requests >= n) {
            return Err(Invalid::new(
                "arrivals.warmup_requests",
                "must be fewer than num_requests, or nothing is measured",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::{raise_worker, workers_raised, RAISED_NICE};

    #[test]
    fn the_pacer_wakes_a_request_no_earlier_than_its_time_and_says_when() {
        let pacer = Pacer::start();
        let at = Instant::now() + Duration::from_millis(5);
        let woken = pacer.wake_at(at).blocking_recv().expect("the pacer is running");
        assert!(woken >= at, "woken {:?} before its time", at - woken);
        // An instant already past wakes at once.
        let past = Instant::now();
        assert!(pacer.wake_at(past).blocking_recv().is_ok_and(|w| w >= past));
    }

    #[test]
    fn a_worker_runs_at_the_priority_the_note_says() {
        // No other test raises a worker; this one raises only the thread it starts.
        let (fifo, nice) = std::thread::spawn(|| {
            raise_worker();
            // SAFETY: plain system calls on the calling thread.
            #[cfg(target_os = "linux")]
            return unsafe {
                let policy = libc::sched_getscheduler(0) & !libc::SCHED_RESET_ON_FORK;
                (policy == libc::SCHED_FIFO, libc::getpriority(libc::PRIO_PROCESS, 0))
            };
            #[cfg(not(target_os = "linux"))]
            (false, 0)
        })
        .join()
        .unwrap();
        let raised = workers_raised().expect("a worker asked");
        match raised {
            Workers::Realtime => assert!(fifo),
            Workers::Nice => assert!(!fifo && nice == RAISED_NICE),
            Workers::Normal => assert!(!fifo && nice != RAISED_NICE),
        }
        let note = pacer_note(true, Some(raised));
        assert_eq!(note.contains("workers at real-time"), fifo, "{note}");
        let workers = workers_note(Some(raised)).unwrap();
        assert_eq!(workers.contains("ran at real-time"), fifo, "{workers}");
        assert_eq!(workers_note(None), None, "no worker asked: nothing to say");
        // Each note says something the others do not.
        for notes in [pacer_notes().into_iter().map(|(note, _)| note).collect(), workers_notes()] {
            for (i, a) in notes.iter().enumerate() {
                assert!(notes[i + 1..].iter().all(|b| a != b), "{a}");
            }
        }
        assert_eq!(workers_notes().len(), 3);
    }

    #[test]
    fn schedules_are_reproducible_and_have_the_rate_asked() {
        let a = schedule(7, 50.0, 1.0, 20_000, None);
        assert_eq!(a, schedule(7, 50.0, 1.0, 20_000, None));
        assert_ne!(a, schedule(8, 50.0, 1.0, 20_000, None));
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        let rate = (a.len() - 1) as f64 / a[a.len() - 1];
        assert!((rate - 50.0).abs() < 2.0, "{rate}");
        // Burstier arrivals: the same mean gap, a larger spread (coefficient of variation 1/sqrt(k)).
        let cv = |s: &[f64]| {
            let gaps: Vec<f64> = s.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt() / mean
        };
        let (poisson, bursty, even) =
            (cv(&a), cv(&schedule(7, 50.0, 0.25, 20_000, None)), cv(&schedule(7, 50.0, 16.0, 20_000, None)));
        assert!(
            (poisson - 1.0).abs() < 0.05 && (bursty - 2.0).abs() < 0.15 && (even - 0.25).abs() < 0.02,
            "{poisson} {bursty} {even}"
        );
        // A duration bounds it too.
        let short = schedule(7, 50.0, 1.0, 20_000, Some(2.0));
        assert!(short.iter().all(|t| *t <= 2.0) && short.len() > 60 && short.len() < 140, "{}", short.len());
    }
}
