//! `serving-bench`: reproduce the seed 001 benchmark. A strict streaming client measures
//! OpenAI- and Ollama-compatible servers; with no `--target` it measures the project's own
//! embedded server on the manifest's model. `serving-bench serve` runs that server alone.

use anyhow::{bail, Context, Result};
use common::experiment::{claims_table, claims_to_judge, judge_claims, prepare, ModelArgs};
use common::workspace::Workspace;
use serving_bench::cli::{seed_parameters, BenchArgs, Cli, Command, ServeArgs};
use serving_bench::client::{self, Spec, Target};
use serving_bench::load;
use serving_bench::server::{self, ServerConfig};
use serving_bench::serving::{self, Parameters, RequestRecord, Runtime, ServingArtifact};
use serving_bench::workload::{self, Workload};
use serving_bench::{ServingBench, EXPERIMENT};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

fn main() {
    common::experiment::main(|cli: Cli| {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("a tokio runtime")?;
        match cli.command {
            Some(Command::Serve(args)) => runtime.block_on(serve(args)).map(|()| 0),
            None => runtime.block_on(bench(cli.bench)),
        }
    })
}

async fn serve(args: ServeArgs) -> Result<()> {
    let model_args = ModelArgs {
        manifest: args.manifest,
        model_dir: args.model_dir,
        out: None,
        offline: args.offline,
        dtype: args.dtype,
    };
    let prepared = prepare::<Parameters, serde_json::Value>(EXPERIMENT, &model_args)?;
    let name = model_name(&prepared.resolved);
    let config = ServerConfig {
        policy: args.policy,
        max_active: args.max_active as usize,
        chunk_size: args.chunk_size.map(|c| c as usize),
        queue: args.queue as usize,
        max_body_bytes: args.max_body_bytes as usize,
        max_connections: args.max_connections as usize,
        header_timeout: common::manifest::seconds("--header-timeout", args.header_timeout)?,
        idle_timeout: common::manifest::seconds("--idle-timeout", args.idle_timeout)?,
        kv_budget: args.kv_budget.map(|b| b.positions(prepared.model.model.block_bytes() / common::kernel::TILE)),
        ..ServerConfig::new(name.clone())
    };
    if !args.host.is_loopback() {
        eprintln!(
            "warning: binding {}: the server is reachable from the network, without authentication; use --host 127.0.0.1 to keep it local",
            args.host
        );
    }
    let running = server::spawn((args.host, args.port).into(), prepared.model, config)
        .await
        .with_context(|| format!("cannot bind {}:{}; pick another --port", args.host, args.port))?;
    // Listen for Ctrl-C before announcing the address: an interrupt sent as soon as the address
    // is known must stop the server cleanly, not kill it before the handler exists.
    #[cfg(unix)]
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    println!(
        "serving `{name}` on http://{} (OpenAI /v1/chat/completions and /v1/completions, Ollama /api/chat and /api/generate); policy {}, up to {} active, {} connections; Ctrl-C stops",
        running.addr,
        args.policy.name(),
        args.max_active,
        running.max_connections
    );
    let kv = &running.kv;
    println!(
        "KV cache: {} positions in {} blocks of {} ({}), {}",
        kv.blocks() * common::kernel::TILE,
        kv.blocks(),
        common::kernel::TILE,
        common::budget::human((kv.blocks() * kv.block_bytes()) as u128),
        if args.kv_budget.is_some() { "from --kv-budget" } else { "half the memory available (--kv-budget sets it)" }
    );
    #[cfg(unix)]
    interrupt.recv().await;
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    // Whoever started us may have stopped reading our output; that is no reason to fail.
    let _ = writeln!(std::io::stdout(), "stopping: finishing open streams");
    running.stop().await;
    Ok(())
}

fn model_name(resolved: &common::resolve::ResolvedModel) -> String {
    resolved.pin.as_ref().map(|p| p.name.clone()).unwrap_or_else(|| {
        resolved.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
    })
}

