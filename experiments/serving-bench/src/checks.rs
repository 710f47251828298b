//! The serving benchmark's checks: the invariants of its artifacts (request times in order, every
//! summary recomputed from the per-request records), and the predecessor's seed read for what its
//! summary allows.

use crate::serving::{ErrorClass, Kind, RequestRecord};
use common::finding::Findings;
use serde_json::Value;

mod schedule;
mod series;

use schedule::{closed_rounds, open_loop, redrawn};
use series::{machine_stalls, server_series};

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// The invariants of a serving-bench artifact; every summary is recomputed from the requests (and
/// the server's view from the scrapes).
/// (The manifest pins no expectations: serving numbers are this machine's.)
pub(crate) fn audit(artifact: &crate::serving::ServingArtifact, f: &mut Findings) {
    if serde_json::to_value(&artifact.arguments).ok().as_ref() != Some(&artifact.provenance.settings.effective) {
        f.wrong("invariants", "arguments", "differs from provenance.settings.effective");
    }
    recorded_facts(artifact, f);
    redrawn(artifact, f);
    for (i, r) in artifact.requests.iter().enumerate() {
        let at = |k: &str| format!("requests[{i}].{k}");
        let admitted = r.arrival.and_then(|a| a.admitted_s);
        let mut times = vec![
            ("scheduled_s", Some(r.scheduled_s)),
            ("arrival.admitted_s", admitted),
            ("sent_s", r.sent_s),
            ("first_byte_s", r.first_byte_s),
        ];
        if r.ok() {
            times.push(("first_token_s", r.first_token_s));
        }
        times.push(("end_s", Some(r.end_s)));
        let present: Vec<(&str, f64)> = times.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        if let Some(w) = present.windows(2).find(|w| w[0].1 > w[1].1) {
            f.wrong("invariants", at(w[1].0), format!("{} is before {} {}", w[1].1, w[0].0, w[0].1));
        }
        // The pacer wakes a request at its time or later, and the client sends it after.
        if let Some(woken) = r.arrival.and_then(|a| a.woken_s) {
            if !(r.scheduled_s <= woken && r.sent_s.is_some_and(|sent| woken <= sent)) {
                f.wrong(
                    "invariants",
                    at("arrival.woken_s"),
                    format!("{woken} is not between scheduled_s {} and sent_s {:?}", r.scheduled_s, r.sent_s),
                );
            }
        }
        if r.ok() && (r.first_token_s.is_none() || r.status.is_none()) {
            f.wrong("invariants", at("first_token_s"), "a successful request must have a status and a first token");
        }
        if r.ok() != r.error_detail.is_none() {
            f.wrong("invariants", at("error_detail"), "an error class and its detail come together");
        }
        // The client counts a chunk with text, its gap after the one before and the first one's
        // time together, on every record: a failure keeps what its stream carried.
        if r.chunk_gaps_s.len() as u64 != r.chunks.saturating_sub(1) {
            f.wrong("invariants", at("chunk_gaps_s"), format!("{} gaps for {} chunks", r.chunk_gaps_s.len(), r.chunks));
        }
        if (r.chunks > 0) != r.first_token_s.is_some() {
            f.wrong(
                "invariants",
                at("chunks"),
                format!("{} chunks with text, first_token_s {:?}", r.chunks, r.first_token_s),
            );
        }
        // The gaps lie between the first chunk with text and the end of the stream (a
        // microsecond allowed per gap for the seconds' rounding).
        if let Some(first) = r.first_token_s.filter(|_| r.ok()) {
            let gaps: f64 = r.chunk_gaps_s.iter().sum();
            if !(r.chunk_gaps_s.iter().all(|g| *g >= 0.0)
                && gaps <= r.end_s - first + 1e-6 * (1.0 + r.chunk_gaps_s.len() as f64))
            {
                f.wrong(
                    "invariants",
                    at("chunk_gaps_s"),
                    format!("{gaps} s of gaps between the first chunk and the end, {} s apart", r.end_s - first),
                );
            }
        }
        // A success was answered 2xx, an HTTP status failure was not.
        let answered = r.status.map(|s| (200..300).contains(&s));
        let status_agrees = match r.error {
            None => answered == Some(true),
            Some(ErrorClass::HttpStatus) => answered == Some(false),
            Some(_) => true,
        };
        if !status_agrees {
            f.wrong("invariants", at("status"), format!("{:?} for a request whose outcome is {:?}", r.status, r.error));
        }
        // Each API's counters come from its own stream: usage from OpenAI's, eval counts from Ollama's.
        let kind = artifact.runtimes.iter().find(|t| t.name == r.runtime).map(|t| t.kind);
        let ollama_counts = [
            r.ollama_eval_count,
            r.ollama_eval_duration_ns,
            r.ollama_prompt_eval_count,
            r.ollama_prompt_eval_duration_ns,
        ];
        let usage_counts = [r.usage_completion_tokens, r.usage_prompt_tokens];
        let foreign = match kind {
            Some(Kind::OpenAi) => ollama_counts.iter().any(Option::is_some),
            Some(Kind::Ollama) => usage_counts.iter().any(Option::is_some) || !r.chunk_tokens.is_empty(),
            None => false,
        };
        if foreign {
            f.wrong(
                "invariants",
                at("runtime"),
                format!("carries counters a {} stream does not send", kind.map(Kind::name).unwrap_or_default()),
            );
        }
        if r.arrival.is_some() && r.round != 0 {
            f.wrong("invariants", at("round"), "an open-loop request is in no round (0)");
        }
        let contradiction = crate::serving::usage_contradiction(r);
        match (r.error, &contradiction) {
            (None, Some(problem)) => f.wrong(
                "invariants",
                at("usage_completion_tokens"),
                format!("counted a success, but {problem}: such a request is an inconsistent_usage failure"),
            ),
            (Some(ErrorClass::InconsistentUsage), None) => f.wrong(
                "invariants",
                at("error"),
                "inconsistent_usage, but its counts agree with its cap and its stream",
            ),
            _ => {}
        }
        let own_caps = artifact.workload.as_ref().is_some_and(|w| w.items_with_max_tokens > 0);
        if let (Some(cap), false) = (r.max_tokens, own_caps) {
            if cap != artifact.arguments.max_tokens as u64 {
                f.wrong(
                    "invariants",
                    at("max_tokens"),
                    format!(
                        "{cap}, but the run sent max_tokens {} (no item has its own)",
                        artifact.arguments.max_tokens
                    ),
                );
            }
        }
        match artifact.runtimes.iter().find(|t| t.name == r.runtime) {
            None => f.wrong("invariants", at("runtime"), format!("`{}` is not among the runtimes", r.runtime)),
            Some(t) => match (r.replica, t.replicas.len()) {
                (None, 0) => {}
                (Some(i), n) if i < n => {}
                (Some(i), n) => f.wrong("invariants", at("replica"), format!("{i}, but `{}` has {n} replicas", t.name)),
                (None, _) => {
                    f.wrong("invariants", at("replica"), format!("missing: `{}` is a group of replicas", t.name))
                }
            },
        }
    }
    checked_outputs(artifact, f);
    match &artifact.arguments.arrivals {
        Some(arrivals) => open_loop(arrivals, artifact.arguments.seed, &artifact.requests, f),
        None => {
            if let Some(i) = artifact.requests.iter().position(|r| r.arrival.is_some()) {
                f.wrong(
                    "invariants",
                    format!("requests[{i}].arrival"),
                    "an open-loop record in a run of closed rounds",
                );
            }
            closed_rounds(artifact, f);
        }
    }
    sequential(artifact, f);
    // The embedded server's KV pool kept its budget, and only an embedded server reports one.
    let embedded = artifact.runtimes.iter().any(|r| r.name.starts_with("embedded-"));
    match &artifact.embedded_kv {
        Some(kv) if kv.peak_bytes > kv.budget_bytes => f.wrong(
            "invariants",
            "embedded_kv.peak_bytes",
            format!("{} bytes, over the budget of {}", kv.peak_bytes, kv.budget_bytes),
        ),
        Some(_) if !embedded => f.wrong("invariants", "embedded_kv", "recorded, but no target is the embedded server"),
        _ => {}
    }
    for line in crate::serving::failed_groups(&artifact.requests) {
        f.note("invariants", "requests", format!("every request failed in {line}"));
    }
    server_series(artifact, f);
    machine_stalls(artifact, f);
    let fresh = crate::serving::summarize_artifact(artifact);
    for i in 0..fresh.len().max(artifact.summary.len()) {
        match (fresh.get(i), artifact.summary.get(i)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                // Column by column, under the names the artifact stores.
                let (a, b) = (a.columns(), b.columns());
                let key = a.keys().chain(b.keys()).find(|k| a.get(*k) != b.get(*k)).cloned().unwrap_or_default();
                // The server's view is the scrapes'; everything else is the requests'.
                let source = if key.starts_with("server_") { "scrapes" } else { "requests" };
                f.wrong(
                    "invariants",
                    format!("summary[{i}].{key}"),
                    format!(
                        "recorded {}, recomputed from the {source} {}",
                        b.get(&key).unwrap_or(&Value::Null),
                        a.get(&key).unwrap_or(&Value::Null)
                    ),
                );
            }
            _ => f.wrong("invariants", format!("summary[{i}]"), "the groups differ from those of the requests"),
        }
    }
}

