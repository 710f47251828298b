//! Writing artifacts: atomically, never over an existing file, and never with a home path, a
//! user name or a secret in them.
//!
//! Redaction runs on the finished JSON value, just before it is written, so no field added later
//! can slip past it. Long arrays of records are then stored as columns ([`crate::columns`]) and
//! the seal is taken over that stored form; readers check the seal, then unpack.

use serde::Serialize;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{0} already exists; artifacts are never overwritten, pick another --out path")]
    Exists(String),
    #[error("{path}: cannot write: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("cannot serialise the artifact: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("{path}: {cause}")]
    Unpack { path: String, cause: crate::columns::UnpackError },
}

/// Where an artifact of `experiment` under `manifest` goes: `artifacts/<experiment>/<manifest>/<run_id>.json`.
pub fn default_path(artifacts_dir: &Path, experiment: &str, manifest: &str, run_id: &str) -> PathBuf {
    artifacts_dir.join(experiment).join(manifest).join(format!("{run_id}.json"))
}

/// Serialises, redacts, packs, seals and writes `artifact` to `path` atomically (temporary file
/// in the same folder, flushed and synced, then linked into place only if `path` does not exist
/// yet).
pub fn write_new<T: Serialize>(path: &Path, artifact: &T) -> Result<(), ArtifactError> {
    let mut value = serde_json::to_value(artifact)?;
    Redactor::from_env().redact(&mut value);
    let mut value = crate::columns::pack(value);
    if let Value::Object(map) = &mut value {
        let seal = seal(&value_without_seal(map));
        map.insert(SEAL_KEY.into(), serde_json::to_value(seal)?);
    }
    let mut text = String::new();
    write_text(&value, 0, &mut text);
    text.push('\n');
    write_bytes_new(path, text.as_bytes())
}

/// Indented JSON where a person reads it, one line where nobody does: objects are indented, and
/// an array takes one line when it holds no object or is a column's (under `@columns`).
fn write_text(value: &Value, indent: usize, out: &mut String) {
    write_part(value, indent, false, out)
}

fn write_part(value: &Value, indent: usize, in_columns: bool, out: &mut String) {
    fn holds_object(v: &Value) -> bool {
        match v {
            Value::Object(_) => true,
            Value::Array(items) => items.iter().any(holds_object),
            _ => false,
        }
    }
    let pad = |out: &mut String, n: usize| out.extend(std::iter::repeat_n("  ", n));
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, v)) in map.iter().enumerate() {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                pad(out, indent + 1);
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_part(v, indent + 1, in_columns || key == crate::columns::COLUMNS, out);
            }
            out.push('\n');
            pad(out, indent);
            out.push('}');
        }
        Value::Array(items) if !in_columns && holds_object(value) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                pad(out, indent + 1);
                write_part(v, indent + 1, in_columns, out);
            }
            out.push('\n');
            pad(out, indent);
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The top-level key of an artifact's seal.
pub const SEAL_KEY: &str = "seal";

/// How deep the seal's digests go: one digest per value at this depth (or shallower leaf), so a
/// changed value is located to its field, e.g. `runs[3].timeline` or `provenance.host`.
const SEAL_DEPTH: usize = 2;

/// Digests of an artifact's parts, taken when it is written. A hand edit of any recorded value
/// changes the digest of the part holding it, which the audit names. It detects edits, not
/// forgeries: whoever edits can recompute it, and provenance plus re-running is the defence there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seal {
    /// `sha256` of each part's compact JSON, first 16 hex digits.
    pub algorithm: String,
    pub digests: std::collections::BTreeMap<String, String>,
}

