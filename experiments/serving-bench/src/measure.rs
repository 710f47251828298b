//! The measuring run, in three steps the binary calls in turn: [`plan`] (everything fixed
//! before the first request: the model, the parameters, the targets up and asked what they
//! serve, the workload), [`run`] (warm-ups, then the open loop's groups or the closed rounds,
//! every target in turn, scraped and probed as asked) and [`record`] (the embedded server
//! stopped, the artifact summarized, its claims judged and written).

use crate::cli::{BenchArgs, Cli, TargetSpec};
use crate::serving::{self, Parameters, RequestRecord, Runtime, ServingArtifact};
use crate::ServingBench;
use anyhow::{bail, Context, Result};
use common::experiment::{judge_claims, Model, PrepareError, Prepared};
use common::workspace::Workspace;
use loadgen::client::{self, RequestOptions, Spec, Timeouts};
use loadgen::load;
use loadgen::probe::Probe;
use loadgen::progress::Progress;
use loadgen::scrape::Scraper;
use loadgen::workload::{self, Workload};
use serve::ServerConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// Everything a run fixes before its first request: the model (when the embedded server or a
/// manifest needs one), the parameters, the targets (the embedded server started, each external
/// one asked what it serves), the workload, and the claims to judge.
pub struct Plan {
    t0: Instant,
    /// The run's manifest, parameters and workspace, as prepared.
    pub prepared: Prepared<ServingBench, Option<Model>>,
    timeouts: Timeouts,
    http: client::Http,
    options: RequestOptions,
    sent_headers: Vec<String>,
    embedded: Option<serve::Running>,
    targets: Vec<Runtime>,
    versions: BTreeMap<String, serde_json::Value>,
    model_metadata: BTreeMap<String, serde_json::Value>,
    workload: Workload,
}

