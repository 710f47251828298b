//! The machine's holds on the client, as its stall probe saw them (`--stall-probe`,
//! [`crate::probe`]), and the part of each open-loop send delay they account for.
//!
//! The pacer's late wakes are the machine's by construction (it runs above the client), but a
//! hold that begins after a wake and before the send counts in `send_delay`, the client's part.
//! A probe thread per CPU, above the pacer, records every wake of its own that came late: a
//! span of time the machine kept that CPU from the client. The part of a request's send delay
//! that overlaps such a span on the CPU it was sent from is `send_held`; the rest, `send_own`,
//! is what the client itself took.

use super::record::RequestRecord;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// The part of `r`'s send delay ([`RequestRecord::send_delay`]) that a stall of the CPU it was
/// sent from overlaps; `None` where it has no send delay or no recorded CPU.
pub fn send_held(r: &RequestRecord, stalls: &[Stall]) -> Option<f64> {
    let delay = r.send_delay()?;
    let (sent, cpu) = (r.sent_s?, r.sent_cpu?);
    let ready = sent - delay;
    let held: f64 =
        stalls.iter().filter(|s| s.cpu == cpu).map(|s| (s.to_s.min(sent) - s.from_s.max(ready)).max(0.0)).sum();
    // Spans of one CPU never overlap (the audit holds them to it), so the sum is within the
    // delay; the bound keeps a forged file's overlap from making an own part below zero.
    Some(held.min(delay))
}

/// A probed group's columns: how much of each send delay the machine held (`send_held_s`) and
/// what is left, the client's own (`send_own_s`), and what the probe saw and cost.
pub(crate) fn columns(probed: &MachineStalls, group: &[&RequestRecord]) -> BTreeMap<String, serde_json::Value> {
    let mut row = BTreeMap::new();
    let held: Vec<(f64, f64)> =
        group.iter().filter_map(|r| Some((send_held(r, &probed.stalls)?, r.send_delay()?))).collect();
    let own: Vec<f64> = held.iter().map(|(held, delay)| delay - held).collect();
    let held: Vec<f64> = held.iter().map(|(held, _)| *held).collect();
    for (key, values) in [("send_held_s", held), ("send_own_s", own)] {
        super::summary::put(&mut row, key, &values);
        row.insert(format!("{key}_max"), serde_json::json!(values.iter().copied().reduce(f64::max)));
    }
    let stalled: f64 = probed.stalls.iter().map(|s| s.to_s - s.from_s).sum();
    row.insert("machine_stalls".into(), serde_json::json!(probed.stalls.len()));
    row.insert("machine_stalled_s".into(), serde_json::json!(stalled));
    row.insert("stall_probe_cpu_s".into(), serde_json::json!(probed.cpu_time_s));
    row
}

/// What the artifact says of the probe, where one ran.
pub const NOTE: &str = "Open loops under --stall-probe: a thread per CPU, pinned to it at real-time priority SCHED_FIFO 3 (above the client's pacer and workers), woke every millisecond; each wake more than 0.1 ms late is a stall of that CPU, machine_stalls[].stalls[] from when it was due to when it ran (the machine held the CPU: the kernel, or the host pausing the virtual CPU). send_held is the part of send_delay that overlaps a stall of the CPU the request was sent from (sent_cpu); send_own is the rest, what the client itself took. A stall is seen from its due wake on, so up to a millisecond of one may count as the client's own; the probes' CPU time is in stall_probe_cpu_s.";

#[cfg(test)]
mod tests {
    use super::super::record::Arrival;
    use super::*;

    fn probed(stalls: Vec<Stall>) -> MachineStalls {
        MachineStalls {
            runtime: "r".into(),
            load: "rate8".into(),
            cpus: vec![0, 1],
            period_s: 0.001,
            min_stall_s: 0.0001,
            from_s: 0.0,
            to_s: 10.0,
            wakes: 20_000,
            cpu_time_s: 0.1,
            stalls,
        }
    }

    /// Admitted at 1 s, woken at `woken`, sent at `sent` from `cpu`.
    fn sent(woken: f64, sent: f64, cpu: usize) -> RequestRecord {
        let mut r = super::super::summary::tests::rec(0, 1.0, sent + 0.01, sent + 0.1, 4);
        r.sent_s = Some(sent);
        r.sent_cpu = Some(cpu);
        r.arrival = Some(Arrival { rate_rps: Some(8.0), warmup: false, admitted_s: Some(1.0), woken_s: Some(woken) });
        r
    }

    #[test]
    fn a_send_delay_is_held_where_a_stall_of_its_cpu_overlaps_it() {
        let stalls = [
            Stall { cpu: 0, from_s: 1.001, to_s: 1.004 },
            Stall { cpu: 1, from_s: 1.000, to_s: 1.010 },
            Stall { cpu: 0, from_s: 1.009, to_s: 1.020 },
        ];
        // Ready at 1.000 (woken on time), sent at 1.010 from CPU 0: held 1.001-1.004 and
        // 1.009-1.010; CPU 1's stall is not its own.
        let r = sent(1.0, 1.010, 0);
        let held = send_held(&r, &stalls).unwrap();
        assert!((held - 0.004).abs() < 1e-9, "{held}");
        // The same send from CPU 1 was held throughout.
        assert!((send_held(&sent(1.0, 1.010, 1), &stalls).unwrap() - 0.010).abs() < 1e-9);
        // Woken late at 1.005: only from then on is it the send's.
        assert!((send_held(&sent(1.005, 1.010, 0), &stalls).unwrap() - 0.001).abs() < 1e-9);
        // Without a recorded CPU nothing is held, and nothing counts as the client's own either.
        let mut unknown = sent(1.0, 1.010, 0);
        unknown.sent_cpu = None;
        assert_eq!(send_held(&unknown, &stalls), None);
        // Overlapping spans (a forged file) never make the held part exceed the delay.
        let forged = [Stall { cpu: 0, from_s: 0.9, to_s: 1.1 }, Stall { cpu: 0, from_s: 0.9, to_s: 1.1 }];
        assert!((send_held(&r, &forged).unwrap() - 0.010).abs() < 1e-9);
    }

    #[test]
    fn held_and_own_parts_make_each_send_delay_whole() {
        let group = [sent(1.0, 1.010, 0), sent(1.0, 1.0005, 1), sent(1.002, 1.003, 0)];
        let refs: Vec<&RequestRecord> = group.iter().collect();
        let row = columns(&probed(vec![Stall { cpu: 0, from_s: 1.001, to_s: 1.004 }]), &refs);
        // Held 3 ms, 0 and 1 ms; own 7 ms, 0.5 ms and 0.
        let v = |k: &str| row[k].as_f64().unwrap();
        assert!((v("send_held_s_max") - 0.003).abs() < 1e-9);
        assert!((v("send_own_s_max") - 0.007).abs() < 1e-9);
        assert!((v("send_held_s_mean") + v("send_own_s_mean") - (0.010 + 0.0005 + 0.001) / 3.0).abs() < 1e-9);
        assert_eq!(row["machine_stalls"], 1);
        assert!((v("machine_stalled_s") - 0.003).abs() < 1e-9);
    }
}
