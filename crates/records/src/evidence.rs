//! Judging a manifest's claims (`supply::claim`) on the rounds a run recorded.
//!
//! Rounds are paired: the runs a claim compares took turns round by round, so round `i` of one
//! and round `i` of the other saw the same machine state, and their ratio cancels most of the
//! drift that shared hardware adds. Each pair of runs gets the median of its per-round ratios and
//! a distribution-free interval for it from the sign test (order statistics `k` and `n + 1 - k` of
//! the sorted ratios, `k` the largest whose binomial tail keeps the level). The claim `holds`
//! when every interval lies inside the expected range, `fails` when one lies wholly outside it,
//! and is `inconclusive` otherwise, or with too few rounds for an interval at its level (one round
//! is a point estimate, never a verdict). Everything is computed from recorded values alone, so
//! the audit repeats it bit for bit.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use supply::claim::{Claim, Range};

/// The test every verdict states.
pub const METHOD: &str = "sign test on the paired per-round ratios: the median ratio, and the interval between order statistics k and n+1-k of the sorted ratios (distribution-free; its exact coverage is recorded)";

/// One measured value of one round, as an experiment reads it from its artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// What the claim is judged separately for (a serving target); `None` when a run has one.
    pub scope: Option<String>,
    pub run: String,
    pub request: Option<String>,
    pub metric: String,
    pub round: usize,
    pub value: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Holds,
    Fails,
    Inconclusive,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Fails => "fails",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// The evidence on one consecutive pair of a claim's runs: `later / earlier`, round by round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairEvidence {
    pub earlier: String,
    pub later: String,
    /// The paired ratios in round order (rounds where both runs have a positive value).
    pub ratios: Vec<f64>,
    /// The median ratio: the effect size; `None` without a paired round.
    pub estimate: Option<f64>,
    /// The interval's ends; `None` when the rounds are too few for the level.
    pub low: Option<f64>,
    pub high: Option<f64>,
    /// The interval's exact coverage (at least the claim's level).
    pub coverage: Option<f64>,
    pub verdict: Verdict,
}

/// A claim as judged on one artifact (for one scope).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimResult {
    /// The claim as the manifest stated it when the run was made.
    pub claim: Claim,
    pub scope: Option<String>,
    pub method: String,
    pub pairs: Vec<PairEvidence>,
    pub verdict: Verdict,
    /// Why the verdict is inconclusive, when the data say so (too few rounds, a run missing).
    pub note: Option<String>,
}

/// One pair of runs of a judged claim, as the claims tables (printed and in the report) show it.
pub struct PairLine {
    /// `later / earlier`.
    pub runs: String,
    pub rounds: usize,
    /// [`describe_ratio`].
    pub ratio: String,
    /// The pair's verdict; the claim's beside the last pair's when it has several.
    pub verdict: String,
}

impl ClaimResult {
    /// Its id, and the scope it was judged in: `id [scope]`.
    pub fn label(&self) -> String {
        match &self.scope {
            Some(scope) => format!("{} [{scope}]", self.claim.id),
            None => self.claim.id.clone(),
        }
    }

    /// Its pairs as table lines, in order.
    pub fn lines(&self) -> Vec<PairLine> {
        let n = self.pairs.len();
        self.pairs
            .iter()
            .enumerate()
            .map(|(i, pair)| PairLine {
                runs: format!("{} / {}", pair.later, pair.earlier),
                rounds: pair.ratios.len(),
                ratio: describe_ratio(pair),
                verdict: match (n, i + 1 == n) {
                    (1, _) => self.verdict.name().to_string(),
                    (_, true) => format!("{} (claim: {})", pair.verdict.name(), self.verdict.name()),
                    _ => pair.verdict.name().to_string(),
                },
            })
            .collect()
    }
}

/// Judges each claim on the observations, once per scope they hold (in order of appearance).
pub fn judge(claims: &[Claim], observations: &[Observation]) -> Vec<ClaimResult> {
    let mut scopes: Vec<Option<String>> = Vec::new();
    for o in observations {
        if !scopes.contains(&o.scope) {
            scopes.push(o.scope.clone());
        }
    }
    if scopes.is_empty() {
        scopes.push(None);
    }
    claims.iter().flat_map(|claim| scopes.iter().map(move |scope| judge_one(claim, scope, observations))).collect()
}

