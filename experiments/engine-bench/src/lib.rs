//! `engine-bench`: the engine's speed goals as an artifact, not a printout. On the generated
//! `qwen2.5-0.5b` checkpoint, in one run: decode against the stock candle-transformers loop; our
//! F32, BF16 and F16 weights against llama.cpp on the same weights (when its Python binding is
//! installed, `.venv-llama/`), prefill of prompts of several lengths and decode at those contexts;
//! a decode step at a long context against a short one; several sessions in one batched step
//! against one; a decode step's stream of bytes against the machine's measured read bandwidth;
//! the scheduler's own cost per step.
//!
//! Every comparison records both sides of every round (or step) as they alternated, and the
//! ratio of each pair; the audit recomputes the ratios and their summary from the pairs. `just
//! bench` runs it into `artifacts/bench/`; `just reproduce` leaves it out (see
//! [`Experiment::reproduced`]).

use clap::Parser;
use common::chart::{Chart, CompareRow, Grouped, Section};
use common::experiment::{read_as, CommandLine, Experiment, ExperimentError, ModelArgs, ReportOptions};
use common::finding::Findings;
use common::gguf::WeightType;
use common::manifest::Invalid;
use common::provenance::Provenance;
use common::qwen::WeightDtype;
use common::sample::Sampling;
use common::stats::{summarize, Summary};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt::Write;

/// The experiment's name.
pub const EXPERIMENT: &str = "engine-bench";

#[derive(Parser, Debug)]
#[command(about = "engine-bench: the engine against the stock candle loop and llama.cpp, context and batch scaling, \
                   scheduler overhead; every round recorded")]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Rounds of each comparison, every prompt length's included [default: the manifest's].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub rounds: Option<u64>,
}

impl CommandLine for Args {
    type Parameters = Parameters;

    fn model(&self) -> &ModelArgs {
        &self.model
    }

    fn effective(&self, base: &Parameters) -> Parameters {
        let mut p = base.clone();
        if let Some(r) = self.rounds {
            p.rounds = r as usize;
            for prompt in &mut p.prompts {
                prompt.rounds = r as usize;
            }
        }
        p
    }

    fn requested(&self) -> Value {
        json!({ "rounds": self.rounds, "model": self.model })
    }
}

/// The manifest's `parameters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    /// Greedy steps timed after each round's prefill.
    pub decode_tokens: usize,
    /// Rounds of each side in a round-by-round comparison.
    pub rounds: usize,
    /// Pairs of steps in a step-by-step comparison.
    pub steps: usize,
    /// The two contexts a decode step is compared at.
    pub short_context: usize,
    pub long_context: usize,
    /// Sessions in the batched step compared with one.
    pub batch: usize,
    /// The prompt lengths prefilled against llama.cpp (each prompt whole, then `decode_tokens`
    /// steps at that context), each with its own rounds: a long prompt's round takes minutes.
    pub prompts: Vec<PromptRounds>,
    /// Bytes of the buffer the machine's read bandwidth is measured on (larger than any cache).
    pub probe_bytes: usize,
}

/// One prompt length of [`Parameters::prompts`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptRounds {
    pub tokens: usize,
    pub rounds: usize,
}

impl Parameters {
    pub fn validate(&self) -> Result<(), Invalid> {
        for (name, v, max) in [
            ("decode_tokens", self.decode_tokens, 4096),
            ("rounds", self.rounds, 1000),
            ("steps", self.steps, 10_000),
            ("short_context", self.short_context, 1 << 20),
            ("long_context", self.long_context, 1 << 20),
            ("batch", self.batch, 256),
        ] {
            if v == 0 || v > max {
                return Err(Invalid::new(format!("parameters.{name}"), format!("{v} is not in 1..={max}")));
            }
        }
        if self.short_context >= self.long_context {
            return Err(Invalid::new("parameters.short_context", "must be below long_context"));
        }
        if self.prompts.is_empty() {
            return Err(Invalid::new("parameters.prompts", "is empty; give at least one {\"tokens\", \"rounds\"}"));
        }
        for (i, p) in self.prompts.iter().enumerate() {
            for (name, v, max) in [("tokens", p.tokens, 1 << 20), ("rounds", p.rounds, 1000)] {
                if v == 0 || v > max {
                    return Err(Invalid::new(
                        format!("parameters.prompts[{i}].{name}"),
                        format!("{v} is not in 1..={max}"),
                    ));
                }
            }
            if i > 0 && p.tokens <= self.prompts[i - 1].tokens {
                return Err(Invalid::new(format!("parameters.prompts[{i}].tokens"), "lengths must increase"));
            }
        }
        if !(1 << 20..=1 << 36).contains(&self.probe_bytes) {
            return Err(Invalid::new("parameters.probe_bytes", "must be 1 MiB to 64 GiB"));
        }
        Ok(())
    }
}