fn value_without_seal(map: &serde_json::Map<String, Value>) -> Value {
    Value::Object(map.iter().filter(|(k, _)| *k != SEAL_KEY).map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// The seal of an artifact value (without its `seal` key).
pub fn seal(value: &Value) -> Seal {
    let mut digests = std::collections::BTreeMap::new();
    collect_digests(value, String::new(), 0, &mut digests);
    Seal { algorithm: "sha256-16".into(), digests }
}

fn collect_digests(value: &Value, path: String, depth: usize, out: &mut std::collections::BTreeMap<String, String>) {
    let children: Vec<(String, &Value)> = match value {
        Value::Object(map) if depth < SEAL_DEPTH => {
            map.iter().map(|(k, v)| (if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, v)).collect()
        }
        Value::Array(items) if depth < SEAL_DEPTH && !path.is_empty() => {
            items.iter().enumerate().map(|(i, v)| (format!("{path}[{i}]"), v)).collect()
        }
        _ => {
            let digest = supply::digest::bytes_digest(value.to_string().as_bytes(), supply::digest::Algorithm::Sha256);
            out.insert(path, digest[..16].to_string());
            return;
        }
    };
    // Arrays count as a level only through their elements' fields, so `runs[3].timeline` is
    // reached at depth 2 even though `runs` is an array.
    for (child_path, child) in children {
        let next = if matches!(value, Value::Array(_)) { depth } else { depth + 1 };
        collect_digests(child, child_path, next, out);
    }
}

/// Why an artifact's seal cannot be checked.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SealError {
    #[error("the artifact is not a JSON object")]
    NotAnObject,
    #[error("it has no seal")]
    Missing,
    #[error("its seal does not parse: {0}")]
    Unreadable(String),
}

/// Checks an artifact's seal; `Ok(None)` when it holds, `Ok(Some(parts))` naming the parts whose
/// digest changed (or appeared, or vanished).
pub fn check_seal(artifact: &Value) -> Result<Option<Vec<String>>, SealError> {
    let map = artifact.as_object().ok_or(SealError::NotAnObject)?;
    let recorded: Seal = serde_json::from_value(map.get(SEAL_KEY).cloned().ok_or(SealError::Missing)?)
        .map_err(|e| SealError::Unreadable(e.to_string()))?;
    let fresh = seal(&value_without_seal(map));
    let mut changed: Vec<String> = fresh
        .digests
        .iter()
        .filter(|(k, v)| recorded.digests.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(recorded.digests.keys().filter(|k| !fresh.digests.contains_key(*k)).cloned())
        .collect();
    changed.sort();
    changed.dedup();
    Ok((!changed.is_empty()).then_some(changed))
}

/// An artifact's records as they were made: the seal set aside and columns back into rows.
/// Check the seal first (with [`check_seal`], on the value as stored) where that matters.
pub fn body(mut stored: Value) -> Result<Value, crate::columns::UnpackError> {
    if let Value::Object(map) = &mut stored {
        map.shift_remove(SEAL_KEY);
    }
    crate::columns::unpack(stored)
}

/// Reads an artifact into its type, leaving the seal aside (check it with [`check_seal`]).
pub fn read_artifact<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ArtifactError> {
    let shown = || path.display().to_string();
    let bytes = std::fs::read(path).map_err(|cause| ArtifactError::Io { path: shown(), cause })?;
    let value =
        body(serde_json::from_slice(&bytes)?).map_err(|cause| ArtifactError::Unpack { path: shown(), cause })?;
    Ok(serde_json::from_value(value)?)
}

/// Atomically replaces (or creates) `path` with `bytes`: for reviewed files such as manifests,
/// where a crash must leave the old version or the new one, never half of one.
pub fn write_replace(path: &Path, bytes: &[u8]) -> Result<(), ArtifactError> {
    let io = |cause| ArtifactError::Io { path: path.display().to_string(), cause };
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new().prefix(".partial-").tempfile_in(parent).map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// Atomic, no-clobber write of raw bytes.
pub(crate) fn write_bytes_new(path: &Path, bytes: &[u8]) -> Result<(), ArtifactError> {
    let io = |cause| ArtifactError::Io { path: path.display().to_string(), cause };
    if path.exists() {
        return Err(ArtifactError::Exists(path.display().to_string()));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(io)?;
    let mut tmp = tempfile::Builder::new().prefix(".partial-").tempfile_in(parent).map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist_noclobber(path).map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            ArtifactError::Exists(path.display().to_string())
        } else {
            io(e.error)
        }
    })?;
    Ok(())
}

/// Replaces home paths with `~` and secret values with `<redacted>` in every string of a value.
pub struct Redactor {
    /// This machine's home folder, replaced wherever it starts a path.
    pub home: Option<String>,
    /// Values to replace wherever they occur.
    pub secrets: Vec<String>,
}

/// Environment variable names that hold credentials.
fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"].iter().any(|w| upper.contains(w))
}

