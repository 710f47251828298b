//! The run's progress while it measures: on a terminal, a bar with the requests done and an
//! ETA, and for the group running its completed and failed requests, its rolling TTFT p50 and
//! output tokens per second; where stderr is not a terminal (a log file, CI) the same as a plain
//! line every few seconds, since a bar would print nothing there.

use crate::serving::RequestRecord;
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
        Progress { bar, terminal: std::io::stderr().is_terminal(), state: Mutex::new(State::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A group begins: its counts start again.
    pub fn group(&self, name: String) {
        let mut s = self.state();
        *s = State { group: name, last_line: s.last_line, ..State::default() };
        self.bar.set_message(s.group.clone());
    }

    /// A request that is not measured (a warm-up) ended.
    pub fn unmeasured(&self) {
        self.bar.inc(1);
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
        if !self.terminal && s.last_line.is_none_or(|t| t.elapsed() >= LINE_EVERY) {
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
        let p50 = common::stats::percentile_sorted(&ttft, 50.0);
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