/// The output checks, recomputed: a kept text is the one its digest names, texts are kept where
/// the run keeps them (and only on answers with a digest), each answer's inconsistency is the
/// one its record and text give, and `check_agreement`'s comparison and verdicts are the ones
/// the records and the probe's log-probabilities give.
fn checked_outputs(a: &crate::serving::ServingArtifact, f: &mut Findings) {
    let stops = &a.arguments.sampling.stop;
    let keeps = a.arguments.keeps_text();
    for (i, r) in a.requests.iter().enumerate() {
        let at = |k: &str| format!("requests[{i}].{k}");
        let Some(digest) = &r.text_sha256 else {
            if r.text.is_some() || r.inconsistency.is_some() {
                f.wrong("invariants", at("text_sha256"), "missing beside a kept text or an inconsistency");
            }
            continue;
        };
        match &r.text {
            Some(text) => {
                let own = common::digest::bytes_digest(text.as_bytes(), common::digest::Algorithm::Sha256);
                if &own != digest {
                    f.wrong("invariants", at("text"), format!("digests to {own}, not the recorded text_sha256"));
                }
            }
            None if keeps => f.wrong(
                "invariants",
                at("text"),
                "missing: a run with check_agreement or stop strings keeps every answer's text",
            ),
            None => {}
        }
        let fresh = crate::serving::output_inconsistency(r, r.text.as_deref(), stops);
        if fresh != r.inconsistency {
            f.wrong(
                "invariants",
                at("inconsistency"),
                format!("recorded {:?}, recomputed from the record {fresh:?}", r.inconsistency),
            );
        }
    }
    if !a.arguments.check_agreement {
        if !a.agreement.is_empty() {
            f.wrong("invariants", "agreement", "recorded, but the run did not check agreement");
        }
        return;
    }
    let fresh = crate::serving::compare(&a.runtimes, &a.requests);
    if fresh.len() != a.agreement.len() {
        f.wrong(
            "invariants",
            "agreement",
            format!("{} pairs, where the targets make {}", a.agreement.len(), fresh.len()),
        );
    }
    for (i, (pair, fresh)) in a.agreement.iter().zip(&fresh).enumerate() {
        let at = |k: &str| format!("agreement[{i}].{k}");
        let recomputed = crate::serving::Agreement { explanations: pair.explanations.clone(), ..fresh.clone() };
        if *pair != recomputed {
            let field = if pair.targets != fresh.targets {
                "targets"
            } else if (pair.compared, pair.identical) != (fresh.compared, fresh.identical) {
                "identical"
            } else if pair.share != fresh.share {
                "share"
            } else {
                "differences"
            };
            f.wrong("invariants", at(field), "not what the requests' texts give");
        }
        let asked: Vec<&str> = pair.explanations.iter().map(|e| e.prompt.as_str()).collect();
        let differing = crate::serving::differing_prompts(fresh);
        if asked != differing.iter().map(String::as_str).collect::<Vec<_>>() {
            f.wrong(
                "invariants",
                at("explanations"),
                format!("for {asked:?}, where the answers differ on {differing:?}"),
            );
        }
        for (j, e) in pair.explanations.iter().enumerate() {
            if crate::serving::verdict(e) != (e.margins, e.near_tie) {
                f.wrong(
                    "invariants",
                    format!("agreement[{i}].explanations[{j}].near_tie"),
                    "the margins and verdict are not what its tokens' log-probabilities give",
                );
            }
        }
    }
}

