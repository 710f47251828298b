//! The command line: `serve` and the benchmark's flags, the seed's settings, and what a run records
//! of its flags. In the library so that the audit can re-read a recorded `argv`.

use crate::serving::{self, Parameters};
use clap::{Args, Parser, Subcommand};
use common::experiment::{CommandLine, ModelArgs};
use common::manifest::Invalid;
use common::policy::Policy;
use serde_json::{json, Value};

mod values;

pub use serve::cli::ServeArgs;
use values::scrape_interval;
pub use values::{rate, seconds, slo, Rate, RateError, SecondsError, SloError};

#[derive(Parser)]
#[command(
    about = "Serving benchmark: streaming TTFT, latency and throughput against OpenAI- and Ollama-compatible servers"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub bench: BenchArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the embedded OpenAI- and Ollama-compatible server until Ctrl-C.
    Serve(ServeArgs),
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A server to measure, [NAME=]KIND=URL with KIND openai or ollama (repeatable; targets take
    /// turns round by round, and each is compared with the first). NAME is how tables, charts
    /// and claims call it [default: its KIND, numbered when several]. URL `embedded` is the
    /// embedded server on the manifest's model. Without any, the embedded server through both
    /// APIs. KIND=URL@GROUP makes the URL one replica of the target GROUP: a deployment of
    /// several servers measured as one, its requests spread over the replicas in turn.
    #[arg(long, value_name = "[NAME=]KIND=URL")]
    pub target: Vec<String>,
    /// Model name to request [default: the first model each server lists].
    #[arg(long)]
    pub model_name: Option<String>,
    /// Unrecorded requests per target first [default: the manifest's].
    #[arg(long)]
    pub warmups: Option<usize>,
    /// Rounds per concurrency level [default: the manifest's]. Closed rounds only: an open loop
    /// sends its groups' requests instead.
    #[arg(long, conflicts_with_all = OPEN_LOOP_ARGS)]
    pub rounds: Option<usize>,
    /// Concurrency levels, comma-separated [default: the manifest's]. Closed rounds only: an
    /// open loop's cap is --max-concurrency.
    #[arg(long, value_delimiter = ',', conflicts_with_all = OPEN_LOOP_ARGS)]
    pub concurrency: Vec<usize>,
    /// Cap on generated tokens per request [default: the manifest's].
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Seed sent with every request, for servers that sample [default: the manifest's].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds to connect [default: the manifest's].
    #[arg(long, value_parser = seconds)]
    pub connect_timeout: Option<f64>,
    /// Seconds from sending to the first generated text [default: the manifest's].
    #[arg(long, value_parser = seconds)]
    pub first_token_timeout: Option<f64>,
    /// Seconds of silence allowed inside a stream [default: the manifest's].
    #[arg(long, value_parser = seconds)]
    pub idle_timeout: Option<f64>,
    /// Seconds for a whole request [default: the manifest's].
    #[arg(long, value_parser = seconds)]
    pub timeout: Option<f64>,
    /// Open loop in place of the closed rounds: requests per second, comma-separated, one group
    /// per rate in order; `inf` sends each request as soon as `--max-concurrency` allows, or
    /// all at once without it [default: the manifest's load].
    #[arg(long, value_delimiter = ',', value_parser = rate)]
    pub request_rate: Vec<Rate>,
    /// Open loop that finds its rates, as guidellm's sweep: per target, one request at a time,
    /// then as many at once as `--max-concurrency` allows (every request without it), then N - 2
    /// groups at rates evenly spaced between those two groups' completed requests/s.
    #[arg(long, value_name = "N", conflicts_with = "request_rate")]
    pub sweep: Option<usize>,
    /// Gamma shape of the gaps between arrivals: 1 is Poisson, below 1 burstier [default: 1].
    #[arg(long)]
    pub burstiness: Option<f64>,
    /// At most this many requests in flight; with `--request-rate inf`, a closed pool whose slot
    /// refills as soon as a request ends.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Requests per open-loop group, warm-up included [default: 100 when no --duration, unless
    /// the group would send them all at once (an inf rate or a sweep without --max-concurrency)].
    #[arg(long)]
    pub num_requests: Option<usize>,
    /// Seconds over which each open-loop group sends its requests.
    #[arg(long, value_parser = seconds)]
    pub duration: Option<f64>,
    /// The first requests of each open-loop group, recorded but left out of the summary [default: 0].
    #[arg(long)]
    pub warmup_requests: Option<usize>,
    /// OpenAI endpoint: chat (`/v1/chat/completions`) or completions (`/v1/completions`)
    /// [default: the manifest's, else chat].
    #[arg(long, value_enum)]
    pub endpoint: Option<serving::Endpoint>,
    /// The embedded server's KV budget: positions (`65536`) or bytes with a unit (`512MiB`), as
    /// `serve --kv-budget` [default: the manifest's, else half the memory available, at most its
    /// active requests' whole contexts].
    #[arg(long, value_name = "POSITIONS|BYTES", value_parser = common::qwen::KvBudget::parse)]
    pub server_kv_budget: Option<common::qwen::KvBudget>,
    /// The embedded server computes every prompt whole, reusing no cached prefix (for measuring
    /// what reuse saves) [default: the manifest's, else reuse on].
    #[arg(long)]
    pub server_no_prefix_cache: bool,
    /// Ask servers to ignore end-of-sequence (vLLM's `ignore_eos`), so answers reach --max-tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature sent with every request (Ollama: options.temperature) [default: the
    /// manifest's, else 0, greedy]. With a temperature above 0 each request still carries its own
    /// seed (from --seed), so a server that honours seeds answers the same again.
    #[arg(long, value_name = "T")]
    pub temperature: Option<f64>,
    /// Nucleus sampling's top-p sent with every request [default: the manifest's, else not sent].
    #[arg(long, value_name = "P")]
    pub top_p: Option<f64>,
    /// Top-k sent with every request (vLLM's; -1 keeps every id) [default: the manifest's, else
    /// not sent].
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    pub top_k: Option<i64>,
    /// Min-p sent with every request (vLLM's) [default: the manifest's, else not sent].
    #[arg(long, value_name = "P")]
    pub min_p: Option<f64>,
    /// A stop string sent with every request (repeatable, at most 4) [default: the manifest's].
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// A JSON object merged into every request body, for anything else a server takes (e.g.
    /// '{"repetition_penalty": 1.1}'); it may not set what the client sets itself.
    #[arg(long, value_name = "JSON", value_parser = parse_extra_body)]
    pub extra_body: Option<serde_json::Map<String, Value>>,
    /// A header added to every request, NAME:VALUE (repeatable). Its value is never recorded
    /// (the artifact keeps the name, and the command line NAME:<redacted>) unless NAME is given
    /// to --record-header.
    #[arg(long, value_name = "NAME:VALUE")]
    pub header: Vec<String>,
    /// A --header name whose value is safe to record in the artifact (repeatable).
    #[arg(long, value_name = "NAME")]
    pub record_header: Vec<String>,
    /// Exit 0 even when every request of a group failed (the artifact is written either way).
    #[arg(long)]
    pub allow_failed_groups: bool,
    /// The variable holding an API key, sent as `Authorization: Bearer` [default: OPENAI_API_KEY
    /// when set]. The key is never recorded; the artifact says only that one was sent.
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
    /// Ask OpenAI servers for usage counts with every chunk (vLLM's continuous_usage_stats), so
    /// inter-token latency is per token rather than per chunk.
    #[arg(long)]
    pub continuous_usage: bool,
    /// Compare the targets' answers request by request (for targets serving the same weights,
    /// greedily): keep every answer's text, give the share identical per pair of targets and
    /// where they part, and ask each prompt that differed again of both for log-probabilities,
    /// to tell a near tie in the logits from a wrong answer.
    #[arg(long)]
    pub check_agreement: bool,
    /// Watch every CPU for the machine's holds on the client during each open-loop group at a
    /// finite rate: a probe thread per CPU at real-time priority (SCHED_FIFO 3, so root,
    /// CAP_SYS_NICE or an RLIMIT_RTPRIO of 3), waking every millisecond, records each late wake;
    /// the summary then splits the send delay into the machine's part and the client's own
    /// (send_held_s, send_own_s). The CPU time the probes took is recorded (stall_probe_cpu_s).
    #[arg(long)]
    pub stall_probe: bool,
    /// Skip TLS certificate verification for https targets (recorded in the artifact).
    #[arg(long)]
    pub insecure: bool,
    /// Prompts from a JSON Lines file: one {"prompt": TEXT} or {"messages": [...]} per line, with
    /// an optional "max_tokens"; sent in turn [default: the seed's three prompts].
    #[arg(long, value_name = "FILE.jsonl", conflicts_with = "sharegpt")]
    pub prompts: Option<std::path::PathBuf>,
    /// Prompts from a ShareGPT JSON export: each conversation's first human turn, in turn, capped
    /// at the length of the reply that follows it (counted with --tokenizer's, or the manifest's
    /// checkpoint's, tokenizer; --max-tokens where there is neither, or no reply).
    #[arg(long, value_name = "FILE.json")]
    pub sharegpt: Option<std::path::PathBuf>,
    /// Synthetic prompts of this many input tokens, a distribution: fixed:N, uniform:LO:HI or
    /// normal:MEAN:SD:LO:HI, counted with the model's tokenizer (see --tokenizer).
    #[arg(long, value_name = "DIST", value_parser = loadgen::workload::Lengths::parse, conflicts_with_all = ["prompts", "sharegpt"])]
    pub input_tokens: Option<loadgen::workload::Lengths>,
    /// The synthetic prompts' caps on generated tokens, a distribution as for --input-tokens
    /// (add --ignore-eos so answers reach them) [default: --max-tokens for all].
    #[arg(long, value_name = "DIST", value_parser = loadgen::workload::Lengths::parse, requires = "input_tokens")]
    pub output_tokens: Option<loadgen::workload::Lengths>,
    /// How many synthetic prompts to draw (sent in turn).
    #[arg(long, default_value_t = 100, requires = "input_tokens")]
    pub synthetic_count: usize,
    /// Generated prompts that share prefixes, GROUPS:PROMPTS:PREFIX:QUESTION: GROUPS groups of
    /// PROMPTS chat requests each, every request a system prompt of PREFIX tokens that its group
    /// shares and a question of QUESTION tokens of its own (counted with the model's tokenizer,
    /// drawn from --seed); sent one question of every group in turn, as SGLang's
    /// generated-shared-prefix dataset shapes them.
    #[arg(long, value_name = "G:P:S:Q", value_parser = loadgen::workload::SharedPrefix::parse, conflicts_with_all = ["prompts", "sharegpt", "input_tokens"])]
    pub shared_prefix: Option<loadgen::workload::SharedPrefix>,
    /// Multi-turn conversations from a file: JSON Lines of {"turns": [TEXT, ...]} with an optional
    /// "system" and "max_tokens", or a ShareGPT export (each conversation's human turns). Each
    /// turn is sent with the history before it and the server's actual replies; in each closed
    /// round, --concurrency conversations run at once, each turn after the last one's answer.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompts", "sharegpt", "input_tokens", "shared_prefix"])]
    pub conversations: Option<std::path::PathBuf>,
    /// Generated multi-turn conversations, CONVERSATIONS:TURNS:SYSTEM:QUESTION: each with a system
    /// prompt of SYSTEM tokens of its own and TURNS user turns of QUESTION tokens (counted with
    /// the model's tokenizer, drawn from --seed), sent as --conversations sends a file's.
    #[arg(long, value_name = "C:T:S:Q", value_parser = loadgen::workload::MultiTurn::parse, conflicts_with_all = ["prompts", "sharegpt", "input_tokens", "shared_prefix", "conversations"])]
    pub multi_turn: Option<loadgen::workload::MultiTurn>,
    /// A folder with the target model's tokenizer.json, to count synthetic prompts' tokens and
    /// ShareGPT replies' [default: the manifest's checkpoint].
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Also write the result as CSV (one row per request) or in vLLM's `--save-result` JSON shape
    /// (one file per group), beside the artifact (repeatable).
    #[arg(long, value_enum)]
    pub export: Vec<crate::export::Format>,
    /// Percentiles to report beside p50, p95 and p99, comma-separated, e.g. 90,99.9 [default: the manifest's].
    #[arg(long, value_delimiter = ',')]
    pub percentiles: Vec<f64>,
    /// A service-level objective in milliseconds, METRIC=MS with METRIC ttft_ms, tpot_ms or e2e_ms
    /// (repeatable): the summary gives the share of requests that met all, and the goodput
    /// [default: the manifest's].
    #[arg(long, value_name = "METRIC=MS", value_parser = slo)]
    pub slo: Vec<(String, f64)>,
    /// Scrape each target's Prometheus /metrics every SECONDS during every group (vLLM, SGLang,
    /// llama-server with --metrics, the embedded server): the artifact keeps the series, the
    /// summary gives the server's view (running, waiting, KV use, prefix hit rate, tokens per
    /// step, /metrics answer time); SECONDS from 0.1 to 3600 [default when given without
    /// SECONDS: 1; without the flag: the manifest's].
    #[arg(
        long,
        value_name = "SECONDS",
        num_args = 0..=1,
        default_missing_value = "1",
        allow_negative_numbers = true,
        value_parser = scrape_interval
    )]
    pub scrape_metrics: Option<f64>,
}

