//! The machine's holds on the client, as its stall probe saw them (`--stall-probe`,
//! [`crate::probe`]), and the part of each open-loop send delay they account for.
//!
//! The pacer's late wakes are the machine's by construction (it runs above the client), but a
//! hold that begins after a wake and before the send counts in `send_delay`, the client's part.
//! A probe thread per CPU, above the pacer, records every wake of its own that came late: a
//! span of time the machine kept that CPU from the client. The part of a request's send delay
//! that overlaps such a span on the CPU it was sent from is held ([`split_send`]); the rest is
//! what the client itself took. The summary's columns of the split are
//! serving-bench's.

use crate::record::RequestRecord;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One span in which the machine kept a CPU from the client: the probe pinned to `cpu` was due
/// at `from_s` and ran at `to_s` (seconds on the run's clock).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stall {
    pub cpu: usize,
    pub from_s: f64,
    pub to_s: f64,
}

/// What the probe saw over one open-loop group of one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MachineStalls {
    pub runtime: String,
    /// The group's load, as the summary names it (`rate500`, ...).
    pub load: String,
    /// The CPUs watched: every one the client may run on, a probe thread pinned to each.
    pub cpus: Vec<usize>,
    /// How often each probe woke, seconds.
    pub period_s: f64,
    /// How late a wake had to be to count as a stall, seconds.
    pub min_stall_s: f64,
    /// The span watched on every CPU: from before the group's first request to after its last
    /// end (seconds on the run's clock).
    pub from_s: f64,
    pub to_s: f64,
    /// Wakes over every CPU, and the CPU time the probes took: what watching cost the server.
    pub wakes: u64,
    pub cpu_time_s: f64,
    /// Each CPU's spans in time order, none overlapping another of the same CPU.
    pub stalls: Vec<Stall>,
}

/// A send delay ([`RequestRecord::send_delay`]) in its two parts: what a stall of the CPU the
/// request was sent from overlaps (`held`), and the rest, the client's own (`own`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendSplit {
    pub held: f64,
    pub own: f64,
}

/// `r`'s send delay split by `stalls`; `None` where it has no send delay or no recorded CPU.
pub fn split_send(r: &RequestRecord, stalls: &[Stall]) -> Option<SendSplit> {
    let (ready, sent, cpu) = (r.ready_s()?, r.sent_s?, r.sent_cpu?);
    let delay = sent - ready;
    let held: f64 =
        stalls.iter().filter(|s| s.cpu == cpu).map(|s| (s.to_s.min(sent) - s.from_s.max(ready)).max(0.0)).sum();
    // Spans of one CPU never overlap (the audit holds them to it), so the sum is within the
    // delay; the bound keeps a forged file's overlap from making an own part below zero.
    let held = held.min(delay);
    Some(SendSplit { held, own: delay - held })
}

/// What the artifact says of the probe, where one ran.
pub const NOTE: &str = "Open loops under --stall-probe: a thread per CPU, pinned to it at real-time priority SCHED_FIFO 3 (above the client's pacer and workers), woke every millisecond; each wake more than 0.1 ms late is a stall of that CPU, machine_stalls[].stalls[] from when it was due to when it ran (the machine held the CPU: the kernel, or the host pausing the virtual CPU). send_held is the part of send_delay that overlaps a stall of the CPU the request was sent from (sent_cpu); send_own is the rest, what the client itself took. A stall is seen from its due wake on, so up to a millisecond of one may count as the client's own; the probes' CPU time is in stall_probe_cpu_s.";
