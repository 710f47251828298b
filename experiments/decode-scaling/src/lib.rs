//! `decode-scaling`: the engine's cost curves as a study. A decode step's time against the context
//! it attends over and against the sessions batched into it, and a prompt's prefill time against
//! the chunk size, each measured on our engine and on the stock candle-transformers loop over the
//! same checkpoint, the two taking turns point by point in every round.
//!
//! Made with `just new-experiment`. The binary (`main.rs`) measures; this library is what the
//! workspace tools know of it, through [`DecodeScaling`]'s [`Experiment`] implementation: its
//! types, its invariants (every summary and ratio recomputed from the recorded steps), and its
//! report section with the curves.

use clap::Parser;
use common::chart::{cell, Chart, CompareRow, Lines, Section};
use common::experiment::{read_as, CommandLine, Experiment, ExperimentError, ModelArgs, ReportOptions};
use common::finding::Findings;
use common::manifest::Invalid;
use common::provenance::Provenance;
use common::stats::{summarize, Summary};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt::Write;

/// The experiment's name.
pub const EXPERIMENT: &str = "decode-scaling";

#[derive(Parser, Debug)]
#[command(about = "decode-scaling: decode step time against context and batch, prefill time against chunk size, \
                   our engine beside the stock candle-transformers loop")]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Measured rounds [default: the manifest's].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub rounds: Option<u64>,
    /// Leave out the stock candle-transformers loop (our engine alone, much faster).
    #[arg(long)]
    pub no_stock: bool,
}

impl CommandLine for Args {
    type Parameters = Parameters;

    fn model(&self) -> &ModelArgs {
        &self.model
    }

    /// The manifest's parameters with the command line's overrides.
    fn effective(&self, base: &Parameters) -> Parameters {
        let mut p = base.clone();
        if let Some(r) = self.rounds {
            p.rounds = r as usize;
        }
        if self.no_stock {
            p.stock = false;
        }
        p
    }

    /// What the command line asked for, as `provenance.settings.requested` records it.
    fn requested(&self) -> Value {
        json!({ "rounds": self.rounds, "no_stock": self.no_stock, "model": self.model })
    }
}

/// The manifest's `parameters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    /// Context lengths a single session's decode step attends over.
    pub contexts: Vec<usize>,
    /// Sessions decoding in one batched step, each at `batch_context`.
    pub batches: Vec<usize>,
    pub batch_context: usize,
    /// Prompt tokens prefilled, once per chunk size.
    pub prefill_tokens: usize,
    /// Largest prefill step, in tokens.
    pub chunk_sizes: Vec<usize>,
    /// Prompt lengths prefilled whole, in one step each (long prompts built from the seed's).
    pub prompt_lengths: Vec<usize>,
    /// Timed decode steps per point (after one untimed).
    pub steps: usize,
    /// Rounds; in each, every point runs on our engine, then on the stock loop.
    pub rounds: usize,
    /// Whether the stock candle-transformers loop runs beside our engine.
    pub stock: bool,
}

/// Limits that keep every count small enough to run and every product far from overflow.
const MAX_TOKENS: usize = 1 << 20;
const MAX_BATCH: usize = 256;
const MAX_STEPS: usize = 10_000;

impl Parameters {
    /// Checks what can be checked before the model is loaded; the error names the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        let nonempty = |name: &str, v: &[usize], max: usize| -> Result<(), Invalid> {
            if v.is_empty() {
                return Err(Invalid::new(format!("parameters.{name}"), "empty; give at least one"));
            }
            match v.iter().position(|&x| x == 0 || x > max) {
                Some(i) => {
                    Err(Invalid::new(format!("parameters.{name}[{i}]"), format!("{} is not in 1..={max}", v[i])))
                }
                None => Ok(()),
            }
        };
        nonempty("contexts", &self.contexts, MAX_TOKENS)?;
        nonempty("batches", &self.batches, MAX_BATCH)?;
        nonempty("chunk_sizes", &self.chunk_sizes, MAX_TOKENS)?;
        nonempty("prompt_lengths", &self.prompt_lengths, MAX_TOKENS)?;
        for (name, v, max) in [
            ("batch_context", self.batch_context, MAX_TOKENS),
            ("prefill_tokens", self.prefill_tokens, MAX_TOKENS),
            ("steps", self.steps, MAX_STEPS),
            ("rounds", self.rounds, 1000),
        ] {
            if v == 0 || v > max {
                return Err(Invalid::new(format!("parameters.{name}"), format!("{v} is not in 1..={max}")));
            }
        }
        Ok(())
    }

    /// The decode points: every context at batch 1, then every batch at `batch_context`.
    pub fn decode_points(&self) -> Vec<(usize, usize)> {
        let mut points: Vec<(usize, usize)> = self.contexts.iter().map(|&c| (c, 1)).collect();
        for &b in &self.batches {
            if !points.contains(&(self.batch_context, b)) {
                points.push((self.batch_context, b));
            }
        }
        points
    }

    /// The longest sequence a point needs: its context, the untimed step and the timed ones.
    pub fn longest(&self) -> usize {
        let context = self
            .contexts
            .iter()
            .chain(&self.prompt_lengths)
            .copied()
            .chain([self.batch_context, self.prefill_tokens])
            .max();
        context.unwrap_or(0) + self.steps + 1
    }
}

