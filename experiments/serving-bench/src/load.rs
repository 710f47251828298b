//! Open-loop load: requests arrive on a schedule drawn before the run (Poisson, or gamma with a
//! chosen burstiness), whatever the server's answers, with an optional cap on the requests in
//! flight; or, at an unbounded rate with a cap, a closed pool whose slot refills as soon as a
//! request ends. (The seed's closed rounds, `c` requests at once per round, stay the default; see
//! `main.rs`.)
//!
//! Each request records when the schedule wanted it sent (`scheduled_s`) and when the client
//! sent it (`sent_s`): their difference is the client's lateness, which the summary reports and
//! the audit recomputes, and the audit redraws the schedule from the seed to check that it was
//! the one promised.

use crate::client::{measure, Spec, Target, Timeouts};
use crate::serving::{Arrival, Arrivals, RequestRecord, MAX_COUNT};
use crate::workload::Item;
use rand::SeedableRng;
use rand_distr::Distribution;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// One open-loop group: `arrivals` at `rate` (`None`: unbounded) against `target`, items taken
/// in turn from `items`. Returns every request, warm-up ones included (marked).
#[allow(clippy::too_many_arguments)] // one group's whole description, named at the one caller
pub async fn run_group(
    http: &reqwest::Client,
    target: &Target,
    arrivals: &Arrivals,
    rate: Option<f64>,
    items: &[Item],
    max_tokens: usize,
    seed: u64,
    timeouts: &Timeouts,
    t0: Instant,
    progress: &indicatif::ProgressBar,
) -> Vec<RequestRecord> {
    let cap = arrivals.max_concurrency.map(|n| Arc::new(tokio::sync::Semaphore::new(n)));
    let planned = arrivals.num_requests.unwrap_or(MAX_COUNT);
    let offsets = rate.map(|r| schedule(seed, r, arrivals.burstiness, planned, arrivals.duration_s));
    let start = Instant::now();
    let stop = arrivals.duration_s.map(|d| start + Duration::from_secs_f64(d));
    let pacer = Pacer::start();
    let mut tasks = tokio::task::JoinSet::new();
    let mut index = 0usize;
    loop {
        let (scheduled, slot, go) = match &offsets {
            Some(offsets) => {
                let Some(&offset) = offsets.get(index) else { break };
                let at = start + Duration::from_secs_f64(offset);
                // The task starts ahead of its time and the pacer wakes it at the instant, so
                // that then it is ready to send rather than waiting to be spawned.
                if let Some(ahead) = at.checked_sub(LEAD) {
                    tokio::time::sleep_until(ahead.into()).await;
                }
                (at, None, Some(pacer.wake_at(at)))
            }
            // Unbounded rate: each request as soon as a slot is free (all at once without a cap).
            None => {
                if index >= planned || stop.is_some_and(|s| Instant::now() >= s) {
                    break;
                }
                let slot = match &cap {
                    Some(cap) => Some(cap.clone().acquire_owned().await.expect("the semaphore is never closed")),
                    None => None,
                };
                (Instant::now(), slot, None)
            }
        };
        let item = items[index % items.len()].clone();
        let spec = Spec {
            concurrency: arrivals.max_concurrency.unwrap_or(0),
            round: 0,
            index,
            prompt_name: "",
            prompt: "",
            messages: None,
            max_tokens: item.max_tokens.unwrap_or(max_tokens),
            seed,
        };
        let (http, target, timeouts, cap) = (http.clone(), target.clone(), *timeouts, cap.clone());
        let warmup = index < arrivals.warmup_requests;
        tasks.spawn(async move {
            // With a cap and a finite rate, a request whose time came while every slot was busy
            // waits here, and the wait shows as lateness: the schedule is the users', not ours.
            if let Some(go) = go {
                // The pacer only ends after every wake-up it was given.
                let _ = go.await;
            }
            let _slot = match (slot, cap) {
                (Some(slot), _) => Some(slot),
                (None, Some(cap)) => Some(cap.acquire_owned().await.expect("the semaphore is never closed")),
                (None, None) => None,
            };
            let spec = Spec { prompt_name: &item.name, prompt: &item.prompt, messages: item.messages.as_ref(), ..spec };
            let mut record = measure(&http, &target, &spec, &timeouts, t0, Some(scheduled)).await;
            record.arrival = Some(Arrival { rate_rps: rate, warmup });
            record
        });
        index += 1;
    }
    let mut records = Vec::with_capacity(index);
    while let Some(done) = tasks.join_next().await {
        // A measuring task does not panic (every failure is a record); if one did, its record is
        // lost and the count below says so.
        if let Ok(record) = done {
            progress.inc(1);
            records.push(record);
        }
    }
    records.sort_by_key(|r| r.index);
    records
}

/// How long before its time an open-loop request's task starts.
const LEAD: Duration = Duration::from_millis(5);

/// Wakes tasks at their instants from a thread of its own, which sleeps with the operating
/// system's fine timer and spins the last stretch: the runtime's timer ticks in milliseconds,
/// and tasks spinning on the runtime's workers would take the CPU from the streams they share it
/// with.
struct Pacer {
    queue: std::sync::mpsc::Sender<(Instant, tokio::sync::oneshot::Sender<()>)>,
}

impl Pacer {
    fn start() -> Self {
        let (queue, wake_ups) = std::sync::mpsc::channel::<(Instant, tokio::sync::oneshot::Sender<()>)>();
        std::thread::spawn(move || {
            // In schedule order; the thread ends when the group drops its sender.
            for (at, wake) in wake_ups {
                const SPIN: Duration = Duration::from_micros(200);
                if let Some(rest) = at.checked_duration_since(Instant::now()).and_then(|d| d.checked_sub(SPIN)) {
                    std::thread::sleep(rest);
                }
                while Instant::now() < at {
                    std::hint::spin_loop();
                }
                let _ = wake.send(());
            }
        });
        Pacer { queue }
    }

    /// A future that completes at `at` (at once if the pacer is gone).
    fn wake_at(&self, at: Instant) -> tokio::sync::oneshot::Receiver<()> {
        let (wake, woken) = tokio::sync::oneshot::channel();
        let _ = self.queue.send((at, wake));
        woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
