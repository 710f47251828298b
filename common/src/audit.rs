//! The audit: how a reviewer trusts an artifact without re-running it.
//!
//! For each artifact, in order: it parses and its seal holds; it validates against the committed
//! JSON Schema of its experiment and version; its manifest exists and is the one it ran; its
//! model pin and file digests are the manifest's; its source hash is the current code's (else it
//! is *stale*, which is not *wrong*); its parameters are the manifest's; its expectations and
//! the invariants of an honest run hold. Foreign artifacts (the Python predecessor's seeds) get
//! the checks their fields allow, and a list of what they lack.

use crate::artifact::{check_seal, SEAL_KEY};
use crate::manifest::{manifest_sha256, read_experiment_manifest, ExperimentManifest};
use crate::qwen::WeightDtype;
use crate::scheduler::study::{self, SchedulerArtifact};
use crate::workspace::Workspace;
use serde::Serialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    /// The code or a manifest changed since the run: re-run, then re-pin if intended.
    Stale,
    /// Something recorded is inconsistent, tampered with, or not what the manifest asks.
    Wrong,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; changes no verdict (e.g. what a foreign artifact lacks).
    Note,
    Stale,
    Wrong,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// Which check: parse, seal, schema, manifest, pin, source, parameters, expectations,
    /// invariants, lacks.
    pub check: &'static str,
    /// The JSON path of the field concerned.
    pub field: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub artifact: String,
    pub experiment: Option<String>,
    pub manifest: Option<String>,
    pub verdict: Verdict,
    pub findings: Vec<Finding>,
}

impl Report {
    /// The first finding that decided the verdict, or the first note.
    pub fn first_reason(&self) -> String {
        let worst = self.findings.iter().map(|f| f.severity).max().unwrap_or(Severity::Note);
        if worst == Severity::Note {
            return match self.findings.len() {
                0 => "all checks passed".into(),
                n => format!("all checks passed ({n} notes)"),
            };
        }
        self.findings
            .iter()
            .find(|f| f.severity == worst)
            .map(|f| if f.field.is_empty() { f.message.clone() } else { format!("{}: {}", f.field, f.message) })
            .unwrap_or_else(|| "all checks passed".into())
    }
}

struct Findings(Vec<Finding>);

impl Findings {
    fn add(&mut self, severity: Severity, check: &'static str, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Finding { severity, check, field: field.into(), message: message.into() });
    }
    fn wrong(&mut self, check: &'static str, field: impl Into<String>, message: impl Into<String>) {
        self.add(Severity::Wrong, check, field, message)
    }
    fn into_report(self, artifact: String, experiment: Option<String>, manifest: Option<String>) -> Report {
        let verdict = match self.0.iter().map(|f| f.severity).max() {
            Some(Severity::Wrong) => Verdict::Wrong,
            Some(Severity::Stale) => Verdict::Stale,
            _ => Verdict::Ok,
        };
        Report { artifact, experiment, manifest, verdict, findings: self.0 }
    }
}

/// Every JSON file under `dir` (recursively), sorted.
pub fn artifact_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The file's JSON, or the report that says why it cannot be read (the audit's first finding for
/// any artifact, ours or foreign).
fn read_json(path: &Path, shown: &str) -> Result<Value, Report> {
    let value = std::fs::read(path)
        .map_err(|e| format!("cannot read: {e}"))
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| format!("does not parse as JSON: {e}")));
    value.map_err(|e| {
        let mut f = Findings(Vec::new());
        f.wrong("parse", "", e);
        f.into_report(shown.to_string(), None, None)
    })
}

