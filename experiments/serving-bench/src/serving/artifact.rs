//! The artifact a run writes: the seed's fields, every request, provenance; and the definitions
//! and defaults it records.

use super::params::Parameters;
use super::{RequestRecord, Runtime, WorkloadRecord};
use common::provenance::Provenance;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The machine of the client (the seed's `host`; provenance has the details).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientHost {
    pub platform: String,
    pub machine: String,
    pub rust: String,
}

/// The serving-benchmark artifact: the seed's fields plus every request and provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServingArtifact {
    pub run_id: String,
    pub created_at: String,
    pub host: ClientHost,
    pub arguments: Parameters,
    pub runtimes: Vec<Runtime>,
    /// Server versions as each reported it.
    pub versions: BTreeMap<String, serde_json::Value>,
    /// What each server said about its model.
    pub model_metadata: BTreeMap<String, serde_json::Value>,
    pub prompts: BTreeMap<String, String>,
    pub measurement_notes: BTreeMap<String, String>,
    pub completed_at: String,
    pub summary: Vec<super::SummaryRow>,
    pub requests: Vec<RequestRecord>,
    /// What was sent: the workload's source, digests and prompt lengths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRecord>,
    /// The names of the headers added to every request (`authorization` when an API key was
    /// sent); never their values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sent_headers: Vec<String>,
    /// The manifest's claims, judged on the paired rounds (the audit recomputes them).
    #[serde(default)]
    pub claims: Vec<common::evidence::ClaimResult>,
    /// The embedded server's KV cache, when it served: its budget, the most it held, and how
    /// often it preempted a request to keep the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedded_kv: Option<EmbeddedKv>,
    /// What each target's `/metrics` said during every group (`scrape_metrics_s`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_metrics: Vec<super::ServerSeries>,
    /// With `stall_probe`: what the probe saw over every open-loop group at a finite rate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_stalls: Vec<super::MachineStalls>,
    /// With `check_agreement`: every pair of targets compared answer by answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agreement: Vec<super::Agreement>,
    pub provenance: Provenance,
}

/// What the embedded server's KV pool did over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedKv {
    pub budget_bytes: usize,
    pub peak_bytes: usize,
    pub preemptions: usize,
    /// What its prefix cache did (warm-ups included); absent when reuse was off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<common::prefix::PrefixStats>,
}

/// The definitions a run of `requests` records: every artifact's, and the output checks' where
/// its answers carry digests (older runs' have neither).
pub fn measurement_notes(requests: &[RequestRecord]) -> BTreeMap<String, String> {
    let mut notes: BTreeMap<String, String> = [
        ("ttft", "Client wall time from request start until the first chunk with non-empty generated text (role-only and usage-only chunks do not count)."),
        ("total", "Client wall time from request start until the end of the stream."),
        ("decode_tps", "Ollama's eval_count / eval_duration when the server gives them; otherwise output tokens / (total - ttft)."),
        ("tpot", "(total - ttft) / (output tokens - 1)."),
        ("request_tps", "Output tokens / total."),
        ("aggregate_output_tps", "Per round: successful output tokens of the concurrency group / the round's wall time (first request start to last end)."),
        ("output_tokens", "Server usage.completion_tokens, else Ollama eval_count, else the number of chunks with generated text; each summary lists the sources used."),
        ("send_lateness", "Open loops: sent_s - scheduled_s, how late the client sent a request; client_lateness leaves out any wait for a slot under max_concurrency (sent_s - arrival.admitted_s), the part that was the client's own."),
        ("percentiles", "Linear interpolation between order statistics; every metric carries its sample count _n and its population standard deviation _std."),
        ("throughput", "Per group, over its window (first scheduled request to last end, the one goodput_rps takes): request_throughput_rps is successful requests, output_throughput_tps their output tokens, total_token_throughput_tps their prompt (as the server counted them) and output tokens, each per second."),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if requests.iter().any(|r| r.arrival.is_some_and(|a| a.woken_s.is_some())) {
        notes.insert("pacer_lateness".into(), "Open loops at a finite rate: the part of client_lateness that the client's pacer waking a request late made (arrival.woken_s - arrival.admitted_s where positive, else 0); the pacer runs above everything else of the client's, so this part is the machine's (the kernel, or the host pausing the VM). send_delay is the rest: sent_s less the later of arrival.admitted_s and arrival.woken_s, what the client took to send a request once it could.".into());
    }
    if requests.iter().any(|r| r.text_sha256.is_some()) {
        notes.insert("output_checks".into(), super::agreement::output_checks_note());
    }
    notes
}
