//! Sampling the next token from a step's logits, reproducibly.
//!
//! The filters run in the order transformers' `generate` applies them: the repetition penalty
//! over every id the sequence holds (prompt and output), then temperature, top-k, top-p and
//! min-p, then one draw from the softmax of what is left. Each is the same rule as there:
//!
//! - repetition penalty `r`: a held id's logit `l` becomes `l / r` when `l > 0`, else `l · r`;
//! - temperature `t`: every logit is divided by `t`;
//! - top-k: logits below the k-th largest are dropped (ties with it stay);
//! - top-p: over the logits in ascending order, those whose cumulative probability is at most
//!   `1 − p` are dropped; at least the largest stays;
//! - min-p: ids whose probability is below `min_p` times the largest probability are dropped.
//!
//! The draw is the inverse of the cumulative distribution (in f64, over the kept ids from the
//! most likely down, ties in id order) at a uniform number from a counter-based generator:
//! ChaCha8 keyed by the request's seed, on the stream numbered by the position the new token
//! takes. So a request's ids depend only on the model, its prompt, its settings and its seed:
//! never on its batch-mates, the policy, the chunk size, the thread count, or a preemption
//! (which prefills again and draws the same number at the same position).

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a session picks its next token. The default, temperature 0, is greedy: the first index of
/// the largest logit, through the head's screen, with every other setting ignored.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    /// Divides the logits; 0 is greedy.
    pub temperature: f64,
    /// Keeps the `top_k` largest logits; 0 keeps all.
    pub top_k: u32,
    /// Keeps the smallest set of most likely ids whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f64,
    /// Drops ids less likely than `min_p` times the most likely; 0 keeps all.
    pub min_p: f64,
    /// Divides (or, for negative logits, multiplies) the logits of ids already in the sequence;
    /// 1 leaves them.
    pub repetition_penalty: f64,
    /// Keys the generator: the same seed draws the same numbers at the same positions.
    pub seed: u64,
}

/// The largest top-k read through the head's screen ([`Sampling::screened_top_k`]): past it, the
/// candidates approach the whole vocabulary and a full product is as cheap.
pub const SCREENED_TOP_K: usize = 1024;

/// Every logit as candidates: `(id, logit)` for each id.
pub fn every(logits: &[f32]) -> Vec<(u32, f32)> {
    (0..).zip(logits.iter().copied()).collect()
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::GREEDY
    }
}

/// A setting out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("sampling `{field}` is {value}: it must be {want}")]
pub struct SamplingError {
    pub field: &'static str,
    pub value: f64,
    pub want: &'static str,
}