/// Audits one of our artifacts against its manifest and the current code.
pub fn audit_artifact(ws: &Workspace, path: &Path) -> Report {
    let shown = ws.display_path(path);
    let value = match read_json(path, &shown) {
        Ok(v) => v,
        Err(report) => return report,
    };
    let mut f = Findings(Vec::new());
    match check_seal(&value) {
        Ok(None) => {}
        Ok(Some(parts)) => {
            f.wrong("seal", parts[0].clone(), format!("edited after the run (seal mismatch in {})", parts.join(", ")))
        }
        Err(e) => f.wrong("seal", SEAL_KEY, e),
    }
    let mut body = value.clone();
    if let Some(map) = body.as_object_mut() {
        map.remove(SEAL_KEY);
    }
    let experiment = body.pointer("/provenance/experiment").and_then(Value::as_str).map(str::to_string);
    let version = body.pointer("/provenance/schema_version").and_then(Value::as_u64);
    let Some(experiment) = experiment else {
        f.wrong(
            "schema",
            "provenance.experiment",
            "missing: not an artifact of this project (foreign ones: --external)",
        );
        return f.into_report(shown, None, None);
    };
    check_schema(ws, &experiment, version.unwrap_or(0), &body, &mut f);

    let manifest_path = body.pointer("/provenance/manifest/path").and_then(Value::as_str).map(str::to_string);
    let manifest = match &manifest_path {
        None => {
            f.add(
                Severity::Note,
                "manifest",
                "provenance.manifest",
                "unpinned run (--model-dir without a manifest): internal checks only",
            );
            None
        }
        Some(rel) => check_manifest(ws, rel, &body, &mut f),
    };
    check_source(ws, &body, &mut f);
    if let Some(m) = &manifest {
        check_pin(ws, m, &body, &mut f);
        let recorded = body.pointer("/provenance/settings/effective").cloned().unwrap_or(Value::Null);
        for (field, msg) in diff_values(&recorded, &m.parameters, "parameters") {
            f.wrong("parameters", field, msg);
        }
    }
    match experiment.as_str() {
        "scheduler" => check_scheduler(&body, manifest.as_ref(), &mut f),
        "serving-bench" => check_serving(&body, &mut f),
        _ => {}
    }
    f.into_report(shown, Some(experiment), manifest_path)
}

fn check_schema(ws: &Workspace, experiment: &str, version: u64, body: &Value, f: &mut Findings) {
    let name = format!("{experiment}-artifact.v{version}");
    let path = ws.root.join("schemas").join(format!("{name}.json"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        f.add(
            Severity::Note,
            "schema",
            "",
            format!("no committed schema schemas/{name}.json; structure not validated"),
        );
        return;
    };
    let schema: Value = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => return f.wrong("schema", "", format!("schemas/{name}.json does not parse: {e}")),
    };
    match jsonschema::validator_for(&schema) {
        Err(e) => f.wrong("schema", "", format!("schemas/{name}.json is not a valid schema: {e}")),
        Ok(validator) => {
            if let Some(e) = validator.iter_errors(body).next() {
                let at = e.instance_path().to_string();
                f.wrong("schema", json_path(&at), format!("does not match schemas/{name}.json: {e}"));
            }
        }
    }
}

/// `/runs/0/elapsed_ms` -> `runs[0].elapsed_ms`.
fn json_path(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        if part.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(part);
        }
    }
    out
}

fn check_manifest(
    ws: &Workspace,
    rel: &str,
    body: &Value,
    f: &mut Findings,
) -> Option<ExperimentManifest<Value, Value>> {
    let path = ws.root.join(rel);
    if !path.is_file() {
        f.wrong("manifest", "provenance.manifest.path", format!("{rel} does not exist"));
        return None;
    }
    let manifest = match read_experiment_manifest::<Value, Value>(&path) {
        Ok(m) => m,
        Err(e) => {
            f.wrong("manifest", "provenance.manifest.path", e.to_string());
            return None;
        }
    };
    let recorded = body.pointer("/provenance/manifest/sha256").and_then(Value::as_str).unwrap_or_default();
    match manifest_sha256(&path) {
        Ok(now) if now != recorded => f.add(
            Severity::Stale,
            "manifest",
            "provenance.manifest.sha256",
            format!("{rel} changed since the run (recorded {}, now {})", short(recorded), short(&now)),
        ),
        Ok(_) => {}
        Err(e) => f.wrong("manifest", "provenance.manifest.path", e.to_string()),
    }
    if body.pointer("/provenance/experiment").and_then(Value::as_str) != Some(manifest.experiment.as_str()) {
        f.wrong("manifest", "provenance.experiment", format!("the manifest is for `{}`", manifest.experiment));
    }
    Some(manifest)
}

