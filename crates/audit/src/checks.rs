//! The audit's generic checks of one artifact, each adding its findings: the recorded command
//! line, provenance's own facts, the schema, the manifest, the model pin, the claims, and that no
//! home path or secret leaked into it.

use crate::guarded;
use common::claim::Claim;
use common::evidence::ClaimResult;
use common::experiment::{AnyExperiment, AnyManifest};
use common::finding::{diff_values, Findings, Severity};
use common::manifest::{manifest_sha256, read_experiment_manifest};
use common::workspace::Workspace;
use serde_json::Value;

/// `provenance.argv` must be the command line the recorded settings came from, and with the
/// manifest's parameters it must give the recorded effective ones: an edited argv, or parameters
/// edited to look like the manifest's own (with the seal recomputed), would otherwise pass.
pub(crate) fn check_argv(kind: &dyn AnyExperiment, manifest: Option<&AnyManifest>, body: &Value, f: &mut Findings) {
    let argv: Option<Vec<String>> =
        body.pointer("/provenance/argv").and_then(|v| serde_json::from_value(v.clone()).ok());
    let Some(argv) = argv.filter(|a| !a.is_empty()) else {
        return f.wrong("invariants", "provenance.argv", "missing or empty");
    };
    let parameters = manifest.map(|m| &m.parameters);
    let settings = match guarded(|| kind.settings(&argv, parameters)) {
        Ok(Ok(settings)) => settings,
        Ok(Err(e)) => {
            return f.wrong(
                "invariants",
                "provenance.argv",
                format!("does not parse as a {} command line: {e}", kind.name()),
            )
        }
        Err(panic) => return f.wrong("invariants", "provenance.argv", format!("parsing it panicked: {panic}")),
    };
    let recorded = |key: &str| body.pointer(&format!("/provenance/settings/{key}")).cloned().unwrap_or(Value::Null);
    if let Some((field, msg)) =
        diff_values(&recorded("requested"), &settings.requested, "provenance.settings.requested").into_iter().next()
    {
        f.wrong(
            "invariants",
            "provenance.argv",
            format!("the command line does not give the recorded settings: {field}: {msg}"),
        );
    }
    if let Some(effective) = settings.effective {
        if let Some((field, msg)) =
            diff_values(&recorded("effective"), &effective, "provenance.settings.effective").into_iter().next()
        {
            f.wrong(
                "parameters",
                field,
                format!("not what the manifest's parameters and the command line give: {msg}"),
            );
        }
    }
}