/// How a comparison's ratio is made from one pair `(a, b)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// `a / b`: a speed of ours over theirs, or a long time over a short one.
    AOverB,
    /// `b / a`: their time over ours (how many times faster ours is).
    BOverA,
    /// `n · a / b`: `n` sessions' tokens in a step of time `b` against one in time `a`.
    Aggregate { sessions: usize },
}

impl Rule {
    pub(crate) fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Rule::AOverB => a / b,
            Rule::BOverA => b / a,
            Rule::Aggregate { sessions } => sessions as f64 * a / b,
        }
    }
}

/// Two sides measured alternately, pair by pair, and the ratio of each pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    pub name: String,
    /// What the ratio says, e.g. "ours / stock decode tokens/s".
    pub meaning: String,
    pub unit: String,
    pub a_label: String,
    pub a: Vec<f64>,
    pub b_label: String,
    pub b: Vec<f64>,
    pub rule: Rule,
    pub ratios: Vec<f64>,
    pub ratio: Summary,
}

impl Comparison {
    /// The comparison of two series, its ratios made by `rule`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        meaning: &str,
        unit: &str,
        a_label: &str,
        a: Vec<f64>,
        b_label: &str,
        b: Vec<f64>,
        rule: Rule,
    ) -> Self {
        let ratios: Vec<f64> = a.iter().zip(&b).map(|(a, b)| rule.apply(*a, *b)).collect();
        let ratio = summarize(&ratios);
        Comparison {
            name: name.into(),
            meaning: meaning.into(),
            unit: unit.into(),
            a_label: a_label.into(),
            a,
            b_label: b_label.into(),
            b,
            rule,
            ratios,
            ratio,
        }
    }
}

/// One weight dtype's arithmetic, in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arithmetic {
    pub dtype: String,
    pub arithmetic: String,
}

/// What every artifact records of our dtypes' arithmetic: every dtype a run can compare.
pub fn arithmetic() -> Vec<Arithmetic> {
    [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16, WeightDtype::Native]
        .into_iter()
        .map(|d| Arithmetic { dtype: d.name().into(), arithmetic: common::qwen::arithmetic(d).into() })
        .collect()
}

/// How far two engines' greedy ids agree from the start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Agreement {
    pub what: String,
    pub agree: usize,
    pub of: usize,
}

/// The peer, when it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlamaCpp {
    /// `llama_cpp.__version__` of the binding.
    pub version: String,
    /// Its context's settings as the worker made them (its defaults, but for the context size
    /// and threads): batch, micro-batch, flash attention, KV cache type.
    pub settings: Value,
    /// The GGUF files it ran: weight type, SHA-256, bytes.
    pub gguf: Vec<Gguf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gguf {
    pub weights: String,
    pub sha256: String,
    pub bytes: u64,
}

/// What a decode step must read, by what it holds ([`Comparison`] "decode stream vs read
/// bandwidth" divides it by each step's time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stream {
    /// The cached positions a step attends over (the parameters' short context).
    pub context: usize,
    /// Every layer matrix, in the weights' dtype.
    pub layer_bytes: usize,
    /// The head as its greedy screen reads it (eight-bit rows and their scales).
    pub head_bytes: usize,
    pub kv_bytes: usize,
    pub total_bytes: usize,
    /// The buffer each bandwidth pass reads whole.
    pub probe_bytes: usize,
}

