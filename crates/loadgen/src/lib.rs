//! The load generator: everything that sends requests to a server and records what came back,
//! with no knowledge of the engine or of any experiment. serving-bench builds its artifact,
//! checks and report on it; any other experiment that measures a server can too.
//!
//! One module per job: `client` (one request, sent and timed, its stream parsed strictly, every
//! failure classified), `stream` (the SSE and NDJSON parsers), `load` (open-loop schedules, the
//! pacer and groups of requests), `workload` (what is sent: prompts, synthetic and conversation
//! workloads), `scrape` and `metrics` (a server's `/metrics` during a run, in each server's
//! dialect), `probe` and `stall` (the machine's holds on the client's CPUs), `progress` (one line
//! per group), `os` (priorities and CPUs), `record` and `group` (what is recorded of a request,
//! and requests by target and load).

pub mod client;
pub mod group;
pub mod load;
pub mod metrics;
pub mod os;
pub mod probe;
pub mod progress;
pub mod record;
pub mod scrape;
pub mod stall;
pub mod stream;
pub mod workload;

/// The largest count accepted for rounds, warm-ups, tokens and streams: far beyond any run this
/// machine can make, and small enough that their products cannot overflow.
pub const MAX_COUNT: usize = 1 << 20;

/// `text` (a server's error page, a parser's complaint) on one line of at most `max_chars`: a
/// record's error and the notes that quote it stay one line each.
pub fn one_line(text: &str, max_chars: usize) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(max_chars).collect()
}
