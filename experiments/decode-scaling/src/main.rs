//! `decode-scaling`: decode step time against context and batch, prefill time against chunk size
//! and prompt length, our engine beside the stock candle-transformers loop on the same checkpoint, point by point.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_transformers::models::qwen2::ModelForCausalLM;
use common::experiment::{prepare, CommandLine};
use common::load::LoadedModel;
use common::session::Session;
use decode_scaling::{
    summarize_points, Args, Artifact, DecodePoint, Engine, Expectations, Parameters, Points, PrefillPoint, PromptPoint,
    EXPERIMENT,
};
use std::time::Instant;

/// Without a manifest (`--model-dir`): short contexts, so that any checkpoint runs it quickly.
fn default_parameters() -> Parameters {
    Parameters {
        contexts: vec![64, 256, 1024],
        batches: vec![1, 2, 4, 8],
        batch_context: 64,
        prefill_tokens: 256,
        chunk_sizes: vec![32, 64, 128, 256],
        prompt_lengths: vec![256, 1024],
        steps: 4,
        rounds: 2,
        stock: true,
    }
}

/// The stock loop fills its cache for a decode point in prefill steps of this many tokens, which
/// bounds its attention mask (a whole 4096-token prompt in one step would build gigabytes).
const STOCK_FILL_CHUNK: usize = 256;

fn main() {
    common::experiment::main(run)
}

fn run(args: Args) -> Result<()> {
    let prepared = prepare::<Parameters, Expectations>(EXPERIMENT, &args.model)?;
    let origin = prepared.manifest.as_ref().map(|m| m.record.path.clone()).unwrap_or_else(|| "parameters".into());
    let base = prepared.manifest.as_ref().map(|m| m.manifest.parameters.clone()).unwrap_or_else(default_parameters);
    let params = args.effective(&base);
    if let Err(problem) = params.validate() {
        bail!("{origin}: {problem}");
    }
    let model = &prepared.model;
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
    let mut stock = if params.stock { Some(Stock::new(model)?) } else { None };

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
                let step_ms = stock.decode(&filler(context), batch, params.steps)?;
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
                let chunk_ms = stock.prefill(&tokens, chunk_size)?;
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
                let ms = stock.prefill(ids, tokens)?.iter().sum();
                prompts.push(PromptPoint { engine: Engine::StockCandle, round, tokens, ms });
            }
        }
    }

    let (summary, ratios) =
        summarize_points(&params, &Points { decode: &decode, prefill: &prefill, prompts: &prompts });
    let provenance = prepared.provenance(common::build_facts!(), args.requested(), serde_json::to_value(&params)?);
    let model_id = prepared
        .resolved
        .pin
        .as_ref()
        .map(|p| p.repo.clone())
        .unwrap_or_else(|| prepared.ws.display_path(&prepared.resolved.dir));
    let artifact = Artifact {
        parameters: params,
        model_id,
        decode,
        prefill,
        prompts,
        summary,
        ratios,
        notes: decode_scaling::NOTES.into(),
        provenance,
    };
    let path = prepared.write(args.model.out.as_ref(), &artifact)?;
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
    let wanted = vec![true; batch];
    let mut times = Vec::with_capacity(steps);
    for step in 0..=steps {
        let mut items: Vec<_> = caches.iter_mut().map(|c| (c, &[1u32][..])).collect();
        let t = Instant::now();
        model.model.greedy_batch(&mut items, &wanted)?;
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

/// The stock candle-transformers Qwen2 on the same files, in F32.
struct Stock {
    model: ModelForCausalLM,
    device: Device,
}

impl Stock {
    fn new(loaded: &LoadedModel) -> Result<Self> {
        let weights = loaded.dir.join("model.safetensors");
        // SAFETY: the checkpoint was verified against its pin and is not modified while mapped.
        let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &loaded.device) }
            .with_context(|| format!("mapping {}", weights.display()))?;
        let model = ModelForCausalLM::new(&loaded.config, vb).context("building the stock candle model")?;
        Ok(Stock { model, device: loaded.device.clone() })
    }

    /// One forward of `batch` copies of `piece` at `offset`; the argmax of each copy's last logits.
    fn forward(&mut self, piece: &[u32], batch: usize, offset: usize) -> Result<Vec<u32>> {
        let ids: Vec<u32> = (0..batch).flat_map(|_| piece.iter().copied()).collect();
        let input = Tensor::from_vec(ids, (batch, piece.len()), &self.device)?;
        let logits = self.model.forward(&input, offset)?;
        Ok(logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?)
    }

    /// `steps` timed decode steps (after one untimed) of `batch` sequences whose cache holds
    /// `context` (filled by forwards first, untimed).
    fn decode(&mut self, context: &[u32], batch: usize, steps: usize) -> Result<Vec<f64>> {
        self.model.clear_kv_cache();
        let mut offset = 0;
        for piece in context.chunks(STOCK_FILL_CHUNK) {
            self.forward(piece, batch, offset)?;
            offset += piece.len();
        }
        let mut next = vec![1u32; batch];
        let mut times = Vec::with_capacity(steps);
        for step in 0..=steps {
            let ids: Vec<u32> = next.clone();
            let t = Instant::now();
            let input = Tensor::from_vec(ids, (batch, 1), &self.device)?;
            let logits = self.model.forward(&input, offset)?;
            next = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?;
            if step > 0 {
                times.push(ms(t));
            }
            offset += 1;
        }
        Ok(times)
    }

    /// A prefill of `tokens` in forwards of at most `chunk` tokens, each timed.
    fn prefill(&mut self, tokens: &[u32], chunk: usize) -> Result<Vec<f64>> {
        self.model.clear_kv_cache();
        let mut times = Vec::new();
        let mut offset = 0;
        for piece in tokens.chunks(chunk) {
            let t = Instant::now();
            self.forward(piece, 1, offset)?;
            times.push(ms(t));
            offset += piece.len();
        }
        Ok(times)
    }
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