/// The scheduler's time outside forwards, over one run of the seed workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Overhead {
    pub run: String,
    pub steps: usize,
    pub overhead_ms: f64,
    pub forward_ms: f64,
    /// `overhead_ms / forward_ms`, in percent.
    pub share_percent: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub parameters: Parameters,
    pub model_id: String,
    /// The seed prompt's tokens: the prompt of the comparisons that are not by prompt length.
    pub prompt_tokens: usize,
    pub comparisons: Vec<Comparison>,
    /// How our engine computes with each weight dtype it ran ([`common::qwen::arithmetic`]).
    pub arithmetic: Vec<Arithmetic>,
    pub stream: Stream,
    pub agreement: Vec<Agreement>,
    pub llama_cpp: Option<LlamaCpp>,
    /// What did not run, and why.
    pub skipped: Vec<String>,
    pub overhead: Vec<Overhead>,
    /// The sampling the sampled decode step drew with ([`SAMPLED_STEP`]); absent from runs made
    /// before that comparison, which then lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<Sampling>,
    /// Each quantized file whose blocks ran in place ([`WeightDtype::Native`]): its decode
    /// stream and what a fresh process running it holds; absent from runs made before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub native: Vec<NativeFile>,
    pub provenance: Provenance,
}

/// A quantized file's blocks read in place: the bytes a decode step streams of them (its
/// comparison with the read bandwidth is [`native_stream_name`]) and the resident memory of a
/// fresh process of each engine on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NativeFile {
    /// The file's weight type, as [`Gguf::weights`] names it.
    pub weights: String,
    pub stream: Stream,
    /// Absent where a fresh process could not be measured (the reason is in `skipped`).
    pub resident: Option<Resident>,
}

/// The peak resident memory (`VmHWM`) of a fresh process that loads the file, prefills the first
/// prompt length and decodes the parameters' steps, against the file and the KV cache it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resident {
    pub file_bytes: u64,
    /// The positions the process's cache holds: the prompt and the decode steps.
    pub positions: usize,
    /// Our KV cache for those positions, as allocated.
    pub kv_bytes: u64,
    pub ours_peak_bytes: u64,
    /// `ours_peak_bytes / (file_bytes + kv_bytes)`: at most 1.1 is the goal.
    pub ours_over_file_and_kv: f64,
    /// llama.cpp's binding in its worker on the same file and positions (its own KV cache in
    /// F16, the Python interpreter included); absent where llama.cpp did not run.
    pub llama_peak_bytes: Option<u64>,
}

impl Resident {
    pub fn new(file_bytes: u64, positions: usize, kv_bytes: u64, ours_peak_bytes: u64, llama: Option<u64>) -> Self {
        Resident {
            file_bytes,
            positions,
            kv_bytes,
            ours_peak_bytes,
            ours_over_file_and_kv: ours_peak_bytes as f64 / (file_bytes as f64 + kv_bytes as f64),
            llama_peak_bytes: llama,
        }
    }
}

/// The comparison of a quantized pair's decode stream with the read bandwidth.
pub fn native_stream_name(pair: &str) -> String {
    format!("{pair}: {STREAM}")
}

/// Which of our weight dtypes run against each of llama.cpp's weight types (its F32 against our
/// F32; its F16 against our BF16 and F16; its block formats against ours read in place from the
/// same file).
pub const AGAINST_LLAMA: [(WeightType, &[WeightDtype]); 5] = [
    (WeightType::F32, &[WeightDtype::F32]),
    (WeightType::F16, &[WeightDtype::Bf16, WeightDtype::F16]),
    (WeightType::Q8_0, &[WeightDtype::Native]),
    (WeightType::Q4_0, &[WeightDtype::Native]),
    (WeightType::Q4_1, &[WeightDtype::Native]),
];

/// A llama.cpp pair's name, as its comparisons and agreement are named: `llama.cpp f16 vs ours bf16`.
pub fn llama_pair(weights: WeightType, ours: WeightDtype) -> String {
    format!("llama.cpp {weights:?} vs ours {}", ours.name()).to_lowercase()
}

