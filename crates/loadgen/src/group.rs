//! Requests by group: one target under one load, as every summary, export, claim and sweep
//! sees them, and the figures of a group the load generator itself needs (a sweep's rates come
//! from its first groups' completed rates).

use crate::record::RequestRecord;
use std::collections::BTreeMap;

/// The wall time of a round or group: from its first scheduled request to its last end.
pub fn window_s(group: &[&RequestRecord]) -> Option<f64> {
    let start = group.iter().map(|r| r.scheduled_s).fold(f64::INFINITY, f64::min);
    let end = group.iter().map(|r| r.end_s).fold(f64::NEG_INFINITY, f64::max);
    (end > start).then_some(end - start)
}

/// A group's successful requests per second of its wall time: the rate the server sustained.
pub fn completed_rate(group: &[&RequestRecord]) -> Option<f64> {
    let ok = group.iter().filter(|r| r.ok()).count();
    window_s(group).map(|w| ok as f64 / w).filter(|r| *r > 0.0)
}

/// A group's load as claims, exports and tables name it: `c4` (closed groups of 4), `rate8` or
/// `rate-inf` (an open loop's rate), `synchronous` (an unbounded rate under a cap of one).
pub fn load_label(concurrency: usize, open_loop_rate: Option<Option<f64>>) -> String {
    match open_loop_rate {
        None => format!("c{concurrency}"),
        Some(Some(rate)) => format!("rate{rate}"),
        // A closed pool of one: a request at a time.
        Some(None) if concurrency == 1 => "synchronous".into(),
        Some(None) => "rate-inf".into(),
    }
}

/// One group of measured requests: one target under one load.
pub struct Group<'a> {
    pub runtime: &'a str,
    /// [`load_label`].
    pub load: String,
    pub concurrency: usize,
    /// The open loop's rate (`Some(None)`: as fast as allowed); `None` for a closed group.
    pub rate: Option<Option<f64>>,
    pub records: Vec<&'a RequestRecord>,
}

/// The measured requests (an open loop's warm-ups left out) by target and load, the groups in the
/// order they first appear. Every summary, export and claim groups requests through this.
pub fn groups(records: &[RequestRecord]) -> Vec<Group<'_>> {
    let mut index: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut out: Vec<Group> = Vec::new();
    for r in records.iter().filter(|r| !r.arrival.is_some_and(|a| a.warmup)) {
        let rate = r.arrival.map(|a| a.rate_rps);
        let load = load_label(r.concurrency, rate);
        let i = *index.entry((r.runtime.as_str(), load.clone())).or_insert_with(|| {
            out.push(Group { runtime: &r.runtime, load, concurrency: r.concurrency, rate, records: Vec::new() });
            out.len() - 1
        });
        out[i].records.push(r);
    }
    out
}
