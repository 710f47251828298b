//! Writing artifacts: atomically, never over an existing file, and never with a home path, a
//! user name or a secret in them.
//!
//! Redaction runs on the finished JSON value, just before it is written, so no field added later
//! can slip past it.

use serde::Serialize;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{0} already exists; artifacts are never overwritten, pick another --out path")]
    Exists(String),
    #[error("{path}: cannot write: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot serialise the artifact: {0}")]
    Serialize(#[from] serde_json::Error),
}

/// Where an artifact of `experiment` under `manifest` goes: `artifacts/<experiment>/<manifest>/<run_id>.json`.
pub fn default_path(artifacts_dir: &Path, experiment: &str, manifest: &str, run_id: &str) -> PathBuf {
    artifacts_dir.join(experiment).join(manifest).join(format!("{run_id}.json"))
}

/// Serialises, redacts and writes `artifact` to `path` atomically (temporary file in the same
/// folder, flushed and synced, then linked into place only if `path` does not exist yet).
pub fn write_new<T: Serialize>(path: &Path, artifact: &T) -> Result<(), ArtifactError> {
    let mut value = serde_json::to_value(artifact)?;
    Redactor::from_env().redact(&mut value);
    let mut text = serde_json::to_string_pretty(&value)?;
    text.push('\n');
    write_bytes_new(path, text.as_bytes())
}

/// Atomic, no-clobber write of raw bytes.
pub fn write_bytes_new(path: &Path, bytes: &[u8]) -> Result<(), ArtifactError> {
    let io = |source| ArtifactError::Io { path: path.display().to_string(), source };
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
    home: Option<String>,
    secrets: Vec<String>,
}

/// Environment variable names that hold credentials.
fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"].iter().any(|w| upper.contains(w))
}

impl Redactor {
    pub fn from_env() -> Self {
        let home = std::env::var("HOME").ok().map(|h| h.trim_end_matches('/').to_string()).filter(|h| h.len() > 1);
        let mut secrets: Vec<String> = std::env::vars()
            .filter(|(k, v)| is_secret_name(k) && v.len() >= 6)
            .map(|(_, v)| v)
            .collect();
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { home, secrets }
    }

    pub fn redact(&self, value: &mut Value) {
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
    fn writes_are_atomic_and_never_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/run.json");
        write_new(&path, &serde_json::json!({"x": 1})).unwrap();
        let err = write_new(&path, &serde_json::json!({"x": 2})).unwrap_err();
        assert!(matches!(err, ArtifactError::Exists(_)), "{err}");
        let kept: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(kept["x"], 1);
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("run.json")]);
    }
}