/// A llama.cpp pair's comparisons at one prompt length: prefill of the prompt, then decode at
/// its context; and the agreement of their greedy ids.
pub fn prefill_name(pair: &str, tokens: usize) -> String {
    format!("{pair}: prefill {tokens}")
}

pub fn decode_name(pair: &str, tokens: usize) -> String {
    format!("{pair}: decode at {tokens}")
}

pub fn agreement_name(pair: &str, tokens: usize) -> String {
    format!("{pair}, prompt {tokens}")
}

/// Our ids on `dtype` against our F32 ids on the same prompt, as an agreement is named: for half
/// precision the checkpoint's F32 run, for a file's blocks read in place (`weights`' file) the
/// same file widened to F32.
pub fn against_f32(dtype: WeightDtype, weights: WeightType) -> String {
    match dtype {
        WeightDtype::Native => format!("ours native vs ours f32 of the {weights:?} file").to_lowercase(),
        _ => format!("ours {} vs ours f32", dtype.name()),
    }
}

/// The comparison of a decode step's stream with the machine's read bandwidth.
pub const STREAM: &str = "decode stream vs read bandwidth";

/// The comparison of a sampled decode step with a greedy one.
pub const SAMPLED_STEP: &str = "sampled vs greedy decode step";

/// The sampling a product would use, as the sampled step draws: temperature 0.7, top-k 50,
/// top-p 0.9 (the top-k read through the head's screen).
pub const SAMPLED: Sampling =
    Sampling { temperature: 0.7, top_k: 50, top_p: 0.9, min_p: 0.0, repetition_penalty: 1.0, seed: 1 };

/// The comparisons every run makes, whatever ran beside it, and what their pairs count (and
/// [`SAMPLED_STEP`], in every run that records its sampling).
const ALWAYS: [(&str, Pairs); 4] = [
    ("decode vs stock candle", Pairs::Rounds),
    ("decode step, long vs short context", Pairs::Steps),
    ("batched decode step", Pairs::Steps),
    (STREAM, Pairs::Steps),
];

/// What a comparison's pairs are counted in: the parameters' rounds, its prompt length's rounds,
/// or steps.
#[derive(Clone, Copy)]
enum Pairs {
    Rounds,
    Prompt(usize),
    Steps,
}

