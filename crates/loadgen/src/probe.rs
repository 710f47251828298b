//! The stall probe (`--stall-probe`): a thread per CPU, pinned to it at real-time priority
//! above everything of the client's, that wakes every [`PERIOD`] and records each wake that came
//! more than [`MIN_STALL`] late. Nothing of the client's can delay it, so a late wake is a span
//! in which the machine kept that CPU from the client: the kernel, or the host pausing the
//! virtual CPU (on a VM whose host throttles it, one virtual CPU can stop before the other).
//! The summary sets the part of each send delay that such a span overlaps apart from the
//! client's own ([`crate::stall::split_send`]).

use crate::os::{allowed_cpus, pin, thread_cpu_time};
use crate::stall::MachineStalls;
use crate::stall::Stall;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often each probe wakes: a span is seen from its first due wake on, so up to this much of
/// one may go unseen; each wake costs the CPU a timer interrupt and two context switches.
pub const PERIOD: Duration = Duration::from_millis(1);
/// How late a wake must be to count: above a timer's usual lateness on a virtual machine.
pub const MIN_STALL: Duration = Duration::from_micros(100);
/// Above the pacer's (2) and the workers' (1).
const PROBE_PRIORITY: i32 = 3;

/// Probes running on every CPU the client may use.
pub struct Probe {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Watched>>,
    cpus: Vec<usize>,
    from: Instant,
    t0: Instant,
}

/// What one CPU's probe saw.
struct Watched {
    cpu: usize,
    wakes: u64,
    cpu_time: Duration,
    stalls: Vec<(Instant, Instant)>,
}

/// Why the probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the stall probe runs on Linux only")]
    Unsupported,
    #[error("the stall probe could not be pinned to CPU {0}")]
    Pin(usize),
    #[error(
        "the stall probe needs real-time priority (SCHED_FIFO {PROBE_PRIORITY}); run as root, with CAP_SYS_NICE or an RLIMIT_RTPRIO of {PROBE_PRIORITY} or more (ulimit -r), or drop --stall-probe"
    )]
    Priority,
}

impl Probe {
    /// Starts a probe on every CPU the calling thread may run on and returns once each runs,
    /// pinned and at real-time priority; the span watched begins then. `t0` is the run's clock
    /// origin.
    pub fn start(t0: Instant) -> Result<Probe, ProbeError> {
        let cpus = allowed_cpus().ok_or(ProbeError::Unsupported)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, readiness) = std::sync::mpsc::channel();
        let mut starts = Vec::new();
        let mut threads = Vec::new();
        for &cpu in &cpus {
            let (start, started) = std::sync::mpsc::channel::<Instant>();
            let (ready, stop) = (ready.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let set = pin(cpu).then(|| crate::os::realtime_priority(PROBE_PRIORITY));
                let _ = ready.send((cpu, set));
                match (set, started.recv()) {
                    (Some(true), Ok(from)) => watch(cpu, from, &stop),
                    _ => Watched { cpu, wakes: 0, cpu_time: Duration::ZERO, stalls: Vec::new() },
                }
            }));
            starts.push(start);
        }
        drop(ready);
        let mut problem = None;
        for (cpu, set) in readiness.iter().take(cpus.len()) {
            problem = problem.or(match set {
                None => Some(ProbeError::Pin(cpu)),
                Some(false) => Some(ProbeError::Priority),
                Some(true) => None,
            });
        }
        let from = Instant::now();
        match problem {
            Some(e) => {
                // Dropping the senders ends every thread before it watches.
                drop(starts);
                for t in threads {
                    let _ = t.join();
                }
                Err(e)
            }
            None => {
                for start in &starts {
                    let _ = start.send(from);
                }
                Ok(Probe { stop, threads, cpus, from, t0 })
            }
        }
    }

    /// Stops the probes and gives what they saw of the group of `load` against `runtime`: the
    /// span watched ends now, and a stall still under way is cut there.
    pub fn finish(self, runtime: &str, load: String) -> MachineStalls {
        let to = Instant::now();
        self.stop.store(true, Ordering::Relaxed);
        let secs = |at: Instant| at.saturating_duration_since(self.t0).as_secs_f64();
        let (mut wakes, mut cpu_time, mut stalls) = (0u64, Duration::ZERO, Vec::new());
        // A probe thread neither panics nor blocks past its next wake; if one did, its CPU's
        // stalls are missing and the record says so by its wakes.
        for w in self.threads.into_iter().filter_map(|t| t.join().ok()) {
            wakes += w.wakes;
            cpu_time += w.cpu_time;
            let cut = w.stalls.into_iter().filter(|(due, _)| *due < to).map(|(due, woke)| Stall {
                cpu: w.cpu,
                from_s: secs(due),
                to_s: secs(woke.min(to)),
            });
            stalls.extend(cut);
        }
        stalls.sort_by(|a: &Stall, b: &Stall| a.from_s.total_cmp(&b.from_s));
        MachineStalls {
            runtime: runtime.to_string(),
            load,
            cpus: self.cpus,
            period_s: PERIOD.as_secs_f64(),
            min_stall_s: MIN_STALL.as_secs_f64(),
            from_s: secs(self.from),
            to_s: secs(to),
            wakes,
            cpu_time_s: cpu_time.as_secs_f64(),
            stalls,
        }
    }
}

