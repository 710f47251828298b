//! The engine's speed goals, each measured in this one run on the generated `qwen2.5-0.5b`
//! checkpoint (the real model's shapes) and printed as a ratio:
//! - decode tokens/s through `Session::step` against the stock candle-transformers loop, and
//!   prefill time, from the same prompt;
//! - when `just bench` could install llama.cpp's Python binding (`.venv-llama/`), llama.cpp on
//!   the same weights exported to GGUF: F32 against our F32, F16 against our half-precision
//!   weights (BF16, exact for this BF16-stored checkpoint, and F16), with whether the greedy ids
//!   agree;
//! - a decode step's cost at context 64 against 4096;
//! - four sessions decoding in one batched step against one: aggregate tokens/s;
//! - the scheduler's time outside forward passes per step, as a share of a step, over the seed
//!   workload under each seed policy.

use candle_core::Tensor;
use common::engine::Session;
use common::gguf::WeightType;
use common::load::LoadedModel;
use common::qwen::WeightDtype;
use common::resolve::{resolve, ResolveOptions};
use common::scheduler::study::Parameters;
use common::scheduler::{self, Job};
use common::workspace::Workspace;
use std::time::Instant;

const DECODE: usize = 31;

/// llama.cpp on the same weights exported as `weights`: its prefill seconds, decode tokens/s
/// and greedy ids, when its binding is installed.
fn llama_cpp(
    ws: &Workspace,
    dir: &std::path::Path,
    prompt: &[u32],
    weights: WeightType,
) -> Option<(f64, f64, Vec<u32>)> {
    let python = ws.root.join(".venv-llama/bin/python");
    if !python.is_file() {
        println!("llama.cpp: skipped (no .venv-llama; `just bench` installs llama-cpp-python there)");
        return None;
    }
    let gguf = ws.root.join(format!("target/bench/qwen2.5-0.5b-{weights:?}.gguf").to_lowercase());
    if !gguf.is_file() {
        std::fs::create_dir_all(gguf.parent().unwrap()).unwrap();
        common::gguf::export(dir, &gguf, weights).expect("export the GGUF");
    }
    let ids_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ids_file.path(), serde_json::to_vec(prompt).unwrap()).unwrap();
    let out = std::process::Command::new(&python)
        .arg(ws.root.join("scripts/llamacpp_bench.py"))
        .args(["--gguf", gguf.to_str().unwrap(), "--prompt-ids", ids_file.path().to_str().unwrap()])
        .args(["--decode", &DECODE.to_string(), "--threads", &candle_core::utils::get_num_threads().to_string()])
        .output()
        .expect("run the llama.cpp script");
    let Ok(result) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        println!("llama.cpp: failed: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default());
        return None;
    };
    let prefill = result["prefill_s"].as_f64().unwrap_or(f64::NAN);
    let decode = result["decode_tps"].as_f64().unwrap_or(f64::NAN);
    Some((prefill, decode, serde_json::from_value(result["ids"].clone()).unwrap_or_default()))
}

/// Prefill seconds, decode tokens/s and greedy ids of one session on `model`.
fn engine(model: &LoadedModel, prompt: &[u32]) -> (f64, f64, Vec<u32>) {
    let mut s = Session::new(model, prompt.to_vec(), DECODE + 1).unwrap();
    let t = Instant::now();
    s.step(None).unwrap();
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    while !s.is_finished() {
        s.step(None).unwrap();
    }
    (prefill_s, DECODE as f64 / t.elapsed().as_secs_f64(), s.output().to_vec())
}

/// Prints our figures against llama.cpp's on the same weights.
fn compare(label: &str, ours: &(f64, f64, Vec<u32>), theirs: Option<(f64, f64, Vec<u32>)>) {
    let Some((prefill, decode, ids)) = theirs else { return };
    let agree = ours.2.iter().zip(&ids).take_while(|(a, b)| a == b).count();
    println!(
        "{label:<26} prefill {:.3} s, decode {:.2} tokens/s: ours prefill speed {:.3}x, decode speed {:.3}x; greedy ids agree on the first {agree} of {}",
        prefill,
        decode,
        prefill / ours.0,
        ours.1 / decode,
        ours.2.len().min(ids.len())
    );
}