/// What the artifact states twice, or what the code writes, agrees: the client host and the
/// creation time are the provenance's (the audit's generic checks hold its run id), the
/// definitions are the code's, every request names a runtime's recorded server and a prompt the
/// artifact holds (the seed's own, for the built-in workload), and the headers sent are those the command line names (and `authorization` for an API key).
fn recorded_facts(a: &crate::serving::ServingArtifact, f: &mut Findings) {
    let p = &a.provenance;
    let host = crate::serving::ClientHost {
        platform: format!("{} {} {}", p.host.os, p.host.kernel, p.host.arch),
        machine: p.host.arch.clone(),
        rust: p.build.rustc.clone(),
    };
    if a.host != host {
        f.wrong("invariants", "host", "differs from what provenance records of the host and build");
    }
    if a.created_at != p.started_at {
        f.wrong("invariants", "created_at", "not provenance's started_at");
    }
    let notes = crate::serving::measurement_notes(&a.requests);
    let (pacer, workers) = (loadgen::load::pacer_notes(), loadgen::load::workers_notes());
    // The pacer's note tells of the workers' priority too: what `client_workers` tells, where
    // the run has that note (those made before it was added have the pacer's alone).
    let client_workers = a.measurement_notes.get("client_workers");
    let agrees = |raised: Option<loadgen::os::Workers>| {
        client_workers.is_none_or(|w| loadgen::load::workers_note(raised).as_ref() == Some(w))
    };
    let known = |(k, v): (&String, &String)| {
        notes.get(k) == Some(v)
            || (k == "send_pacer" && pacer.iter().any(|(note, raised)| note == v && agrees(*raised)))
            || (k == "client_workers" && workers.contains(v))
            || (k == "machine_stalls" && v == crate::serving::STALL_NOTE && !a.machine_stalls.is_empty())
    };
    let probed = !a.machine_stalls.is_empty();
    if a.measurement_notes.iter().any(|kv| !known(kv))
        || notes.keys().any(|k| !a.measurement_notes.contains_key(k))
        || probed != a.measurement_notes.contains_key("machine_stalls")
    {
        f.differs_from_code("measurement_notes", "are not the definitions the code records");
    }
    // The artifact is completed just after provenance is collected, at the run's end.
    let (finished, completed) =
        (common::provenance::parse_time(&p.finished_at), common::provenance::parse_time(&a.completed_at));
    let just_after = finished.zip(completed).is_some_and(|(f, c)| f <= c && (c - f).num_milliseconds() <= 1000);
    if !just_after {
        f.wrong("invariants", "completed_at", "not the run's end (within a second after provenance.finished_at)");
    }
    if let Some(w) = a.workload.as_ref().filter(|w| {
        !["builtin", "jsonl", "sharegpt", "synthetic", "shared-prefix", "conversations", "multi-turn"]
            .contains(&w.source.as_str())
    }) {
        f.wrong("invariants", "workload.source", format!("`{}` is no workload this client sends", w.source));
    }
    let names: Vec<&str> = a.runtimes.iter().map(|r| r.name.as_str()).collect();
    if names.iter().collect::<std::collections::BTreeSet<_>>().len() != names.len() {
        f.wrong("invariants", "runtimes", "a runtime is named twice");
    }
    for (field, map) in [("versions", &a.versions), ("model_metadata", &a.model_metadata)] {
        if !map.keys().map(String::as_str).eq(names.iter().copied().collect::<std::collections::BTreeSet<_>>()) {
            f.wrong("invariants", field, "one entry per runtime, by its name");
        }
    }
    if let Some(i) = a.requests.iter().position(|r| !a.prompts.contains_key(&r.prompt)) {
        f.wrong("invariants", format!("requests[{i}].prompt"), "names no prompt the artifact holds");
    }
    // Every item of a file or a draw was sent: its lengths follow from the prompts held.
    if let Some(w) = a.workload.as_ref().filter(|w| w.source != "builtin" && w.items == a.prompts.len()) {
        let s = loadgen::workload::prompt_chars(a.prompts.values().map(String::as_str));
        if (w.prompt_chars_min, w.prompt_chars_p50, w.prompt_chars_mean, w.prompt_chars_max)
            != (s.min, s.p50, s.mean, s.max)
        {
            f.wrong(
                "invariants",
                "workload.prompt_chars_mean",
                "the prompts' lengths are not what the prompts held give",
            );
        }
    }
    if a.workload.as_ref().is_some_and(|w| w.items_with_max_tokens > w.items || a.prompts.len() > w.items) {
        f.wrong("invariants", "workload.items", "fewer items than the prompts sent, or than items with their own cap");
    }
    if a.workload.as_ref().is_none_or(|w| w.source == "builtin") {
        let seed = crate::serving::default_prompts();
        if a.prompts.iter().any(|(k, v)| seed.get(k) != Some(v)) {
            f.wrong("invariants", "prompts", "are not the seed's prompts, which the built-in workload sends");
        }
        if a.workload.as_ref().is_some_and(|w| *w != loadgen::workload::Workload::builtin().record) {
            f.wrong("invariants", "workload", "is not the built-in workload's record");
        }
    }
    let asked: std::collections::BTreeSet<String> = p
        .settings
        .requested
        .get("header")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|h| Some(h.as_str()?.split_once(':')?.0.trim().to_ascii_lowercase()))
        .collect();
    let sent: std::collections::BTreeSet<String> = a.sent_headers.iter().cloned().collect();
    let extra: Vec<&String> = sent.difference(&asked).filter(|h| *h != "authorization").collect();
    if !asked.is_subset(&sent) || !extra.is_empty() {
        f.wrong(
            "invariants",
            "sent_headers",
            "are not the headers the command line names (and authorization for a key)",
        );
    }
}