fn judge_one(claim: &Claim, scope: &Option<String>, observations: &[Observation]) -> ClaimResult {
    let values = |run: &str| -> Vec<(usize, f64)> {
        let mut v: Vec<(usize, f64)> = observations
            .iter()
            .filter(|o| &o.scope == scope && o.run == run && o.request == claim.request && o.metric == claim.metric)
            .map(|o| (o.round, o.value))
            .collect();
        v.sort_by_key(|(round, _)| *round);
        v
    };
    let bounds = claim.expect.bounds();
    let pairs: Vec<PairEvidence> = claim
        .runs
        .windows(2)
        .map(|w| {
            let (earlier, later) = (values(&w[0]), values(&w[1]));
            let ratios: Vec<f64> = earlier
                .iter()
                .filter_map(|(round, a)| {
                    let b = later.iter().find(|(r, _)| r == round)?.1;
                    let usable = |x: f64| x.is_finite() && x > 0.0;
                    (usable(*a) && usable(b)).then(|| b / a)
                })
                .collect();
            pair_evidence(w[0].clone(), w[1].clone(), ratios, claim.level(), bounds)
        })
        .collect();
    let verdict = if pairs.iter().any(|p| p.verdict == Verdict::Fails) {
        Verdict::Fails
    } else if !pairs.is_empty() && pairs.iter().all(|p| p.verdict == Verdict::Holds) {
        Verdict::Holds
    } else {
        Verdict::Inconclusive
    };
    let fewest = pairs.iter().map(|p| p.ratios.len()).min().unwrap_or(0);
    let needed = rounds_needed(claim.level());
    let note = match fewest {
        0 => Some(format!("no paired round with a positive `{}` in both runs", claim.metric)),
        n if n < needed => Some(format!(
            "{n} paired round{}: a point estimate only; a {}% interval needs {needed}",
            if n == 1 { "" } else { "s" },
            claim.level() * 100.0
        )),
        _ => None,
    };
    ClaimResult { claim: claim.clone(), scope: scope.clone(), method: METHOD.into(), pairs, verdict, note }
}

fn pair_evidence(earlier: String, later: String, ratios: Vec<f64>, level: f64, bounds: Range) -> PairEvidence {
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    let estimate = crate::stats::percentile_sorted(&sorted, 50.0);
    let interval =
        sign_test_rank(sorted.len(), level).map(|(k, coverage)| (sorted[k - 1], sorted[sorted.len() - k], coverage));
    let verdict = match interval {
        None => Verdict::Inconclusive,
        Some((low, high, _)) => {
            let inside = bounds.at_least.is_none_or(|l| low >= l) && bounds.at_most.is_none_or(|u| high <= u);
            let outside = bounds.at_least.is_some_and(|l| high < l) || bounds.at_most.is_some_and(|u| low > u);
            if inside {
                Verdict::Holds
            } else if outside {
                Verdict::Fails
            } else {
                Verdict::Inconclusive
            }
        }
    };
    PairEvidence {
        earlier,
        later,
        ratios,
        estimate,
        low: interval.map(|i| i.0),
        high: interval.map(|i| i.1),
        coverage: interval.map(|i| i.2),
        verdict,
    }
}

/// The sign test's interval for the median of `n` values at `level`: the largest `k >= 1` whose
/// two-sided tail `2 P(X <= k - 1)`, `X ~ Binomial(n, 1/2)`, is at most `1 - level`, and the
/// coverage `1 - 2 P(X <= k - 1)`; `None` when even `k = 1` (the extremes) falls short.
pub fn sign_test_rank(n: usize, level: f64) -> Option<(usize, f64)> {
    let alpha = 1.0 - level;
    // ln P(X = i), from ln C(n, i) built up term by term (no overflow at any n).
    let ln_half_n = n as f64 * std::f64::consts::LN_2;
    let (mut ln_choose, mut tail, mut best) = (0.0f64, 0.0f64, None);
    for i in 0..n / 2 {
        tail += (ln_choose - ln_half_n).exp();
        if 2.0 * tail > alpha {
            break;
        }
        best = Some((i + 1, 1.0 - 2.0 * tail));
        ln_choose += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
    }
    best
}

/// The fewest paired rounds that give an interval at `level` (6 at 95%).
pub fn rounds_needed(level: f64) -> usize {
    (1..=64).find(|&n| sign_test_rank(n, level).is_some()).unwrap_or(usize::MAX)
}

