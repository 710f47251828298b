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
//!   workload under each seed policy and under continuous batching.
//!
//! Every comparison alternates its two sides, round after round or step after step, and reports
//! the median of the per-round ratios with their range: on a machine shared with other work the
//! same step's time drifts by tens of percent within a minute, so only measurements taken side by
//! side compare fairly, and the range shows how far one round can mislead.

use candle_core::Tensor;
use common::gguf::WeightType;
use common::load::LoadedModel;
use common::policy::Policy;
use common::qwen::{Cache, WeightDtype};
use common::resolve::{resolve, ResolveOptions};
use common::schedule::{self, Job, RunConfig};
use common::session::Session;
use common::stats::percentile_sorted;
use common::workspace::Workspace;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const DECODE: usize = 31;
/// Rounds of each side in a comparison.
const ROUNDS: usize = 5;

/// One round of a prompt's prefill then `DECODE` greedy steps.
struct Round {
    prefill_s: f64,
    decode_tps: f64,
    /// The greedy ids: the prefill's, then each step's.
    ids: Vec<u32>,
}

/// Prefill and decode of one fresh session on `model`.
fn ours(model: &LoadedModel, prompt: &[u32]) -> Round {
    let mut s = Session::new(model, prompt.to_vec(), DECODE + 1).unwrap();
    let t = Instant::now();
    s.step(None).unwrap();
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    while !s.is_finished() {
        s.step(None).unwrap();
    }
    Round { prefill_s, decode_tps: DECODE as f64 / t.elapsed().as_secs_f64(), ids: s.output().to_vec() }
}

/// llama.cpp on the same weights, exported as a GGUF file, in a worker process
/// (`scripts/llamacpp_bench.py`) that runs one round per request.
struct LlamaCpp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl LlamaCpp {
    /// Starts the worker on `dir`'s weights as `weights`; None (saying why) when the binding is
    /// not installed or the worker fails to start.
    fn start(ws: &Workspace, dir: &std::path::Path, prompt: &[u32], weights: WeightType) -> Option<Self> {
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
        let ids = ws.root.join(format!("target/bench/prompt-{}.json", prompt.len()));
        std::fs::write(&ids, serde_json::to_vec(prompt).unwrap()).unwrap();
        let mut child = Command::new(&python)
            .arg(ws.root.join("scripts/llamacpp_bench.py"))
            .args(["--gguf", gguf.to_str().unwrap(), "--prompt-ids", ids.to_str().unwrap()])
            .args(["--max-decode", &DECODE.to_string()])
            .args(["--threads", &candle_core::utils::get_num_threads().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the llama.cpp script");
        let mut worker = LlamaCpp {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        };
        match worker.read() {
            Some(ready) if ready["ready"] == true => Some(worker),
            _ => {
                println!("llama.cpp: its worker did not start on {} (its error is above)", gguf.display());
                None
            }
        }
    }

    fn read(&mut self) -> Option<serde_json::Value> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).ok()?;
        serde_json::from_str(&line).ok()
    }

    fn ask(&mut self, command: &str) -> Option<serde_json::Value> {
        writeln!(self.stdin, "{command}").ok()?;
        self.read()
    }

    fn round(&mut self) -> Option<Round> {
        let prefill = self.ask("prefill")?;
        let decode = self.ask(&format!("decode {DECODE}"))?;
        let mut ids = vec![prefill["token"].as_u64()? as u32];
        ids.extend(decode["ids"].as_array()?.iter().filter_map(|v| v.as_u64()).map(|v| v as u32));
        Some(Round { prefill_s: prefill["s"].as_f64()?, decode_tps: DECODE as f64 / decode["s"].as_f64()?, ids })
    }
}

impl Drop for LlamaCpp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Median and range of values, as "median (min-max)".
fn spread(values: &[f64], digits: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = percentile_sorted(&sorted, 50.0).unwrap_or(f64::NAN);
    let (lo, hi) = (sorted.first().copied().unwrap_or(f64::NAN), sorted.last().copied().unwrap_or(f64::NAN));
    format!("{median:.digits$} ({lo:.digits$}-{hi:.digits$})")
}