/// The manifest's `expectations`: none; timings are this machine's.
pub type Expectations = Value;

/// Which loop a point ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// This project's engine: `Qwen2::next_batch` for decode (the greedy id through the head's
    /// screen, as the engine runs it), `Session` steps for prefill.
    Ours,
    /// candle-transformers' `qwen2::ModelForCausalLM`, one forward per step, argmax of its logits.
    StockCandle,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Ours => "ours",
            Engine::StockCandle => "stock-candle",
        }
    }
}

/// One decode point of one round: `batch` sessions at `context`, `steps` timed steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecodePoint {
    pub engine: Engine,
    pub round: usize,
    pub context: usize,
    pub batch: usize,
    /// Wall time of each timed step, milliseconds.
    pub step_ms: Vec<f64>,
}

/// One prefill of `prefill_tokens` in steps of at most `chunk_size`, one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrefillPoint {
    pub engine: Engine,
    pub round: usize,
    pub chunk_size: usize,
    /// Wall time of each chunk, milliseconds.
    pub chunk_ms: Vec<f64>,
}

/// One prompt of `tokens` prefilled whole, one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptPoint {
    pub engine: Engine,
    pub round: usize,
    pub tokens: usize,
    /// Wall time of the prefill, milliseconds.
    pub ms: f64,
}

/// Per engine and point, over rounds: each round's median step (decode) or total (prefill).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummaryRow {
    /// `decode context C batch B`, `prefill chunk C` or `prefill prompt L`.
    pub point: String,
    pub engine: Engine,
    pub ms: Summary,
    /// Tokens per second at the median: `batch` per decode step, `prefill_tokens` per chunked
    /// prefill, `L` per prompt of `L`.
    pub tokens_per_s: Option<f64>,
}

/// Per point, over rounds: the stock loop's time over ours in the same round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RatioRow {
    pub point: String,
    pub stock_over_ours: Summary,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub parameters: Parameters,
    pub model_id: String,
    pub decode: Vec<DecodePoint>,
    pub prefill: Vec<PrefillPoint>,
    pub prompts: Vec<PromptPoint>,
    pub summary: Vec<SummaryRow>,
    pub ratios: Vec<RatioRow>,
    /// What the numbers are and are not.
    pub notes: String,
    pub provenance: Provenance,
}

/// What the numbers are and are not (every artifact's `notes`).
pub const NOTES: &str =
    "Wall-clock times on this machine, both loops in one process taking turns point by point. Ours decodes \
                through Qwen2::next_batch (greedy ids) over caches marked filled to the context (a step's work does not depend \
                on the cached values) and prefills through Session steps; the stock loop is candle-transformers' \
                qwen2::ModelForCausalLM in F32 with its own concatenating KV cache, filled by real forwards, and \
                takes the argmax of its logits.";

fn decode_label(context: usize, batch: usize) -> String {
    format!("decode context {context} batch {batch}")
}

fn prefill_label(chunk: usize) -> String {
    format!("prefill chunk {chunk}")
}

fn prompt_label(tokens: usize) -> String {
    format!("prefill prompt {tokens}")
}

fn median(v: &[f64]) -> f64 {
    summarize(v).p50.unwrap_or(f64::NAN)
}