fn short(hex: &str) -> &str {
    &hex[..hex.len().min(12)]
}

fn check_pin(ws: &Workspace, manifest: &ExperimentManifest<Value, Value>, body: &Value, f: &mut Findings) {
    let pin = match ws.model_pin(&manifest.model) {
        Ok(p) => p,
        Err(e) => return f.wrong("pin", "provenance.model.name", e.to_string()),
    };
    let model = body.pointer("/provenance/model").cloned().unwrap_or(Value::Null);
    let expect = [
        ("name", Some(pin.name.as_str())),
        ("repo", Some(pin.repo.as_str())),
        ("revision", Some(pin.revision.as_str())),
    ];
    for (key, want) in expect {
        let got = model.get(key).and_then(Value::as_str);
        if got != want {
            f.wrong("pin", format!("provenance.model.{key}"), format!("recorded {got:?}, the pin says {want:?}"));
        }
    }
    if model.get("pinned") != Some(&Value::Bool(true)) {
        f.wrong("pin", "provenance.model.pinned", "the files were not verified against the pin");
    }
    let files = model.get("files").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, want) in pin.files.iter().enumerate() {
        let got = files.iter().find(|v| v.get("path").and_then(Value::as_str) == Some(want.path.as_str()));
        match got {
            None => f.wrong("pin", format!("provenance.model.files[{i}]"), format!("{} is not recorded", want.path)),
            Some(g)
                if g.get("digest").and_then(Value::as_str) != Some(want.digest.as_str())
                    || g.get("size").and_then(Value::as_u64) != Some(want.size) =>
            {
                f.wrong(
                    "pin",
                    format!("provenance.model.files[{i}].digest"),
                    format!(
                        "{}: recorded {} differs from the pin's {}",
                        want.path,
                        g.get("digest").unwrap_or(&Value::Null),
                        want.digest
                    ),
                )
            }
            Some(_) => {}
        }
    }
    if files.len() != pin.files.len() {
        f.wrong(
            "pin",
            "provenance.model.files",
            format!("{} files recorded, the pin has {}", files.len(), pin.files.len()),
        );
    }
    let pin_path = ws.manifests_dir().join("models").join(format!("{}.json", pin.name));
    let recorded = body.pointer("/provenance/manifest/model_pin_sha256").and_then(Value::as_str).unwrap_or_default();
    if let Ok(now) = manifest_sha256(&pin_path) {
        if now != recorded {
            f.add(
                Severity::Stale,
                "pin",
                "provenance.manifest.model_pin_sha256",
                format!("the pin file changed since the run (recorded {}, now {})", short(recorded), short(&now)),
            );
        }
    }
}

fn check_source(ws: &Workspace, body: &Value, f: &mut Findings) {
    let recorded = body.pointer("/provenance/source/sha256").and_then(Value::as_str).unwrap_or_default();
    let crate_dir = body.pointer("/provenance/source/crate_dir").and_then(Value::as_str).unwrap_or_default();
    if crate_dir.is_empty() || !ws.root.join(crate_dir).is_dir() {
        return f.wrong(
            "source",
            "provenance.source.crate_dir",
            format!("`{crate_dir}` is not an experiment crate of this workspace"),
        );
    }
    match source_hash::hash_sources(&ws.root, &source_hash::hashed_roots(crate_dir)) {
        Ok(now) if now.sha256 != recorded => f.add(
            Severity::Stale,
            "source",
            "provenance.source.sha256",
            format!(
                "the code changed since the run (recorded {}, now {}); re-run it",
                short(recorded),
                short(&now.sha256)
            ),
        ),
        Ok(_) => {}
        Err(e) => f.wrong("source", "provenance.source.crate_dir", format!("cannot hash the sources: {e}")),
    }
}