/// Whether a target's name reads well in tables, file names and claims.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Open-loop requests per group when neither `--num-requests` nor `--duration` says.
pub const DEFAULT_NUM_REQUESTS: usize = 100;

/// The flags that make a run an open loop (as clap names the arguments).
const OPEN_LOOP_ARGS: [&str; 7] =
    ["request_rate", "sweep", "burstiness", "max_concurrency", "num_requests", "duration", "warmup_requests"];

/// A `--target` as given: the name it was given, its API, its URL (`None`: the embedded server
/// on the manifest's model) and the group of replicas it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSpec {
    pub name: Option<String>,
    pub kind: crate::serving::Kind,
    pub url: Option<String>,
    pub group: Option<String>,
}

impl BenchArgs {
    /// The targets to measure: each `--target` checked (its kind, its URL), or without any, the
    /// embedded server through both of its APIs. `URL@group` makes the URL one replica of the
    /// target `group`. The error is one line naming the flag.
    pub fn targets(&self) -> Result<Vec<TargetSpec>, String> {
        use crate::serving::Kind;
        use loadgen::client;
        let mut specs = Vec::new();
        for spec in &self.target {
            let shown = loadgen::client::redacted(spec);
            let (kind, url) = spec.split_once('=').ok_or_else(|| {
                format!("--target {shown}: write KIND=URL, e.g. openai=http://127.0.0.1:8000 or openai=embedded")
            })?;
            // NAME=KIND=URL: a name of the user's for tables, charts and claims.
            let (name, kind, url) = match (Kind::parse(kind), url.split_once('=')) {
                (Err(_), Some((k, u))) if Kind::parse(k).is_ok() => (Some(kind), k, u),
                // NAME=KIND=URL with a NAME that is itself a kind.
                (Ok(_), Some((k, _))) if Kind::parse(k).is_ok() => {
                    return Err(format!(
                        "--target {shown}: the name `{kind}` is a kind of API; give the target another name, e.g. llama-server={k}=URL"
                    ))
                }
                _ => (None, kind, url),
            };
            if let Some(name) = name.filter(|n| !valid_name(n)) {
                return Err(format!(
                    "--target {shown}: the name `{name}` must be 1 to 64 ASCII letters, digits, `.`, `_` or `-`, not starting with `-`"
                ));
            }
            let kind = Kind::parse(kind).map_err(|e| format!("--target {shown}: {e}"))?;
            let (url, group) = client::split_group(url);
            if let (Some(_), Some(group)) = (name, group) {
                return Err(format!(
                    "--target {shown}: a replica's target is named by its group `{group}`; leave out NAME="
                ));
            }
            let name = name.map(str::to_string);
            if url == "embedded" && group.is_none() {
                if name.is_some() {
                    // The audit knows the embedded server by its names.
                    return Err(format!(
                        "--target {shown}: the embedded server is named embedded-{}; leave out NAME=",
                        kind.name()
                    ));
                }
                specs.push(TargetSpec { name, kind, url: None, group: None });
            } else if url.starts_with("http://") || url.starts_with("https://") {
                client::check_url(url).map_err(|problem| format!("--target {shown}: {problem}"))?;
                let url = Some(url.trim_end_matches('/').to_string());
                specs.push(TargetSpec { name, kind, url, group: group.map(str::to_string) });
            } else {
                return Err(format!("--target {shown}: the URL must start with http:// or https://, or be `embedded`"));
            }
        }
        if specs.is_empty() {
            specs = [Kind::OpenAi, Kind::Ollama]
                .map(|kind| TargetSpec { name: None, kind, url: None, group: None })
                .to_vec();
        }
        Ok(specs)
    }

