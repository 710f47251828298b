//! `engine-bench`: the engine's speed goals, measured side by side and written as an artifact.
//! Every comparison alternates its two sides, round after round or step after step: on a machine
//! shared with other work the same step's time drifts by tens of percent within a minute, so only
//! measurements taken side by side compare, and the ratios' range shows how far one pair can
//! mislead.

use anyhow::{bail, Context, Result};
use common::experiment::prepare;
use common::gguf::WeightType;
use common::kernel::ReadProbe;
use common::load::LoadedModel;
use common::policy::Policy;
use common::qwen::{Cache, Want, WeightDtype};
use common::schedule::{self, Job, RunConfig};
use common::session::Session;
use common::stock::Stock;
use common::workspace::Workspace;
use engine_bench::{
    Agreement, Args, Artifact, Comparison, EngineBench, Gguf, LlamaCpp, NativeFile, Overhead, Parameters, Resident,
    Rule, Stream,
};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

/// Set (to a GGUF file), the process is a fresh one [`resident`] measures: it loads the file with
/// its blocks in place, prefills the ids in the file [`RESIDENT_IDS`] names, decodes
/// [`RESIDENT_DECODE`] steps and prints its peak resident memory and KV bytes as one JSON line.
const RESIDENT_OF: &str = "ENGINE_BENCH_RESIDENT_OF";
const RESIDENT_IDS: &str = "ENGINE_BENCH_RESIDENT_IDS";
const RESIDENT_DECODE: &str = "ENGINE_BENCH_RESIDENT_DECODE";

fn main() {
    if let Some(file) = std::env::var_os(RESIDENT_OF) {
        if let Err(e) = resident_child(Path::new(&file)) {
            eprintln!("engine-bench (resident memory of {}): {e:#}", Path::new(&file).display());
            std::process::exit(1);
        }
        return;
    }
    common::experiment::main(run)
}