/// Two alternating series and the ratio of each pair, as [`spread`]s.
fn pairs(a: &[f64], b: &[f64], ratio: impl Fn(f64, f64) -> f64) -> [String; 3] {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| ratio(*a, *b)).collect();
    [spread(a, 2), spread(b, 2), spread(&ratios, 3)]
}

/// `ROUNDS` rounds of ours, each followed by one of llama.cpp's when its worker runs; prints our
/// medians, and theirs with the per-round speed ratios. Returns our rounds.
fn side_by_side(label: &str, model: &LoadedModel, prompt: &[u32], mut theirs: Option<&mut LlamaCpp>) -> Vec<Round> {
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let ours = ours(model, prompt);
        let theirs = theirs.as_deref_mut().and_then(LlamaCpp::round);
        rounds.push((ours, theirs));
    }
    let of = |f: fn(&Round) -> f64| rounds.iter().map(|(o, _)| f(o)).collect::<Vec<_>>();
    let (decode, prefill) = (of(|r| r.decode_tps), of(|r| r.prefill_s));
    println!("{label:<28} decode {} tokens/s, prefill {} s", spread(&decode, 2), spread(&prefill, 3));
    match rounds.iter().map(|(_, t)| t.as_ref()).collect::<Option<Vec<&Round>>>() {
        Some(their_rounds) if theirs.is_some() => {
            let of = |f: fn(&Round) -> f64| their_rounds.iter().map(|t| f(t)).collect::<Vec<_>>();
            let [_, their_decode, decode_ratio] = pairs(&decode, &of(|r| r.decode_tps), |o, t| o / t);
            let [_, their_prefill, prefill_ratio] = pairs(&prefill, &of(|r| r.prefill_s), |o, t| t / o);
            let (o, t) = (&rounds[0].0, their_rounds[0]);
            let agree = o.ids.iter().zip(&t.ids).take_while(|(a, b)| a == b).count();
            println!("  llama.cpp, same weights    decode {their_decode} tokens/s, prefill {their_prefill} s");
            println!(
                "  ours / llama.cpp per round decode speed {decode_ratio}x, prefill speed {prefill_ratio}x; greedy ids agree on the first {agree} of {}",
                o.ids.len().min(t.ids.len())
            );
        }
        _ if theirs.is_some() => println!("  llama.cpp: a round failed; no comparison"),
        _ => {}
    }
    rounds.into_iter().map(|(o, _)| o).collect()
}

/// Steps in an alternating step comparison.
const STEPS: usize = 16;

/// Milliseconds of `STEPS` calls of `a` and of `b`, alternating.
fn alternate(mut a: impl FnMut(), mut b: impl FnMut()) -> (Vec<f64>, Vec<f64>) {
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1000.0
    };
    (0..STEPS).map(|_| (time(&mut a), time(&mut b))).unzip()
}

