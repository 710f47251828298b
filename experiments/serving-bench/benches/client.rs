//! The client must not be what is measured. Against the embedded server (its own process,
//! `serving-bench serve` on the tiny checkpoint, streaming as fast as it can), this holds 256
//! concurrent streams and reports, from one run:
//! - whether every stream completed and every token arrived;
//! - the client's own CPU time per received chunk (from /proc/self/stat, so Linux only);
//! - how late the client's event loop runs: a probe task asks to wake every millisecond and
//!   records how far past the deadline it woke, first with the client idle (the timer's own
//!   granularity) and then under the 256 streams. A chunk's timestamp is late by at most the
//!   loop's lag, so the loaded distribution, less the idle one, bounds the timestamp error.

use loadgen::client::{http_client, measure, Spec, Timeouts};
use loadgen::record::{Kind, Runtime};
use std::io::BufRead;
use std::time::{Duration, Instant};

const STREAMS: usize = 256;
const TOKENS: usize = 64;

/// User + system CPU seconds of this process.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ is 100 on Linux
}

/// Wakes every millisecond until `stop` is set or `limit` passes; returns how late each wake was.
async fn probe(stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>, limit: Duration) -> Vec<f64> {
    let start = Instant::now();
    let mut lags = Vec::new();
    while start.elapsed() < limit && !stop.as_ref().is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed)) {
        let due = Instant::now() + Duration::from_millis(1);
        tokio::time::sleep_until(due.into()).await;
        lags.push(Instant::now().duration_since(due).as_secs_f64());
    }
    lags
}

fn main() {
    let workspace = source_hash::find_workspace(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))).expect("workspace");
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_serving-bench"))
        .current_dir(&workspace)
        .args(["serve", "--port", "0", "--max-active", &STREAMS.to_string(), "--queue", "1024"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the embedded server");
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().expect("stdout")).read_line(&mut line).expect("server banner");
    let base = line.split_whitespace().find(|w| w.starts_with("http://")).expect("server URL").to_string();

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (records, lags, wall, cpu) = rt.block_on(async {
        let timeouts = Timeouts {
            connect: Duration::from_secs(10),
            first_token: Duration::from_secs(120),
            idle: Duration::from_secs(60),
            total: Duration::from_secs(300),
        };
        let http = http_client(&timeouts, Default::default(), false);
        let target = Runtime {
            name: "embedded".into(),
            kind: Kind::OpenAi,
            base_url: base.clone(),
            model: "tiny".into(),
            replicas: Vec::new(),
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probe_stop = stop.clone();
        let idle = probe(None, Duration::from_millis(300)).await;
        let probe = tokio::spawn(async move { probe(Some(probe_stop), Duration::from_secs(3600)).await });
        let t0 = Instant::now();
        let cpu0 = cpu_seconds();
        let specs: Vec<Spec> = (0..STREAMS)
            .map(|i| Spec {
                concurrency: STREAMS,
                round: 0,
                index: i,
                prompt_name: "short",
                prompt: "Explain cache invalidation in one sentence.",
                messages: None,
                max_tokens: TOKENS,
                seed: 1,
                options: Default::default(),
            })
            .collect();
        let records =
            futures_util::future::join_all(specs.iter().map(|s| measure(&http, &target, s, &timeouts, t0, None))).await;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = cpu0.zip(cpu_seconds()).map(|(a, b)| b - a);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (records, (idle, probe.await.unwrap()), wall, cpu)
    });
    let _ = server.kill();
    let _ = server.wait();

    let ok = records.iter().filter(|r| r.ok()).count();
    let tokens: u64 = records.iter().map(|r| r.usage_completion_tokens.unwrap_or(0)).sum();
    let chunks: u64 = records.iter().map(|r| r.chunks).sum();
    let idle = common::stats::summarize(&lags.0);
    let lag = common::stats::summarize(&lags.1);
    println!("client against the embedded server: {STREAMS} concurrent streams x {TOKENS} tokens, {wall:.2} s");
    println!(
        "  streams completed      {ok}/{STREAMS} (failures: {:?})",
        records.iter().filter_map(|r| r.error).collect::<Vec<_>>()
    );
    println!("  tokens reported        {tokens} of {} asked, {chunks} chunks received", STREAMS * TOKENS);
    match cpu {
        Some(cpu) => println!(
            "  client CPU             {cpu:.2} s = {:.1} us per chunk ({:.1}% of one core over the run)",
            cpu * 1e6 / chunks.max(1) as f64,
            100.0 * cpu / wall
        ),
        None => println!("  client CPU             unavailable (no /proc/self/stat)"),
    }
    let ms = |v: Option<f64>| v.map(|s| format!("{:.3} ms", s * 1e3)).unwrap_or_default();
    println!(
        "  event-loop lag, idle client,    n={}: p50 {}, p99 {}, max {}",
        idle.n,
        ms(idle.p50),
        ms(idle.p99),
        ms(idle.max)
    );
    println!(
        "  event-loop lag, 256 streams,    n={}: p50 {}, p99 {}, max {}",
        lag.n,
        ms(lag.p50),
        ms(lag.p99),
        ms(lag.max)
    );
    println!(
        "  timestamp error bound (loaded p99 - idle p99): {}",
        ms(lag.p99.zip(idle.p99).map(|(a, b)| (a - b).max(0.0)))
    );
}