    /// Applies the command-line overrides to the manifest's parameters.
    pub fn effective(&self, base: Parameters) -> Parameters {
        let args = self;
        let mut p = base;
        if let Some(v) = args.warmups {
            p.warmups = v
        }
        if let Some(v) = args.rounds {
            p.rounds = v
        }
        if !args.concurrency.is_empty() {
            p.concurrency = args.concurrency.clone()
        }
        if let Some(v) = args.max_tokens {
            p.max_tokens = v
        }
        if let Some(v) = args.seed {
            p.seed = v
        }
        if let Some(v) = args.connect_timeout {
            p.connect_timeout_s = v
        }
        if let Some(v) = args.first_token_timeout {
            p.first_token_timeout_s = v
        }
        if let Some(v) = args.idle_timeout {
            p.idle_timeout_s = v
        }
        if let Some(v) = args.timeout {
            p.total_timeout_s = v
        }
        if let Some(e) = args.endpoint {
            p.endpoint = e;
        }
        if let Some(b) = args.server_kv_budget {
            p.server_kv_budget = Some(b);
        }
        p.server_prefix_cache &= !args.server_no_prefix_cache;
        p.ignore_eos |= args.ignore_eos;
        p.continuous_usage |= args.continuous_usage;
        p.tls_insecure |= args.insecure;
        p.check_agreement |= args.check_agreement;
        p.stall_probe |= args.stall_probe;
        if !args.percentiles.is_empty() {
            p.percentiles = args.percentiles.clone();
        }
        if !args.slo.is_empty() {
            p.slo = args.slo.iter().cloned().collect();
        }
        if let Some(s) = args.scrape_metrics {
            p.scrape_metrics_s = Some(s);
        }
        let sampling = &mut p.sampling;
        sampling.temperature = args.temperature.or(sampling.temperature);
        sampling.top_p = args.top_p.or(sampling.top_p);
        sampling.top_k = args.top_k.or(sampling.top_k);
        sampling.min_p = args.min_p.or(sampling.min_p);
        if !args.stop.is_empty() {
            sampling.stop = args.stop.clone();
        }
        if let Some(body) = &args.extra_body {
            sampling.extra_body = Some(body.clone());
        }
        if !args.open_loop_flags().is_empty() {
            let a = p.arrivals.get_or_insert_with(|| serving::Arrivals {
                rates: vec![None],
                sweep: None,
                burstiness: 1.0,
                max_concurrency: None,
                num_requests: None,
                duration_s: None,
                warmup_requests: 0,
            });
            if !args.request_rate.is_empty() {
                a.rates = args.request_rate.iter().map(|r| r.0).collect();
                a.sweep = None;
            }
            if args.sweep.is_some() {
                a.rates = Vec::new();
                a.sweep = args.sweep;
            }
            a.burstiness = args.burstiness.unwrap_or(a.burstiness);
            a.max_concurrency = args.max_concurrency.or(a.max_concurrency);
            a.num_requests = args.num_requests.or(a.num_requests);
            a.duration_s = args.duration.or(a.duration_s);
            a.warmup_requests = args.warmup_requests.unwrap_or(a.warmup_requests);
            // The default count, except where it would send every request at once: there the
            // check asks for a count (or a cap) instead.
            let all_at_once = (a.rates.contains(&None) || a.sweep.is_some()) && a.max_concurrency.is_none();
            if a.num_requests.is_none() && a.duration_s.is_none() && !all_at_once {
                a.num_requests = Some(DEFAULT_NUM_REQUESTS);
            }
        }
        p
    }