/// Each point's per-round value, by engine, in the parameters' order: the median decode step,
/// the chunked prefill's total, or the prompt's prefill. One function for the binary and the audit.
fn per_round(p: &Parameters, points: &Points) -> Vec<(String, Engine, Vec<f64>, f64)> {
    let Points { decode, prefill, prompts } = points;
    let mut rows = Vec::new();
    for engine in [Engine::Ours, Engine::StockCandle] {
        for (context, batch) in p.decode_points() {
            let values: Vec<f64> = decode
                .iter()
                .filter(|d| d.engine == engine && d.context == context && d.batch == batch)
                .map(|d| median(&d.step_ms))
                .collect();
            rows.push((decode_label(context, batch), engine, values, batch as f64));
        }
        for &chunk in &p.chunk_sizes {
            let values: Vec<f64> = prefill
                .iter()
                .filter(|d| d.engine == engine && d.chunk_size == chunk)
                .map(|d| d.chunk_ms.iter().sum())
                .collect();
            rows.push((prefill_label(chunk), engine, values, p.prefill_tokens as f64));
        }
        for &tokens in &p.prompt_lengths {
            let values: Vec<f64> =
                prompts.iter().filter(|d| d.engine == engine && d.tokens == tokens).map(|d| d.ms).collect();
            rows.push((prompt_label(tokens), engine, values, tokens as f64));
        }
    }
    rows.retain(|(_, _, values, _)| !values.is_empty());
    rows
}

/// An artifact's recorded points, by kind.
pub struct Points<'a> {
    pub decode: &'a [DecodePoint],
    pub prefill: &'a [PrefillPoint],
    pub prompts: &'a [PromptPoint],
}

impl Artifact {
    pub fn points(&self) -> Points<'_> {
        Points { decode: &self.decode, prefill: &self.prefill, prompts: &self.prompts }
    }
}

/// The summary rows and the stock-over-ours ratios, from the recorded points.
pub fn summarize_points(p: &Parameters, points: &Points) -> (Vec<SummaryRow>, Vec<RatioRow>) {
    let rows = per_round(p, points);
    let summary = rows
        .iter()
        .map(|(point, engine, values, tokens)| {
            let ms = summarize(values);
            let tokens_per_s = ms.p50.filter(|m| *m > 0.0).map(|m| tokens * 1000.0 / m);
            SummaryRow { point: point.clone(), engine: *engine, ms, tokens_per_s }
        })
        .collect();
    let ratios = rows
        .iter()
        .filter(|(_, engine, ..)| *engine == Engine::Ours)
        .filter_map(|(point, _, ours, _)| {
            let stock = rows.iter().find(|(q, e, ..)| q == point && *e == Engine::StockCandle)?;
            let per_round: Vec<f64> = ours.iter().zip(&stock.2).map(|(o, s)| s / o).collect();
            Some(RatioRow { point: point.clone(), stock_over_ours: summarize(&per_round) })
        })
        .collect();
    (summary, ratios)
}