pub async fn plan(cli: &Cli) -> Result<Plan> {
    let args = &cli.bench;
    let t0 = Instant::now();
    let specs = args.targets().map_err(anyhow::Error::msg)?;
    let embedded = specs.iter().any(|t| t.url.is_none());
    // The embedded target needs a model (and so a manifest or --model-dir); external ones don't.
    let load = embedded || args.model.manifest.is_some();
    let prepared = Prepared::prepare_optional(&ServingBench, cli, load).map_err(|e| match e {
        // A parameter a flag set is the flag's error, not the manifest's.
        PrepareError::Parameters { cause, .. } if !args.flags_behind(&cause.field).is_empty() => {
            anyhow::anyhow!("{}: {cause}", args.flags_behind(&cause.field).join(", "))
        }
        e => e.into(),
    })?;
    let params = &prepared.parameters;
    // `prepare` validated the run (`cli::check_run`, schedules drawn and all); only its timeouts
    // are wanted here.
    let timeouts = params.timeouts()?;
    let (headers, sent_headers) =
        client::request_headers(&args.header, &args.record_header, args.api_key_env.as_deref())?;
    let http = client::http_client(&timeouts, headers, params.tls_insecure);
    let options = RequestOptions {
        endpoint: params.endpoint,
        ignore_eos: params.ignore_eos,
        continuous_usage: params.continuous_usage,
        sampling: std::sync::Arc::new(params.sampling.clone()),
        keep_text: params.keeps_text(),
    };

    let embedded = match (embedded, &prepared.model) {
        (true, Some(model)) => {
            let config = ServerConfig {
                engine: params.server_engine(&model.loaded.model),
                queue: params.server_queue,
                ..ServerConfig::new(model.name())
            };
            Some(serve::spawn(([127, 0, 0, 1], 0).into(), model.loaded.clone(), config).await?)
        }
        _ => None,
    };
    let targets = targets(args, &specs, embedded.as_ref(), prepared.model.as_ref(), &http, &timeouts).await?;
    if params.check_agreement && targets.len() < 2 {
        bail!("--check-agreement compares targets' answers: give at least two --target");
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
    let workload = workload(args, &prepared.ws, prepared.model.as_ref(), params)?;
    check_memory(params, &workload.items, targets.len())?;
    Ok(Plan {
        t0,
        prepared,
        timeouts,
        http,
        options,
        sent_headers,
        embedded,
        targets,
        versions,
        model_metadata,
        workload,
    })
}

/// The targets as measured and recorded: the embedded server through each API asked for, each
/// external server under its kind's name (numbered when there are several) with the model it
/// serves, and the replicas of one group joined into one target.
async fn targets(
    args: &BenchArgs,
    specs: &[TargetSpec],
    embedded: Option<&serve::Running>,
    model: Option<&Model>,
    http: &client::Http,
    timeouts: &Timeouts,
) -> Result<Vec<Runtime>> {
    let external = specs.iter().filter(|t| t.url.is_some() && t.group.is_none()).count();
    let mut targets: Vec<Runtime> = Vec::new();
    for (i, TargetSpec { name: given, kind, url, group }) in specs.iter().enumerate() {
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
        let target = match (url, embedded, model) {
            (None, Some(running), Some(model)) => Runtime {
                name: given.clone().unwrap_or_else(|| format!("embedded-{}", kind.name())),
                kind: *kind,
                base_url: format!("http://{}", running.addr),
                model: model.name(),
                replicas: Vec::new(),
            },
            (Some(url), _, _) => {
                let model = match &args.model_name {
                    Some(m) => m.clone(),
                    None => client::discover_model(http, *kind, url, timeouts)
                        .await
                        .map_err(|e| anyhow::anyhow!("--target {}: {e}", args.target[i]))?,
                };
                let (name, replicas) = match (group, given) {
                    (Some(group), _) => (group.clone(), vec![url.clone()]),
                    (None, Some(name)) => (name.clone(), Vec::new()),
                    (None, None) if external > 1 => (format!("{}-{}", kind.name(), i + 1), Vec::new()),
                    (None, None) => (kind.name().to_string(), Vec::new()),
                };
                Runtime { name, kind: *kind, base_url: url.clone(), model, replicas }
            }
            _ => unreachable!("an embedded target starts the embedded server"),
        };
        if let Some(other) = targets.iter().find(|t| t.name == target.name) {
            let shown = args.target.get(i).map(|t| client::redacted(t)).unwrap_or_default();
            match given {
                Some(name) => bail!("--target {shown}: the name `{name}` is another target's; give each its own"),
                None if other.base_url == target.base_url && other.kind == target.kind => {
                    bail!("--target {shown}: measured twice; give each target once")
                }
                None => bail!(
                    "--target {shown}: `{}`, the name it would get, is another target's; name it with NAME=KIND=URL",
                    target.name
                ),
            }
        }
        targets.push(target);
    }
    Ok(targets)
}

/// The prompts to send: a JSONL file, ShareGPT conversations, synthetic lengths, or the seed's.
fn workload(args: &BenchArgs, ws: &Workspace, model: Option<&Model>, params: &Parameters) -> Result<Workload> {
    // A generated workload counts its tokens with the target model's tokenizer.
    let tokenizer_dir = |flag: &str| match (&args.tokenizer, model) {
        (Some(dir), _) => Ok(dir.clone()),
        (None, Some(m)) => Ok(m.resolved.dir.clone()),
        (None, None) => {
            Err(anyhow::anyhow!("{flag}: give --tokenizer DIR (the target model's tokenizer) or --manifest"))
        }
    };
    // The workload flags conflict with one another (clap), so at most one is given.
    let workload = match (&args.prompts, &args.sharegpt, args.input_tokens) {
        _ if let Some(shape) = args.shared_prefix => {
            let dir = tokenizer_dir("--shared-prefix")?;
            Workload::shared_prefix(&dir, &ws.display_path(&dir), shape, params.seed)?
        }
        _ if let Some(shape) = args.multi_turn => {
            let dir = tokenizer_dir("--multi-turn")?;
            Workload::multi_turn(&dir, &ws.display_path(&dir), shape, params.seed)?
        }
        _ if let Some(path) = &args.conversations => Workload::conversations(path, &ws.display_path(path))?,
        (Some(path), _, _) => Workload::jsonl(path, &ws.display_path(path))?,
        (None, Some(path), _) => {
            // The replies' lengths are counted with the target model's tokenizer where there is one.
            let dir = args.tokenizer.clone().or_else(|| model.map(|m| m.resolved.dir.clone()));
            let shown = dir.as_ref().map(|d| ws.display_path(d));
            let tokenizer = dir.as_deref().zip(shown.as_deref());
            Workload::sharegpt(path, &ws.display_path(path), tokenizer)?
        }
        (None, None, Some(input)) => {
            let dir = tokenizer_dir("--input-tokens")?;
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
    if params.arrivals.is_some() && workload.is_conversational() {
        let given = args.open_loop_flags();
        let cause = match given.is_empty() {
            true => "the manifest's arrivals make an open loop; give --manifest one without arrivals".to_string(),
            false => format!("{} make an open loop; drop them", given.join(", ")),
        };
        bail!("multi-turn conversations run in closed rounds (--concurrency, --rounds): {cause}");
    }
    Ok(workload)
}

/// What a run measured: every request's record, and whether each open-loop pacer ran at
/// real-time priority.
pub struct Measured {
    records: Vec<RequestRecord>,
    agreement: Vec<serving::Agreement>,
    realtime_pacers: Vec<bool>,
    server_metrics: Vec<serving::ServerSeries>,
    machine_stalls: Vec<serving::MachineStalls>,
}

/// Warm-ups, then the open loop's groups or the closed rounds, every target in turn.
pub async fn run(plan: &Plan) -> Result<Measured> {
    let Plan { targets, http, timeouts, t0, options, .. } = plan;
    let (t0, params) = (*t0, &plan.prepared.parameters);
    let items = &plan.workload.items;
    let conversational = plan.workload.is_conversational();
    // The spec of a request sending the `n`-th item: the workload's items in turn.
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
            options: options.clone(),
        }
    };
    let per_target = match &params.arrivals {
        // A group bounded by its duration alone has no count known up front: the bar counts up.
        Some(a) => a.num_requests.unwrap_or(0).checked_mul(a.sweep.unwrap_or(a.rates.len())),
        // Every turn of a conversation is a request.
        None => (0..params.rounds)
            .flat_map(|round| params.concurrency.iter().flat_map(move |&c| (0..c).map(move |i| (round, c, i))))
            .try_fold(0usize, |n, (round, c, i)| {
                n.checked_add(items[params.closed_item(round, c, i) % items.len()].turns())
            }),
    };
    let measured = per_target
        .and_then(|n| n.checked_mul(targets.len()))
        .context("the run has more requests than can be counted; give fewer --rounds, --concurrency or --target")?;
    let bar = Progress::new(measured.saturating_add(params.warmups.saturating_mul(targets.len())) as u64);
    let mut records: Vec<RequestRecord> = Vec::new();
    let mut server_metrics = Vec::new();
    let mut machine_stalls = Vec::new();
    // Asked for, the probe must run: found out before anything is sent.
    if params.stall_probe {
        Probe::start(t0)?.finish("", String::new());
    }
    let interval = params.scrape_metrics_s.map(std::time::Duration::from_secs_f64);
    let scrape = |target| async move {
        match interval {
            Some(interval) => Some(Scraper::start(http, target, interval, t0).await),
            None => None,
        }
    };
    for target in targets.iter().filter(|_| params.warmups > 0) {
        bar.group(format!("{} warm-up", target.name));
        for w in 0..params.warmups {
            let spec = spec_of(w, 1, 0, w);
            client::measure(http, target, &spec, timeouts, t0, None).await;
            bar.unmeasured();
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
                bar.group(format!("{} {}", target.name, group_load.label()));
                let scraper = scrape(target).await;
                let probe = match params.stall_probe && group_load.rate.is_some() {
                    true => Some(Probe::start(t0)?),
                    false => None,
                };
                let group = load::run_group(
                    http,
                    target,
                    options.clone(),
                    arrivals,
                    group_load,
                    items,
                    params.max_tokens,
                    params.seed,
                    timeouts,
                    t0,
                    &bar,
                )
                .await
                .with_context(|| format!("{}: its group {}", target.name, group_load.label()))?;
                if let Some(p) = probe {
                    // Joining the probe threads waits up to a period: off the runtime's workers.
                    machine_stalls.push(tokio::task::block_in_place(|| p.finish(&target.name, group_load.label())));
                }
                if let Some(s) = scraper {
                    server_metrics.push(s.finish(&target.name, group_load.label(), 0).await);
                }
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
            for target in targets {
                bar.group(format!("{} concurrency {c} round {}", target.name, round + 1));
                // In a workload of conversations every item is one, turns numbered, even one of
                // a single turn; otherwise each item is a single request.
                let specs: Vec<(Spec, &[String])> = (0..c)
                    .map(|i| (i, params.closed_item(round, c, i)))
                    .map(|(i, n)| (spec_of(n, c, round, i), &items[n % items.len()].follow_ups[..]))
                    .collect();
                let scraper = scrape(target).await;
                let bar = &bar;
                let batch = futures_util::future::join_all(specs.iter().map(|(s, follow_ups)| async move {
                    // Shown as each request or conversation ends.
                    let done = if conversational {
                        client::converse(http, target, s, follow_ups, timeouts, t0).await
                    } else {
                        vec![client::measure(http, target, s, timeouts, t0, None).await]
                    };
                    done.iter().for_each(|r| bar.done(r));
                    done
                }))
                .await;
                if let Some(s) = scraper {
                    server_metrics.push(s.finish(&target.name, serving::load_label(c, None), round).await);
                }
                records.extend(batch.into_iter().flatten());
            }
        }
    }
    bar.finish();
    // Asked of the servers while they still run (the embedded one stops when the run is recorded).
    let agreement = match params.check_agreement {
        true => {
            let spec_of = |name: &str| items.iter().position(|i| i.name == name).map(|n| spec_of(n, 1, 0, 0));
            check_agreement(http, targets, &records, spec_of, timeouts).await
        }
        false => Vec::new(),
    };
    Ok(Measured { records, agreement, realtime_pacers, server_metrics, machine_stalls })
}

/// Stops the embedded server (keeping what its KV pool did), then writes the artifact: the
/// records, their summary, provenance, and the claims judged; returns its path, and the
/// manifest's label for the claims table.
pub async fn record(plan: Plan, measured: Measured) -> Result<(PathBuf, Option<String>)> {
    let Plan { prepared, targets, versions, model_metadata, workload, sent_headers, .. } = plan;
    let Measured { records, agreement, realtime_pacers, server_metrics, machine_stalls } = measured;
    let mut embedded_kv = None;
    if let Some(s) = plan.embedded {
        let kv = &s.kv;
        let preemptions = s.engine.preemptions.load(std::sync::atomic::Ordering::SeqCst);
        embedded_kv = Some(serving::EmbeddedKv {
            budget_bytes: kv.blocks() * kv.block_bytes(),
            peak_bytes: kv.peak_bytes(),
            preemptions,
            prefix_cache: kv.reuses_prefixes().then(|| kv.prefix_stats()),
        });
        s.stop().await;
    }
    let items = &workload.items;
    let params = prepared.parameters.clone();
    let provenance = prepared.provenance(common::build_facts!())?;
    let mut artifact = ServingArtifact {
        run_id: prepared.clock.run_id.clone(),
        created_at: prepared.clock.started_at.clone(),
        host: serving::ClientHost {
            platform: format!("{} {} {}", provenance.host.os, provenance.host.kernel, provenance.host.arch),
            machine: provenance.host.arch.clone(),
            rust: provenance.build.rustc.clone(),
        },
        summary: Vec::new(),
        arguments: params,
        runtimes: targets,
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
            let mut notes = serving::measurement_notes(&records);
            if !realtime_pacers.is_empty() {
                notes.insert(
                    "send_pacer".into(),
                    load::pacer_note(realtime_pacers.iter().all(|&r| r), loadgen::os::workers_raised()),
                );
            }
            if let Some(note) = load::workers_note(loadgen::os::workers_raised()) {
                notes.insert("client_workers".into(), note);
            }
            if !machine_stalls.is_empty() {
                notes.insert("machine_stalls".into(), serving::STALL_NOTE.into());
            }
            notes
        },
        completed_at: common::provenance::now_utc(),
        requests: records,
        sent_headers,
        claims: Vec::new(),
        embedded_kv,
        server_metrics,
        machine_stalls,
        agreement,
        provenance,
    };
    artifact.summary = serving::summarize_artifact(&artifact);
    artifact.claims = judge_claims(&ServingBench, &prepared.claims, &artifact)?;
    let path = prepared.write(&artifact)?;
    Ok((path, prepared.manifest.as_ref().map(|_| prepared.manifest_label())))
}

