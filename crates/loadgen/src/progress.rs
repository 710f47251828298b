//! The run's progress while it measures: on a terminal, a bar with the requests done and an
//! ETA, and for the group running its completed and failed requests, its rolling TTFT p50 and
//! output tokens per second; where stderr is not a terminal (a log file, CI) the same as a plain
//! line every few seconds, since a bar would print nothing there.

use crate::record::RequestRecord;
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Successful requests the rolling TTFT is taken over.
const ROLLING: usize = 32;
/// The window the rolling output rate is taken over, in seconds of the client's clock.
const RATE_WINDOW_S: f64 = 10.0;
/// How often a plain line is written when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    bar: indicatif::ProgressBar,
    terminal: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    group: String,
    ok: usize,
    failed: usize,
    /// Requests ended that are not measured (warm-ups).
    unmeasured: usize,
    /// The TTFT of the group's latest successes.
    ttfts: VecDeque<f64>,
    /// The group's successes that ended in the last seconds: (end_s, output tokens).
    ends: VecDeque<(f64, u64)>,
    /// When the group began, on the client's clock.
    group_start_s: Option<f64>,
    last_line: Option<Instant>,
}

impl Progress {
    /// A run of `total` requests (warm-ups included; 0 when unknown: the bar counts up).
    pub fn new(total: u64) -> Self {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} requests, ETA {eta} {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        let terminal = std::io::stderr().is_terminal();
        if terminal {
            // Drawn at once and ticking, so a slow first request (a long prompt's warm-up)
            // still shows the run alive.
            bar.enable_steady_tick(Duration::from_millis(500));
        }
        Progress { bar, terminal, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A group begins: its counts start again. Where stderr is no terminal this is always said,
    /// at once: a group's first request may take long (a long prompt's warm-up).
    pub fn group(&self, name: String) {
        let mut s = self.state();
        *s = State { group: name, last_line: None, ..State::default() };
        let message = format!("{}: started", s.group);
        self.bar.set_message(message.clone());
        self.plain_line(&mut s, &message);
    }

    /// A request that is not measured (a warm-up) ended.
    pub fn unmeasured(&self) {
        let mut s = self.state();
        s.unmeasured += 1;
        let message = format!("{}: {} warm-up done", s.group, s.unmeasured);
        self.bar.inc(1);
        self.bar.set_message(message.clone());
        self.plain_line(&mut s, &message);
    }

    /// A measured request ended.
    pub fn done(&self, r: &RequestRecord) {
        let mut s = self.state();
        s.group_start_s.get_or_insert(r.scheduled_s);
        match r.ttft().filter(|_| r.ok()) {
            Some(ttft) => {
                s.ok += 1;
                s.ttfts.push_back(ttft);
                if s.ttfts.len() > ROLLING {
                    s.ttfts.pop_front();
                }
                s.ends.push_back((r.end_s, r.output_tokens().0));
                let latest = s.ends.iter().map(|e| e.0).fold(f64::NEG_INFINITY, f64::max);
                s.ends.retain(|e| e.0 > latest - RATE_WINDOW_S);
            }
            None => s.failed += 1,
        }
        let message = s.message();
        self.bar.inc(1);
        self.bar.set_message(message.clone());
        self.plain_line(&mut s, &message);
    }

    /// Where stderr is no terminal, `message` as a plain line, at most one every few seconds
    /// within a group (its start is written at once).
    fn plain_line(&self, s: &mut State, message: &str) {
        if self.terminal || s.last_line.is_some_and(|t| t.elapsed() < LINE_EVERY) {
            return;
        }
        s.last_line = Some(Instant::now());
        let elapsed = self.bar.elapsed().as_secs();
        let len = self.bar.length().filter(|n| *n > 0).map_or(String::new(), |n| format!("/{n}"));
        eprintln!(
            "[{:02}:{:02}:{:02}] {}{len} requests; {message}",
            elapsed / 3600,
            elapsed / 60 % 60,
            elapsed % 60,
            self.bar.position()
        );
    }

    /// Runs `f` (which prints) with the bar out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl State {
    /// `group: 12 ok, 1 failed, TTFT p50 140 ms, 95 out tok/s`: the TTFT over the latest
    /// successes, the rate over the last seconds of the group (from its first request's
    /// schedule at the most).
    fn message(&self) -> String {
        let mut ttft: Vec<f64> = self.ttfts.iter().copied().collect();
        ttft.sort_by(f64::total_cmp);
        let p50 = records::stats::percentile_sorted(&ttft, 50.0);
        let latest = self.ends.iter().map(|e| e.0).fold(f64::NEG_INFINITY, f64::max);
        let since = (latest - RATE_WINDOW_S).max(self.group_start_s.unwrap_or(latest));
        let tokens: u64 = self.ends.iter().filter(|e| e.0 > since).map(|e| e.1).sum();
        let rate = (latest > since).then(|| tokens as f64 / (latest - since));
        let mut m = format!("{}: {} ok, {} failed", self.group, self.ok, self.failed);
        if let Some(p50) = p50 {
            m.push_str(&format!(", TTFT p50 {:.0} ms", p50 * 1000.0));
        }
        if let Some(rate) = rate {
            m.push_str(&format!(", {rate:.0} out tok/s"));
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_gives_counts_the_rolling_ttft_and_the_recent_output_rate() {
        let mut s = State { group: "llama-server c4".into(), ok: 3, failed: 1, ..State::default() };
        assert_eq!(s.message(), "llama-server c4: 3 ok, 1 failed");
        s.ttfts.extend([0.2, 0.1, 0.3]);
        s.group_start_s = Some(0.0);
        // 40 tokens ended within the last 10 s of the group's 20 s; 100 before them.
        s.ends.extend([(5.0, 100), (15.0, 10), (20.0, 30)]);
        assert_eq!(s.message(), "llama-server c4: 3 ok, 1 failed, TTFT p50 200 ms, 4 out tok/s");
    }
}