/// The run made the comparisons it always makes, and llama.cpp's (prefill and decode at every
/// prompt length, for each of our dtypes against each of its weights) exactly when llama.cpp ran,
/// one agreement each; each comparison's pairs are as many as its parameter says, and a batched
/// comparison's sessions are the parameters' batch; the stream is the model's at the short
/// context, its parts summed; the scheduler's overhead is of the seed's runs and continuous
/// batching.
fn check_plan(a: &Artifact, f: &mut Findings) {
    let p = &a.parameters;
    let llama: Vec<String> = a
        .llama_cpp
        .iter()
        .flat_map(|l| &l.gguf)
        .flat_map(|g| {
            let side = AGAINST_LLAMA.iter().find(|(w, _)| format!("{w:?}").eq_ignore_ascii_case(&g.weights));
            match side {
                Some((w, ours)) => ours.iter().map(|d| llama_pair(*w, *d)).collect(),
                None => vec![format!("llama.cpp {}", g.weights)],
            }
        })
        .collect();
    let mut planned: Vec<(String, Pairs)> = ALWAYS.iter().map(|(n, k)| (n.to_string(), *k)).collect();
    if a.sampled.is_some() {
        planned.push((SAMPLED_STEP.to_string(), Pairs::Steps));
    }
    let native: Vec<(WeightType, String)> = AGAINST_LLAMA
        .iter()
        .filter(|(w, ds)| ds.contains(&WeightDtype::Native) && llama.contains(&llama_pair(*w, WeightDtype::Native)))
        .map(|(w, _)| (*w, llama_pair(*w, WeightDtype::Native)))
        .collect();
    planned.extend(native.iter().map(|(_, pair)| (native_stream_name(pair), Pairs::Steps)));
    let mut agreements = Vec::new();
    for pair in &llama {
        for prompt in &p.prompts {
            planned.push((prefill_name(pair, prompt.tokens), Pairs::Prompt(prompt.rounds)));
            planned.push((decode_name(pair, prompt.tokens), Pairs::Prompt(prompt.rounds)));
            agreements.push(agreement_name(pair, prompt.tokens));
        }
    }
    // Our half precision against our F32 where both ran (the F32 ids come from the F32 pair); our
    // blocks read in place against the same file widened, wherever they ran.
    let f32_ran = llama.contains(&llama_pair(WeightType::F32, WeightDtype::F32));
    for (w, dtypes) in AGAINST_LLAMA {
        for d in dtypes.iter().filter(|d| **d != WeightDtype::F32 && llama.contains(&llama_pair(w, **d))) {
            if f32_ran || *d == WeightDtype::Native {
                agreements.extend(p.prompts.iter().map(|prompt| agreement_name(&against_f32(*d, w), prompt.tokens)));
            }
        }
    }
    let mut names: Vec<&str> = a.comparisons.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    let mut wanted: Vec<&str> = planned.iter().map(|(n, _)| n.as_str()).collect();
    wanted.sort_unstable();
    if names != wanted {
        return f.wrong("invariants", "comparisons", format!("{names:?}, but the run's plan makes {wanted:?}"));
    }
    for (i, c) in a.comparisons.iter().enumerate() {
        let kind = planned.iter().find(|(n, _)| *n == c.name).map(|(_, k)| *k);
        let pairs = match kind {
            Some(Pairs::Rounds) => p.rounds,
            Some(Pairs::Prompt(rounds)) => rounds,
            _ => p.steps,
        };
        if c.a.len() != pairs {
            f.wrong(
                "invariants",
                format!("comparisons[{i}].a"),
                format!("{} pairs, the parameters make {pairs}", c.a.len()),
            );
        }
        if let Rule::Aggregate { sessions } = c.rule {
            if sessions != p.batch {
                f.wrong(
                    "invariants",
                    format!("comparisons[{i}].rule"),
                    format!("{sessions} sessions, the parameters' batch is {}", p.batch),
                );
            }
        }
    }
    let mut agreed: Vec<&str> = a.agreement.iter().map(|g| g.what.as_str()).collect();
    agreed.sort_unstable();
    agreements.sort_unstable();
    if agreed != agreements {
        f.wrong("invariants", "agreement", format!("{agreed:?}, one per llama.cpp pair and prompt {agreements:?}"));
    }
    let probe = common::kernel::ReadProbe::bytes_for(p.probe_bytes);
    let streams = std::iter::once(("stream".to_string(), &a.stream))
        .chain(a.native.iter().enumerate().map(|(i, n)| (format!("native[{i}].stream"), &n.stream)));
    for (field, s) in streams {
        if s.context != p.short_context
            || s.probe_bytes != probe
            || s.layer_bytes.checked_add(s.head_bytes).and_then(|b| b.checked_add(s.kv_bytes)) != Some(s.total_bytes)
        {
            f.wrong(
                "invariants",
                field,
                format!("not at the short context, its probe not the {probe} bytes the parameters make, or its parts do not sum to its total"),
            );
        }
    }
    let files: Vec<String> = a.native.iter().map(|n| n.weights.clone()).collect();
    let ran: Vec<String> = native.iter().map(|(w, _)| format!("{w:?}").to_lowercase()).collect();
    if files != ran {
        f.wrong("invariants", "native", format!("{files:?}, but the quantized pairs that ran are {ran:?}"));
    }
    let first = p.prompts.first().map_or(0, |l| l.tokens) + p.decode_tokens + 1;
    for (i, r) in a.native.iter().enumerate().filter_map(|(i, n)| Some((i, n.resident.as_ref()?))) {
        let fresh = Resident::new(r.file_bytes, r.positions, r.kv_bytes, r.ours_peak_bytes, r.llama_peak_bytes);
        let recorded = a.llama_cpp.iter().flat_map(|l| &l.gguf).find(|g| g.weights == a.native[i].weights);
        if r.positions != first || recorded.is_none_or(|g| g.bytes != r.file_bytes) {
            f.wrong(
                "invariants",
                format!("native[{i}].resident"),
                "not of the first prompt length and the decode steps, or not of the file llama.cpp ran",
            );
        } else if fresh.ours_over_file_and_kv != r.ours_over_file_and_kv {
            f.wrong(
                "invariants",
                format!("native[{i}].resident.ours_over_file_and_kv"),
                "is not the peak over the file and KV bytes",
            );
        }
    }
    // The dtypes recorded as this engine computes with them, in its order (a run from before a
    // dtype existed records those before it), and every dtype a pair ran among them.
    let now = arithmetic();
    let recorded = |d: WeightDtype| a.arithmetic.iter().any(|r| r.dtype == d.name());
    let ran = AGAINST_LLAMA.iter().flat_map(|(w, ds)| ds.iter().map(move |d| (*w, *d)));
    if now.get(..a.arithmetic.len()) != Some(&a.arithmetic[..])
        || ran.filter(|(w, d)| llama.contains(&llama_pair(*w, *d))).any(|(_, d)| !recorded(d))
    {
        f.wrong("invariants", "arithmetic", "is not how this engine computes with its dtypes");
    }
    if let Some(i) = a.agreement.iter().position(|g| g.agree > g.of || g.of > p.decode_tokens + 1) {
        f.wrong("invariants", format!("agreement[{i}]"), "more agreeing ids than ids, or than a round generates");
    }
    let runs: Vec<&str> = a.overhead.iter().map(|o| o.run.as_str()).collect();
    if runs != ["fifo", "interleave", "interleave chunk 64", "batched chunk 64"] {
        f.wrong("invariants", "overhead", format!("{runs:?}: the seed's runs and continuous batching, once each"));
    }
}