fn run(args: Args) -> Result<()> {
    // No default parameters: without a manifest, prepare refuses the run (it compares pinned weights).
    let prepared = prepare(&EngineBench, &args)?;
    let origin = prepared.manifest.as_ref().map_or("parameters", |m| m.record.path.as_str());
    let params = prepared.parameters.clone();
    let model = &prepared.model.loaded;
    let context = model.config.max_position_embeddings;
    if params.long_context + params.steps + 1 > context {
        bail!("{origin}: parameters.long_context: beyond the model's context of {context}");
    }
    let longest = params.prompts.last().map_or(0, |p| p.tokens);
    if longest + params.decode_tokens + 1 > context {
        bail!(
            "{origin}: parameters.prompts: {longest} tokens and the decode steps pass the model's context of {context}"
        );
    }
    let ws = &prepared.ws;
    let dir = prepared.model.resolved.dir.clone();
    let (_, prompt) = model.encode_user_prompt(&common::schedule::seed_workload().jobs[0].prompt)?;
    let long_prompt = schedule::long_prompt(model, longest)?;
    let mut comparisons = Vec::new();
    let mut agreement = Vec::new();
    let mut skipped = Vec::new();
    let p = &params;

    // The stock candle-transformers Qwen2 on the same files: prefill, then one forward per token.
    tracing::info!("decode: ours against the stock candle loop, {} rounds", p.rounds);
    let mut stock = Stock::new(model).context("building the stock candle model")?;
    let (mut ours_tps, mut stock_tps) = (Vec::new(), Vec::new());
    for _ in 0..p.rounds {
        stock_tps.push(stock_round(&mut stock, &prompt, p.decode_tokens)?);
        ours_tps.push(ours(model, &prompt, p.decode_tokens)?.decode_tps);
    }
    drop(stock);
    comparisons.push(Comparison::new(
        "decode vs stock candle",
        "ours / stock decode tokens/s",
        "tokens/s",
        "ours",
        ours_tps,
        "stock candle",
        stock_tps,
        Rule::AOverB,
    ));

    let probe = ReadProbe::new(p.probe_bytes)?;
    let mut native = Vec::new();

    // llama.cpp on the same weights, F32 against our F32, F16 against our BF16 and F16, its block
    // formats against ours read in place: each prompt length prefilled whole, then decoded at
    // that context.
    let mut llama_record: Option<LlamaCpp> = None;
    // Our F32 ids at each prompt length (the first round's), for our half precision to agree with.
    let mut f32_ids: Vec<Vec<u32>> = Vec::new();
    for (weights, ours_dtypes) in engine_bench::AGAINST_LLAMA {
        let worker = match Worker::start(ws, &dir, &long_prompt, weights, p.decode_tokens) {
            Ok(w) => w,
            Err(why) => {
                skipped.push(format!("llama.cpp with {weights:?} weights: {why:#}"));
                continue;
            }
        };
        let mut worker = worker;
        let record = llama_record.get_or_insert_with(|| LlamaCpp {
            version: worker.version.clone(),
            settings: worker.settings.clone(),
            gguf: Vec::new(),
        });
        record.gguf.push(worker.gguf.clone());
        for &dtype in ours_dtypes {
            // Blocks are read in place from the very file llama.cpp runs, and their ids are held
            // against that file widened to F32 (one untimed run per prompt length).
            let (held, widened) = match dtype {
                WeightDtype::F32 => (None, None),
                WeightDtype::Native => (
                    Some(LoadedModel::load_as(&worker.path, dtype)?),
                    Some(LoadedModel::load_as(&worker.path, WeightDtype::F32)?),
                ),
                _ => (Some(LoadedModel::load_as(&dir, dtype)?), None),
            };
            let ours_model = held.as_ref().unwrap_or(model);
            let pair = engine_bench::llama_pair(weights, dtype);
            for (l, length) in p.prompts.iter().enumerate() {
                let (tokens, rounds) = (length.tokens, length.rounds);
                tracing::info!("{pair}: prompt of {tokens} tokens, {rounds} rounds");
                let (mut o, mut t) = (Vec::new(), Vec::new());
                for _ in 0..rounds {
                    o.push(ours(ours_model, &long_prompt[..tokens], p.decode_tokens)?);
                    t.push(worker.round(tokens, p.decode_tokens).context("a llama.cpp round failed")?);
                }
                let of = |rounds: &[Round], f: fn(&Round) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
                // Prefill time (lower is better) and decode tokens/s (higher is better).
                let measures: [(String, &str, &str, fn(&Round) -> f64, Rule); 2] = [
                    (
                        engine_bench::prefill_name(&pair, tokens),
                        "llama.cpp / ours prefill time (how many times faster ours prefills)",
                        "s",
                        |r| r.prefill_s,
                        Rule::BOverA,
                    ),
                    (
                        engine_bench::decode_name(&pair, tokens),
                        "ours / llama.cpp decode tokens/s",
                        "tokens/s",
                        |r| r.decode_tps,
                        Rule::AOverB,
                    ),
                ];
                for (name, meaning, unit, field, rule) in measures {
                    comparisons.push(Comparison::new(
                        &name,
                        meaning,
                        unit,
                        "ours",
                        of(&o, field),
                        "llama.cpp",
                        of(&t, field),
                        rule,
                    ));
                }
                let agree = o[0].ids.iter().zip(&t[0].ids).take_while(|(a, b)| a == b).count();
                agreement.push(Agreement {
                    what: engine_bench::agreement_name(&pair, tokens),
                    agree,
                    of: o[0].ids.len().min(t[0].ids.len()),
                });
                let reference = match &widened {
                    Some(f32) => Some(ours(f32, &long_prompt[..tokens], p.decode_tokens)?.ids),
                    None => f32_ids.get(l).cloned(),
                };
                if dtype == WeightDtype::F32 {
                    f32_ids.push(o[0].ids.clone());
                } else if let Some(f32) = reference {
                    agreement.push(Agreement {
                        what: engine_bench::agreement_name(&engine_bench::against_f32(dtype, weights), tokens),
                        agree: o[0].ids.iter().zip(&f32).take_while(|(a, b)| a == b).count(),
                        of: o[0].ids.len().min(f32.len()),
                    });
                }
            }
            if dtype == WeightDtype::Native {
                drop(widened);
                tracing::info!("{pair}: decode stream, then each engine's resident memory in a fresh process");
                let (c, stream) = stream_against(ours_model, &probe, p, &engine_bench::native_stream_name(&pair))?;
                comparisons.push(c);
                let first = p.prompts.first().map_or(0, |l| l.tokens);
                let resident = match resident(ws, &worker, &long_prompt[..first], p.decode_tokens) {
                    Ok(r) => Some(r),
                    Err(why) => {
                        skipped.push(format!("{pair}: resident memory: {why:#}"));
                        None
                    }
                };
                native.push(NativeFile { weights: worker.gguf.weights.clone(), stream, resident });
            }
        }
    }

    // A decode step at the long context against the short one, steps alternating. The caches are
    // marked filled (their values do not change a step's work).
    tracing::info!("decode step at context {} against {}", p.long_context, p.short_context);
    let filled = |context: usize| filled(model, context, p.steps);
    let step = |caches: Vec<&mut Cache>| step_ms(model, caches);
    let (mut short, mut long) = (filled(p.short_context)?, filled(p.long_context)?);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..p.steps {
        a.push(step(vec![&mut long])?);
        b.push(step(vec![&mut short])?);
    }
    comparisons.push(Comparison::new(
        "decode step, long vs short context",
        &format!("step time at {} / at {}", p.long_context, p.short_context),
        "ms",
        &format!("context {}", p.long_context),
        a,
        &format!("context {}", p.short_context),
        b,
        Rule::AOverB,
    ));

    // Several sessions in one batched step against one, at the prompt's length.
    tracing::info!("{} sessions in one step against one", p.batch);
    let mut one = filled(prompt.len())?;
    let mut many: Vec<Cache> = (0..p.batch).map(|_| filled(prompt.len())).collect::<Result<_>>()?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..p.steps {
        a.push(step(vec![&mut one])?);
        b.push(step(many.iter_mut().collect())?);
    }
    comparisons.push(Comparison::new(
        "batched decode step",
        &format!("aggregate tokens/s of {} sessions in one step over one session's", p.batch),
        "ms",
        "1 session",
        a,
        &format!("{} sessions", p.batch),
        b,
        Rule::Aggregate { sessions: p.batch },
    ));

    // A decode step's bytes over its time against a pass of the bandwidth probe, alternating.
    tracing::info!("decode stream at context {} against the read bandwidth", p.short_context);
    let (stream_comparison, stream) = stream_against(model, &probe, p, engine_bench::STREAM)?;
    comparisons.push(stream_comparison);
    // A decode step that samples (the draw included) against a greedy one, two sessions on the
    // same prompt stepping in turn, as the stepping loop runs them.
    tracing::info!("sampled decode step against a greedy one");
    let session = |sampling| -> Result<Session> {
        let mut s = Session::new(model, prompt.clone(), p.steps + 1)?.without_stop_ids().with_sampling(sampling)?;
        s.step(None)?; // the prompt
        Ok(s)
    };
    let (mut sampled, mut greedy) = (session(engine_bench::SAMPLED)?, session(Default::default())?);
    let timed = |s: &mut Session| -> Result<f64> {
        let t = Instant::now();
        s.step(None)?;
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..p.steps {
        a.push(timed(&mut sampled)?);
        b.push(timed(&mut greedy)?);
    }
    comparisons.push(Comparison::new(
        engine_bench::SAMPLED_STEP,
        &{
            let s = engine_bench::SAMPLED;
            format!("step time sampling (temperature {}, top-k {}, top-p {}) / greedy", s.temperature, s.top_k, s.top_p)
        },
        "ms",
        "sampled",
        a,
        "greedy",
        b,
        Rule::AOverB,
    ));

    // The scheduler's own cost under the seed's runs and continuous batching.
    let seed = common::schedule::seed_workload();
    let jobs: Vec<Job> = seed.jobs.iter().map(|j| Job::from_spec(model, j)).collect::<Result<_, _>>()?;
    let batched = RunConfig {
        policy: Policy::Batched,
        chunk_size: Some(64),
        max_active: 2,
        kv_budget: None,
        prefix_cache: false,
    };
    let mut overhead = Vec::new();
    for config in seed.runs.iter().chain([&batched]) {
        let out = schedule::run(model, &jobs, *config)?;
        // A batched step is on the timeline once per job in it: count and time each step once.
        let mut steps: Vec<(u64, u64)> =
            out.timeline.iter().map(|s| (s.start_ms.to_bits(), s.end_ms.to_bits())).collect();
        steps.dedup();
        let forward_ms: f64 = steps.iter().map(|&(a, b)| f64::from_bits(b) - f64::from_bits(a)).sum();
        let chunk = config.chunk_size.map(|c| format!(" chunk {c}")).unwrap_or_default();
        overhead.push(Overhead {
            run: format!("{}{chunk}", config.policy.name()),
            steps: steps.len(),
            overhead_ms: out.overhead_ms,
            forward_ms,
            share_percent: 100.0 * out.overhead_ms / forward_ms,
        });
    }

    let provenance = prepared.provenance(common::build_facts!())?;
    let model_id = prepared.model_id();
    let artifact = Artifact {
        parameters: params,
        model_id,
        prompt_tokens: prompt.len(),
        comparisons,
        arithmetic: engine_bench::arithmetic(),
        stream,
        agreement,
        llama_cpp: llama_record,
        skipped,
        overhead,
        sampled: Some(engine_bench::SAMPLED),
        native,
        provenance,
    };
    let path = prepared.write(&artifact)?;
    print_table(&artifact);
    println!("artifact: {}", ws.display_path(&path));
    Ok(())
}

/// A cache of `model`'s for `context` positions and `steps` more, marked filled (its values do not
/// change a step's work).
fn filled(model: &LoadedModel, context: usize, steps: usize) -> Result<Cache> {
    let mut cache = model.model.new_cache(context + steps + 1)?;
    cache.assume_filled(context)?;
    Ok(cache)
}

/// One greedy decode step of every cache in `caches`, batched: its milliseconds.
fn step_ms(model: &LoadedModel, caches: Vec<&mut Cache>) -> Result<f64> {
    let wants = vec![Want::Greedy; caches.len()];
    let mut items: Vec<_> = caches.into_iter().map(|c| (c, &[1u32][..])).collect();
    let t = Instant::now();
    model.model.next_batch(&mut items, &wants)?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// `model`'s decode step at the short context, its bytes over its time, against passes of the
/// bandwidth probe, alternating: the comparison `name` and the bytes it divided.
fn stream_against(model: &LoadedModel, probe: &ReadProbe, p: &Parameters, name: &str) -> Result<(Comparison, Stream)> {
    let bytes = model.model.decode_step_bytes(p.short_context);
    let mut cache = filled(model, p.short_context, p.steps)?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..p.steps {
        a.push(bytes.total() as f64 / step_ms(model, vec![&mut cache])? / 1e6);
        b.push(probe.read_rate() / 1e9);
    }
    let comparison = Comparison::new(
        name,
        "share of the measured read bandwidth a decode step streams (its bytes over its time)",
        "GB/s",
        "decode step",
        a,
        "read probe",
        b,
        Rule::AOverB,
    );
    let stream = Stream {
        context: p.short_context,
        layer_bytes: bytes.layers,
        head_bytes: bytes.head,
        kv_bytes: bytes.kv,
        total_bytes: bytes.total(),
        probe_bytes: probe.bytes(),
    };
    Ok((comparison, stream))
}

/// The peak resident memory of a fresh process of each engine that loads `worker`'s file,
/// prefills `prompt` and decodes `decode` steps: ours (this binary as [`RESIDENT_OF`] runs it) and
/// llama.cpp's (a fresh worker).
fn resident(ws: &Workspace, worker: &Worker, prompt: &[u32], decode: usize) -> Result<Resident> {
    let ids = prompt_file(ws, prompt)?;
    let out = Command::new(std::env::current_exe().context("finding this binary")?)
        .env(RESIDENT_OF, &worker.path)
        .env(RESIDENT_IDS, &ids)
        .env(RESIDENT_DECODE, decode.to_string())
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run a fresh engine-bench")?;
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let (Some(peak), Some(kv)) = (line["peak"].as_u64(), line["kv"].as_u64()) else {
        bail!("the fresh process gave no reading ({})", out.status);
    };
    let mut fresh = Worker::spawn(ws, worker.path.clone(), worker.gguf.clone(), &ids, decode)
        .context("a fresh llama.cpp worker")?;
    fresh.round(prompt.len(), decode).context("a llama.cpp round failed")?;
    let llama = fresh.ask("memory").and_then(|m| m["peak"].as_u64());
    Ok(Resident::new(worker.gguf.bytes, prompt.len() + decode + 1, kv, peak, llama))
}

/// The llama.cpp binding's interpreter, under the workspace.
const PYTHON: &str = ".venv-llama/bin/python";

/// `prompt`'s ids written where a worker or a fresh process reads them (one file per length).
fn prompt_file(ws: &Workspace, prompt: &[u32]) -> Result<PathBuf> {
    let scratch = ws.root.join("target/bench");
    std::fs::create_dir_all(&scratch).with_context(|| scratch.display().to_string())?;
    let ids = scratch.join(format!("prompt-{}.json", prompt.len()));
    std::fs::write(&ids, serde_json::to_vec(prompt)?).with_context(|| ids.display().to_string())?;
    Ok(ids)
}

/// [`RESIDENT_OF`]'s run, in the fresh process.
fn resident_child(file: &Path) -> Result<()> {
    let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
    let prompt: Vec<u32> = serde_json::from_slice(&std::fs::read(var(RESIDENT_IDS)?)?)?;
    let decode: usize = var(RESIDENT_DECODE)?.parse()?;
    let model = LoadedModel::load_as(file, WeightDtype::Native)?;
    ours(&model, &prompt, decode)?;
    let kv = model.model.cache_bytes(prompt.len() + decode + 1);
    let peak = common::schedule::peak_rss().context("no resident-memory reading on this system")?;
    println!("{}", serde_json::json!({ "peak": peak, "kv": kv }));
    Ok(())
}

/// One round of a prompt's prefill then greedy steps.
struct Round {
    prefill_s: f64,
    decode_tps: f64,
    /// The greedy ids: the prefill's, then each step's.
    ids: Vec<u32>,
}

/// Prefill and decode of one fresh session on `model`.
fn ours(model: &LoadedModel, prompt: &[u32], decode: usize) -> Result<Round> {
    let mut s = Session::new(model, prompt.to_vec(), decode + 1)?.without_stop_ids();
    let t = Instant::now();
    s.step(None)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    while !s.is_finished() {
        s.step(None)?;
    }
    Ok(Round { prefill_s, decode_tps: decode as f64 / t.elapsed().as_secs_f64(), ids: s.output().to_vec() })
}

/// The stock loop's decode tokens/s after a prefill of `prompt`.
fn stock_round(stock: &mut Stock, prompt: &[u32], decode: usize) -> Result<f64> {
    stock.clear();
    let mut next = stock.forward(prompt, 1, 0)?;
    let t = Instant::now();
    for i in 0..decode {
        next = stock.forward(&next, 1, prompt.len() + i)?;
    }
    Ok(decode as f64 / t.elapsed().as_secs_f64())
}

/// llama.cpp on the same weights, exported as a GGUF file, in a worker process
/// (`scripts/llamacpp_bench.py`) that runs one round per request.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    version: String,
    settings: serde_json::Value,
    gguf: Gguf,
    /// The file it runs.
    path: PathBuf,
}

impl Worker {
    /// Starts the worker on `dir`'s weights as `weights`, with room for `prompt` (whose first ids
    /// each round prefills) and `decode` steps; the error says why it cannot run.
    fn start(ws: &Workspace, dir: &Path, prompt: &[u32], weights: WeightType, decode: usize) -> Result<Self> {
        if !ws.root.join(PYTHON).is_file() {
            bail!("no .venv-llama (`just bench` installs llama-cpp-python there)");
        }
        let scratch = ws.root.join("target/bench");
        std::fs::create_dir_all(&scratch).with_context(|| scratch.display().to_string())?;
        // Named by the checkpoint's folder: an export is reused only for the weights it was made of.
        let name = dir.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy());
        let path: PathBuf = scratch.join(format!("{name}-{weights:?}.gguf").to_lowercase());
        if !path.is_file() {
            common::gguf::export(dir, &path, weights).context("exporting the GGUF")?;
        }
        let (bytes, digest) = common::digest::file_digest(&path, common::digest::Algorithm::Sha256)
            .with_context(|| path.display().to_string())?;
        let gguf = Gguf { weights: format!("{weights:?}").to_lowercase(), sha256: digest, bytes };
        Self::spawn(ws, path, gguf, &prompt_file(ws, prompt)?, decode)
    }

    /// A worker on the file at `path` (`gguf` says what it is), the prompt's ids in the file `ids`.
    fn spawn(ws: &Workspace, path: PathBuf, gguf: Gguf, ids: &Path, decode: usize) -> Result<Self> {
        let mut child = Command::new(ws.root.join(PYTHON))
            .arg(ws.root.join("scripts/llamacpp_bench.py"))
            .args(["--gguf", &path.to_string_lossy(), "--prompt-ids", &ids.to_string_lossy()])
            .args(["--max-decode", &decode.to_string()])
            .args(["--threads", &common::engine_threads().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot run the llama.cpp worker")?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else { bail!("the worker has no pipes") };
        let shown = ws.display_path(&path);
        let mut worker = Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            version: String::new(),
            settings: serde_json::Value::Null,
            gguf,
            path,
        };
        match worker.read() {
            Some(ready) if ready["ready"] == true => {
                worker.version = ready["version"].as_str().unwrap_or("unknown").to_string();
                worker.settings = ready["settings"].clone();
                Ok(worker)
            }
            _ => bail!("its worker did not start on {shown} (its error is above)"),
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

    /// Prefill of the first `tokens` prompt ids, then `decode` greedy steps.
    fn round(&mut self, tokens: usize, decode: usize) -> Option<Round> {
        let prefill = self.ask(&format!("prefill {tokens}"))?;
        let steps = self.ask(&format!("decode {decode}"))?;
        let mut ids = vec![prefill["token"].as_u64()? as u32];
        ids.extend(steps["ids"].as_array()?.iter().filter_map(|v| v.as_u64()).map(|v| v as u32));
        Some(Round { prefill_s: prefill["s"].as_f64()?, decode_tps: decode as f64 / steps["s"].as_f64()?, ids })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn print_table(a: &Artifact) {
    let spread = |s: &common::stats::Summary| match (s.p50, s.min, s.max) {
        (Some(m), Some(lo), Some(hi)) => format!("{m:.3} ({lo:.3}-{hi:.3})"),
        _ => "-".into(),
    };
    for c in &a.comparisons {
        println!("{:<44} {:<20} {}", c.name, spread(&c.ratio), c.meaning);
    }
    for g in &a.agreement {
        println!("{:<44} greedy ids agree on the first {} of {}", g.what, g.agree, g.of);
    }
    for o in &a.overhead {
        println!("scheduler {:<34} {} steps, overhead {:.3}% of forward time", o.run, o.steps, o.share_percent);
    }
    for s in &a.skipped {
        println!("skipped: {s}");
    }
}