/// The invariants of an artifact: every point of every round present once, with its step count;
/// every duration a positive number; the summary and the ratios those of the points.
fn check(a: &Artifact, f: &mut Findings) {
    if let Err(Invalid { field, problem }) = a.parameters.validate() {
        return f.wrong("invariants", field, problem);
    }
    if a.notes != NOTES {
        f.differs_from_code("notes", "are not what the code records");
    }
    let p = &a.parameters;
    let engines: &[Engine] = if p.stock { &[Engine::Ours, Engine::StockCandle] } else { &[Engine::Ours] };
    let (decode_points, chunks) = (p.decode_points().len(), p.chunk_sizes.len());
    // Multiplied checked: the counts come from the file.
    let expected = |per_round: usize| per_round.checked_mul(p.rounds).and_then(|n| n.checked_mul(engines.len()));
    if Some(a.decode.len()) != expected(decode_points) {
        f.wrong(
            "invariants",
            "decode",
            format!("{} points, the parameters give {:?}", a.decode.len(), expected(decode_points)),
        );
    }
    if Some(a.prompts.len()) != expected(p.prompt_lengths.len()) {
        f.wrong(
            "invariants",
            "prompts",
            format!("{} points, the parameters give {:?}", a.prompts.len(), expected(p.prompt_lengths.len())),
        );
    }
    if Some(a.prefill.len()) != expected(chunks) {
        f.wrong(
            "invariants",
            "prefill",
            format!("{} points, the parameters give {:?}", a.prefill.len(), expected(chunks)),
        );
    }
    let positive = |v: &[f64]| v.iter().position(|t| !(t.is_finite() && *t > 0.0));
    for (i, d) in a.decode.iter().enumerate() {
        let known =
            p.decode_points().contains(&(d.context, d.batch)) && engines.contains(&d.engine) && d.round < p.rounds;
        if !known {
            f.wrong("invariants", format!("decode[{i}]"), "a point the parameters do not give");
        }
        let twin = a
            .decode
            .iter()
            .position(|e| (e.engine, e.round, e.context, e.batch) == (d.engine, d.round, d.context, d.batch));
        if twin != Some(i) {
            f.wrong("invariants", format!("decode[{i}]"), "the same point twice");
        }
        if d.step_ms.len() != p.steps {
            f.wrong(
                "invariants",
                format!("decode[{i}].step_ms"),
                format!("{} steps, the parameters say {}", d.step_ms.len(), p.steps),
            );
        }
        if let Some(j) = positive(&d.step_ms) {
            f.wrong("invariants", format!("decode[{i}].step_ms[{j}]"), "not a positive duration");
        }
    }
    for (i, d) in a.prefill.iter().enumerate() {
        let known = p.chunk_sizes.contains(&d.chunk_size) && engines.contains(&d.engine) && d.round < p.rounds;
        if !known {
            f.wrong("invariants", format!("prefill[{i}]"), "a point the parameters do not give");
        }
        let twin =
            a.prefill.iter().position(|e| (e.engine, e.round, e.chunk_size) == (d.engine, d.round, d.chunk_size));
        if twin != Some(i) {
            f.wrong("invariants", format!("prefill[{i}]"), "the same point twice");
        }
        let chunks = p.prefill_tokens.div_ceil(d.chunk_size.max(1));
        if d.chunk_ms.len() != chunks {
            f.wrong(
                "invariants",
                format!("prefill[{i}].chunk_ms"),
                format!(
                    "{} chunks, {} tokens in chunks of {} make {chunks}",
                    d.chunk_ms.len(),
                    p.prefill_tokens,
                    d.chunk_size
                ),
            );
        }
        if let Some(j) = positive(&d.chunk_ms) {
            f.wrong("invariants", format!("prefill[{i}].chunk_ms[{j}]"), "not a positive duration");
        }
    }
    for (i, d) in a.prompts.iter().enumerate() {
        let known = p.prompt_lengths.contains(&d.tokens) && engines.contains(&d.engine) && d.round < p.rounds;
        if !known {
            f.wrong("invariants", format!("prompts[{i}]"), "a point the parameters do not give");
        }
        let twin = a.prompts.iter().position(|e| (e.engine, e.round, e.tokens) == (d.engine, d.round, d.tokens));
        if twin != Some(i) {
            f.wrong("invariants", format!("prompts[{i}]"), "the same point twice");
        }
        if positive(&[d.ms]).is_some() {
            f.wrong("invariants", format!("prompts[{i}].ms"), "not a positive duration");
        }
    }
    let (summary, ratios) = summarize_points(p, &a.points());
    if let Some(i) = (0..summary.len().max(a.summary.len())).find(|&i| summary.get(i) != a.summary.get(i)) {
        f.wrong("invariants", format!("summary[{i}]"), "differs from the statistics recomputed from the points");
    }
    if let Some(i) = (0..ratios.len().max(a.ratios.len())).find(|&i| ratios.get(i) != a.ratios.get(i)) {
        f.wrong("invariants", format!("ratios[{i}]"), "differs from the ratios recomputed from the points");
    }
    if serde_json::to_value(&a.parameters).ok().as_ref() != Some(&a.provenance.settings.effective) {
        f.wrong("invariants", "parameters", "differs from provenance.settings.effective");
    }
}

/// A chart of the report: file stem, title, x label, the x values, and the point at each.
type Curve<'a> = (&'a str, &'a str, &'a str, &'a [usize], &'a dyn Fn(usize) -> String);

/// The experiment, as the workspace tools see it.
pub struct DecodeScaling;

impl Experiment for DecodeScaling {
    const NAME: &'static str = EXPERIMENT;
    type Parameters = Parameters;
    type Expectations = Expectations;
    type Artifact = Artifact;
    type Args = Args;

    /// Without a manifest (`--model-dir`): short contexts, so that any checkpoint runs it quickly.
    fn default_parameters(&self) -> Option<Parameters> {
        Some(Parameters {
            contexts: vec![64, 256, 1024],
            batches: vec![1, 2, 4, 8],
            batch_context: 64,
            prefill_tokens: 256,
            chunk_sizes: vec![32, 64, 128, 256],
            prompt_lengths: vec![256, 1024],
            steps: 4,
            rounds: 2,
            stock: true,
        })
    }

    fn validate(&self, parameters: &Parameters) -> Result<(), Invalid> {
        parameters.validate()
    }

