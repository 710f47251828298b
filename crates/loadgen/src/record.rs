//! What the client records of each request, and of the servers and workload it measured, with
//! the metrics read off one request.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use supply::manifest::Invalid;

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The TCP connection could not be made (refused, unreachable, connect timeout).
    Connect,
    /// The server answered with a non-2xx status.
    HttpStatus,
    /// No generated text within the first-token timeout.
    FirstTokenTimeout,
    /// A gap between two reads longer than the idle timeout.
    IdleTimeout,
    /// The whole request took longer than the total timeout.
    TotalTimeout,
    /// The stream ended before its final event.
    TruncatedStream,
    /// The stream ended well (its final event arrived) but carried no generated text: nothing to
    /// time a first token by, so it is no success.
    EmptyStream,
    /// The server sent an error object in the stream.
    ErrorEvent,
    /// A line or event that is not the JSON the protocol promises.
    BadJson,
    /// The server's token counts contradict the request or the stream: more generated tokens
    /// than `max_tokens` allows, or running counts that go down or past the final one. Such a
    /// count cannot be trusted, so the request enters no throughput.
    InconsistentUsage,
}

impl ErrorClass {
    /// Its name as artifacts write it (`http_status`, `inconsistent_usage`).
    pub fn name(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }
}

/// Where an output token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The OpenAI `usage.completion_tokens` of the server.
    Usage,
    /// Ollama's `eval_count`.
    OllamaCounters,
    /// The number of chunks with generated text (a lower bound when a chunk holds several tokens).
    Chunks,
}

/// One request, as the client saw it. Times are seconds on the client's monotonic clock, from
/// the start of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestRecord {
    pub runtime: String,
    pub concurrency: usize,
    /// 0-based measured round.
    pub round: usize,
    /// Position within the round.
    pub index: usize,
    /// Which prompt (`short`, `medium`, `code`).
    pub prompt: String,
    pub scheduled_s: f64,
    pub sent_s: Option<f64>,
    /// The CPU the client sent it from, read as `sent_s` was: the CPU whose stalls the stall
    /// probe matches against its send ([`crate::stall::split_send`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_cpu: Option<usize>,
    pub first_byte_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub end_s: f64,
    /// HTTP status, when one arrived.
    pub status: Option<u16>,
    /// `None` on success.
    pub error: Option<ErrorClass>,
    pub error_detail: Option<String>,
    pub finish_reason: Option<String>,
    /// Token counts by source, when the source gave one.
    pub usage_completion_tokens: Option<u64>,
    pub usage_prompt_tokens: Option<u64>,
    pub ollama_eval_count: Option<u64>,
    pub ollama_eval_duration_ns: Option<u64>,
    pub ollama_prompt_eval_count: Option<u64>,
    pub ollama_prompt_eval_duration_ns: Option<u64>,
    pub chunks: u64,
    /// Gaps between consecutive chunks with generated text, seconds.
    pub chunk_gaps_s: Vec<f64>,
    /// Its place in an open-loop schedule; absent in the seed's closed rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<Arrival>,
    /// Generated tokens in each chunk with text, from the server's running usage counts, when it
    /// sent one with every such chunk (vLLM's `continuous_usage_stats`); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_tokens: Vec<u64>,
    /// Which of its runtime's `replicas` served it, for a group of replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<usize>,
    /// The cap on generated tokens it was sent with (`max_tokens`, Ollama's `num_predict`): a
    /// success never counts more output tokens than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Its turn in a multi-turn conversation (0 the first), which sent the history before it with
    /// the server's replies; absent for a single request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<usize>,
    /// The first send found its kept-alive connection closed by the server before any answer,
    /// and the request was sent again, once (its times run from the first send).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resent: bool,
    /// SHA-256 of the generated text as the client received it, when any came: two targets gave
    /// the same answer when their digests are equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_sha256: Option<String>,
    /// The generated text, kept where the run checks it (`check_agreement`, or stop strings
    /// sent), so the audit can recompute the digest, the agreement and the inconsistencies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Where the answer contradicts its own request ([`output_inconsistency`]):
    /// `finish_reason` `length` with fewer tokens than `max_tokens`, or a stop string in the text.
    /// Recorded and counted, not a failure: the text and its timing are what the server sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inconsistency: Option<String>,
}