fn main() {
    let ws = Workspace::discover().expect("run from the workspace");
    let pin = ws.model_pin("qwen2.5-0.5b").unwrap();
    let resolved = resolve(&ws, &pin, &ResolveOptions { generate_missing: true, offline: true, ..Default::default() })
        .expect("generate or verify the qwen2.5-0.5b checkpoint");
    let model = LoadedModel::load(&resolved.dir).unwrap();
    let params = common::schedule::seed_workload();
    let (_, prompt) = model.encode_user_prompt(&params.jobs[0].prompt).unwrap();
    println!(
        "qwen2.5-0.5b shape, {} threads, prompt {} tokens, {DECODE} decode steps, {ROUNDS} alternating rounds per comparison; figures are median (min-max)",
        candle_core::utils::get_num_threads(),
        prompt.len()
    );

    // Bare candle: the stock candle-transformers Qwen2 on the same files, prefill, then one
    // forward per token, alternating with our engine's rounds.
    {
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(
                &[resolved.dir.join("model.safetensors")],
                candle_core::DType::F32,
                &model.device,
            )
        }
        .unwrap();
        let mut m = candle_transformers::models::qwen2::ModelForCausalLM::new(&model.config, vb).unwrap();
        let mut bare_round = || {
            m.clear_kv_cache();
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
        let (mut bare, mut engine) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            bare.push(bare_round());
            engine.push(ours(&model, &prompt).decode_tps);
        }
        let [bare, engine, ratio] = pairs(&bare, &engine, |b, e| e / b);
        println!(
            "decode, stock candle loop    {bare} tokens/s; engine {engine} tokens/s; engine / stock per round {ratio}x"
        );
    }

    let f32_rounds = {
        let mut llama = LlamaCpp::start(&ws, &resolved.dir, &prompt, WeightType::F32);
        side_by_side("engine, F32 weights", &model, &prompt, llama.as_mut())
    };
    let mut llama_f16 = LlamaCpp::start(&ws, &resolved.dir, &prompt, WeightType::F16);
    for dtype in [WeightDtype::Bf16, WeightDtype::F16] {
        let half = LoadedModel::load_as(&resolved.dir, dtype).unwrap();
        let rounds = side_by_side(&format!("engine, {} weights", dtype.name()), &half, &prompt, llama_f16.as_mut());
        let same = rounds[0].ids == f32_rounds[0].ids;
        println!("  {} greedy ids {} the F32 ones", dtype.name(), if same { "equal" } else { "differ from" });
    }
    drop(llama_f16);

    // A decode step's cost against the context it attends over, steps at the two contexts
    // alternating. The caches are marked filled to the context without computing it (their
    // values do not change the work of a step).
    let filled = |context: usize| {
        let mut cache = model.model.new_cache(context + STEPS + 1).unwrap();
        cache.assume_filled(context).unwrap();
        cache
    };
    // A decode step as the engine runs it: the greedy id through the head's screen.
    let decode = |caches: Vec<&mut Cache>| {
        let wanted = vec![true; caches.len()];
        let mut items: Vec<_> = caches.into_iter().map(|c| (c, &[1u32][..])).collect();
        drop(model.model.greedy_batch(&mut items, &wanted).unwrap())
    };
    let (mut short, mut long) = (filled(64), filled(4096));
    let (short_ms, long_ms) = alternate(|| decode(vec![&mut short]), || decode(vec![&mut long]));
    let [short, long, ratio] = pairs(&short_ms, &long_ms, |s, l| l / s);
    println!("decode step at context 64    {short} ms, at 4096 {long} ms: 4096 / 64 per pair {ratio}");

    // Four sessions decoding in one batched step against one session's step, at the same
    // context, alternating: aggregate tokens per second.
    let mut one = filled(prompt.len());
    let mut four: Vec<_> = (0..4).map(|_| filled(prompt.len())).collect();
    let (one_ms, four_ms) = alternate(|| decode(vec![&mut one]), || decode(four.iter_mut().collect()));
    let [one, four, ratio] = pairs(&one_ms, &four_ms, |o, f| 4.0 * o / f);
    println!(
        "batched decode step          1 stream {one} ms, 4 streams {four} ms: aggregate tokens/s per pair {ratio}x"
    );

    // The scheduler's own cost under every policy: the seed's runs and continuous batching.
    let jobs: Vec<Job> = params.jobs.iter().map(|j| Job::from_spec(&model, j).unwrap()).collect();
    let batched = RunConfig { policy: Policy::Batched, chunk_size: Some(64), max_active: 2 };
    for config in params.runs.iter().chain([&batched]) {
        let out = schedule::run(&model, &jobs, *config).unwrap();
        // A batched step is on the timeline once per job in it: count and time each step once.
        let mut steps: Vec<(u64, u64)> =
            out.timeline.iter().map(|s| (s.start_ms.to_bits(), s.end_ms.to_bits())).collect();
        steps.dedup();
        let forward_ms: f64 = steps.iter().map(|&(a, b)| f64::from_bits(b) - f64::from_bits(a)).sum();
        let steps = steps.len() as f64;
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