    fn rederive(&self, a: &mut Artifact) {
        (a.summary, a.ratios) = summarize_points(&a.parameters, &a.points());
    }

    fn audit(&self, artifact: &Artifact, _expectations: Option<&Expectations>, f: &mut Findings) {
        check(artifact, f)
    }

    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        _options: &ReportOptions,
    ) -> Result<Section, ExperimentError> {
        let a: Artifact = read_as(title, artifact)?;
        let p = &a.parameters;
        let mut section = Section::new(dir);
        let mut md = format!(
            "## Decode scaling: {title}\n\nModel `{}`, {} rounds, medians over rounds (each round's median step); \
             ratio: the stock loop's time over ours in the same round.\n\n| point | ours ms | stock ms | ours tok/s | stock / ours |\n|---|---|---|---|---|\n",
            a.model_id, p.rounds
        );
        let row = |point: &str, engine| a.summary.iter().find(|r| r.point == point && r.engine == engine);
        let points: Vec<String> =
            a.summary.iter().filter(|r| r.engine == Engine::Ours).map(|r| r.point.clone()).collect();
        for point in &points {
            let ours = row(point, Engine::Ours);
            let stock = row(point, Engine::StockCandle);
            let ratio = a.ratios.iter().find(|r| &r.point == point).and_then(|r| r.stock_over_ours.p50);
            let _ = writeln!(
                md,
                "| {point} | {} | {} | {} | {} |",
                cell(ours.and_then(|r| r.ms.p50), 2),
                cell(stock.and_then(|r| r.ms.p50), 2),
                cell(ours.and_then(|r| r.tokens_per_s), 1),
                cell(ratio, 2)
            );
        }
        md.push('\n');
        section.markdown = md;
        let median_of = |point: String, engine| row(&point, engine).and_then(|r| r.ms.p50);
        let curve = |engine: Engine, xs: &[usize], point: &dyn Fn(usize) -> String| -> (String, Vec<(f64, f64)>) {
            let pts = xs.iter().filter_map(|&x| median_of(point(x), engine).map(|m| (x as f64, m))).collect();
            (engine.name().to_string(), pts)
        };
        let engines: &[Engine] = if p.stock { &[Engine::Ours, Engine::StockCandle] } else { &[Engine::Ours] };
        let charts: [Curve; 3] = [
            ("context", "decode step against context (one session)", "context (tokens)", &p.contexts, &|c| {
                decode_label(c, 1)
            }),
            ("batch", "decode step against sessions batched", "sessions in the step", &p.batches, &|b| {
                decode_label(p.batch_context, b)
            }),
            ("prefill", "prefill time against chunk size", "chunk size (tokens)", &p.chunk_sizes, &|c| {
                prefill_label(c)
            }),
        ];
        for (stem, chart_title, x_label, xs, point) in charts {
            let lines = engines.iter().map(|&e| curve(e, xs, point)).collect();
            let chart =
                Lines { title: chart_title.into(), x_label: x_label.into(), y_label: "milliseconds".into(), lines };
            section.image(stem, chart_title, Chart::Lines(chart));
        }
        // A prompt's prefill in throughput: flat where the work grows with the prompt alone.
        let throughput = |engine: Engine| -> (String, Vec<(f64, f64)>) {
            let pts = p
                .prompt_lengths
                .iter()
                .filter_map(|&l| row(&prompt_label(l), engine).and_then(|r| r.tokens_per_s).map(|t| (l as f64, t)))
                .collect();
            (engine.name().to_string(), pts)
        };
        let title = "prefill throughput against prompt length (whole prompt, one step)";
        let chart = Lines {
            title: title.into(),
            x_label: "prompt (tokens)".into(),
            y_label: "tokens/s".into(),
            lines: engines.iter().map(|&e| throughput(e)).collect(),
        };
        section.image("prompt", title, Chart::Lines(chart));
        Ok(section)
    }

    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow> {
        let rows = |v: &Value| -> Vec<SummaryRow> {
            v.get("summary").and_then(|s| serde_json::from_value(s.clone()).ok()).unwrap_or_default()
        };
        let (ra, rb) = (rows(a), rows(b));
        ra.iter()
            .map(|r| {
                let other = rb.iter().find(|s| s.point == r.point && s.engine == r.engine);
                (format!("{} {} ms (median)", r.point, r.engine.name()), r.ms.p50, other.and_then(|s| s.ms.p50))
            })
            .collect()
    }
}