/// The groups ran one after another, in the order they are recorded (a closed round's requests,
/// or an open-loop group's, all end before the next group's first is scheduled), and every request
/// within the run's recorded start and end.
fn sequential(a: &crate::serving::ServingArtifact, f: &mut Findings) {
    let key = |r: &RequestRecord| {
        (r.runtime.clone(), r.concurrency, r.round, r.arrival.map(|x| x.rate_rps.map(f64::to_bits)))
    };
    let mut previous_end = f64::NEG_INFINITY;
    let mut group_end = f64::NEG_INFINITY;
    for (i, r) in a.requests.iter().enumerate() {
        if i > 0 && key(r) != key(&a.requests[i - 1]) {
            previous_end = group_end;
        }
        if r.scheduled_s < previous_end {
            return f.wrong(
                "invariants",
                format!("requests[{i}].scheduled_s"),
                format!("{} s, before the group recorded before it ended ({previous_end} s)", r.scheduled_s),
            );
        }
        group_end = group_end.max(r.end_s);
    }
    if let (Some(wall), true) = (a.provenance.wall_s(), group_end.is_finite()) {
        // The client's clock starts just before provenance's; both are read to the millisecond.
        if group_end > wall + 0.01 {
            f.wrong(
                "invariants",
                "requests",
                format!("the last request ends at {group_end:.3} s, after the {wall:.3} s from provenance.started_at to finished_at"),
            );
        }
    }
}