/// `check_agreement`: every pair of targets compared answer by answer ([`serving::compare`]),
/// and each prompt a pair's answers differed on asked again of both, alone, with
/// log-probabilities ([`client::logprobs`], once per target and prompt however many pairs name it), its
/// disagreement judged ([`serving::explain`]). `spec_of` gives the request for a prompt's name.
async fn check_agreement<'a>(
    client: &client::Http,
    targets: &[Runtime],
    records: &[RequestRecord],
    spec_of: impl Fn(&str) -> Option<Spec<'a>>,
    timeouts: &Timeouts,
) -> Vec<serving::Agreement> {
    let mut pairs = serving::compare(targets, records);
    let mut asked: std::collections::HashMap<(String, String), Result<Vec<serving::TokenChoice>, String>> =
        Default::default();
    for pair in &mut pairs {
        let prompts = serving::differing_prompts(pair);
        if !prompts.is_empty() {
            let [a, b] = &pair.targets;
            println!(
                "agreement: {a} and {b} differ on {} prompt(s); asking each again of both for log-probabilities",
                prompts.len()
            );
        }
        for prompt in prompts {
            let Some(spec) = spec_of(&prompt) else { continue };
            for name in &pair.targets {
                let Some(target) = targets.iter().find(|t| &t.name == name) else { continue };
                if let std::collections::hash_map::Entry::Vacant(slot) = asked.entry((name.clone(), prompt.clone())) {
                    slot.insert(client::logprobs(client, target, &spec, timeouts).await);
                }
            }
            let answer = |name: &String| &asked[&(name.clone(), prompt.clone())];
            let loaded = serving::parted(pair, records, &prompt);
            let e = serving::explain(&prompt, answer(&pair.targets[0]), answer(&pair.targets[1]), loaded);
            pair.explanations.push(e);
        }
    }
    pairs
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
            // A conversation records each of its turns.
            let turns = items.iter().map(workload::Item::turns).max().unwrap_or(1) as u64;
            let per_round: u64 = params.concurrency.iter().map(|&c| c as u64 * turns).sum();
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
