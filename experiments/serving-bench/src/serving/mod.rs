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
//! One module per job: `params` (the parameters and their checks), `agreement` (whether targets
//! gave the same answers, and why not), `summary` (the arithmetic the audit repeats), `row` (a
//! summary row's typed columns and their stored names), `artifact` (the file a run writes). What is
//! recorded of a request, a target, a scrape and a stall is the load generator's
//! (`loadgen::record`, `metrics`, `stall`), re-exported here as the artifact's parts.

mod agreement;
mod artifact;
mod params;
mod row;
mod summary;

pub use agreement::{
    compare, differing_prompts, explain, parted, verdict, Agreement, Difference, Explanation, Parted, NEAR_TIE_NATS,
};
pub use artifact::{measurement_notes, ClientHost, EmbeddedKv, ServingArtifact};
pub use loadgen::group::{completed_rate, groups, load_label, Group};
pub use loadgen::load::{Arrivals, MAX_RATE, MAX_SWEEP};
pub(crate) use loadgen::metrics::{columns as server_columns, series_problem};
pub use loadgen::metrics::{dialect_of, Gauge, Scrape, ServerSeries, DIALECTS};
pub use loadgen::record::{
    output_inconsistency, usage_contradiction, Arrival, Candidate, Endpoint, ErrorClass, Kind, RequestRecord, Runtime,
    Sampling, TokenChoice, TokenSource, UnknownKind, WorkloadRecord, PROBE_CANDIDATES,
};
pub use loadgen::record::{CLIENT_FIELDS, MAX_STOPS};
pub use loadgen::stall::NOTE as STALL_NOTE;
pub use loadgen::stall::{split_send, MachineStalls, SendSplit, Stall};
pub use loadgen::workload::default_prompts;
pub use loadgen::MAX_COUNT;
pub use params::{Metric, Parameters, SLO_METRICS};
pub(crate) use params::{MAX_TIMEOUT_S, SCRAPE_INTERVAL_S};
pub use row::{OpenLoop, Slo, Spread, Stalls, SummaryRow, Tail, Throughput, Turns};
pub use summary::{
    aggregate_tps, backlog_notes, bytes_per_request, failed_groups, summarize_all, summarize_artifact,
    unsent_turns_notes,
};

pub(crate) use loadgen::one_line;