/// Paths where `recorded` and `expected` differ, with both values; keys only in `recorded` are
/// unknown parameters, keys only in `expected` missing ones.
pub fn diff_values(recorded: &Value, expected: &Value, path: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    match (recorded, expected) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    None => out.push((p, format!("unknown parameter (recorded {v}), not in the manifest"))),
                    Some(w) => out.extend(diff_values(v, w, &p)),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push((
                    format!("{path}.{k}"),
                    "missing: the manifest sets it, the artifact does not record it".into(),
                ));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                out.extend(diff_values(v, w, &format!("{path}[{i}]")));
            }
        }
        (a, b) if numbers_equal(a, b) => {}
        (a, b) => out.push((path.to_string(), format!("recorded {a}, the manifest says {b}"))),
    }
    out
}

/// `0` and `0.0` are the same parameter value.
fn numbers_equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn check_scheduler(body: &Value, manifest: Option<&ExperimentManifest<Value, Value>>, f: &mut Findings) {
    let artifact: SchedulerArtifact = match serde_json::from_value(body.clone()) {
        Ok(a) => a,
        Err(e) => return f.wrong("schema", "", format!("does not read as a scheduler artifact: {e}")),
    };
    if artifact.source_sha256 != artifact.provenance.source.sha256 {
        f.wrong("invariants", "source_sha256", "differs from provenance.source.sha256");
    }
    if serde_json::to_value(&artifact.parameters).ok().as_ref() != Some(&artifact.provenance.settings.effective) {
        f.wrong("invariants", "parameters", "differs from provenance.settings.effective");
    }
    for (i, run) in artifact.runs.iter().enumerate() {
        for problem in study::run_invariants(i, run) {
            let (field, msg) = problem.split_once(": ").unwrap_or((problem.as_str(), "violated"));
            f.wrong("invariants", field, msg);
        }
        for (j, r) in run.requests.iter().enumerate() {
            match artifact.jobs.iter().find(|job| job.id == r.id) {
                Some(job) if job.prompt_tokens == r.prompt_tokens => {}
                _ => f.wrong("invariants", format!("runs[{i}].requests[{j}].prompt_tokens"), "differs from jobs[]"),
            }
        }
    }
    let (identical, differences) = study::consistency(&artifact.runs);
    if !identical {
        f.wrong("invariants", "runs", format!("output ids differ across runs: {}", differences.join("; ")));
    }
    if identical != artifact.checks.output_ids_identical || differences != artifact.checks.differences {
        f.wrong("invariants", "checks.output_ids_identical", "does not match the runs");
    }
    let summary = study::summarize_runs(&artifact.runs);
    if let Some(i) = (0..summary.len().max(artifact.summary.len())).find(|&i| summary.get(i) != artifact.summary.get(i))
    {
        f.wrong("invariants", format!("summary[{i}]"), "differs from the statistics recomputed from the runs");
    }
    if study::summarize_throughput(&artifact.runs) != artifact.throughput {
        f.wrong("invariants", "throughput", "differs from the throughput recomputed from the runs");
    }
    let ours = artifact.runs.first().map(study::run_ids).unwrap_or_default();
    let expectations: Option<study::Expectations> =
        manifest.and_then(|m| m.expectations.clone()).and_then(|e| serde_json::from_value(e).ok());
    if let Some(expected) = expectations.as_ref().and_then(|e| e.output_ids.as_ref()) {
        let cmp = study::compare_ids("manifest", &ours, expected);
        // The manifest pins F32 ids; with reduced-precision weights leaving them is recorded in
        // checks.expected (compared below), not a failure.
        let f32_weights = artifact.provenance.model.as_ref().is_none_or(|m| m.weights == WeightDtype::F32);
        if let Some(d) = cmp.first_difference.as_ref().filter(|_| f32_weights) {
            let run = artifact.runs.iter().position(|_| true).unwrap_or(0);
            f.wrong(
                "expectations",
                format!(
                    "runs[{run}].requests[{}].output_ids[{}]",
                    artifact.runs[run].requests.iter().position(|r| r.id == d.job).unwrap_or(0),
                    d.index
                ),
                format!("job {}: {:?}, the manifest pins {:?}", d.job, d.ours, d.theirs),
            );
        }
        if artifact.checks.expected.as_ref() != Some(&cmp) {
            f.wrong("invariants", "checks.expected", "does not match a fresh comparison with the manifest");
        }
    }
}

