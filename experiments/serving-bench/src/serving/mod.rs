//! The serving benchmark (seed 001): per-request records, the metric definitions, and the
//! per-(target, concurrency) summary with the seed's field names. Shared by the binary, which
//! measures, and the checks the audit runs through [`crate::ServingBench`], which recomputes
//! every summary from the records.
//!
//! Metric definitions (every artifact records them, [`measurement_notes`]): `ttft` is request
//! start to the first chunk with non-empty generated text; `total` is request start to end of stream; `decode_tps` is Ollama's
//! `eval_count / eval_duration` when the server gives it, else `output_tokens / (total - ttft)`;
//! `tpot` is `(total - ttft) / (output_tokens - 1)`; `request_tps` is `output_tokens / total`;
//! `aggregate_output_tps` is a round's successful output tokens over that round's wall time.
//! Percentiles interpolate linearly between order statistics.
//!
//! One module per job: `record` (what is recorded of a request, a target, a workload), `params`
//! (the parameters and their checks), `agreement` (checked outputs: what an answer says of itself,
//! and whether targets gave the same ones), `summary` (the arithmetic the audit repeats), `server`
//! (what the targets' `/metrics` said, and its columns), `stall` (the machine's holds the stall
//! probe saw, and the send delay they account for), `artifact` (the file a run writes).

mod agreement;
mod artifact;
mod params;
mod record;
mod server;
mod stall;
mod summary;

pub use agreement::{
    compare, differing_prompts, explain, output_inconsistency, parted, verdict, Agreement, Candidate, Difference,
    Explanation, Parted, TokenChoice, NEAR_TIE_NATS, PROBE_CANDIDATES,
};
pub use artifact::{default_prompts, measurement_notes, ClientHost, EmbeddedKv, ServingArtifact};
pub use params::{
    Arrivals, Endpoint, Metric, Parameters, Sampling, CLIENT_FIELDS, MAX_COUNT, MAX_RATE, MAX_STOPS, MAX_SWEEP,
    SLO_METRICS,
};
pub(crate) use params::{MAX_TIMEOUT_S, SCRAPE_INTERVAL_S};
pub use record::{Arrival, ErrorClass, Kind, RequestRecord, Runtime, TokenSource, UnknownKind, WorkloadRecord};
#[cfg(test)]
pub(crate) use server::columns as server_columns;
pub use server::{dialect_of, Gauge, Scrape, ServerSeries, DIALECTS};
pub(crate) use server::{kept as server_kept, series_problem};
pub use stall::NOTE as STALL_NOTE;
pub use stall::{split_send, MachineStalls, SendSplit, Stall};
pub use summary::{
    aggregate_tps, backlog_notes, bytes_per_request, completed_rate, failed_groups, groups, load_label, summarize_all,
    summarize_artifact, unsent_turns_notes, usage_contradiction, Group,
};

/// `text` (a server's error page, a parser's complaint) on one line of at most `max_chars`: a
/// record's error and the notes that quote it stay one line each.
pub(crate) fn one_line(text: &str, max_chars: usize) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(max_chars).collect()
}
