//! The audit's vocabulary: a finding (severity, check, field, message), the findings of one
//! artifact, and the verdict they decide. Here, below the experiments, so that each experiment
//! states its own invariants in the same terms as the audit's generic checks.

use serde::Serialize;
use serde_json::Value;

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

/// The findings of one artifact's audit, as the checks add them (the audit's generic checks and
/// each experiment's own).
#[derive(Debug, Default)]
pub struct Findings(pub Vec<Finding>);

impl Findings {
    pub fn add(
        &mut self,
        severity: Severity,
        check: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.0.push(Finding { severity, check, field: field.into(), message: message.into() });
    }
    pub fn wrong(&mut self, check: &'static str, field: impl Into<String>, message: impl Into<String>) {
        self.add(Severity::Wrong, check, field, message)
    }
    pub fn note(&mut self, check: &'static str, field: impl Into<String>, message: impl Into<String>) {
        self.add(Severity::Note, check, field, message)
    }
    pub fn into_report(self, artifact: String, experiment: Option<String>, manifest: Option<String>) -> Report {
        let verdict = match self.0.iter().map(|f| f.severity).max() {
            Some(Severity::Wrong) => Verdict::Wrong,
            Some(Severity::Stale) => Verdict::Stale,
            _ => Verdict::Ok,
        };
        Report { artifact, experiment, manifest, verdict, findings: self.0 }
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
