//! The shapes a generated workload is drawn to, as the command line writes them: token-count
//! distributions (`--input-tokens`, `--output-tokens`), shared-prefix groups and multi-turn
//! conversations; each parsed with its bounds, and described as the workload's record says it.

/// The most turns a conversation may have.
pub const MAX_TURNS: usize = 1000;

/// A distribution of token counts: `fixed:N`, `uniform:LO:HI` (both included) or
/// `normal:MEAN:SD:LO:HI` (drawn, then held within LO..=HI).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lengths {
    Fixed(usize),
    Uniform(usize, usize),
    Normal { mean: f64, sd: f64, lo: usize, hi: usize },
}

/// A `--input-tokens` or `--output-tokens` value that names no distribution.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a length distribution: fixed:N, uniform:LO:HI or normal:MEAN:SD:LO:HI, counts from 1 to {max}", max = MAX_SYNTHETIC_TOKENS)]
pub struct LengthsError(String);

/// The most tokens of text a generated workload draws, all its prompts together: drawing costs
/// tokenizer work in proportion, before anything is sent.
pub const MAX_GENERATED_TOKENS: u128 = 1 << 24;

/// The longest synthetic prompt or answer, in tokens.
pub const MAX_SYNTHETIC_TOKENS: usize = 1 << 17;

impl Lengths {
    pub fn parse(s: &str) -> Result<Self, LengthsError> {
        let bad = || LengthsError(s.to_string());
        let parts: Vec<&str> = s.split(':').collect();
        let count =
            |p: &str| p.parse::<usize>().ok().filter(|n| (1..=MAX_SYNTHETIC_TOKENS).contains(n)).ok_or_else(bad);
        let real = |p: &str| p.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).ok_or_else(bad);
        let lengths = match parts.as_slice() {
            ["fixed", n] => Lengths::Fixed(count(n)?),
            ["uniform", lo, hi] => Lengths::Uniform(count(lo)?, count(hi)?),
            ["normal", mean, sd, lo, hi] => {
                Lengths::Normal { mean: real(mean)?, sd: real(sd)?, lo: count(lo)?, hi: count(hi)? }
            }
            _ => return Err(bad()),
        };
        match lengths {
            Lengths::Uniform(lo, hi) | Lengths::Normal { lo, hi, .. } if lo > hi => Err(bad()),
            l => Ok(l),
        }
    }

    pub(super) fn draw(self, rng: &mut impl rand::Rng) -> usize {
        match self {
            Lengths::Fixed(n) => n,
            Lengths::Uniform(lo, hi) => rng.random_range(lo..=hi),
            Lengths::Normal { mean, sd, lo, hi } => {
                let v = rand_distr::Normal::new(mean, sd)
                    .map(|d| rand_distr::Distribution::sample(&d, rng))
                    .unwrap_or(mean);
                (v.round().max(lo as f64).min(hi as f64)) as usize
            }
        }
    }

    /// The longest it draws.
    pub(super) fn max(self) -> usize {
        match self {
            Lengths::Fixed(n) | Lengths::Uniform(_, n) | Lengths::Normal { hi: n, .. } => n,
        }
    }

    /// As written on the command line.
    pub fn describe(self) -> String {
        match self {
            Lengths::Fixed(n) => format!("fixed:{n}"),
            Lengths::Uniform(lo, hi) => format!("uniform:{lo}:{hi}"),
            Lengths::Normal { mean, sd, lo, hi } => format!("normal:{mean}:{sd}:{lo}:{hi}"),
        }
    }
}

/// A `--shared-prefix` shape: `groups` system prompts of `prefix` tokens, each shared by
/// `prompts` requests with questions of `question` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPrefix {
    pub groups: usize,
    pub prompts: usize,
    pub prefix: usize,
    pub question: usize,
}

/// A `--shared-prefix` value that is no shape.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a shared-prefix shape: GROUPS:PROMPTS:PREFIX:QUESTION, e.g. 1:32:1000:24 (groups and prompts from 1 to 10000, token counts from 1 to {max})", max = MAX_SYNTHETIC_TOKENS)]
pub struct SharedPrefixError(String);

impl SharedPrefix {
    pub fn parse(s: &str) -> Result<Self, SharedPrefixError> {
        let [groups, prompts, prefix, question] =
            four_counts(s, [10_000, 10_000, MAX_SYNTHETIC_TOKENS, MAX_SYNTHETIC_TOKENS])
                .ok_or_else(|| SharedPrefixError(s.to_string()))?;
        Ok(SharedPrefix { groups, prompts, prefix, question })
    }

    /// As the record and the command line give it.
    pub fn describe(self) -> String {
        let SharedPrefix { groups, prompts, prefix, question } = self;
        format!("{groups}:{prompts}:{prefix}:{question} ({groups} groups of {prompts} prompts: a shared system prompt of {prefix} tokens, a question of {question})")
    }
}

/// A `--multi-turn` shape: `conversations` conversations of `turns` turns, each with a system
/// prompt of `system` tokens and user turns of `question` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiTurn {
    pub conversations: usize,
    pub turns: usize,
    pub system: usize,
    pub question: usize,
}

/// A `--multi-turn` value that is no shape.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a multi-turn shape: CONVERSATIONS:TURNS:SYSTEM:QUESTION, e.g. 8:6:200:40 (conversations from 1 to 10000, turns from 1 to {turns}, token counts from 1 to {max})", turns = MAX_TURNS, max = MAX_SYNTHETIC_TOKENS)]
pub struct MultiTurnError(String);

impl MultiTurn {
    pub fn parse(s: &str) -> Result<Self, MultiTurnError> {
        let [conversations, turns, system, question] =
            four_counts(s, [10_000, MAX_TURNS, MAX_SYNTHETIC_TOKENS, MAX_SYNTHETIC_TOKENS])
                .ok_or_else(|| MultiTurnError(s.to_string()))?;
        Ok(MultiTurn { conversations, turns, system, question })
    }

    /// As the record and the command line give it.
    pub fn describe(self) -> String {
        let MultiTurn { conversations, turns, system, question } = self;
        format!("{conversations}:{turns}:{system}:{question} ({conversations} conversations of {turns} turns: a system prompt of {system} tokens each, user turns of {question})")
    }
}

/// `A:B:C:D`, four counts each from 1 to its maximum.
fn four_counts(s: &str, max: [usize; 4]) -> Option<[usize; 4]> {
    let parts: Vec<&str> = s.split(':').collect();
    let parts: [&str; 4] = parts.try_into().ok()?;
    let mut out = [0; 4];
    for ((o, p), m) in out.iter_mut().zip(parts).zip(max) {
        *o = p.parse::<usize>().ok().filter(|n| (1..=m).contains(n))?;
    }
    Some(out)
}
