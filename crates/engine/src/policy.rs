//! Scheduling policies: which active requests take the next step, and how many prompt tokens
//! each may prefill in it.
//!
//! A policy only decides *when* work runs, never *what* it computes: every session's tokens are
//! computed the same whatever the order or the company in a batched step, so greedy output ids
//! are identical across policies. A new policy is one more variant here, with its name and its
//! choice in [`Policy::plan`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Admitted requests run one at a time to completion, in arrival order.
    Fifo,
    /// Admitted requests take turns, one step each (round robin in admission order).
    Interleave,
    /// Continuous batching: every admitted request advances in each step (one forward for all),
    /// new requests join as slots free, and prompts are prefilled in chunks under the step's
    /// token budget (the run's `chunk_size`): decodes first, one token each, then the rest of
    /// the budget to prefills in admission order.
    Batched,
}

/// What a policy may look at when choosing.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub prompt_tokens: usize,
    pub prefill_remaining: usize,
    pub generated: usize,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Fifo, Policy::Interleave, Policy::Batched];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Interleave => "interleave",
            Policy::Batched => "batched",
        }
    }

    pub fn parse(name: &str) -> Result<Self, UnknownPolicy> {
        Self::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| UnknownPolicy(name.to_string()))
    }

    /// The next step: which requests of `active` (indices in admission order) advance, each with
    /// its prefill limit (`None`: the rest of its prompt). `chunk` is the run's chunk size: per
    /// request for the serial policies, the step's token budget for `batched`. `next` is the index
    /// just after the one stepped last, adjusted for removals (the round-robin cursor).
    pub fn plan(self, active: &[Candidate], next: usize, chunk: Option<usize>) -> Vec<(usize, Option<usize>)> {
        debug_assert!(!active.is_empty());
        match self {
            Policy::Fifo => vec![(0, chunk)],
            Policy::Interleave => vec![(next % active.len(), chunk)],
            Policy::Batched => {
                let decoding = |c: &Candidate| c.prefill_remaining == 0;
                let mut step: Vec<(usize, Option<usize>)> =
                    (0..active.len()).filter(|&i| decoding(&active[i])).map(|i| (i, None)).collect();
                let mut budget = chunk.map(|b| b.saturating_sub(step.len()));
                for (i, c) in active.iter().enumerate().filter(|(_, c)| !decoding(c)) {
                    match budget {
                        Some(0) => break,
                        Some(left) => {
                            let take = left.min(c.prefill_remaining);
                            step.push((i, Some(take)));
                            budget = Some(left - take);
                        }
                        None => step.push((i, None)),
                    }
                }
                step.sort_unstable();
                step
            }
        }
    }
}

/// A policy name that is none of [`Policy::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy `{}`; known policies: {}", .0, Policy::ALL.map(Policy::name).join(", "))]
pub struct UnknownPolicy(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known_ones() {
        for p in Policy::ALL {
            assert_eq!(Policy::parse(p.name()), Ok(p));
        }
        let err = Policy::parse("lifo").unwrap_err();
        assert_eq!(err.to_string(), "unknown policy `lifo`; known policies: fifo, interleave, batched");
    }

    #[test]
    fn fifo_sticks_to_the_oldest_and_interleave_rotates() {
        let c = Candidate { prompt_tokens: 1, prefill_remaining: 0, generated: 1 };
        let active = [c, c, c];
        assert_eq!(Policy::Fifo.plan(&active, 2, Some(5)), [(0, Some(5))]);
        assert_eq!(Policy::Interleave.plan(&active, 2, None), [(2, None)]);
        assert_eq!(Policy::Interleave.plan(&active, 3, None), [(0, None)]);
    }

    #[test]
    fn batched_steps_every_decode_then_fills_the_budget_with_prefill_in_admission_order() {
        let decode = Candidate { prompt_tokens: 5, prefill_remaining: 0, generated: 2 };
        let prefill = |left| Candidate { prompt_tokens: 100, prefill_remaining: left, generated: 0 };
        let active = [prefill(40), decode, prefill(30), decode];
        // Budget 64: two decode tokens, then 40 + 22 prompt tokens.
        assert_eq!(Policy::Batched.plan(&active, 0, Some(64)), [(0, Some(40)), (1, None), (2, Some(22)), (3, None)]);
        // A budget spent on decodes leaves prefills waiting.
        assert_eq!(Policy::Batched.plan(&active, 0, Some(2)), [(1, None), (3, None)]);
        // No budget: everything at once, whole prompts.
        assert_eq!(Policy::Batched.plan(&active, 0, None), [(0, None), (1, None), (2, None), (3, None)]);
    }
}