fn check(a: &Artifact, f: &mut Findings) {
    if let Err(Invalid { field, problem }) = a.parameters.validate() {
        return f.wrong("invariants", field, problem);
    }
    check_plan(a, f);
    for (i, c) in a.comparisons.iter().enumerate() {
        let at = |k: &str| format!("comparisons[{i}].{k}");
        if c.a.len() != c.b.len() || c.a.is_empty() {
            f.wrong(
                "invariants",
                at("b"),
                format!("{} values against {}: the sides alternate in pairs", c.b.len(), c.a.len()),
            );
            continue;
        }
        if let Some(j) = c.a.iter().chain(&c.b).position(|v| !(v.is_finite() && *v > 0.0)) {
            f.wrong("invariants", at("a"), format!("value {j} is not a positive measurement"));
        }
        let fresh =
            Comparison::new(&c.name, &c.meaning, &c.unit, &c.a_label, c.a.clone(), &c.b_label, c.b.clone(), c.rule);
        if fresh.ratios != c.ratios {
            f.wrong("invariants", at("ratios"), "differ from the ratios recomputed from the pairs");
        }
        if fresh.ratio != c.ratio {
            f.wrong("invariants", at("ratio"), "differs from the summary of the ratios");
        }
    }
    for (i, o) in a.overhead.iter().enumerate() {
        let share = 100.0 * o.overhead_ms / o.forward_ms;
        if !(o.forward_ms > 0.0 && o.overhead_ms >= 0.0) || share != o.share_percent {
            f.wrong("invariants", format!("overhead[{i}].share_percent"), "is not overhead_ms / forward_ms");
        }
    }
    let ran = a.comparisons.iter().any(|c| c.name.starts_with("llama.cpp"));
    if ran != a.llama_cpp.is_some() {
        f.wrong("invariants", "llama_cpp", "the llama.cpp comparisons and its version record come together");
    }
    if serde_json::to_value(&a.parameters).ok().as_ref() != Some(&a.provenance.settings.effective) {
        f.wrong("invariants", "parameters", "differs from provenance.settings.effective");
    }
}

/// The engine benchmark, as the workspace tools see it.
pub struct EngineBench;

impl Experiment for EngineBench {
    const NAME: &'static str = EXPERIMENT;
    const REPRODUCED: bool = false;
    type Parameters = Parameters;
    type Expectations = Value;
    type Artifact = Artifact;
    type Args = Args;

    fn validate(&self, parameters: &Parameters) -> Result<(), Invalid> {
        parameters.validate()
    }