impl Sampling {
    /// Temperature 0: the greedy id.
    pub const GREEDY: Sampling =
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0, seed: 0 };

    /// Whether the next id is the greedy one (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The `k` of a top-k the head's screen can serve: the ids it names are then the only ones
    /// the filters could keep, so reading the screen instead of every logit changes no draw.
    /// None without top-k, past [`SCREENED_TOP_K`], or with a repetition penalty (which moves
    /// held ids' logits after the screen has bounded them).
    pub fn screened_top_k(&self) -> Option<usize> {
        let k = self.top_k as usize;
        (k > 0 && k <= SCREENED_TOP_K && self.repetition_penalty == 1.0).then_some(k)
    }

    /// Checks every setting's range.
    pub fn check(&self) -> Result<(), SamplingError> {
        let bad = |field, value, want| Err(SamplingError { field, value, want });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", self.temperature, "a finite number >= 0 (0 is greedy)");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "above 0 and at most 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "from 0 to 1");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty", self.repetition_penalty, "a finite number above 0 (1 is none)");
        }
        Ok(())
    }

    /// The id drawn at `position` (the position the new token takes) from `candidates` (ids in
    /// increasing order with their logits: every id, or those a top-k screen names) for a
    /// sequence that holds `held` (its prompt and output so far).
    pub fn pick(&self, candidates: Vec<(u32, f32)>, held: &[u32], position: usize) -> u32 {
        let kept = self.distribution(candidates, held);
        let u = uniform(self.seed, position);
        let mut below = 0.0;
        for &(id, p) in &kept {
            below += p;
            if u < below {
                return id;
            }
        }
        // Rounding left the sum a hair under 1 and `u` above it: the least likely kept id.
        kept.last().expect("a distribution keeps at least one id").0
    }

    /// The filtered distribution `pick` draws from: the kept ids from the most likely down (ties
    /// in id order), each with its probability (summing to 1 up to rounding).
    pub fn distribution(&self, mut candidates: Vec<(u32, f32)>, held: &[u32]) -> Vec<(u32, f64)> {
        assert!(!candidates.is_empty(), "sampling from no logits");
        debug_assert!(candidates.windows(2).all(|p| p[0].0 < p[1].0), "candidates in increasing id order");
        if self.repetition_penalty != 1.0 {
            let mut held: Vec<u32> = held.to_vec();
            held.sort_unstable();
            held.dedup();
            for (id, l) in &mut candidates {
                if held.binary_search(id).is_ok() {
                    // In F32, as torch divides an F32 tensor by a Python float.
                    let r = self.repetition_penalty as f32;
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
        if self.temperature != 1.0 && self.temperature != 0.0 {
            let t = self.temperature as f32;
            for (_, l) in &mut candidates {
                *l /= t;
            }
        }
        // What top-k keeps (all of it when it is off), then sorted from the largest logit.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = self.top_k as usize;
        if k > 0 && k < candidates.len() {
            candidates.select_nth_unstable_by(k - 1, by_logit);
            let kth = candidates[k - 1].1;
            candidates.retain(|(_, l)| *l >= kth);
        }
        candidates.sort_unstable_by(by_logit);
        let mut kept = softmax(&candidates);
        if self.top_p < 1.0 {
            // Ascending, an id goes when the mass up to and including it is at most 1 − p: from
            // the top, when the mass strictly above it is at least p.
            let mut above = 0.0;
            let n = kept
                .iter()
                .take_while(|(_, p)| {
                    let keep = above < self.top_p;
                    above += p;
                    keep
                })
                .count();
            kept.truncate(n.max(1));
            kept = renormalized(kept);
        }
        if self.min_p > 0.0 {
            let floor = self.min_p * kept[0].1;
            kept.retain(|(_, p)| *p >= floor);
            kept = renormalized(kept);
        }
        kept
    }
}

/// The softmax of `logits` (in f64), in their order, which starts with the largest.
fn softmax(logits: &[(u32, f32)]) -> Vec<(u32, f64)> {
    let max = logits[0].1 as f64;
    let mut kept: Vec<(u32, f64)> = logits.iter().map(|&(id, l)| (id, (l as f64 - max).exp())).collect();
    let sum: f64 = kept.iter().map(|(_, e)| e).sum();
    for (_, p) in &mut kept {
        *p /= sum;
    }
    kept
}

fn renormalized(mut kept: Vec<(u32, f64)>) -> Vec<(u32, f64)> {
    let sum: f64 = kept.iter().map(|(_, p)| p).sum();
    for (_, p) in &mut kept {
        *p /= sum;
    }
    kept
}

/// A generated token's log-probability under the model (the log-softmax of the raw logits,
/// before any penalty, temperature or filter, as vLLM reports by default), and the `top` most
/// likely ids' (ties in id order).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

impl TokenLogprob {
    /// `id`'s entry among `logits` (every id, in id order).
    pub fn of(id: u32, logits: &[(u32, f32)], top: usize) -> TokenLogprob {
        let max = logits.iter().map(|(_, l)| *l as f64).fold(f64::NEG_INFINITY, f64::max);
        let lse = max + logits.iter().map(|(_, l)| (*l as f64 - max).exp()).sum::<f64>().ln();
        let logprob_of = |l: f32| l as f64 - lse;
        let own = logits.iter().find(|(i, _)| *i == id).map_or(f64::NEG_INFINITY, |(_, l)| logprob_of(*l));
        let mut best: Vec<(u32, f32)> = logits.to_vec();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if top > 0 && top < best.len() {
            best.select_nth_unstable_by(top - 1, by_logit);
        }
        best.truncate(top);
        best.sort_unstable_by(by_logit);
        TokenLogprob { id, logprob: own, top: best.into_iter().map(|(i, l)| (i, logprob_of(l))).collect() }
    }
}

/// A uniform number in [0, 1) for `position` of a request seeded `seed`: the first 53 bits of
/// ChaCha8's stream number `position` under key `seed`.
pub fn uniform(seed: u64, position: usize) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(position as u64);
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(s: Sampling, logits: &[f32], held: &[u32]) -> Vec<u32> {
        s.distribution(every(logits), held).into_iter().map(|(id, _)| id).collect()
    }

    #[test]
    fn top_k_keeps_ties_with_the_kth_and_orders_ties_by_id() {
        let s = Sampling { temperature: 1.0, top_k: 2, ..Sampling::GREEDY };
        assert_eq!(kept(s, &[1.0, 3.0, 2.0, 2.0, 0.5], &[]), [1, 2, 3]);
    }

    #[test]
    fn top_p_keeps_the_fewest_ids_that_reach_it_and_never_none() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logarithms).
        let logits = [0.5f32, 0.25, 0.125, 0.125].map(f32::ln);
        let top_p = |p| kept(Sampling { temperature: 1.0, top_p: p, ..Sampling::GREEDY }, &logits, &[]);
        assert_eq!(top_p(0.5), [0]);
        assert_eq!(top_p(0.6), [0, 1]);
        assert_eq!(top_p(0.75), [0, 1]);
        // Of two tied ids, the later one goes first (ascending, ties in reverse id order).
        assert_eq!(top_p(0.8), [0, 1, 2]);
        assert_eq!(top_p(0.9), [0, 1, 2, 3]);
        assert_eq!(top_p(f64::MIN_POSITIVE), [0]);
    }

    #[test]
    fn the_penalty_lowers_held_ids_whatever_their_sign_once_each() {
        let s = Sampling { temperature: 1.0, repetition_penalty: 2.0, ..Sampling::GREEDY };
        // After the penalty: 2, -2, 3 (id 0 held thrice is divided once).
        let penalized = s.distribution(every(&[4.0, -1.0, 3.0]), &[0, 1, 0, 0, 99]);
        let plain = Sampling { temperature: 1.0, ..Sampling::GREEDY }.distribution(every(&[2.0, -2.0, 3.0]), &[]);
        assert_eq!(penalized, plain);
    }

    #[test]
    fn logprobs_are_the_log_softmax_of_the_raw_logits() {
        let logits = every(&[1.0, 3.0, 2.0, 3.0]);
        let t = TokenLogprob::of(2, &logits, 2);
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln();
        assert!((t.logprob - (2.0 - lse)).abs() < 1e-12);
        assert_eq!(t.top.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 3]);
        assert!((t.top[0].1 - (3.0 - lse)).abs() < 1e-12);
        assert!(TokenLogprob::of(0, &logits, 0).top.is_empty());
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = |s: Sampling| s.check().unwrap_err().field;
        assert_eq!(bad(Sampling { temperature: -0.1, ..Sampling::GREEDY }), "temperature");
        assert_eq!(bad(Sampling { temperature: f64::NAN, ..Sampling::GREEDY }), "temperature");
        assert_eq!(bad(Sampling { top_p: 0.0, ..Sampling::GREEDY }), "top_p");
        assert_eq!(bad(Sampling { min_p: 1.5, ..Sampling::GREEDY }), "min_p");
        assert_eq!(bad(Sampling { repetition_penalty: 0.0, ..Sampling::GREEDY }), "repetition_penalty");
        assert!(Sampling::GREEDY.check().is_ok());
    }
}
