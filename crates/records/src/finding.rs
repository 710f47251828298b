//! The audit's vocabulary: a finding (severity, check, field, message), the findings of one
//! artifact, and the verdict they decide. Here, below the experiments, so that each experiment
//! states its own invariants in the same terms as the audit's generic checks.

use serde::Serialize;
use serde_json::Value;

/// The check of [`Findings::differs_from_code`].
const CODE: &str = "code";

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
    /// invariants, code ([`Findings::differs_from_code`]), lacks.
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
    /// A text the code itself writes into every artifact (a metric's definition, a note on how
    /// it measured) is not today's code's. Wrong when the run's code is today's; when the code
    /// changed since the run ([`Findings::settle_code`]) it is stale instead: the older code may
    /// have worded it otherwise, and a re-run says which.
    pub fn differs_from_code(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.wrong(CODE, field, message)
    }

    /// Once the source check has run: if it found the code changed since the run, each
    /// [`Findings::differs_from_code`] finding becomes stale, saying why.
    pub fn settle_code(&mut self) {
        if !self.0.iter().any(|f| f.check == "source" && f.severity == Severity::Stale) {
            return;
        }
        for f in self.0.iter_mut().filter(|f| f.check == CODE && f.severity == Severity::Wrong) {
            f.severity = Severity::Stale;
            f.message.push_str("; the code changed since the run and may have written it so: re-run it");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_of_the_code_is_wrong_on_todays_code_and_stale_on_older_code() {
        let mut today = Findings::default();
        today.differs_from_code("notes", "are not what the code records");
        today.settle_code();
        assert_eq!(today.into_report("a".into(), None, None).verdict, Verdict::Wrong);

        let mut older = Findings::default();
        older.differs_from_code("notes", "are not what the code records");
        older.add(Severity::Stale, "source", "provenance.source.sha256", "the code changed since the run");
        older.wrong("invariants", "requests", "a forged record");
        older.settle_code();
        let notes = older.0.iter().find(|f| f.field == "notes").unwrap();
        assert_eq!(notes.severity, Severity::Stale);
        assert!(notes.message.contains("re-run"), "{}", notes.message);
        // Nothing else is softened: a wrong invariant stays wrong.
        assert_eq!(older.into_report("a".into(), None, None).verdict, Verdict::Wrong);
    }
}