/// Where a run's prompts came from, and enough about them to tell whether two runs sent the
/// same requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadRecord {
    /// `builtin` (the seed's three prompts), `jsonl`, `sharegpt`, `synthetic`, `shared-prefix`,
    /// `conversations` (a file's multi-turn conversations) or `multi-turn` (generated ones).
    pub source: String,
    /// The file, as given (for synthetic prompts, the tokenizer's folder).
    pub path: Option<String>,
    /// SHA-256 of the file's bytes (for synthetic prompts, of `tokenizer.json`).
    pub file_sha256: Option<String>,
    /// SHA-256 of the items read from it (prompt, messages, max_tokens, and a conversation's
    /// later turns): equal for the same requests whatever the file's formatting.
    pub items_sha256: String,
    pub items: usize,
    pub prompt_chars_min: Option<f64>,
    pub prompt_chars_p50: Option<f64>,
    pub prompt_chars_mean: Option<f64>,
    pub prompt_chars_max: Option<f64>,
    /// Items with their own `max_tokens`.
    pub items_with_max_tokens: usize,
    /// For synthetic prompts: the distributions their lengths were drawn from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths: Option<String>,
    /// For synthetic prompts: their lengths in tokens, as the tokenizer counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_max: Option<f64>,
    /// For multi-turn conversations: each item's turns, in the items' order (the audit checks
    /// that every conversation sent them all, or stopped at a failed one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversation_turns: Vec<usize>,
}

/// An open-loop request's group and window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arrival {
    /// The group's rate, requests per second; `null`: unbounded (all at once, or a closed pool
    /// under `max_concurrency`).
    pub rate_rps: Option<f64>,
    /// Sent before the measured window: recorded, left out of the summary.
    pub warmup: bool,
    /// When it could first be sent: its scheduled time, or, when every slot under
    /// `max_concurrency` was taken then, the instant one was freed (in a closed pool, always
    /// that instant). From here to `sent_s` is the client's own lateness; before it, the cap's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_s: Option<f64>,
    /// At a finite rate, when the client's pacer woke it: the pacer thread runs above everything
    /// else of the client's, so a wake later than `scheduled_s` is the machine's (the kernel, or
    /// the host pausing the VM), not the client's. (Runs before it was recorded have none.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub woken_s: Option<f64>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Output tokens and where the count came from: server usage, then Ollama, then chunks.
    pub fn output_tokens(&self) -> (u64, TokenSource) {
        if let Some(n) = self.usage_completion_tokens {
            (n, TokenSource::Usage)
        } else if let Some(n) = self.ollama_eval_count {
            (n, TokenSource::OllamaCounters)
        } else {
            (self.chunks, TokenSource::Chunks)
        }
    }

    /// The gaps between its tokens: each gap between two chunks split evenly over the second
    /// chunk's tokens (from `chunk_tokens`; a chunk without a new token keeps its gap whole).
    pub fn token_gaps(&self) -> Vec<f64> {
        let counts = self.chunk_tokens.iter().skip(1);
        self.chunk_gaps_s
            .iter()
            .zip(counts)
            .flat_map(|(gap, &k)| {
                let k = k.clamp(1, 1 << 16);
                std::iter::repeat_n(gap / k as f64, k as usize)
            })
            .collect()
    }

    /// How late the client sent it: from when the schedule wanted it sent to when it was.
    pub fn lateness(&self) -> Option<f64> {
        self.sent_s.map(|s| s - self.scheduled_s)
    }

    /// The part of its lateness that was the client's own: from when it could first be sent (a
    /// slot free, its time come) to when it was.
    pub fn client_lateness(&self) -> Option<f64> {
        Some(self.sent_s? - self.arrival?.admitted_s?)
    }

    /// The part of its [`client_lateness`](Self::client_lateness) that the pacer's late wake made,
    /// which the machine held the client for: from when it could first be sent to when the pacer
    /// woke it, if that was later (where the pacer's wake was recorded). With
    /// [`send_delay`](Self::send_delay) it makes the client's lateness whole.
    pub fn pacer_lateness(&self) -> Option<f64> {
        Some(self.ready_s()? - self.arrival?.admitted_s?)
    }

    /// How long the client took to send it once it could: from [`ready_s`](Self::ready_s) to
    /// when it was sent.
    pub fn send_delay(&self) -> Option<f64> {
        Some(self.sent_s? - self.ready_s()?)
    }

    /// When the client could send it and was awake to: the later of its admission and its
    /// pacer's wake-up (where the pacer's wake was recorded).
    pub fn ready_s(&self) -> Option<f64> {
        let arrival = self.arrival?;
        Some(arrival.admitted_s?.max(arrival.woken_s?))
    }

    /// Whether it could not be sent at its time because every slot under `max_concurrency` was
    /// taken (admitted later than scheduled; a microsecond allowed for the seconds' rounding).
    pub fn waited_for_slot(&self) -> bool {
        self.arrival.and_then(|a| a.admitted_s).is_some_and(|t| t - self.scheduled_s > 1e-6)
    }

    pub fn ttft(&self) -> Option<f64> {
        self.first_token_s.map(|t| t - self.scheduled_s)
    }

    pub fn total(&self) -> f64 {
        self.end_s - self.scheduled_s
    }

    pub fn decode_tps(&self) -> Option<f64> {
        if let (Some(n), Some(ns)) = (self.ollama_eval_count, self.ollama_eval_duration_ns) {
            return (ns > 0).then(|| n as f64 / (ns as f64 / 1e9));
        }
        let (n, _) = self.output_tokens();
        let decode = self.total() - self.ttft()?;
        (decode > 0.0).then(|| n as f64 / decode)
    }

    pub fn tpot(&self) -> Option<f64> {
        let (n, _) = self.output_tokens();
        (n > 1).then(|| (self.total() - self.ttft().unwrap_or(0.0)) / (n - 1) as f64).filter(|_| self.ttft().is_some())
    }

    pub fn request_tps(&self) -> Option<f64> {
        let total = self.total();
        (total > 0.0).then(|| self.output_tokens().0 as f64 / total)
    }

    /// Prefill tokens per second, where the server says how long prefill took (Ollama's
    /// `prompt_eval_count / prompt_eval_duration`); `None` otherwise.
    pub fn prompt_tps(&self) -> Option<f64> {
        match (self.ollama_prompt_eval_count, self.ollama_prompt_eval_duration_ns) {
            (Some(n), Some(ns)) if ns > 0 => Some(n as f64 / (ns as f64 / 1e9)),
            _ => None,
        }
    }
}