/// `0.213 [0.190, 0.244]`, or the estimate alone, or `-`.
pub fn describe_ratio(pair: &PairEvidence) -> String {
    match (pair.estimate, pair.low, pair.high) {
        (Some(e), Some(l), Some(h)) => format!("{e:.3} [{l:.3}, {h:.3}]"),
        (Some(e), _, _) => format!("{e:.3}"),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use supply::claim::{Direction, Expect};

    fn obs(run: &str, round: usize, value: f64) -> Observation {
        Observation { scope: None, run: run.into(), request: None, metric: "m".into(), round, value }
    }

    fn claim(runs: &[&str], expect: Expect) -> Claim {
        Claim {
            id: "c".into(),
            statement: "s".into(),
            metric: "m".into(),
            request: None,
            runs: runs.iter().map(|r| r.to_string()).collect(),
            expect,
            level: None,
        }
    }

    #[test]
    fn sign_test_ranks_match_the_binomial_table() {
        // n = 5: 2/32 = 0.0625 > 0.05, no 95% interval; n = 6: 2/64 = 0.03125, the extremes.
        assert_eq!(sign_test_rank(5, 0.95), None);
        assert_eq!(sign_test_rank(6, 0.95), Some((1, 1.0 - 2.0 / 64.0)));
        // n = 10: P(X <= 1) = 11/1024, 2x = 0.0215 <= 0.05; P(X <= 2) = 56/1024, 2x = 0.109 > 0.05.
        let (k, coverage) = sign_test_rank(10, 0.95).unwrap();
        assert_eq!(k, 2);
        assert!((coverage - (1.0 - 22.0 / 1024.0)).abs() < 1e-12);
        // n = 20 at 95%: k = 6 (2 P(X <= 5) = 0.0414).
        assert_eq!(sign_test_rank(20, 0.95).unwrap().0, 6);
        assert_eq!(rounds_needed(0.95), 6);
        assert_eq!(rounds_needed(0.9), 5);
        // Large n does not overflow and keeps the coverage at the level.
        let (k, coverage) = sign_test_rank(5000, 0.95).unwrap();
        assert!(k > 2000 && coverage >= 0.95, "{k} {coverage}");
    }

    #[test]
    fn clear_effects_hold_or_fail_and_straddling_ones_are_inconclusive() {
        let mut o = Vec::new();
        for round in 0..6 {
            o.push(obs("fifo", round, 100.0 + round as f64));
            o.push(obs("interleave", round, 20.0 + round as f64));
            o.push(obs("noise", round, if round % 2 == 0 { 90.0 } else { 110.0 }));
        }
        let lower = |runs: &[&str]| judge(&[claim(runs, Expect::Word(Direction::Lower))], &o).remove(0);
        let r = lower(&["fifo", "interleave"]);
        assert_eq!(r.verdict, Verdict::Holds, "{r:?}");
        assert_eq!(r.pairs[0].ratios.len(), 6);
        assert_eq!(r.pairs[0].low, Some(20.0 / 100.0));
        assert_eq!(r.pairs[0].high, Some(25.0 / 105.0));
        assert_eq!(lower(&["interleave", "fifo"]).verdict, Verdict::Fails);
        assert_eq!(lower(&["fifo", "noise"]).verdict, Verdict::Inconclusive);
        // A sweep: fifo -> noise -> interleave; one pair straddles 1, so not all hold.
        let r = lower(&["fifo", "noise", "interleave"]);
        assert_eq!((r.pairs.len(), r.verdict), (2, Verdict::Inconclusive));
        // A bound the effect does not reach fails; one it passes holds.
        let bound = |x: f64| {
            judge(&[claim(&["fifo", "interleave"], Expect::Range(Range { at_least: None, at_most: Some(x) }))], &o)
                .remove(0)
                .verdict
        };
        assert_eq!(bound(0.1), Verdict::Fails);
        assert_eq!(bound(0.3), Verdict::Holds);
    }

    #[test]
    fn one_round_is_a_point_estimate_and_missing_runs_say_so() {
        let o = vec![obs("fifo", 0, 100.0), obs("interleave", 0, 20.0)];
        let r = judge(&[claim(&["fifo", "interleave"], Expect::Word(Direction::Lower))], &o).remove(0);
        assert_eq!(r.verdict, Verdict::Inconclusive);
        assert_eq!(r.pairs[0].estimate, Some(0.2));
        assert!(r.note.as_deref().unwrap().contains("point estimate"), "{:?}", r.note);
        let r = judge(&[claim(&["fifo", "batched"], Expect::Word(Direction::Lower))], &o).remove(0);
        assert_eq!((r.verdict, r.pairs[0].estimate), (Verdict::Inconclusive, None));
        assert!(r.note.is_some());
    }

    #[test]
    fn scopes_are_judged_apart() {
        let mut o = Vec::new();
        for round in 0..6 {
            for (scope, c4) in [("fast", 400.0), ("flat", 100.0 + if round % 2 == 0 { 5.0 } else { -5.0 })] {
                o.push(Observation {
                    scope: Some(scope.into()),
                    run: "c1".into(),
                    request: None,
                    metric: "m".into(),
                    round,
                    value: 100.0,
                });
                o.push(Observation {
                    scope: Some(scope.into()),
                    run: "c4".into(),
                    request: None,
                    metric: "m".into(),
                    round,
                    value: c4,
                });
            }
        }
        let r = judge(&[claim(&["c1", "c4"], Expect::Word(Direction::Higher))], &o);
        let verdicts: Vec<_> = r.iter().map(|r| (r.scope.clone().unwrap(), r.verdict)).collect();
        assert_eq!(verdicts, vec![("fast".into(), Verdict::Holds), ("flat".into(), Verdict::Inconclusive)]);
    }
}