async fn bench(args: BenchArgs) -> Result<i32> {
    args.model.check_out()?;
    let t0 = Instant::now();
    let clock = common::provenance::RunClock::start();
    let ws = Workspace::discover()?;
    let specs = args.targets().map_err(anyhow::Error::msg)?;
    let embedded = specs.iter().any(|t| t.url.is_none());

    // The embedded target needs a model (and so a manifest or --model-dir); external ones don't.
    let (prepared, base, manifest_record) = if embedded || args.model.manifest.is_some() {
        let prepared = prepare::<Parameters, serde_json::Value>(EXPERIMENT, &args.model)?;
        let base = prepared.manifest.as_ref().map(|m| m.manifest.parameters.clone()).unwrap_or_else(seed_parameters);
        let record = prepared.manifest.as_ref().map(|m| m.record.clone());
        (Some(prepared), base, record)
    } else {
        (None, seed_parameters(), None)
    };
    let claims = match &prepared {
        Some(p) => claims_to_judge(&ServingBench, p)?,
        None => Vec::new(),
    };
    let (params, timeouts) = args.parameters(base).map_err(|problem| {
        let origin = manifest_record.as_ref().map(|m| m.path.clone()).unwrap_or_else(|| "parameters".into());
        anyhow::anyhow!("{origin}: {problem}")
    })?;
    let (headers, sent_headers) =
        client::request_headers(&args.header, &args.record_header, args.api_key_env.as_deref())?;
    let http = client::http_client(&timeouts, headers, params.tls_insecure);
    let options = client::RequestOptions {
        endpoint: params.endpoint,
        ignore_eos: params.ignore_eos,
        continuous_usage: params.continuous_usage,
    };

    let mut embedded_server = None;
    if let (true, Some(prepared)) = (embedded, prepared.as_ref()) {
        let config = ServerConfig {
            policy: params.server_policy,
            max_active: params.server_max_active,
            chunk_size: params.server_chunk_size,
            queue: params.server_queue,
            kv_budget: params.server_kv_budget,
            ..ServerConfig::new(model_name(&prepared.resolved))
        };
        embedded_server = Some(server::spawn(([127, 0, 0, 1], 0).into(), prepared.model.clone(), config).await?);
    }
    let external = specs.iter().filter(|t| t.url.is_some() && t.group.is_none()).count();
    let mut targets: Vec<Target> = Vec::new();
    for (i, serving_bench::cli::TargetSpec { kind, url, group }) in specs.iter().enumerate() {
        if let (Some(url), Some(group)) = (url, group) {
            // A replica joins its group's target (made by the group's first replica).
            if let Some(t) = targets.iter_mut().find(|t| !t.replicas.is_empty() && &t.name == group) {
                if t.kind != *kind {
                    bail!("--target {}: the replicas of `{group}` must speak one API", args.target[i]);
                }
                if t.replicas.contains(url) {
                    bail!("--target {}: measured twice; give each replica once", args.target[i]);
                }
                t.replicas.push(url.clone());
                continue;
            }
        }
        let target = match (url, &embedded_server, &prepared) {
            (None, Some(running), Some(prepared)) => Target {
                name: format!("embedded-{}", kind.name()),
                kind: *kind,
                base_url: format!("http://{}", running.addr),
                model: model_name(&prepared.resolved),
                options,
                replicas: Vec::new(),
            },
            (Some(url), _, _) => {
                let model = match &args.model_name {
                    Some(m) => m.clone(),
                    None => client::discover_model(&http, *kind, url, &timeouts)
                        .await
                        .map_err(|e| anyhow::anyhow!("--target {}: {e}", args.target[i]))?,
                };
                let (name, replicas) = match group {
                    Some(group) => (group.clone(), vec![url.clone()]),
                    None if external > 1 => (format!("{}-{}", kind.name(), i + 1), Vec::new()),
                    None => (kind.name().to_string(), Vec::new()),
                };
                Target { name, kind: *kind, base_url: url.clone(), model, options, replicas }
            }
            _ => unreachable!("an embedded target starts the embedded server"),
        };
        if targets.iter().any(|t: &Target| t.name == target.name) {
            bail!(
                "--target {}: measured twice; give each target once",
                args.target.get(i).map(String::as_str).unwrap_or("")
            );
        }
        targets.push(target);
    }

    let mut versions = BTreeMap::new();
    let mut model_metadata = BTreeMap::new();
    for t in &targets {
        let (version, meta) = client::metadata(&http, t, &timeouts).await.map_err(|e| {
            anyhow::anyhow!(
                "target `{}`: {e}; none of its metadata calls was answered, so measuring it would only fail",
                t.name
            )
        })?;
        versions.insert(t.name.clone(), version);
        model_metadata.insert(t.name.clone(), meta);
    }

    let workload = match (&args.prompts, &args.sharegpt, args.input_tokens) {
        (Some(path), _, _) => Workload::jsonl(path, &ws.display_path(path))?,
        (None, Some(path), _) => {
            // The replies' lengths are counted with the target model's tokenizer where there is one.
            let dir = args.tokenizer.clone().or_else(|| prepared.as_ref().map(|p| p.resolved.dir.clone()));
            let shown = dir.as_ref().map(|d| ws.display_path(d));
            let tokenizer = dir.as_deref().zip(shown.as_deref());
            Workload::sharegpt(path, &ws.display_path(path), tokenizer)?
        }
        (None, None, Some(input)) => {
            let dir = match (&args.tokenizer, &prepared) {
                (Some(dir), _) => dir.clone(),
                (None, Some(p)) => p.resolved.dir.clone(),
                (None, None) => {
                    bail!("--input-tokens: give --tokenizer DIR (the target model's tokenizer) or --manifest")
                }
            };
            if !(1..=serving::MAX_COUNT).contains(&args.synthetic_count) {
                bail!("--synthetic-count {}: must be from 1 to {}", args.synthetic_count, serving::MAX_COUNT);
            }
            let output = args.output_tokens.unwrap_or(workload::Lengths::Fixed(params.max_tokens));
            Workload::synthetic(&dir, &ws.display_path(&dir), input, output, args.synthetic_count, params.seed)?
        }
        (None, None, None) => Workload::builtin(),
    };
    if params.endpoint == serving::Endpoint::Completions && workload.items.iter().any(|i| i.messages.is_some()) {
        bail!("--endpoint completions sends text: the workload has conversations (messages), which need chat");
    }
    let items = &workload.items;
    check_memory(&params, items, targets.len())?;
    // The `n`-th request's spec: the workload's items in turn.
    let spec_of = |n: usize, concurrency: usize, round: usize, index: usize| {
        let item = &items[n % items.len()];
        Spec {
            concurrency,
            round,
            index,
            prompt_name: &item.name,
            prompt: &item.prompt,
            messages: item.messages.as_ref(),
            max_tokens: item.max_tokens.unwrap_or(params.max_tokens),
            seed: params.seed,
        }
    };
    let per_target = match &params.arrivals {
        // A group bounded by its duration alone has no count known up front: the bar counts up.
        Some(a) => a.num_requests.unwrap_or(0).checked_mul(a.sweep.unwrap_or(a.rates.len())),
        None => params
            .concurrency
            .iter()
            .try_fold(0usize, |n, c| n.checked_add(*c))
            .and_then(|n| n.checked_mul(params.rounds)),
    };
    let measured = per_target
        .and_then(|n| n.checked_mul(targets.len()))
        .context("the run has more requests than can be counted; give fewer --rounds, --concurrency or --target")?;
    let bar = indicatif::ProgressBar::new(measured.saturating_add(params.warmups.saturating_mul(targets.len())) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} requests {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut records: Vec<RequestRecord> = Vec::new();
    for target in &targets {
        bar.set_message(format!("{} warmup", target.name));
        for w in 0..params.warmups {
            let spec = spec_of(w, 1, 0, w);
            client::measure(&http, target, &spec, &timeouts, t0, None).await;
            bar.inc(1);
        }
    }
    // An open loop: per group, each target in turn runs it. A sweep's later groups have rates
    // of each target's own, from its first two.
    let rounds = if params.arrivals.is_some() { 0 } else { params.rounds };
    let mut realtime_pacers = Vec::new();
    if let Some(arrivals) = &params.arrivals {
        // Per group, each target's load (none: it sits the group out).
        let mut steps: Vec<Vec<Option<load::Load>>> =
            load::Load::planned(arrivals).into_iter().map(|l| vec![Some(l); targets.len()]).collect();
        let mut step = 0;
        while step < steps.len() {
            for (target, group_load) in targets.iter().zip(&steps[step]) {
                let Some(group_load) = *group_load else { continue };
                bar.set_message(format!("{} {}", target.name, group_load.label()));
                let group = load::run_group(
                    &http,
                    target,
                    arrivals,
                    group_load,
                    items,
                    params.max_tokens,
                    params.seed,
                    &timeouts,
                    t0,
                    &bar,
                )
                .await
                .with_context(|| format!("{}: its group {}", target.name, group_load.label()))?;
                records.extend(group.records);
                realtime_pacers.extend(group.realtime_pacer);
            }
            step += 1;
            if let (Some(n), 2) = (arrivals.sweep, step) {
                let rates: Vec<Vec<f64>> = targets.iter().map(|t| load::sweep_rates(&records, &t.name, n)).collect();
                for (t, r) in targets.iter().zip(&rates) {
                    let shown: Vec<String> = r.iter().map(|r| format!("{r:.3}")).collect();
                    bar.suspend(|| println!("{}: sweep rates {} requests/s", t.name, shown.join(", ")));
                }
                // A target without rates to sweep (no success in either group) sits the rest out.
                for k in 0..n.saturating_sub(2) {
                    let cap = arrivals.max_concurrency;
                    steps.push(
                        rates.iter().map(|r| r.get(k).map(|&rate| load::Load { rate: Some(rate), cap })).collect(),
                    );
                }
            }
        }
    }
    // Targets and concurrency levels take turns round by round: on a machine whose speed drifts
    // by tens of percent within minutes, only measurements taken side by side compare fairly,
    // whether two servers or one server's scaling from one level to the next.
    for round in 0..rounds {
        for &c in &params.concurrency {
            for target in &targets {
                bar.set_message(format!("{} concurrency {c} round {}", target.name, round + 1));
                let specs: Vec<Spec> = (0..c).map(|i| spec_of(round * c + i, c, round, i)).collect();
                let batch = futures_util::future::join_all(
                    specs.iter().map(|s| client::measure(&http, target, s, &timeouts, t0, None)),
                )
                .await;
                bar.inc(batch.len() as u64);
                records.extend(batch);
            }
        }
    }
    bar.finish_and_clear();
    let mut embedded_kv = None;
    if let Some(s) = embedded_server {
        let kv = &s.kv;
        let preemptions = s.engine.preemptions.load(std::sync::atomic::Ordering::SeqCst);
        embedded_kv = Some(serving::EmbeddedKv {
            budget_bytes: kv.blocks() * kv.block_bytes(),
            peak_bytes: kv.peak_bytes(),
            preemptions,
        });
        s.stop().await;
    }

    let runtimes: Vec<Runtime> = targets
        .iter()
        .map(|t| Runtime {
            name: t.name.clone(),
            kind: t.kind.name().into(),
            base_url: t.base_url.clone(),
            model: t.model.clone(),
            replicas: t.replicas.clone(),
        })
        .collect();
    let facts = common::build_facts!();
    let requested = args.requested();
    let provenance = common::provenance::collect(
        &ws,
        common::provenance::RunFacts {
            experiment: EXPERIMENT,
            clock: clock.clone(),
            facts,
            requested,
            effective: serde_json::to_value(&params)?,
            model: prepared.as_ref().map(|p| &p.resolved),
            weights: args.model.dtype,
            manifest: manifest_record,
            threads: common::engine_threads(),
            argv: args.recorded_argv(std::env::args()),
        },
    );
    let provenance_effective = provenance.settings.effective.clone();
    let mut artifact = ServingArtifact {
        run_id: clock.run_id.clone(),
        created_at: clock.started_at.clone(),
        host: serving::ClientHost {
            platform: format!("{} {} {}", provenance.host.os, provenance.host.kernel, provenance.host.arch),
            machine: provenance.host.arch.clone(),
            rust: provenance.build.rustc.clone(),
        },
        summary: serving::summarize_all(&params, &runtimes, &records),
        arguments: params,
        runtimes,
        versions,
        model_metadata,
        // The prompts sent, by name (a large file's unsent items are in its digest only).
        prompts: records
            .iter()
            .filter_map(|r| items.iter().find(|i| i.name == r.prompt))
            .map(|i| (i.name.clone(), i.prompt.clone()))
            .collect(),
        workload: Some(workload.record.clone()),
        measurement_notes: {
            let mut notes = serving::measurement_notes();
            if !realtime_pacers.is_empty() {
                notes.insert("send_pacer".into(), load::pacer_note(realtime_pacers.iter().all(|&r| r)));
            }
            notes
        },
        completed_at: common::provenance::now_utc(),
        requests: records,
        sent_headers,
        claims: Vec::new(),
        embedded_kv,
        provenance,
    };
    artifact.claims = judge_claims(&ServingBench, &claims, &artifact)?;
    let path = match (&args.model.out, &prepared) {
        (Some(out), _) => out.clone(),
        (None, Some(p)) => p.artifact_path(None, Some(&provenance_effective)),
        (None, None) => common::artifact::default_path(&ws.artifacts_dir(), EXPERIMENT, "external", &clock.run_id),
    };
    common::artifact::write_new(&path, &artifact)?;
    // Exports and tables come from the artifact as written: redacted, so that no export or
    // printed line holds what the artifact may not.
    let artifact: ServingArtifact = common::artifact::read_artifact(&path)?;
    for format in &args.export {
        for file in serving_bench::export::write(&artifact, &path, *format)? {
            println!("export: {}", ws.display_path(&file));
        }
    }
    print_table(&artifact);
    for note in serving::backlog_notes(&artifact.requests) {
        println!("note: {note}");
    }
    print_comparison(&artifact);
    if let (false, Some(p)) = (artifact.claims.is_empty(), &prepared) {
        let rows: Vec<_> = artifact.claims.iter().map(|c| (p.manifest_label(), c)).collect();
        print!("\n{}", claims_table(&rows));
    }
    println!("artifact: {}", ws.display_path(&path));
    let failed = serving::failed_groups(&artifact.requests);
    if failed.is_empty() || args.allow_failed_groups {
        return Ok(0);
    }
    eprintln!(
        "error: every request failed in {}; the artifact is written (--allow-failed-groups exits 0 on such a run)",
        failed.join("; ")
    );
    Ok(1)
}

/// The records a run will hold must fit in memory ([`common::budget`]): every measured request
/// of every target, at the longest cap any item has, counted in the unit a user changes (closed
/// rounds, or an open loop's requests per group). Groups bounded by a duration alone at an
/// unbounded rate have no count known up front and are left out; each still stops at
/// [`serving::MAX_COUNT`] requests.
fn check_memory(params: &Parameters, items: &[workload::Item], targets: usize) -> Result<()> {
    let longest = items.iter().filter_map(|i| i.max_tokens).chain([params.max_tokens]).max().unwrap_or(0);
    let request = serving::bytes_per_request(longest).saturating_mul(targets as u64);
    let (field, count, each) = match &params.arrivals {
        None => {
            let per_round: u64 = params.concurrency.iter().map(|&c| c as u64).sum();
            ("rounds", params.rounds as u64, request.saturating_mul(per_round))
        }
        Some(a) => {
            let groups = a.sweep.unwrap_or(a.rates.len()) as u64;
            let per_group = match (a.num_requests, a.duration_s) {
                (Some(n), _) => n as u64,
                // Poisson arrivals: allow for a group that draws more than its mean.
                (None, Some(d)) => (a.rates.iter().flatten().copied().fold(0.0, f64::max) * d * 1.5)
                    .min(serving::MAX_COUNT as f64) as u64,
                (None, None) => 0,
            };
            ("num_requests", per_group, request.saturating_mul(groups))
        }
    };
    common::budget::fits(field, count, each, 0, common::budget::available_bytes())?;
    Ok(())
}

fn print_table(a: &ServingArtifact) {
    let f = |row: &BTreeMap<String, serde_json::Value>, k: &str, scale: f64| {
        row.get(k).and_then(|v| v.as_f64()).map(|v| format!("{:.1}", v * scale)).unwrap_or_else(|| "-".into())
    };
    let open = a.arguments.arrivals.is_some();
    // Send lateness, and in brackets the client's own part (without waits for a slot).
    let (group, late) = if open { ("rate", "late p99 (own)") } else { ("conc", "") };
    let slo = !a.arguments.slo.is_empty();
    println!(
        "{:<18} {:>8} {:>5} {:>5} {:>9} {:>9} {:>10} {:>10} {:>11} {:>16} {:>8} {:>9}",
        "runtime",
        group,
        "ok",
        "fail",
        "ttft p50",
        "ttft p95",
        "total p50",
        "decode t/s",
        "aggr t/s",
        late,
        if slo { "SLO met" } else { "" },
        if slo && open { "goodput/s" } else { "" }
    );
    for row in &a.summary {
        let lateness = if open {
            format!("{} ({})ms", f(row, "send_lateness_s_p99", 1000.0), f(row, "client_lateness_s_p99", 1000.0))
        } else {
            String::new()
        };
        let group = load_cell(row, open);
        let met = if slo { format!("{}%", f(row, "slo_met_share", 100.0)) } else { String::new() };
        let goodput = if slo && open { f(row, "goodput_rps", 1.0) } else { String::new() };
        println!(
            "{:<18} {:>8} {:>5} {:>5} {:>7}ms {:>7}ms {:>8}ms {:>10} {:>11} {:>16} {:>8} {:>9}",
            row["runtime"].as_str().unwrap_or_default(),
            group,
            row["successes"].to_string(),
            row["failures"].to_string(),
            f(row, "ttft_s_p50", 1000.0),
            f(row, "ttft_s_p95", 1000.0),
            f(row, "total_s_p50", 1000.0),
            f(row, "decode_tps_mean", 1.0),
            f(row, "aggregate_output_tps_mean", 1.0),
            lateness,
            met,
            goodput,
        );
    }
}

/// A summary row's load as the tables show it: the closed rounds' concurrency, else the open
/// loop's rate (`sync`: one at a time; `inf`: as fast as the cap allows).
fn load_cell(row: &BTreeMap<String, serde_json::Value>, open: bool) -> String {
    match (open, row.get("request_rate").and_then(serde_json::Value::as_f64)) {
        (false, _) => row["concurrency"].to_string(),
        (true, Some(rate)) => format!("{rate:.2}"),
        (true, None) if row["concurrency"] == 1 => "sync".into(),
        (true, None) => "inf".into(),
    }
}

/// Median and range of `values`, as "median (min-max)".
fn spread(values: &[f64]) -> String {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    match (common::stats::percentile_sorted(&sorted, 50.0), sorted.first(), sorted.last()) {
        (Some(m), Some(lo), Some(hi)) => format!("{m:.3} ({lo:.3}-{hi:.3})"),
        _ => "-".into(),
    }
}

/// Paired ratios, round by round (targets and levels took turns, so each round's pair ran side
/// by side): every target's aggregate tokens/s and TTFT median against the first target's at
/// each concurrency, and each target's aggregate tokens/s at its highest concurrency over its
/// lowest.
fn print_comparison(a: &ServingArtifact) {
    if a.arguments.arrivals.is_some() {
        return print_open_comparison(a); // an open loop has no rounds to pair
    }
    // Per (runtime, concurrency, round): the round's aggregate tokens/s and its median TTFT.
    let mut rounds: BTreeMap<(&str, usize, usize), Vec<&RequestRecord>> = BTreeMap::new();
    for r in &a.requests {
        rounds.entry((r.runtime.as_str(), r.concurrency, r.round)).or_default().push(r);
    }
    let aggregate =
        |t: &str, c: usize, round: usize| rounds.get(&(t, c, round)).and_then(|rs| serving::aggregate_tps(rs));
    let ttft = |t: &str, c: usize, round: usize| {
        let mut v: Vec<f64> = rounds.get(&(t, c, round))?.iter().filter_map(|r| r.ttft()).collect();
        v.sort_by(f64::total_cmp);
        common::stats::percentile_sorted(&v, 50.0)
    };
    let pairs = |f: &dyn Fn(usize) -> Option<(f64, f64)>| -> Vec<f64> {
        (0..a.arguments.rounds).filter_map(f).filter(|(_, b)| *b > 0.0).map(|(x, b)| x / b).collect()
    };
    let Some(first) = a.runtimes.first() else { return };
    let levels = &a.arguments.concurrency;
    let others = &a.runtimes[1..];
    if !others.is_empty() {
        println!("\nper-round ratios against {} (median (min-max) over {} rounds)", first.name, a.arguments.rounds);
        for t in others {
            for &c in levels {
                let tps = pairs(&|r| Some((aggregate(&t.name, c, r)?, aggregate(&first.name, c, r)?)));
                let first_token = pairs(&|r| Some((ttft(&t.name, c, r)?, ttft(&first.name, c, r)?)));
                println!(
                    "  {:<18} concurrency {c:<3} aggregate tokens/s {}x, TTFT median {}x",
                    t.name,
                    spread(&tps),
                    spread(&first_token)
                );
            }
        }
    }
    if let (Some(&low), Some(&high)) = (levels.iter().min(), levels.iter().max()) {
        if high > low {
            println!("\naggregate tokens/s at concurrency {high} over {low}, round by round");
            for t in &a.runtimes {
                let scaling = pairs(&|r| Some((aggregate(&t.name, high, r)?, aggregate(&t.name, low, r)?)));
                println!("  {:<18} {}x", t.name, spread(&scaling));
            }
        }
    }
}

/// An open loop's groups beside the first target's group under the same load (rate and cap):
/// each figure over the first target's. A sweep's rates are each target's own (found from its
/// own saturation), so there only the synchronous and throughput groups pair; its curves in the
/// report compare the rest.
fn print_open_comparison(a: &ServingArtifact) {
    let Some(first) = a.runtimes.first().filter(|_| a.runtimes.len() > 1) else { return };
    let load =
        |row: &BTreeMap<String, serde_json::Value>| (row.get("concurrency").cloned(), row.get("request_rate").cloned());
    let runtime = |row: &BTreeMap<String, serde_json::Value>| {
        row.get("runtime").and_then(|v| v.as_str()).unwrap_or_default().to_string()
    };
    let mut columns =
        vec![("ttft_s_p99", "TTFT p99"), ("total_s_p50", "total p50"), ("aggregate_output_tps_mean", "output tok/s")];
    if !a.arguments.slo.is_empty() {
        columns.push(("goodput_rps", "goodput"));
    }
    let mut lines = Vec::new();
    for row in a.summary.iter().filter(|r| runtime(r) != first.name) {
        let Some(base) = a.summary.iter().find(|b| runtime(b) == first.name && load(b) == load(row)) else { continue };
        let ratios: Vec<String> = columns
            .iter()
            .map(|(key, name)| {
                let value = |r: &BTreeMap<String, serde_json::Value>| r.get(*key).and_then(serde_json::Value::as_f64);
                match (value(row), value(base)) {
                    (Some(x), Some(b)) if b > 0.0 => format!("{name} {:.2}x", x / b),
                    _ => format!("{name} -"),
                }
            })
            .collect();
        lines.push(format!("  {:<18} {:>8}  {}", runtime(row), load_cell(row, true), ratios.join(", ")));
    }
    if !lines.is_empty() {
        println!("\neach target over {} under the same load", first.name);
        println!("{}", lines.join("\n"));
    }
}