fn check_serving(body: &Value, f: &mut Findings) {
    let artifact: crate::serving::ServingArtifact = match serde_json::from_value(body.clone()) {
        Ok(a) => a,
        Err(e) => return f.wrong("schema", "", format!("does not read as a serving-bench artifact: {e}")),
    };
    if serde_json::to_value(&artifact.arguments).ok().as_ref() != Some(&artifact.provenance.settings.effective) {
        f.wrong("invariants", "arguments", "differs from provenance.settings.effective");
    }
    for (i, r) in artifact.requests.iter().enumerate() {
        let at = |k: &str| format!("requests[{i}].{k}");
        let mut times =
            vec![("scheduled_s", Some(r.scheduled_s)), ("sent_s", r.sent_s), ("first_byte_s", r.first_byte_s)];
        if r.ok() {
            times.push(("first_token_s", r.first_token_s));
        }
        times.push(("end_s", Some(r.end_s)));
        let present: Vec<(&str, f64)> = times.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        if let Some(w) = present.windows(2).find(|w| w[0].1 > w[1].1) {
            f.wrong("invariants", at(w[1].0), format!("{} is before {} {}", w[1].1, w[0].0, w[0].1));
        }
        if r.ok() && (r.first_token_s.is_none() || r.status.is_none()) {
            f.wrong("invariants", at("first_token_s"), "a successful request must have a status and a first token");
        }
        if r.ok() != r.error_detail.is_none() {
            f.wrong("invariants", at("error_detail"), "an error class and its detail come together");
        }
        if r.ok() && r.chunk_gaps_s.len() as u64 != r.chunks.saturating_sub(1) {
            f.wrong("invariants", at("chunk_gaps_s"), format!("{} gaps for {} chunks", r.chunk_gaps_s.len(), r.chunks));
        }
        if !artifact.runtimes.iter().any(|t| t.name == r.runtime) {
            f.wrong("invariants", at("runtime"), format!("`{}` is not among the runtimes", r.runtime));
        }
    }
    let fresh = crate::serving::summarize_all(&artifact.runtimes, &artifact.requests);
    for i in 0..fresh.len().max(artifact.summary.len()) {
        match (fresh.get(i), artifact.summary.get(i)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                let key = a.keys().chain(b.keys()).find(|k| a.get(*k) != b.get(*k)).cloned().unwrap_or_default();
                f.wrong(
                    "invariants",
                    format!("summary[{i}].{key}"),
                    format!(
                        "recorded {}, recomputed from the requests {}",
                        b.get(&key).unwrap_or(&Value::Null),
                        a.get(&key).unwrap_or(&Value::Null)
                    ),
                );
            }
            _ => f.wrong("invariants", format!("summary[{i}]"), "the groups differ from those of the requests"),
        }
    }
}