/// Values this process was given as secrets (an API key from a variable of any name, a header's
/// credentials): every artifact it writes has them redacted, like the environment's.
static KEPT_SECRETS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Redacts `value` from every artifact this process writes from now on.
pub fn keep_secret(value: &str) {
    if !value.is_empty() {
        KEPT_SECRETS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(value.to_string());
    }
}

impl Redactor {
    pub fn from_env() -> Self {
        let home = std::env::var("HOME").ok().map(|h| h.trim_end_matches('/').to_string()).filter(|h| h.len() > 1);
        let mut secrets: Vec<String> =
            std::env::vars().filter(|(k, v)| is_secret_name(k) && v.len() >= 6).map(|(_, v)| v).collect();
        secrets.extend(KEPT_SECRETS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).iter().cloned());
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { home, secrets }
    }

    pub(crate) fn redact(&self, value: &mut Value) {
        match value {
            Value::String(s) => *s = self.redact_str(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.redact(v)),
            _ => {}
        }
    }

    pub fn redact_str(&self, s: &str) -> String {
        let mut out = s.to_string();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "<redacted>");
            }
        }
        out = redact_url_credentials(&out);
        if let Some(home) = &self.home {
            out = replace_path_prefix(&out, home);
        }
        // Any other user's home, e.g. a path copied from another machine.
        for root in ["/home/", "/Users/"] {
            while let Some(at) = out.find(root) {
                let rest = &out[at + root.len()..];
                let user_len = rest.find(['/', '"', ' ', '\n', ':']).unwrap_or(rest.len());
                out.replace_range(at..at + root.len() + user_len, "~");
            }
        }
        replace_path_prefix(&out, "/root")
    }
}

