//! Claims: what a manifest says its runs will show, beside what they must be.
//!
//! A claim names one of the experiment's metrics, the runs it compares in order (two for a
//! comparison or a bound, more for an ordering across a sweep), optionally the request it is
//! about, and the range the paired ratio `later / earlier` is expected in. "Interleave cuts
//! interactive-a's TTFT against fifo" is `runs: [fifo, interleave]`, `expect: lower` (the ratio
//! below 1); "batched output tokens/s at least 1.3x fifo's" is `expect: {at_least: 1.3}`; "step
//! time grows with context by at most 15%" is `runs: [ctx-64, ctx-256, ...]`,
//! `expect: {at_least: 1, at_most: 1.15}`, judged on each consecutive pair.
//!
//! This module holds the declaration and its checks against an experiment's names; judging a
//! claim on measured rounds is `records::evidence`.

use crate::invalid::Invalid;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The confidence level a claim is judged at unless it says otherwise.
pub const DEFAULT_LEVEL: f64 = 0.95;

/// One claim of a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// A short unique name (`interleave-cuts-interactive-ttft`), the claim's key across artifacts.
    pub id: String,
    /// The finding in words, as a reader would state it.
    pub statement: String,
    /// One of the experiment's metric names.
    pub metric: String,
    /// The request the metric is about, for per-request metrics (a scheduler job id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The runs compared, in order: each ratio is a run's value over the one before it.
    pub runs: Vec<String>,
    /// The range each paired ratio is expected in.
    pub expect: Expect,
    /// Confidence level of the interval (0.5..1); 0.95 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<f64>,
}

/// The range a paired ratio is expected in: `lower` (below 1), `higher` (above 1), or bounds.
// Read by hand (`Deserialize` below) so that a mistake gets a message that says what to write.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Expect {
    Word(Direction),
    Range(Range),
}

impl<'de> Deserialize<'de> for Expect {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        const WHAT: &str = r#""lower", "higher" or {"at_least": x, "at_most": y}"#;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Expect;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(WHAT)
            }

            fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<Expect, E> {
                match word {
                    "lower" => Ok(Expect::Word(Direction::Lower)),
                    "higher" => Ok(Expect::Word(Direction::Higher)),
                    _ => Err(E::custom(format!("`{word}` is not an expectation; write {WHAT}"))),
                }
            }

            fn visit_map<M: serde::de::MapAccess<'de>>(self, map: M) -> Result<Expect, M::Error> {
                Range::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Expect::Range)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// The later run's value is below the earlier one's (ratio at most 1).
    Lower,
    /// The later run's value is above the earlier one's (ratio at least 1).
    Higher,
}

/// Bounds on the ratio, inclusive; at least one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Range {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_least: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_most: Option<f64>,
}

impl Expect {
    /// The bounds, `(at_least, at_most)`, either open.
    pub fn bounds(&self) -> Range {
        match self {
            Expect::Word(Direction::Lower) => Range { at_least: None, at_most: Some(1.0) },
            Expect::Word(Direction::Higher) => Range { at_least: Some(1.0), at_most: None },
            Expect::Range(r) => *r,
        }
    }

    /// As a reader would write it: `< 1`, `>= 1.3`, `1..1.15`.
    pub fn describe(&self) -> String {
        match (self, self.bounds()) {
            (Expect::Word(Direction::Lower), _) => "< 1".into(),
            (Expect::Word(Direction::Higher), _) => "> 1".into(),
            (_, Range { at_least: Some(l), at_most: Some(u) }) => format!("{l}..{u}"),
            (_, Range { at_least: Some(l), at_most: None }) => format!(">= {l}"),
            (_, Range { at_least: None, at_most: Some(u) }) => format!("<= {u}"),
            (_, Range { at_least: None, at_most: None }) => "any".into(),
        }
    }
}

impl Claim {
    pub fn level(&self) -> f64 {
        self.level.unwrap_or(DEFAULT_LEVEL)
    }
}

/// The names an experiment's claims may use, for one manifest's parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Vocabulary {
    /// Metrics of a whole run (throughput, wall time).
    pub run_metrics: Vec<String>,
    /// Metrics of one request of a run; a claim on one names its `request`.
    pub request_metrics: Vec<String>,
    /// The runs' names.
    pub runs: Vec<String>,
    /// The requests' names.
    pub requests: Vec<String>,
}

