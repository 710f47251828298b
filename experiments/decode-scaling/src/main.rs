//! `decode-scaling`: decode step time against context and batch, prefill time against chunk size
//! and prompt length, our engine beside the stock candle-transformers loop on the same checkpoint, point by point.

use anyhow::{bail, Context, Result};
use common::experiment::prepare;
use common::load::LoadedModel;
use common::qwen::Want;
use common::session::Session;
use common::stock::Stock;
use decode_scaling::{
    summarize_points, Args, Artifact, DecodePoint, DecodeScaling, Engine, Points, PrefillPoint, PromptPoint,
};
use std::time::Instant;

/// The stock loop fills its cache for a decode point in prefill steps of this many tokens, which
/// bounds its attention mask (a whole 4096-token prompt in one step would build gigabytes).
const STOCK_FILL_CHUNK: usize = 256;

fn main() {
    common::experiment::main(run)
}

fn run(args: Args) -> Result<()> {
    let prepared = prepare(&DecodeScaling, &args)?;
    let origin = prepared.manifest.as_ref().map(|m| m.record.path.clone()).unwrap_or_else(|| "parameters".into());
    let params = prepared.parameters.clone();
    let model = &prepared.model.loaded;
    let context = model.config.max_position_embeddings;
    if params.longest() > context {
        bail!(
            "{origin}: parameters: the longest point needs {} positions (context or prefill, plus {} steps and one), the model has {context}; lower the contexts",
            params.longest(),
            params.steps
        );
    }
    // The largest batch's caches must fit: each session holds a cache for its whole point.
    let batch = params.batches.iter().copied().max().unwrap_or(1);
    let cache = model.model.cache_bytes(params.batch_context + params.steps + 1) as u64;
    common::budget::fits("parameters.batches", batch as u64, cache, 0, common::budget::available_bytes())
        .map_err(|problem| anyhow::anyhow!("{origin}: {problem}"))?;
    // What fills a context: the chat-templated prompt's ids, repeated. The values do not change
    // a step's work; the stock loop needs real ids in its cache, our caches are marked filled.
    let (_, prompt) = model.encode_user_prompt("Explain cache invalidation in one sentence.")?;
    let filler = |n: usize| -> Vec<u32> { prompt.iter().copied().cycle().take(n).collect() };
    let long = common::schedule::long_prompt(model, params.prompt_lengths.iter().copied().max().unwrap_or(0))?;
    let mut stock =
        if params.stock { Some(Stock::new(model).context("building the stock candle model")?) } else { None };

    let (mut decode, mut prefill, mut prompts) = (Vec::new(), Vec::new(), Vec::new());
    let points = params.decode_points();
    let total = params.rounds * (points.len() + params.chunk_sizes.len() + params.prompt_lengths.len());
    let mut done = 0;
    for round in 0..params.rounds {
        for &(context, batch) in &points {
            done += 1;
            tracing::info!("[{done}/{total}] round {round}: decode at context {context}, {batch} sessions");
            let step_ms = ours_decode(model, context, batch, params.steps)?;
            decode.push(DecodePoint { engine: Engine::Ours, round, context, batch, step_ms });
            if let Some(stock) = stock.as_mut() {
                let step_ms = stock_decode(stock, &filler(context), batch, params.steps)?;
                decode.push(DecodePoint { engine: Engine::StockCandle, round, context, batch, step_ms });
            }
        }
        for &chunk_size in &params.chunk_sizes {
            done += 1;
            tracing::info!(
                "[{done}/{total}] round {round}: prefill of {} in chunks of {chunk_size}",
                params.prefill_tokens
            );
            let tokens = filler(params.prefill_tokens);
            let chunk_ms = ours_prefill(model, &tokens, chunk_size)?;
            prefill.push(PrefillPoint { engine: Engine::Ours, round, chunk_size, chunk_ms });
            if let Some(stock) = stock.as_mut() {
                let chunk_ms = stock_prefill(stock, &tokens, chunk_size)?;
                prefill.push(PrefillPoint { engine: Engine::StockCandle, round, chunk_size, chunk_ms });
            }
        }
        for &tokens in &params.prompt_lengths {
            done += 1;
            tracing::info!("[{done}/{total}] round {round}: prefill of a {tokens}-token prompt, whole");
            let ids = &long[..tokens];
            let ms = ours_prefill(model, ids, tokens)?.iter().sum();
            prompts.push(PromptPoint { engine: Engine::Ours, round, tokens, ms });
            if let Some(stock) = stock.as_mut() {
                let ms = stock_prefill(stock, ids, tokens)?.iter().sum();
                prompts.push(PromptPoint { engine: Engine::StockCandle, round, tokens, ms });
            }
        }
    }

    let (summary, ratios) =
        summarize_points(&params, &Points { decode: &decode, prefill: &prefill, prompts: &prompts });
    let provenance = prepared.provenance(common::build_facts!())?;
    let artifact = Artifact {
        parameters: params,
        model_id: prepared.model_id(),
        decode,
        prefill,
        prompts,
        summary,
        ratios,
        notes: decode_scaling::NOTES.into(),
        provenance,
    };
    let path = prepared.write(&artifact)?;
    print_table(&artifact);
    println!("artifact: {}", prepared.ws.display_path(&path));
    Ok(())
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// `steps` timed decode steps (after one untimed) of `batch` sessions at `context`, in one
/// forward each, the greedy id through the head's screen as the engine runs it.
fn ours_decode(model: &LoadedModel, context: usize, batch: usize, steps: usize) -> Result<Vec<f64>> {
    let mut caches = Vec::with_capacity(batch);
    for _ in 0..batch {
        let mut cache = model.model.new_cache(context + steps + 1)?;
        cache.assume_filled(context)?;
        caches.push(cache);
    }
    let wants = vec![Want::Greedy; batch];
    let mut times = Vec::with_capacity(steps);
    for step in 0..=steps {
        let mut items: Vec<_> = caches.iter_mut().map(|c| (c, &[1u32][..])).collect();
        let t = Instant::now();
        model.model.next_batch(&mut items, &wants)?;
        if step > 0 {
            times.push(ms(t));
        }
    }
    Ok(times)
}

/// A prefill of `tokens` in steps of at most `chunk` tokens, each timed.
fn ours_prefill(model: &LoadedModel, tokens: &[u32], chunk: usize) -> Result<Vec<f64>> {
    let mut session = Session::new(model, tokens.to_vec(), 1)?.without_stop_ids();
    let mut times = Vec::new();
    while session.prefill_remaining() > 0 {
        let t = Instant::now();
        session.step(Some(chunk))?;
        times.push(ms(t));
    }
    Ok(times)
}

/// `steps` timed decode steps (after one untimed) of the stock loop on `batch` copies of a
/// sequence whose cache holds `context` (filled by forwards first, untimed).
fn stock_decode(stock: &mut Stock, context: &[u32], batch: usize, steps: usize) -> Result<Vec<f64>> {
    stock.clear();
    let mut offset = 0;
    for piece in context.chunks(STOCK_FILL_CHUNK) {
        stock.forward(piece, batch, offset)?;
        offset += piece.len();
    }
    let mut next = vec![1u32; batch];
    let mut times = Vec::with_capacity(steps);
    for step in 0..=steps {
        let t = Instant::now();
        // The copies are one sequence: each step feeds every copy the same id.
        next = stock.forward(&next[..1], batch, offset)?;
        if step > 0 {
            times.push(ms(t));
        }
        offset += 1;
    }
    Ok(times)
}

/// A prefill of `tokens` by the stock loop in forwards of at most `chunk` tokens, each timed.
fn stock_prefill(stock: &mut Stock, tokens: &[u32], chunk: usize) -> Result<Vec<f64>> {
    stock.clear();
    let mut times = Vec::new();
    let mut offset = 0;
    for piece in tokens.chunks(chunk) {
        let t = Instant::now();
        stock.forward(piece, 1, offset)?;
        times.push(ms(t));
        offset += piece.len();
    }
    Ok(times)
}

fn print_table(a: &Artifact) {
    println!("{:<34} {:>12} {:>12} {:>12} {:>12}", "point", "ours ms", "stock ms", "ours tok/s", "stock/ours");
    let cell = |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or_else(|| "-".into());
    for ours in a.summary.iter().filter(|r| r.engine == Engine::Ours) {
        let stock = a.summary.iter().find(|r| r.point == ours.point && r.engine == Engine::StockCandle);
        let ratio = a.ratios.iter().find(|r| r.point == ours.point).and_then(|r| r.stock_over_ours.p50);
        println!(
            "{:<34} {:>12} {:>12} {:>12} {:>12}",
            ours.point,
            cell(ours.ms.p50, 2),
            cell(stock.and_then(|s| s.ms.p50), 2),
            cell(ours.tokens_per_s, 1),
            cell(ratio, 2)
        );
    }
}