/// Replaces the user information of every URL in `s` (`scheme://user:password@host`) with
/// `<redacted>`: a target given with credentials uses them, and no artifact, export or printed
/// line keeps them (binaries pass every error line through it before printing).
pub fn redact_url_credentials(s: &str) -> String {
    const MARK: &str = "<redacted>";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends at the path, query, fragment, or whatever cannot be in a URL.
        let end = tail.find(|c: char| "/?#\"' ,;".contains(c) || c.is_whitespace()).unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(userinfo) if &tail[..userinfo] != MARK => {
                out.push_str(MARK);
                rest = &tail[userinfo..];
            }
            _ => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

/// Replaces `prefix` with `~` wherever it starts a path (followed by `/`, a quote, space or end).
fn replace_path_prefix(s: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        let boundary = after.is_empty() || after.starts_with(['/', '"', ' ', '\n', ':']);
        let starts_path = at == 0 || rest[..at].ends_with([' ', '=', '"', ':', '\n', '\'']);
        out.push_str(&rest[..at]);
        out.push_str(if boundary && starts_path { "~" } else { prefix });
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seal_names_the_part_that_was_edited() {
        let mut v = serde_json::json!({
            "model_id": "m",
            "runs": [{"elapsed_ms": 1.5, "requests": [{"ttft_ms": 1.0}]}, {"elapsed_ms": 2.0, "requests": []}],
            "provenance": {"host": {"cores": 2}, "run_id": "r"},
        });
        let s = seal(&v);
        assert!(
            s.digests.contains_key("runs[1].elapsed_ms") && s.digests.contains_key("provenance.host"),
            "{:?}",
            s.digests.keys()
        );
        v.as_object_mut().unwrap().insert(SEAL_KEY.into(), serde_json::to_value(&s).unwrap());
        assert_eq!(check_seal(&v), Ok(None));
        v["runs"][0]["requests"][0]["ttft_ms"] = serde_json::json!(0.9);
        v["provenance"]["host"]["cores"] = serde_json::json!(64);
        assert_eq!(check_seal(&v), Ok(Some(vec!["provenance.host".to_string(), "runs[0].requests".to_string()])));
        v.as_object_mut().unwrap().remove(SEAL_KEY);
        assert!(check_seal(&v).is_err());
    }

    #[test]
    fn artifacts_are_stored_as_columns_sealed_as_stored_and_read_back_as_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        let requests: Vec<Value> =
            (0..40).map(|i| serde_json::json!({"id": i, "api": "openai", "ttft_s": f64::from(i) / 7.0})).collect();
        let artifact = serde_json::json!({"requests": requests, "provenance": {"run_id": "r"}});
        write_new(&path, &artifact).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"@rows\": 40") && !text.contains("\"ttft_s\": 0"), "{text}");
        // Bulk arrays take one line each; objects stay indented.
        assert!(text.lines().count() < 30, "{text}");
        assert_eq!(read_artifact::<Value>(&path).unwrap().to_string(), artifact.to_string());
        let mut stored: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(check_seal(&stored), Ok(None));
        stored["requests"]["@columns"]["ttft_s"]["values"][3] = serde_json::json!(0.5);
        assert_eq!(check_seal(&stored), Ok(Some(vec!["requests.@columns".to_string()])));
    }

    #[test]
    fn home_paths_and_secrets_are_redacted() {
        let r = Redactor { home: Some("/home/alice".into()), secrets: vec!["hf_abcdefSECRET".into()] };
        let mut v = serde_json::json!({
            "out": "/home/alice/results/x.json",
            "argv": ["--out=/home/alice/r", "token hf_abcdefSECRET", "/Users/bob/Documents/x", "/root/.cache/hub"],
            "keep": "/tmp/x /homestead /rooted",
        });
        r.redact(&mut v);
        let text = v.to_string();
        for leak in ["alice", "bob", "hf_abcdefSECRET", "/root/"] {
            assert!(!text.contains(leak), "{leak} leaked: {text}");
        }
        assert_eq!(v["out"], "~/results/x.json");
        assert_eq!(v["argv"][2], "~/Documents/x");
        assert_eq!(v["keep"], "/tmp/x /homestead /rooted");
    }

    #[test]
    fn credentials_in_urls_are_redacted_wherever_they_appear() {
        let r = Redactor { home: None, secrets: Vec::new() };
        let mut v = serde_json::json!({
            "base_url": "http://alice:s3cret@10.0.0.7:8000",
            "argv": ["--target", "openai=https://alice:s3cret@lb.example:443/v1?x=1", "--target=ollama=http://bob@h/"],
            "message": "GET http://alice:s3cret@10.0.0.7:8000/v1/models: connection refused",
            "keep": ["http://10.0.0.7:8000/v1", "user@host", "mailto:a@b", "http://h/a@b"],
        });
        r.redact(&mut v);
        let text = v.to_string();
        for leak in ["alice", "s3cret", "bob"] {
            assert!(!text.contains(leak), "{leak} leaked: {text}");
        }
        assert_eq!(v["base_url"], "http://<redacted>@10.0.0.7:8000");
        assert_eq!(v["argv"][1], "openai=https://<redacted>@lb.example:443/v1?x=1");
        assert_eq!(v["argv"][2], "--target=ollama=http://<redacted>@h/");
        assert_eq!(
            v["keep"],
            serde_json::json!(["http://10.0.0.7:8000/v1", "user@host", "mailto:a@b", "http://h/a@b"])
        );
        // Redacting twice changes nothing (the audit re-reads redacted command lines).
        let once = v.clone();
        r.redact(&mut v);
        assert_eq!(v, once);
    }

    #[test]
    fn writes_are_atomic_and_never_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/run.json");
        write_new(&path, &serde_json::json!({"x": 1})).unwrap();
        let err = write_new(&path, &serde_json::json!({"x": 2})).unwrap_err();
        assert!(matches!(err, ArtifactError::Exists(_)), "{err}");
        let kept: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(kept["x"], 1);
        assert_eq!(check_seal(&kept), Ok(None));
        assert_eq!(read_artifact::<Value>(&path).unwrap(), serde_json::json!({"x": 1}));
        // No temporary file left behind.
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("run.json")]);
    }
}