/// The two API families a target can speak (a runtime's `kind`, as the seed writes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    OpenAi,
    Ollama,
}

impl Kind {
    pub fn parse(s: &str) -> Result<Self, UnknownKind> {
        match s {
            "openai" => Ok(Kind::OpenAi),
            "ollama" => Ok(Kind::Ollama),
            other => Err(UnknownKind(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::OpenAi => "openai",
            Kind::Ollama => "ollama",
        }
    }
}

/// A target kind that is neither API family.
#[derive(Debug, thiserror::Error)]
#[error("unknown target kind `{0}`; use openai=URL or ollama=URL")]
pub struct UnknownKind(String);

/// A server under test: what the client sends to (the seed's `runtimes` entries, recorded as
/// measured).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    pub name: String,
    pub kind: Kind,
    pub base_url: String,
    pub model: String,
    /// The replicas of one deployment measured as this one runtime (`--target KIND=URL@group`),
    /// requests spread in turn; absent for a single server (`base_url`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<String>,
}

impl Runtime {
    /// Which replica serves the request at `index` (in turn), and its URL.
    pub(crate) fn replica(&self, index: usize) -> (Option<usize>, &str) {
        match self.replicas.len() {
            0 => (None, &self.base_url),
            n => (Some(index % n), &self.replicas[index % n]),
        }
    }
}

/// How many candidates per token the probe asks for (OpenAI's `top_logprobs`).
pub const PROBE_CANDIDATES: usize = 5;

/// A token and its log-probability, as a server reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    pub token: String,
    pub logprob: f64,
}

/// One generated token with the candidates the server listed for its place, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenChoice {
    pub chosen: Candidate,
    pub top: Vec<Candidate>,
}

/// Where a successful record's token counts contradict its request or its stream (the
/// [`ErrorClass::InconsistentUsage`] the client gives such a request): more output tokens than
/// its cap, or running per-chunk counts that add up past the total. `None` when they agree.
pub fn usage_contradiction(r: &RequestRecord) -> Option<String> {
    let (tokens, source) = r.output_tokens();
    let source = match source {
        TokenSource::Usage => "usage.completion_tokens",
        TokenSource::OllamaCounters => "eval_count",
        TokenSource::Chunks => "chunks with text",
    };
    if let Some(cap) = r.max_tokens.filter(|cap| tokens > *cap) {
        return Some(format!("{source} {tokens} is more than the {cap} tokens max_tokens allows"));
    }
    let per_chunk = r.chunk_tokens.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
    (r.usage_completion_tokens.is_some_and(|total| per_chunk > total))
        .then(|| format!("the running counts add up to {per_chunk}, more than the final {source} {tokens}"))
}