/// A foreign artifact of the serving benchmark: a `summary` and `runtimes`.
pub(crate) fn recognises(value: &Value) -> bool {
    value.get("summary").is_some() && value.get("runtimes").is_some()
}

pub(crate) fn audit_foreign(value: &Value, f: &mut Findings) {
    let rows = value.get("summary").and_then(Value::as_array).cloned().unwrap_or_default();
    f.note("lacks", "requests", "no per-request records: summary statistics cannot be recomputed");
    let rounds = value.pointer("/arguments/rounds").and_then(Value::as_f64);
    for (i, row) in rows.iter().enumerate() {
        let at = |k: &str| format!("summary[{i}].{k}");
        let (req, ok, failed) = (num(row, "requests"), num(row, "successes"), num(row, "failures"));
        match (req, ok, failed) {
            (Some(r), Some(s), Some(x)) if r != s + x => {
                f.wrong("invariants", at("requests"), format!("{r} != successes {s} + failures {x}"))
            }
            (Some(_), Some(_), Some(_)) => {}
            _ => f.wrong("invariants", at("requests"), "requests, successes or failures missing"),
        }
        if let (Some(r), Some(rounds), Some(c)) = (req, rounds, num(row, "concurrency")) {
            if r != rounds * c {
                f.wrong("invariants", at("requests"), format!("{r} != rounds {rounds} x concurrency {c}"));
            }
        }
        for metric in ["ttft_s", "total_s", "prompt_tps", "decode_tps", "request_tps", "aggregate_output_tps"] {
            let (mean, p50, p95) = (
                num(row, &format!("{metric}_mean")),
                num(row, &format!("{metric}_p50")),
                num(row, &format!("{metric}_p95")),
            );
            match (mean, p50, p95) {
                (None, None, None) => f.note("lacks", at(&format!("{metric}_*")), "null: never measured"),
                (Some(_), Some(p50), Some(p95)) if p50 > p95 => {
                    f.wrong("invariants", at(&format!("{metric}_p50")), format!("{p50} > {metric}_p95 {p95}"))
                }
                (Some(m), Some(_), Some(_)) if !(m.is_finite() && m >= 0.0) => {
                    f.wrong("invariants", at(&format!("{metric}_mean")), format!("{m} is not a non-negative number"))
                }
                (Some(_), Some(_), Some(_)) => {}
                _ => f.wrong("invariants", at(metric), "mean, p50 and p95 must all be present or all null"),
            }
        }
        if let (Some(t), Some(total)) = (num(row, "ttft_s_p50"), num(row, "total_s_p50")) {
            if t > total {
                f.wrong("invariants", at("ttft_s_p50"), format!("{t} > total_s_p50 {total}"));
            }
        }
        f.note("lacks", at("ttft_s_p99"), "no p99, no sample count n, no TPOT or inter-chunk gaps");
    }
}