/// Audits a foreign artifact (the Python predecessor's seeds): recognises the experiment by its
/// fields, checks what they allow, and notes what they lack. Never fails on odd input: anything
/// unreadable is a finding.
pub fn audit_external(path: &Path, shown: String) -> Report {
    let value = match read_json(path, &shown) {
        Ok(v) => v,
        Err(report) => return report,
    };
    let mut f = Findings(Vec::new());
    if value.get("provenance").is_none() {
        f.add(
            Severity::Note,
            "lacks",
            "provenance",
            "no provenance block: code version, build, host details and model digests are unknown",
        );
    }
    let experiment = if value.get("runs").is_some() && value.get("arrival_policy").is_some() {
        external_scheduler(&value, &mut f);
        Some("scheduler")
    } else if value.get("summary").is_some() && value.get("runtimes").is_some() {
        external_serving(&value, &mut f);
        Some("serving-bench")
    } else {
        f.wrong("schema", "", "not recognised: neither a scheduler study (runs, arrival_policy) nor a serving benchmark (summary, runtimes)");
        None
    };
    let redactor = crate::artifact::Redactor { home: None, secrets: Vec::new() };
    leaks(&value, String::new(), &redactor, &mut f);
    f.into_report(shown, experiment.map(str::to_string), None)
}

/// Notes strings holding a home path (ours never do; the seeds may).
fn leaks(value: &Value, path: String, redactor: &crate::artifact::Redactor, f: &mut Findings) {
    match value {
        Value::String(s) if redactor.redact_str(s) != *s => {
            f.add(Severity::Note, "lacks", path, "holds an absolute home path (this project's artifacts never do)")
        }
        Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| leaks(v, if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, redactor, f)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| leaks(v, format!("{path}[{i}]"), redactor, f)),
        _ => {}
    }
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn external_scheduler(value: &Value, f: &mut Findings) {
    let runs = value.get("runs").and_then(Value::as_array).cloned().unwrap_or_default();
    if runs.is_empty() {
        return f.wrong("invariants", "runs", "no runs");
    }
    f.add(Severity::Note, "lacks", "runs[].timeline", "no per-step timeline: per-request numbers cannot be recomputed");
    f.add(Severity::Note, "lacks", "runs[].requests[].prompt_tokens", "no prompt token counts");
    let mut first_ids: Option<Vec<(String, Value)>> = None;
    for (i, run) in runs.iter().enumerate() {
        let requests = run.get("requests").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut last = f64::NEG_INFINITY;
        for (j, r) in requests.iter().enumerate() {
            let at = format!("runs[{i}].requests[{j}]");
            let (Some(ttft), Some(done), Some(gap)) =
                (num(r, "ttft_ms"), num(r, "completion_ms"), num(r, "max_gap_ms"))
            else {
                f.wrong("invariants", at, "lacks ttft_ms, completion_ms or max_gap_ms");
                continue;
            };
            if ttft > done {
                f.wrong("invariants", format!("{at}.ttft_ms"), format!("{ttft} > completion_ms {done}"));
            }
            if gap > done - ttft + 1e-9 {
                f.wrong(
                    "invariants",
                    format!("{at}.max_gap_ms"),
                    format!("{gap} > completion_ms - ttft_ms = {}", done - ttft),
                );
            }
            last = last.max(done);
        }
        // The predecessor read its clock once more after the last token, so its elapsed time may
        // exceed the last completion slightly; it may never fall short of it.
        match num(run, "elapsed_ms") {
            Some(e) if e + 1e-9 < last => f.wrong(
                "invariants",
                format!("runs[{i}].elapsed_ms"),
                format!("{e} is before the last completion {last}"),
            ),
            None => f.wrong("invariants", format!("runs[{i}].elapsed_ms"), "missing"),
            _ => {}
        }
        let mut ids: Vec<(String, Value)> = requests
            .iter()
            .map(|r| {
                (
                    r.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                    r.get("output_ids").cloned().unwrap_or(Value::Null),
                )
            })
            .collect();
        ids.sort_by(|a, b| a.0.cmp(&b.0));
        match &first_ids {
            None => first_ids = Some(ids),
            Some(first) if *first != ids => {
                f.wrong("invariants", format!("runs[{i}].requests"), "output ids differ from the first run's")
            }
            Some(_) => {}
        }
    }
}