/// One CPU's probe, from `from` until told to stop: sleeps to each due wake and records a wake
/// later than [`MIN_STALL`]; after one, the next is due a period after it ran, so that one span
/// is one stall and no two overlap.
fn watch(cpu: usize, from: Instant, stop: &AtomicBool) -> Watched {
    let mut watched = Watched { cpu, wakes: 0, cpu_time: Duration::ZERO, stalls: Vec::new() };
    let mut due = from + PERIOD;
    while !stop.load(Ordering::Relaxed) {
        if let Some(rest) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(rest);
        }
        let woke = Instant::now();
        watched.wakes += 1;
        due = match woke.checked_duration_since(due).is_some_and(|late| late > MIN_STALL) {
            true => {
                watched.stalls.push((due, woke));
                woke + PERIOD
            }
            false => due + PERIOD,
        };
    }
    watched.cpu_time = thread_cpu_time();
    watched
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread above the probe, pinned to its CPU, spinning 5 ms holds that CPU from it as the
    /// host pausing the virtual CPU would: the probe records a stall there covering the spin.
    /// (The tests run with real-time priority allowed, as root or with CAP_SYS_NICE.)
    #[test]
    fn the_probe_sees_a_cpu_held_from_it_and_when() {
        let t0 = Instant::now();
        let probe = Probe::start(t0).expect("the stall probe at real-time priority");
        let cpu = probe.cpus[0];
        std::thread::sleep(Duration::from_millis(20));
        let (from, to) = std::thread::spawn(move || {
            assert!(pin(cpu) && crate::os::realtime_priority(PROBE_PRIORITY + 10));
            let from = Instant::now();
            while from.elapsed() < Duration::from_millis(5) {
                std::hint::spin_loop();
            }
            (from, Instant::now())
        })
        .join()
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let seen = probe.finish("r", "rate1".into());
        let secs = |at: Instant| at.duration_since(t0).as_secs_f64();
        let (from, to) = (secs(from), secs(to));
        // Due within a period of the spin's start (the first wake due while it ran, or one due
        // just before it that had not run yet), run no earlier than it ended.
        let period = PERIOD.as_secs_f64();
        let covering =
            seen.stalls.iter().find(|s| s.cpu == cpu && (s.from_s - from).abs() <= period + 1e-6 && s.to_s >= to);
        assert!(covering.is_some(), "no stall of CPU {cpu} over the spin {from}..{to}: {:?}", seen.stalls);
        assert!(seen.from_s < from && to < seen.to_s, "{seen:?}");
        assert!(seen.wakes > 40 && seen.cpu_time_s > 0.0, "{seen:?}");
        // Each CPU's stalls in order, none overlapping, each at least the threshold.
        for c in &seen.cpus {
            let mine: Vec<&Stall> = seen.stalls.iter().filter(|s| s.cpu == *c).collect();
            assert!(mine.windows(2).all(|w| w[0].to_s <= w[1].from_s), "{mine:?}");
            assert!(mine.iter().all(|s| s.to_s - s.from_s > MIN_STALL.as_secs_f64() - 1e-9), "{mine:?}");
        }
    }
}
