//! A bar of bytes for work the workspace's libraries do without reporting progress (writing a
//! generated checkpoint, hashing one against its pin): the work runs on its own thread while
//! this one reads how many bytes the process has written or read so far (Linux's
//! `/proc/self/io`) and shows them against the bytes expected, with the rate and an ETA. Where
//! stderr is not a terminal, a plain line every few seconds instead; where `/proc/self/io` is
//! absent, the work runs without either.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Which of the process's byte counters the work advances.
#[derive(Debug, Clone, Copy)]
pub enum Io {
    Written,
    Read,
}

impl Io {
    fn field(self) -> &'static str {
        match self {
            Io::Written => "wchar",
            Io::Read => "rchar",
        }
    }
}

/// Runs `work`, showing `label` and the bytes it moved of `total`.
pub fn with_bytes<T: Send>(label: &str, total: u64, io: Io, work: impl FnOnce() -> T + Send) -> T {
    let Some(base) = counter(io) else { return work() };
    std::thread::scope(|scope| {
        let running = scope.spawn(work);
        let bar = indicatif::ProgressBar::new(total).with_message(label.to_string());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        let terminal = std::io::stderr().is_terminal();
        let started = Instant::now();
        let mut last_line = started;
        while !running.is_finished() {
            std::thread::sleep(Duration::from_millis(200));
            let done = counter(io).unwrap_or(base).saturating_sub(base).min(total);
            bar.set_position(done);
            if !terminal && last_line.elapsed() >= Duration::from_secs(5) {
                last_line = Instant::now();
                let rate = done as f64 / started.elapsed().as_secs_f64() / f64::from(1 << 20);
                eprintln!("{label}: {} of {} MiB, {rate:.0} MiB/s", done >> 20, total >> 20);
            }
        }
        bar.finish_and_clear();
        running.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The process's bytes written or read so far, through any file or socket.
fn counter(io: Io) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines().find_map(|l| l.strip_prefix(io.field())?.strip_prefix(':')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_a_file_takes_move_the_counter() {
        let Some(before) = counter(Io::Written) else { return };
        let tmp = tempfile::tempdir().unwrap();
        let written = with_bytes("test", 1 << 20, Io::Written, || {
            std::fs::write(tmp.path().join("f"), vec![7u8; 1 << 20]).unwrap();
            42
        });
        assert_eq!(written, 42, "the work's result comes back");
        assert!(counter(Io::Written).unwrap() - before >= 1 << 20);
    }
}