fn external_serving(value: &Value, f: &mut Findings) {
    let rows = value.get("summary").and_then(Value::as_array).cloned().unwrap_or_default();
    f.add(Severity::Note, "lacks", "requests", "no per-request records: summary statistics cannot be recomputed");
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
                (None, None, None) => {
                    f.add(Severity::Note, "lacks", at(&format!("{metric}_*")), "null: never measured")
                }
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
        f.add(Severity::Note, "lacks", at("ttft_s_p99"), "no p99, no sample count n, no TPOT or inter-chunk gaps");
    }
}

/// Manifests under `manifests/<experiment>/` that no audited artifact ran.
pub fn unreproduced(ws: &Workspace, reports: &[Report]) -> Vec<String> {
    let ran: std::collections::BTreeSet<&str> = reports.iter().filter_map(|r| r.manifest.as_deref()).collect();
    ws.experiment_manifests()
        .map(|list| list.into_iter().map(|(p, _)| ws.display_path(&p)).filter(|p| !ran.contains(p.as_str())).collect())
        .unwrap_or_default()
}

/// `just pin`: the manifest with its expectations taken from a fresh artifact. Refused unless
/// the artifact is current and wrong in nothing but its expectations (an intended change is
/// pinned from an honest run, never from a broken or stale one). Returns the manifest's path,
/// its old text and the new one; the caller shows the difference and writes.
pub fn pin_from_artifact(ws: &Workspace, artifact_path: &Path) -> Result<(PathBuf, String, String), String> {
    let report = audit_artifact(ws, artifact_path);
    if let Some(bad) = report
        .findings
        .iter()
        .find(|f| f.severity == Severity::Stale || (f.severity == Severity::Wrong && f.check != "expectations"))
    {
        return Err(format!(
            "{}: cannot pin from it: {}: {} (re-run the experiment, then pin from the new artifact)",
            report.artifact, bad.field, bad.message
        ));
    }
    let rel = report
        .manifest
        .clone()
        .ok_or_else(|| format!("{}: unpinned run: there is no manifest to update", report.artifact))?;
    if report.experiment.as_deref() != Some("scheduler") {
        return Err(format!("{}: experiment {:?} pins no expectations yet", report.artifact, report.experiment));
    }
    let artifact: SchedulerArtifact = crate::artifact::read_artifact(artifact_path).map_err(|e| e.to_string())?;
    let manifest_path = ws.root.join(&rel);
    let old = std::fs::read_to_string(&manifest_path).map_err(|e| format!("{rel}: {e}"))?;
    let mut manifest: ExperimentManifest<Value, study::Expectations> =
        read_experiment_manifest(&manifest_path).map_err(|e| e.to_string())?;
    let ids = artifact.runs.first().map(study::run_ids).ok_or("the artifact has no runs")?;
    let predecessor = manifest.expectations.as_ref().and_then(|e| e.predecessor.clone());
    manifest.expectations = Some(study::Expectations { output_ids: Some(ids), predecessor });
    manifest.source_sha256 = Some(artifact.provenance.source.sha256.clone());
    let mut new = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())?;
    new.push('\n');
    Ok((manifest_path, old, new))
}

/// Lines of `new` not in `old` and vice versa, in order: a small review diff.
pub fn line_diff(old: &str, new: &str) -> Vec<String> {
    let old_lines: std::collections::BTreeSet<&str> = old.lines().collect();
    let new_lines: std::collections::BTreeSet<&str> = new.lines().collect();
    old.lines()
        .filter(|l| !new_lines.contains(l))
        .map(|l| format!("- {l}"))
        .chain(new.lines().filter(|l| !old_lines.contains(l)).map(|l| format!("+ {l}")))
        .collect()
}