    fn audit(&self, artifact: &Artifact, _expectations: Option<&Value>, f: &mut Findings) {
        check(artifact, f)
    }

    fn rederive(&self, a: &mut Artifact) {
        for c in &mut a.comparisons {
            let (a_side, b_side) = (std::mem::take(&mut c.a), std::mem::take(&mut c.b));
            *c = Comparison::new(&c.name, &c.meaning, &c.unit, &c.a_label, a_side, &c.b_label, b_side, c.rule);
        }
        for o in &mut a.overhead {
            o.share_percent = 100.0 * o.overhead_ms / o.forward_ms;
        }
        for r in a.native.iter_mut().filter_map(|n| n.resident.as_mut()) {
            *r = Resident::new(r.file_bytes, r.positions, r.kv_bytes, r.ours_peak_bytes, r.llama_peak_bytes);
        }
    }

    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        _options: &ReportOptions,
    ) -> Result<Section, ExperimentError> {
        let a: Artifact = read_as(title, artifact)?;
        let mut section = Section::new(dir);
        let mut md = format!(
            "## Engine benchmark: {title}\n\nModel `{}`, prompt {} tokens; median (min-max) of the per-pair ratios.\n\n\
             | comparison | A | B | ratio | meaning |\n|---|---|---|---|---|\n",
            a.model_id, a.prompt_tokens
        );
        let spread = |s: &Summary| match (s.p50, s.min, s.max) {
            (Some(m), Some(lo), Some(hi)) => format!("{m:.3} ({lo:.3}-{hi:.3})"),
            _ => "-".into(),
        };
        for c in &a.comparisons {
            let (ma, mb) = (summarize(&c.a).p50.unwrap_or(f64::NAN), summarize(&c.b).p50.unwrap_or(f64::NAN));
            let _ = writeln!(
                md,
                "| {} | {} {ma:.2} {} | {} {mb:.2} {} | {} | {} |",
                c.name,
                c.a_label,
                c.unit,
                c.b_label,
                c.unit,
                spread(&c.ratio),
                c.meaning
            );
        }
        let st = &a.stream;
        let _ = writeln!(
            md,
            "\nA decode step at context {} reads {:.1} MB: layers {:.1}, head screen {:.1}, KV {:.1}; the bandwidth \
             probe reads {:.0} MB a pass.",
            st.context,
            st.total_bytes as f64 / 1e6,
            st.layer_bytes as f64 / 1e6,
            st.head_bytes as f64 / 1e6,
            st.kv_bytes as f64 / 1e6,
            st.probe_bytes as f64 / 1e6
        );
        for x in &a.arithmetic {
            let _ = writeln!(md, "\nOurs in {}: {}.", x.dtype, x.arithmetic);
        }
        if let Some(l) = &a.llama_cpp {
            let _ = writeln!(md, "\nllama.cpp (binding {}) ran with {}.", l.version, l.settings);
        }
        for s in &a.skipped {
            let _ = writeln!(md, "\n_Skipped: {s}_");
        }
        md.push('\n');
        section.markdown = md;
        let chart = Grouped {
            title: "ratios per comparison (median, whiskers: min-max over pairs)".into(),
            y_label: "ratio".into(),
            categories: a.comparisons.iter().map(|c| c.name.clone()).collect(),
            series: vec![(
                "ratio".into(),
                a.comparisons.iter().map(|c| (c.ratio.p50.unwrap_or(f64::NAN), c.ratio.min.zip(c.ratio.max))).collect(),
            )],
        };
        section.image("ratios", "ratios per comparison", Chart::Grouped(chart));
        Ok(section)
    }

    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow> {
        let comparisons = |v: &Value| -> Vec<Comparison> {
            v.get("comparisons").and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or_default()
        };
        let (ca, cb) = (comparisons(a), comparisons(b));
        ca.iter()
            .map(|c| {
                let other = cb.iter().find(|d| d.name == c.name).and_then(|d| d.ratio.p50);
                (format!("{} ratio (median)", c.name), c.ratio.p50, other)
            })
            .collect()
    }
}