/// Where a successful answer contradicts its own request: `finish_reason` `length` (Ollama's
/// `done_reason`) with fewer output tokens than `max_tokens` as the server counted them (a chunk
/// count is only a lower bound, so it is not judged), or the text holding one of the stop strings
/// it was sent (`text` absent: not judged). `None` when it is consistent.
pub fn output_inconsistency(r: &RequestRecord, text: Option<&str>, stops: &[String]) -> Option<String> {
    if !r.ok() {
        return None;
    }
    let (tokens, source) = r.output_tokens();
    if let (Some("length"), Some(cap), false) =
        (r.finish_reason.as_deref(), r.max_tokens, source == TokenSource::Chunks)
    {
        if tokens < cap {
            return Some(format!(
                "finish_reason length after {tokens} tokens, fewer than the max_tokens {cap} it was sent (unless a context limit ended it, the count or the reason is wrong)"
            ));
        }
    }
    let text = text?;
    stops.iter().filter(|s| !s.is_empty()).find_map(|stop| {
        text.find(stop.as_str()).map(|at| {
            format!(
                "the text holds the stop string {stop:?} at character {} (finish_reason {}): a server honouring it ends before it",
                text[..at].chars().count(),
                r.finish_reason.as_deref().unwrap_or("none")
            )
        })
    })
}

/// Which OpenAI endpoint requests go to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`, the prompt as one user message.
    #[default]
    Chat,
    /// `/v1/completions`, the prompt as text.
    Completions,
}

impl Endpoint {
    pub fn is_chat(&self) -> bool {
        *self == Endpoint::Chat
    }
}

/// The sampling settings sent with every request, by their OpenAI (and vLLM) names; Ollama gets
/// them in `options` under its own. Unset ones are not sent (the server's default applies),
/// except the temperature, sent as 0 unless set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// vLLM's: -1 (or 0) keeps every id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// Texts that end an answer (OpenAI's `stop`, Ollama's `options.stop`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Fields merged into every request body as they are, for whatever else a server takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_body: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Body fields the client sets itself, which `extra_body` may not replace, with the flag to use.
pub const CLIENT_FIELDS: [(&str, &str); 14] = [
    ("model", "--model-name"),
    ("messages", "--prompts"),
    ("prompt", "--prompts"),
    ("stream", "(the client always streams)"),
    ("stream_options", "--continuous-usage"),
    ("max_tokens", "--max-tokens"),
    ("max_completion_tokens", "--max-tokens"),
    ("options", "the sampling flags"),
    ("seed", "--seed"),
    ("temperature", "--temperature"),
    ("top_p", "--top-p"),
    ("top_k", "--top-k"),
    ("min_p", "--min-p"),
    ("stop", "--stop"),
];

/// The most stop strings a request may carry (OpenAI's limit).
pub const MAX_STOPS: usize = 4;

impl Sampling {
    pub fn is_greedy_default(&self) -> bool {
        *self == Sampling::default()
    }

    /// One line per problem, naming the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        let number = |name: &str, v: Option<f64>, ok: fn(f64) -> bool, want: &str| match v {
            Some(v) if !(v.is_finite() && ok(v)) => {
                Err(Invalid::new(format!("sampling.{name}"), format!("{v}; {want}")))
            }
            _ => Ok(()),
        };
        number("temperature", self.temperature, |t| t >= 0.0, "must be 0 (greedy) or above")?;
        number("top_p", self.top_p, |p| p > 0.0 && p <= 1.0, "must be above 0 and at most 1")?;
        number("min_p", self.min_p, |p| (0.0..=1.0).contains(&p), "must be from 0 to 1")?;
        if let Some(k) = self.top_k.filter(|k| *k < -1) {
            return Err(Invalid::new("sampling.top_k", format!("{k}; must be -1 (every id) or more")));
        }
        if self.stop.len() > MAX_STOPS {
            return Err(Invalid::new(
                "sampling.stop",
                format!("{} strings; give at most {MAX_STOPS}", self.stop.len()),
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(Invalid::new("sampling.stop", "an empty string; a stop string needs a character"));
        }
        if let Some((field, flag)) =
            self.extra_body.iter().flat_map(|body| body.keys()).find_map(|k| CLIENT_FIELDS.iter().find(|(f, _)| f == k))
        {
            return Err(Invalid::new(
                format!("sampling.extra_body.{field}"),
                format!("the client sets `{field}` itself; use {flag}"),
            ));
        }
        Ok(())
    }
}