/// Checks every claim against the experiment's names; the error names the field
/// (`claims[1].runs[0]`) and what would be right.
pub fn check(claims: &[Claim], names: &Vocabulary) -> Result<(), Invalid> {
    let known = |list: &[String]| if list.is_empty() { "none".to_string() } else { list.join(", ") };
    let mut ids = std::collections::BTreeSet::new();
    for (i, claim) in claims.iter().enumerate() {
        let at = |field: &str| format!("claims[{i}].{field}");
        if claim.id.trim().is_empty() || !ids.insert(claim.id.as_str()) {
            return Err(Invalid::new(
                at("id"),
                format!("`{}` is empty or used twice; give each claim a unique id", claim.id),
            ));
        }
        let per_request = names.request_metrics.contains(&claim.metric);
        if !per_request && !names.run_metrics.contains(&claim.metric) {
            let all: Vec<String> = names.run_metrics.iter().chain(&names.request_metrics).cloned().collect();
            return Err(Invalid::new(
                at("metric"),
                format!("`{}` is not a metric of this experiment (known: {})", claim.metric, known(&all)),
            ));
        }
        match (&claim.request, per_request) {
            (None, true) => {
                return Err(Invalid::new(
                    at("request"),
                    format!(
                        "missing: `{}` is a per-request metric; name one of: {}",
                        claim.metric,
                        known(&names.requests)
                    ),
                ))
            }
            (Some(_), false) => {
                return Err(Invalid::new(
                    at("request"),
                    format!("`{}` is a metric of whole runs; remove `request`", claim.metric),
                ))
            }
            (Some(r), true) if !names.requests.contains(r) => {
                return Err(Invalid::new(
                    at("request"),
                    format!("`{r}` is not a request of this manifest (known: {})", known(&names.requests)),
                ))
            }
            _ => {}
        }
        if claim.runs.len() < 2 {
            return Err(Invalid::new(
                at("runs"),
                "give at least two runs: the baseline, then the run(s) compared with it",
            ));
        }
        for (j, run) in claim.runs.iter().enumerate() {
            if !names.runs.contains(run) {
                return Err(Invalid::new(
                    at(&format!("runs[{j}]")),
                    format!("`{run}` is not a run of this manifest (known: {})", known(&names.runs)),
                ));
            }
            if claim.runs[..j].contains(run) {
                return Err(Invalid::new(
                    at(&format!("runs[{j}]")),
                    format!("`{run}` is named twice; a ratio needs two different runs"),
                ));
            }
        }
        let Range { at_least, at_most } = claim.expect.bounds();
        let bad = |b: Option<f64>| b.is_some_and(|b| !(b.is_finite() && b > 0.0));
        if (at_least.is_none() && at_most.is_none())
            || bad(at_least)
            || bad(at_most)
            || at_least.zip(at_most).is_some_and(|(l, u)| l > u)
        {
            return Err(Invalid::new(
                at("expect"),
                "give `lower`, `higher`, or {\"at_least\": x, \"at_most\": y} with positive finite ratios, at_least <= at_most",
            ));
        }
        if !(0.5..1.0).contains(&claim.level()) {
            return Err(Invalid::new(
                at("level"),
                format!("{}; give a confidence level from 0.5 to below 1 (0.95 by default)", claim.level()),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vocabulary {
        Vocabulary {
            run_metrics: vec!["output_tokens_per_s".into()],
            request_metrics: vec!["ttft_ms".into()],
            runs: vec!["fifo".into(), "interleave".into()],
            requests: vec!["a".into()],
        }
    }

    fn claim(json: &str) -> Claim {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn shorthands_and_ranges_read_as_bounds() {
        let c = claim(
            r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","interleave"],"expect":"lower"}"#,
        );
        assert_eq!(c.expect.bounds(), Range { at_least: None, at_most: Some(1.0) });
        let c = claim(
            r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","interleave"],"expect":{"at_least":1.3}}"#,
        );
        assert_eq!(c.expect.bounds(), Range { at_least: Some(1.3), at_most: None });
        assert_eq!(c.expect.describe(), ">= 1.3");
        assert!(check(&[c], &names()).is_ok());
    }

    #[test]
    fn a_mistaken_expectation_says_what_to_write() {
        let read = |expect: &str| {
            let json = format!(r#"{{"id":"x","statement":"s","metric":"m","runs":["a","b"],"expect":{expect}}}"#);
            serde_json::from_str::<Claim>(&json).unwrap_err().to_string()
        };
        let word = read(r#""faster""#);
        assert!(
            word.starts_with(r#"`faster` is not an expectation; write "lower", "higher" or {"at_least""#),
            "{word}"
        );
        let field = read(r#"{"at_lest": 1.3}"#);
        assert!(field.starts_with("unknown field `at_lest`, expected `at_least` or `at_most`"), "{field}");
        let kind = read("1.3");
        assert!(kind.contains(r#"expected "lower", "higher" or {"at_least""#), "{kind}");
    }

    #[test]
    fn unknown_names_are_errors_naming_the_field() {
        let cases = [
            (
                r#"{"id":"x","statement":"s","metric":"tpot","request":"a","runs":["fifo","interleave"],"expect":"lower"}"#,
                "claims[0].metric",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"b","runs":["fifo","interleave"],"expect":"lower"}"#,
                "claims[0].request",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","runs":["fifo","interleave"],"expect":"lower"}"#,
                "claims[0].request",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"output_tokens_per_s","request":"a","runs":["fifo","interleave"],"expect":"lower"}"#,
                "claims[0].request",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","batched"],"expect":"lower"}"#,
                "claims[0].runs[1]",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo"],"expect":"lower"}"#,
                "claims[0].runs",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","fifo"],"expect":"lower"}"#,
                "claims[0].runs[1]",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","interleave"],"expect":{"at_least":2,"at_most":1}}"#,
                "claims[0].expect",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","interleave"],"expect":{}}"#,
                "claims[0].expect",
            ),
            (
                r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","interleave"],"expect":"lower","level":1.0}"#,
                "claims[0].level",
            ),
        ];
        for (json, field) in cases {
            let err = check(&[claim(json)], &names()).unwrap_err();
            assert_eq!(err.field, field, "{json}: {err}");
        }
        let twice = claim(
            r#"{"id":"x","statement":"s","metric":"ttft_ms","request":"a","runs":["fifo","interleave"],"expect":"lower"}"#,
        );
        assert_eq!(check(&[twice.clone(), twice], &names()).unwrap_err().field, "claims[1].id");
    }

    #[test]
    fn unknown_fields_and_words_do_not_read() {
        assert!(serde_json::from_str::<Claim>(
            r#"{"id":"x","statement":"s","metric":"m","runs":["a","b"],"expect":"smaller"}"#
        )
        .is_err());
        assert!(serde_json::from_str::<Claim>(
            r#"{"id":"x","statement":"s","metric":"m","runs":["a","b"],"expect":"lower","by":2}"#
        )
        .is_err());
    }
}