/// The provenance block's facts agree among themselves: the run's times read as times, in order,
/// and its id is its start's; the program is the experiment's binary; the build is of a target
/// for the host's architecture, in a profile cargo has; the commit is a commit id. A fact edited
/// by hand into a form no run writes shows here.
pub(crate) fn check_provenance(body: &Value, f: &mut Findings) {
    let provenance = body.get("provenance").and_then(|p| serde_json::from_value(p.clone()).ok());
    let Some(p): Option<common::provenance::Provenance> = provenance else { return };
    match (common::provenance::parse_time(&p.started_at), common::provenance::parse_time(&p.finished_at)) {
        (Some(start), Some(end)) if start <= end => {
            let id = start.format("%Y%m%dT%H%M%SZ").to_string();
            let suffix = p.run_id.strip_prefix(&id).and_then(|s| s.strip_prefix('-'));
            if !suffix
                .is_some_and(|s| s.len() == 4 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
            {
                f.wrong(
                    "invariants",
                    "provenance.run_id",
                    format!("`{}` is not the id of a run started at {}", p.run_id, p.started_at),
                );
            }
        }
        (Some(_), Some(_)) => f.wrong("invariants", "provenance.finished_at", "before the run started"),
        (None, _) => f.wrong("invariants", "provenance.started_at", "not an RFC 3339 time"),
        (_, None) => f.wrong("invariants", "provenance.finished_at", "not an RFC 3339 time"),
    }
    let program = p.argv.first().map(|a| a.rsplit(['/', '\\']).next().unwrap_or_default());
    if program != Some(p.experiment.as_str()) {
        f.wrong(
            "invariants",
            "provenance.argv[0]",
            format!("{program:?}, but the experiment's binary is `{}`", p.experiment),
        );
    }
    if p.build.target.split('-').next() != Some(p.host.arch.as_str())
        || !["debug", "release"].contains(&p.build.profile.as_str())
    {
        f.wrong(
            "invariants",
            "provenance.build",
            "not a build cargo makes for the host's architecture (target, profile)",
        );
    }
    if let Some(git) =
        p.git.as_ref().filter(|g| !(g.commit.len() == 40 && g.commit.bytes().all(|b| b.is_ascii_hexdigit())))
    {
        f.wrong("invariants", "provenance.git.commit", format!("`{}` is not a commit id", git.commit));
    }
    check_copies(body, &p, f);
}

/// The fields an artifact repeats from its provenance, for a reader's convenience, say what
/// provenance says: its `run_id`, its `model_id` (the pinned model's repository; an unpinned run
/// names its folder, which nothing else records) and its `parameters` (the effective settings).
/// Nothing else reads them, so an edit of one would otherwise pass.
fn check_copies(body: &Value, p: &common::provenance::Provenance, f: &mut Findings) {
    if let Some(run_id) = body.get("run_id").filter(|id| id.as_str() != Some(p.run_id.as_str())) {
        f.wrong("invariants", "run_id", format!("{run_id}, but provenance.run_id is `{}`", p.run_id));
    }
    let repo = p.model.as_ref().and_then(|m| m.repo.as_deref());
    if let Some((model_id, repo)) = body.get("model_id").zip(repo).filter(|(id, repo)| id.as_str() != Some(repo)) {
        f.wrong("invariants", "model_id", format!("{model_id}, but provenance.model.repo is `{repo}`"));
    }
    let effective = body.pointer("/provenance/settings/effective").filter(|e| !e.is_null());
    if let Some((parameters, effective)) = body.get("parameters").zip(effective) {
        if let Some((field, _)) = diff_values(parameters, effective, "parameters").into_iter().next() {
            f.wrong("invariants", field, "not what provenance.settings.effective records");
        }
    }
}

pub(crate) fn check_schema(ws: &Workspace, experiment: &str, version: u64, body: &Value, f: &mut Findings) {
    let name = format!("{experiment}-artifact.v{version}");
    let path = ws.root.join("schemas").join(format!("{name}.json"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        return f.wrong(
            "schema",
            "provenance.schema_version",
            format!(
                "{version}: no committed schema schemas/{name}.json for it; this workspace writes no such artifact"
            ),
        );
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

pub(crate) fn check_manifest(ws: &Workspace, rel: &str, body: &Value, f: &mut Findings) -> Option<AnyManifest> {
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

/// The stored verdicts against the ones the recorded rounds give, and (for a run with its
/// manifest's parameters) the claims judged against the ones the manifest states.
pub(crate) fn check_claims(kind: &dyn AnyExperiment, stated: Option<&[Claim]>, body: &Value, f: &mut Findings) {
    let stored: Vec<ClaimResult> = match body.get("claims") {
        None => Vec::new(),
        Some(v) => match serde_json::from_value(v.clone()) {
            Ok(s) => s,
            Err(e) => return f.wrong("claims", "claims", format!("does not read as judged claims: {e}")),
        },
    };
    let mut judged: Vec<Claim> = Vec::new();
    for r in &stored {
        if !judged.iter().any(|c| c.id == r.claim.id) {
            judged.push(r.claim.clone());
        }
    }
    let recomputed = common::evidence::judge(&judged, &kind.observations(body));
    for i in 0..stored.len().max(recomputed.len()) {
        let (s, r) = (stored.get(i), recomputed.get(i));
        if s != r {
            let json = |x: Option<&ClaimResult>| x.and_then(|x| serde_json::to_value(x).ok()).unwrap_or(Value::Null);
            let (field, stored_value, given) = first_difference(&json(s), &json(r), format!("claims[{i}]"))
                .unwrap_or_else(|| (format!("claims[{i}]"), json(s), json(r)));
            f.wrong("claims", field, format!("stored {stored_value}, but the recorded rounds give {given}"));
        }
    }
    if let Some(stated) = stated {
        if stated != judged.as_slice() {
            f.add(
                Severity::Stale,
                "claims",
                "claims",
                "the run judged other claims than its manifest states now: re-run to judge the manifest's",
            );
        }
    }
}

/// The first place where two JSON values differ, as its path and the two values there: what a
/// finding names, rather than two whole objects that look alike.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<(String, Value, Value)> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x
            .iter()
            .map(|(k, v)| (k, v, y.get(k).unwrap_or(&Value::Null)))
            .chain(y.iter().filter(|(k, _)| !x.contains_key(*k)).map(|(k, w)| (k, &Value::Null, w)))
            .find_map(|(k, v, w)| first_difference(v, w, format!("{path}.{k}"))),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (v, w))| first_difference(v, w, format!("{path}[{i}]")))
        }
        (a, b) if a == b => None,
        (a, b) => Some((path, a.clone(), b.clone())),
    }
}

pub(crate) fn short(hex: &str) -> &str {
    &hex[..hex.len().min(12)]
}

pub(crate) fn check_pin(ws: &Workspace, manifest: &AnyManifest, body: &Value, f: &mut Findings) {
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
    let recorded_path = body.pointer("/provenance/manifest/model_pin_path").and_then(Value::as_str);
    if recorded_path != Some(ws.display_path(&pin_path).as_str()) {
        f.wrong(
            "pin",
            "provenance.manifest.model_pin_path",
            format!("{recorded_path:?}, but the manifest's model is pinned in {}", ws.display_path(&pin_path)),
        );
    }
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

/// Notes strings holding a home path (ours never do; the seeds may).
pub(crate) fn leaks(value: &Value, path: String, redactor: &common::artifact::Redactor, f: &mut Findings) {
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