    /// The open-loop flags given, as a user typed them: any of them makes the run an open loop.
    pub fn open_loop_flags(&self) -> Vec<&'static str> {
        [
            ("--request-rate", !self.request_rate.is_empty()),
            ("--sweep", self.sweep.is_some()),
            ("--burstiness", self.burstiness.is_some()),
            ("--max-concurrency", self.max_concurrency.is_some()),
            ("--num-requests", self.num_requests.is_some()),
            ("--duration", self.duration.is_some()),
            ("--warmup-requests", self.warmup_requests.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    /// The sampling flags given, as a user typed them.
    pub fn sampling_flags(&self) -> Vec<&'static str> {
        [
            ("--temperature", self.temperature.is_some()),
            ("--top-p", self.top_p.is_some()),
            ("--top-k", self.top_k.is_some()),
            ("--min-p", self.min_p.is_some()),
            ("--stop", !self.stop.is_empty()),
            ("--extra-body", self.extra_body.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    /// The flags given that set the effective parameter `field` (as [`Parameters::validate`]
    /// names it), so that an error blames what the user typed rather than the manifest.
    pub fn flags_behind(&self, field: &str) -> Vec<&'static str> {
        let root = field.split(['.', '[']).next().unwrap_or_default();
        let one = |flag: &'static str, given: bool| if given { vec![flag] } else { Vec::new() };
        match root {
            "arrivals" => self.open_loop_flags(),
            "rounds" => one("--rounds", self.rounds.is_some()),
            "warmups" => one("--warmups", self.warmups.is_some()),
            "concurrency" => one("--concurrency", !self.concurrency.is_empty()),
            "max_tokens" => one("--max-tokens", self.max_tokens.is_some()),
            "connect_timeout_s" => one("--connect-timeout", self.connect_timeout.is_some()),
            "first_token_timeout_s" => one("--first-token-timeout", self.first_token_timeout.is_some()),
            "idle_timeout_s" => one("--idle-timeout", self.idle_timeout.is_some()),
            "total_timeout_s" => one("--timeout", self.timeout.is_some()),
            "percentiles" => one("--percentiles", !self.percentiles.is_empty()),
            "slo" => one("--slo", !self.slo.is_empty()),
            "scrape_metrics_s" => one("--scrape-metrics", self.scrape_metrics.is_some()),
            "server_kv_budget" => one("--server-kv-budget", self.server_kv_budget.is_some()),
            "sampling" => self.sampling_flags(),
            "check_agreement" => one("--check-agreement", self.check_agreement),
            "stall_probe" => one("--stall-probe", self.stall_probe),
            _ => Vec::new(),
        }
    }

    /// What the command line asked for, as `provenance.settings.requested` records it.
    pub fn requested(&self) -> Value {
        let mut requested = json!({
            "target": self.target, "model_name": self.model_name, "warmups": self.warmups, "rounds": self.rounds,
            "concurrency": self.concurrency, "max_tokens": self.max_tokens, "seed": self.seed,
            "connect_timeout": self.connect_timeout, "first_token_timeout": self.first_token_timeout,
            "idle_timeout": self.idle_timeout, "timeout": self.timeout, "model": self.model,
            "request_rate": self.request_rate.iter().map(|r| r.0.map_or(json!("inf"), |v| json!(v))).collect::<Vec<_>>(),
            "burstiness": self.burstiness, "max_concurrency": self.max_concurrency,
            "num_requests": self.num_requests, "duration": self.duration, "warmup_requests": self.warmup_requests,
            "percentiles": self.percentiles, "slo": self.slo, "endpoint": self.endpoint, "ignore_eos": self.ignore_eos,
            "header": self.header.iter().map(|h| loadgen::client::recorded_header(h, &self.record_header)).collect::<Vec<_>>(),
            "api_key_env": self.api_key_env, "insecure": self.insecure, "continuous_usage": self.continuous_usage,
            "prompts": self.prompts, "sharegpt": self.sharegpt,
            "input_tokens": self.input_tokens.map(|l| l.describe()), "output_tokens": self.output_tokens.map(|l| l.describe()),
            "synthetic_count": self.synthetic_count, "tokenizer": self.tokenizer,
            "export": self.export.iter().map(|f| format!("{f:?}").to_lowercase()).collect::<Vec<_>>(),
        });
        // Named only when given, so that runs from before the flag read back as they were made.
        if let Some(n) = self.sweep {
            requested["sweep"] = json!(n);
        }
        if !self.record_header.is_empty() {
            requested["record_header"] = json!(self.record_header);
        }
        if self.allow_failed_groups {
            requested["allow_failed_groups"] = json!(true);
        }
        if self.check_agreement {
            requested["check_agreement"] = json!(true);
        }
        if self.stall_probe {
            requested["stall_probe"] = json!(true);
        }
        if let Some(b) = self.server_kv_budget {
            requested["server_kv_budget"] = json!(b);
        }
        if let Some(s) = self.scrape_metrics {
            requested["scrape_metrics"] = json!(s);
        }
        for (name, value) in [
            ("temperature", self.temperature.map(|v| json!(v))),
            ("top_p", self.top_p.map(|v| json!(v))),
            ("top_k", self.top_k.map(|v| json!(v))),
            ("min_p", self.min_p.map(|v| json!(v))),
            ("stop", (!self.stop.is_empty()).then(|| json!(self.stop))),
            ("extra_body", self.extra_body.as_ref().map(|b| json!(b))),
        ] {
            if let Some(value) = value {
                requested[name] = value;
            }
        }
        if let Some(shape) = self.shared_prefix {
            requested["shared_prefix"] = json!(shape.describe());
        }
        if self.server_no_prefix_cache {
            requested["server_no_prefix_cache"] = json!(true);
        }
        if let Some(path) = &self.conversations {
            requested["conversations"] = json!(path);
        }
        if let Some(shape) = self.multi_turn {
            requested["multi_turn"] = json!(shape.describe());
        }
        requested
    }

    /// The command line as the artifact records it: every `--header` value redacted unless its
    /// name was given to `--record-header` ([`loadgen::client::recorded_header`]).
    pub fn recorded_argv(&self, argv: impl IntoIterator<Item = String>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut header_value_next = false;
        for arg in argv {
            let recorded = if header_value_next {
                loadgen::client::recorded_header(&arg, &self.record_header)
            } else if let Some(spec) = arg.strip_prefix("--header=") {
                format!("--header={}", loadgen::client::recorded_header(spec, &self.record_header))
            } else {
                arg.clone()
            };
            header_value_next = arg == "--header" && !header_value_next;
            out.push(recorded);
        }
        out
    }
}

/// The seed's settings, for runs against external servers without a manifest.
pub fn seed_parameters() -> Parameters {
    Parameters {
        warmups: 2,
        rounds: 5,
        concurrency: vec![1, 4],
        max_tokens: 128,
        seed: 42,
        connect_timeout_s: 10.0,
        first_token_timeout_s: 600.0,
        idle_timeout_s: 600.0,
        total_timeout_s: 600.0,
        server_max_active: 4,
        server_queue: 64,
        server_policy: Policy::Batched,
        server_chunk_size: None,
        server_kv_budget: None,
        server_prefix_cache: true,
        arrivals: None,
        endpoint: serving::Endpoint::Chat,
        ignore_eos: false,
        continuous_usage: false,
        tls_insecure: false,
        percentiles: Vec::new(),
        slo: Default::default(),
        scrape_metrics_s: None,
        sampling: Default::default(),
        check_agreement: false,
        stall_probe: false,
    }
}

/// What a run must know to be possible, past the parameters' own ranges, before anything loads,
/// runs or is sent: its timeouts, and every finite-rate group's schedule drawn and checked. (A
/// sweep's later rates come from its first groups, and are checked when they are known.)
pub fn check_run(params: &Parameters) -> Result<loadgen::client::Timeouts, Invalid> {
    params.validate()?;
    let timeouts = params.timeouts()?;
    if let Some(arrivals) = &params.arrivals {
        for rate in arrivals.rates.iter().flatten() {
            loadgen::load::offsets(params.seed, *rate, arrivals)?;
        }
    }
    Ok(timeouts)
}

impl CommandLine for Cli {
    type Parameters = Parameters;

    fn model(&self) -> &ModelArgs {
        &self.bench.model
    }

    fn recorded_argv(&self, argv: Vec<String>) -> Vec<String> {
        self.bench.recorded_argv(argv)
    }

    fn requested(&self) -> Value {
        self.bench.requested()
    }

    fn effective(&self, base: &Parameters) -> Parameters {
        self.bench.effective(base.clone())
    }

    fn writes_no_artifact(&self) -> Option<&'static str> {
        self.command.as_ref().map(|_| "`serve` writes no artifact")
    }
}

/// `--extra-body`: a JSON object.
fn parse_extra_body(text: &str) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_str(text) {
        Ok(Value::Object(body)) => Ok(body),
        Ok(_) => Err("a JSON object is needed, like '{\"repetition_penalty\": 1.1}'".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}