fn main() {
    let ws = Workspace::discover().expect("run from the workspace");
    let pin = ws.model_pin("qwen2.5-0.5b").unwrap();
    let resolved = resolve(&ws, &pin, &ResolveOptions { generate_missing: true, offline: true, ..Default::default() })
        .expect("generate or verify the qwen2.5-0.5b checkpoint");
    let model = LoadedModel::load(&resolved.dir).unwrap();
    let params = Parameters::seed();
    let (_, prompt) = model.encode_user_prompt(&params.jobs[0].prompt).unwrap();
    println!(
        "qwen2.5-0.5b shape, F32, {} threads, prompt {} tokens, {DECODE} decode steps",
        candle_core::utils::get_num_threads(),
        prompt.len()
    );

    // Bare candle: the stock candle-transformers Qwen2 on the same files, prefill, then one
    // forward per token.
    let bare = {
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(
                &[resolved.dir.join("model.safetensors")],
                candle_core::DType::F32,
                &model.device,
            )
        }
        .unwrap();
        let mut m = candle_transformers::models::qwen2::ModelForCausalLM::new(&model.config, vb).unwrap();
        let ids = Tensor::new(prompt.as_slice(), &model.device).unwrap().unsqueeze(0).unwrap();
        let logits = m.forward(&ids, 0).unwrap();
        let mut next = logits.flatten_all().unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap();
        let t = Instant::now();
        for i in 0..DECODE {
            let ids = Tensor::new(&[next], &model.device).unwrap().unsqueeze(0).unwrap();
            let logits = m.forward(&ids, prompt.len() + i).unwrap();
            next = logits.flatten_all().unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap();
        }
        DECODE as f64 / t.elapsed().as_secs_f64()
    };
    // The engine: the same work through Session::step.
    let ours = engine(&model, &prompt);
    println!("decode, bare candle loop   {bare:>7.2} tokens/s");
    println!("decode, engine session     {:>7.2} tokens/s   engine / bare = {:.3}", ours.1, ours.1 / bare);
    println!("prefill, engine session    {:>7.3} s for {} tokens", ours.0, prompt.len());
    compare("llama.cpp F32 GGUF", &ours, llama_cpp(&ws, &resolved.dir, &prompt, WeightType::F32));
    let llama_f16 = llama_cpp(&ws, &resolved.dir, &prompt, WeightType::F16);
    for dtype in [WeightDtype::Bf16, WeightDtype::F16] {
        let half = LoadedModel::load_as(&resolved.dir, dtype).unwrap();
        let theirs = engine(&half, &prompt);
        let same = theirs.2 == ours.2;
        println!(
            "decode, {} weights       {:>7.2} tokens/s, prefill {:.3} s; ids {} the F32 ones",
            dtype.name(),
            theirs.1,
            theirs.0,
            if same { "equal" } else { "differ from" }
        );
        compare(&format!("llama.cpp F16 vs our {}", dtype.name()), &theirs, llama_f16.clone());
    }

    // A decode step's cost against the context it attends over. The cache is marked filled to the
    // context without computing it (its values do not change the work of a step).
    let step_ms = |context: usize| {
        let mut cache = model.model.new_cache(context + 9).unwrap();
        cache.assume_filled(context).unwrap();
        let mut best = f64::INFINITY;
        for i in 0..8 {
            let t = Instant::now();
            model.model.forward(&mut cache, &[i as u32 + 1]).unwrap();
            best = best.min(t.elapsed().as_secs_f64() * 1000.0);
        }
        best
    };
    let (short, long) = (step_ms(64), step_ms(4096));
    println!("decode step at context 64  {short:>7.2} ms, at 4096 {long:>7.2} ms: ratio {:.3}", long / short);

    // Four sessions decoding in one batched step against one session's step, at the same
    // context: aggregate tokens per second.
    let decode_step_ms = |streams: usize| {
        let mut caches: Vec<_> = (0..streams).map(|_| model.model.new_cache(prompt.len() + 16).unwrap()).collect();
        caches.iter_mut().for_each(|c| c.assume_filled(prompt.len()).unwrap());
        let mut best = f64::INFINITY;
        for i in 0..8 {
            let token = [i as u32 + 1];
            let mut items: Vec<_> = caches.iter_mut().map(|c| (c, &token[..])).collect();
            let t = Instant::now();
            model.model.forward_batch(&mut items).unwrap();
            best = best.min(t.elapsed().as_secs_f64() * 1000.0);
        }
        best
    };
    let (one, four) = (decode_step_ms(1), decode_step_ms(4));
    println!(
        "batched decode step        1 stream {one:.2} ms, 4 streams {four:.2} ms: aggregate tokens/s {:.3}x",
        4.0 * one / four
    );

    let jobs: Vec<Job> = params.jobs.iter().map(|j| Job::from_spec(&model, j).unwrap()).collect();
    for config in &params.runs {
        let out = scheduler::run(&model, &jobs, *config).unwrap();
        let steps = out.timeline.len() as f64;
        let forward_ms: f64 = out.timeline.iter().map(|s| s.end_ms - s.start_ms).sum();
        println!(
            "scheduler {:<10} chunk {:<4} {:>4} steps, overhead {:>7.1} us/step = {:.3}% of a step",
            config.policy.name(),
            config.chunk_size.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            steps,
            out.overhead_ms * 1000.0 / steps,
            100.0 * out.overhead_ms / forward_ms
        );
    }
}
