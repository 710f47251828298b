//! Scheduling policies: which active request takes the next step.
//!
//! A policy only decides *when* work runs, never *what* it computes: every session's steps are
//! the same whatever the order, so greedy output ids are identical across policies. A new policy
//! is one more variant here, with its name and its choice in [`Policy::pick`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Admitted requests run one at a time to completion, in arrival order.
    Fifo,
    /// Admitted requests take turns, one step each (round robin in admission order).
    Interleave,
}

/// What a policy may look at when choosing.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub prompt_tokens: usize,
    pub prefill_remaining: usize,
    pub generated: usize,
}

impl Policy {
    pub const ALL: [Policy; 2] = [Policy::Fifo, Policy::Interleave];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Interleave => "interleave",
        }
    }

    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
            let known: Vec<_> = Self::ALL.iter().map(|p| p.name()).collect();
            format!("unknown policy `{name}`; known policies: {}", known.join(", "))
        })
    }

    /// Index into `active` (admission order) of the request to step next. `next` is the index
    /// just after the one stepped last, adjusted for removals (the round-robin cursor).
    pub fn pick(self, active: &[Candidate], next: usize) -> usize {
        debug_assert!(!active.is_empty());
        match self {
            Policy::Fifo => 0,
            Policy::Interleave => next % active.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known_ones() {
        for p in Policy::ALL {
            assert_eq!(Policy::parse(p.name()), Ok(p));
        }
        let err = Policy::parse("lifo").unwrap_err();
        assert_eq!(err, "unknown policy `lifo`; known policies: fifo, interleave");
    }

    #[test]
    fn fifo_sticks_to_the_oldest_and_interleave_rotates() {
        let c = Candidate { prompt_tokens: 1, prefill_remaining: 0, generated: 1 };
        let active = [c, c, c];
        assert_eq!(Policy::Fifo.pick(&active, 2), 0);
        assert_eq!(Policy::Interleave.pick(&active, 2), 2);
        assert_eq!(Policy::Interleave.pick(&active, 3), 0);
    }
}
