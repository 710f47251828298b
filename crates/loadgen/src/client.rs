//! The measuring client: sends streaming chat requests, timestamps every stage on a monotonic
//! clock, parses the stream strictly, and classifies every failure. A failure is a record, never
//! a panic or a lost run.

use crate::record::Endpoint;
use crate::record::ErrorClass;
use crate::record::Kind;
use crate::record::RequestRecord;
use crate::record::Runtime;
use crate::stream::{Event, NdjsonParser, SseParser};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

mod headers;
mod metadata;

pub use headers::{recorded_header, request_headers, HeaderError};
use metadata::fetch_json;
pub use metadata::{discover_model, metadata, FetchError};

/// `url` (or any text holding URLs) with every URL's credentials redacted, for printing.
pub fn redacted(url: &str) -> String {
    records::artifact::redact_url_credentials(url)
}

/// A transport error on one line, saying which kind it is: a certificate the client does not
/// trust (and that `--insecure` exists), a refused connection, an unreachable host, a name that
/// does not resolve, a timeout. Its URL is left out (the caller names the target, redacted);
/// the causes follow in brackets.
pub fn describe(e: &reqwest::Error) -> String {
    let chain = first_line(e);
    let mut kind = None;
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            kind = match io.kind() {
                ConnectionRefused => Some("connection refused: nothing listens at that address and port"),
                HostUnreachable | NetworkUnreachable => Some("unreachable: no route to that host"),
                ConnectionReset | ConnectionAborted => Some("the connection was reset by the other side"),
                TimedOut => Some("timed out"),
                _ => kind,
            };
        }
        source = cause.source();
    }
    let lower = chain.to_ascii_lowercase();
    let kind = if lower.contains("certificate") {
        "TLS: the server's certificate is not trusted; pass --insecure to skip verification, or add its issuer to the system's roots"
    } else if lower.contains("dns error") || lower.contains("failed to lookup address") {
        "the host name does not resolve"
    } else if let Some(kind) = kind {
        kind
    } else if e.is_timeout() {
        "timed out"
    } else if e.is_builder() {
        "not a URL this client can use"
    } else {
        return chain;
    };
    format!("{kind} ({chain})")
}

/// Checks a target's URL before anything is sent: it parses, with an http or https scheme and a
/// host (a port out of range, a space or a missing host is named here, not by a transport error).
pub fn check_url(url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url) {
        Err(e) => Err(format!("not a valid URL: {e}")),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => Err("the URL must start with http:// or https://".into()),
        Ok(u) if !u.has_host() => Err("the URL has no host".into()),
        Ok(_) => Ok(()),
    }
}

/// `URL@group` as the URL and the group; a URL alone (credentials' `@` included) has none. A
/// group is a name of letters, digits, `-` and `_` after the last `@`, where what precedes it is
/// a URL with a host (so `http://user:pw@host:8000` has no group, and `http://host:8000@prod` is
/// in `prod`; a URL with credentials and a bare host name is read as a group: give it a port).
pub fn split_group(url: &str) -> (&str, Option<&str>) {
    match url.rsplit_once('@') {
        Some((u, g))
            if !g.is_empty()
                && g != "localhost"
                && g.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && reqwest::Url::parse(u).is_ok_and(|u| u.has_host()) =>
        {
            (u, Some(g))
        }
        _ => (url, None),
    }
}

/// How each request to a target is made, beyond its prompt.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// OpenAI's chat or text completions (Ollama's chat either way).
    pub endpoint: Endpoint,
    /// Ask the server to ignore end-of-sequence so answers reach `max_tokens` (vLLM's
    /// `ignore_eos`, which the embedded server takes too; Ollama has none).
    pub ignore_eos: bool,
    /// Ask for usage counts with every chunk (vLLM's `continuous_usage_stats`).
    pub continuous_usage: bool,
    /// The sampling every request asks for, and fields merged into every body.
    pub sampling: std::sync::Arc<crate::record::Sampling>,
    /// Keep each answer's text in its record (`check_agreement`, or stop strings to check).
    pub keep_text: bool,
}

/// How long a request may take at each stage before it is given up as timed out.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub first_token: Duration,
    pub idle: Duration,
    pub total: Duration,
}

/// What one request is.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub concurrency: usize,
    pub round: usize,
    pub index: usize,
    pub prompt_name: &'a str,
    pub prompt: &'a str,
    /// A whole conversation for chat endpoints, in place of `prompt` as one user message.
    pub messages: Option<&'a Value>,
    pub max_tokens: usize,
    pub seed: u64,
    pub options: RequestOptions,
}

/// The client every request of a run goes through: `headers` on every request (metadata and
/// discovery included), TLS against the system's roots unless `insecure`.
pub fn http_client(timeouts: &Timeouts, headers: reqwest::header::HeaderMap, insecure: bool) -> Http {
    let builder = || {
        reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .default_headers(headers.clone())
            .danger_accept_invalid_certs(insecure)
    };
    // Only a TLS backend that cannot start fails to build, and ours is compiled in.
    let built = "an HTTP client with rustls builds";
    Http {
        pooled: builder().pool_max_idle_per_host(1024).build().expect(built),
        fresh: builder().pool_max_idle_per_host(0).build().expect(built),
    }
}

/// A run's HTTP client: kept-alive connections, as every client of a server uses them, and
/// beside them one that never reuses a connection, for what is sent again after a server closed
/// a kept-alive connection under it (another idle connection of the pool may be closing too).
#[derive(Clone)]
pub struct Http {
    pooled: reqwest::Client,
    fresh: reqwest::Client,
}

impl Http {
    /// The client for a sending: kept-alive connections for the first, a new connection for
    /// one sent again.
    pub fn sending(&self, again: bool) -> &reqwest::Client {
        if again {
            &self.fresh
        } else {
            &self.pooled
        }
    }
}

impl std::ops::Deref for Http {
    type Target = reqwest::Client;
    fn deref(&self) -> &reqwest::Client {
        &self.pooled
    }
}

fn url(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

fn request_body(target: &Runtime, spec: &Spec<'_>) -> (String, Value) {
    let (url, mut body) = base_body(target, spec);
    if let (Some(extra), Some(body)) = (&spec.options.sampling.extra_body, body.as_object_mut()) {
        body.extend(extra.clone());
    }
    (url, body)
}

/// The sampling settings set, by their OpenAI names (Ollama's where they differ), with the
/// temperature always (0 unless set).
fn sampling_fields(sampling: &crate::record::Sampling) -> serde_json::Map<String, Value> {
    let mut fields = serde_json::Map::new();
    fields.insert("temperature".into(), json!(sampling.temperature.unwrap_or(0.0)));
    let set = [
        ("top_p", sampling.top_p.map(|v| json!(v))),
        ("top_k", sampling.top_k.map(|v| json!(v))),
        ("min_p", sampling.min_p.map(|v| json!(v))),
        ("stop", (!sampling.stop.is_empty()).then(|| json!(sampling.stop))),
    ];
    fields.extend(set.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?))));
    fields
}

fn base_body(target: &Runtime, spec: &Spec<'_>) -> (String, Value) {
    let messages = spec.messages.cloned().unwrap_or_else(|| json!([{"role": "user", "content": spec.prompt}]));
    let (_, base) = target.replica(spec.index);
    let sampling = sampling_fields(&spec.options.sampling);
    match target.kind {
        Kind::OpenAi => {
            let mut body = json!({"model": target.model, "max_tokens": spec.max_tokens, "stream": true,
                   "stream_options": {"include_usage": true}, "seed": spec.seed});
            body.as_object_mut().expect("an object").extend(sampling);
            if spec.options.ignore_eos {
                body["ignore_eos"] = json!(true);
            }
            if spec.options.continuous_usage {
                body["stream_options"]["continuous_usage_stats"] = json!(true);
            }
            let path = match spec.options.endpoint {
                Endpoint::Chat => {
                    body["messages"] = messages;
                    "/v1/chat/completions"
                }
                Endpoint::Completions => {
                    body["prompt"] = json!(spec.prompt);
                    "/v1/completions"
                }
            };
            (url(base, path), body)
        }
        Kind::Ollama => {
            let mut options = json!({"num_predict": spec.max_tokens, "seed": spec.seed});
            options.as_object_mut().expect("an object").extend(sampling);
            (
                url(base, "/api/chat"),
                json!({"model": target.model, "messages": messages, "stream": true, "options": options}),
            )
        }
    }
}

/// Sends one streaming request and records it. `t0` is the run's clock origin; `scheduled`, when
/// the load's schedule wanted it sent (`None`: now), from which its latencies count.
pub async fn measure(
    client: &Http,
    target: &Runtime,
    spec: &Spec<'_>,
    timeouts: &Timeouts,
    t0: Instant,
    scheduled: Option<Instant>,
) -> RequestRecord {
    measure_reply(client, target, spec, timeouts, t0, scheduled).await.0
}

/// A conversation, turn by turn: its first turn as `spec` gives it, then each of `follow_ups` as
/// the next user message after the history so far with the server's actual replies (as a chat
/// user's client sends it). Each turn is a record, numbered in `turn`; a failed turn ends the
/// conversation, as there is no reply to continue from.
pub async fn converse(
    client: &Http,
    target: &Runtime,
    spec: &Spec<'_>,
    follow_ups: &[String],
    timeouts: &Timeouts,
    t0: Instant,
) -> Vec<RequestRecord> {
    let mut history = match spec.messages {
        Some(m) => m.as_array().cloned().unwrap_or_default(),
        None => vec![json!({"role": "user", "content": spec.prompt})],
    };
    let mut records = Vec::with_capacity(follow_ups.len() + 1);
    for turn in 0..=follow_ups.len() {
        let messages = Value::Array(history.clone());
        let (mut record, reply) =
            measure_reply(client, target, &Spec { messages: Some(&messages), ..spec.clone() }, timeouts, t0, None)
                .await;
        record.turn = Some(turn);
        let failed = record.error.is_some();
        records.push(record);
        match follow_ups.get(turn) {
            Some(next) if !failed => {
                history.push(json!({"role": "assistant", "content": reply}));
                history.push(json!({"role": "user", "content": next}));
            }
            _ => break,
        }
    }
    records
}

/// [`measure`], and the text the server generated.
async fn measure_reply(
    client: &Http,
    target: &Runtime,
    spec: &Spec<'_>,
    timeouts: &Timeouts,
    t0: Instant,
    scheduled: Option<Instant>,
) -> (RequestRecord, String) {
    let secs = |at: Instant| at.duration_since(t0).as_secs_f64();
    let start = Instant::now();
    let mut rec = RequestRecord {
        runtime: target.name.clone(),
        concurrency: spec.concurrency,
        round: spec.round,
        index: spec.index,
        prompt: spec.prompt_name.to_string(),
        scheduled_s: secs(scheduled.unwrap_or(start).min(start)),
        sent_s: None,
        sent_cpu: None,
        first_byte_s: None,
        first_token_s: None,
        end_s: 0.0,
        status: None,
        error: None,
        error_detail: None,
        finish_reason: None,
        usage_completion_tokens: None,
        usage_prompt_tokens: None,
        ollama_eval_count: None,
        ollama_eval_duration_ns: None,
        ollama_prompt_eval_count: None,
        ollama_prompt_eval_duration_ns: None,
        chunks: 0,
        chunk_gaps_s: Vec::new(),
        arrival: None,
        chunk_tokens: Vec::new(),
        replica: target.replica(spec.index).0,
        max_tokens: Some(spec.max_tokens as u64),
        turn: None,
        resent: false,
        text_sha256: None,
        text: None,
        inconsistency: None,
    };
    let mut reply = String::new();
    let outcome = stream_into(client, target, spec, timeouts, start, t0, &mut rec, &mut reply).await;
    // A count that contradicts the request is no success: it would enter throughput.
    let outcome = outcome.and_then(|()| match crate::record::usage_contradiction(&rec) {
        Some(problem) => Err((ErrorClass::InconsistentUsage, problem)),
        None => Ok(()),
    });
    if let Err((class, detail)) = outcome {
        rec.error = Some(class);
        rec.error_detail = Some(detail);
    }
    rec.end_s = secs(Instant::now());
    if !reply.is_empty() {
        rec.text_sha256 = Some(supply::digest::bytes_digest(reply.as_bytes(), supply::digest::Algorithm::Sha256));
        rec.inconsistency = crate::record::output_inconsistency(&rec, Some(&reply), &spec.options.sampling.stop);
        if spec.options.keep_text {
            rec.text = Some(reply.clone());
        }
    }
    (rec, reply)
}

#[allow(clippy::too_many_arguments)] // one request's whole context, at its one caller
async fn stream_into(
    client: &Http,
    target: &Runtime,
    spec: &Spec<'_>,
    timeouts: &Timeouts,
    start: Instant,
    t0: Instant,
    rec: &mut RequestRecord,
    reply: &mut String,
) -> Result<(), (ErrorClass, String)> {
    let secs = |at: Instant| at.duration_since(t0).as_secs_f64();
    let total_deadline = start + timeouts.total;
    let first_deadline = start + timeouts.first_token;
    let (endpoint, body) = request_body(target, spec);
    rec.sent_s = Some(secs(Instant::now()));
    rec.sent_cpu = crate::os::current_cpu();
    let response = loop {
        let send = client.sending(rec.resent).post(&endpoint).json(&body).send();
        match tokio::time::timeout_at(first_deadline.min(total_deadline).into(), send).await {
            Err(_) => return Err(timeout_class(start, timeouts, false, "no response headers")),
            // The server closed the kept-alive connection as the request went out (a server
            // that caps a connection's requests, as llama-server's HTTP library does, races the
            // client's reuse): nothing was answered, so it is sent again, once, on a new
            // connection, and recorded.
            Ok(Err(e)) if !rec.resent && closed_before_an_answer(&e) => rec.resent = true,
            Ok(Err(e)) if e.is_connect() => return Err((ErrorClass::Connect, describe(&e))),
            Ok(Err(e)) => return Err((ErrorClass::TruncatedStream, format!("before a response: {}", describe(&e)))),
            Ok(Ok(r)) => break r,
        }
    };
    let status = response.status();
    rec.status = Some(status.as_u16());
    if !status.is_success() {
        let text =
            tokio::time::timeout(timeouts.idle, response.text()).await.ok().and_then(Result::ok).unwrap_or_default();
        return Err((ErrorClass::HttpStatus, format!("HTTP {}: {}", status.as_u16(), crate::one_line(&text, 200))));
    }
    let mut sse = SseParser::default();
    let mut ndjson = NdjsonParser::default();
    let mut events = Vec::new();
    let mut stream = response.bytes_stream();
    let mut last_text: Option<Instant> = None;
    let mut complete = false;
    loop {
        let now = Instant::now();
        let mut deadline = (now + timeouts.idle).min(total_deadline);
        if rec.first_token_s.is_none() {
            deadline = deadline.min(first_deadline);
        }
        let next = match tokio::time::timeout_at(deadline.into(), stream.next()).await {
            Err(_) => {
                return Err(timeout_class(start, timeouts, rec.first_token_s.is_some(), "waiting for the stream"))
            }
            Ok(n) => n,
        };
        let at = Instant::now();
        let ended = next.is_none();
        match next {
            None => match target.kind {
                Kind::OpenAi => sse.finish(&mut events),
                Kind::Ollama => ndjson.finish(&mut events),
            },
            Some(Err(e)) => return Err((ErrorClass::TruncatedStream, first_line(&e))),
            Some(Ok(bytes)) => {
                rec.first_byte_s.get_or_insert(secs(at));
                match target.kind {
                    Kind::OpenAi => sse.feed(&bytes, &mut events),
                    Kind::Ollama => ndjson.feed(&bytes, &mut events),
                }
            }
        }
        for event in events.drain(..) {
            match event {
                Event::Text(text) => {
                    reply.push_str(&text);
                    if rec.first_token_s.is_none() {
                        rec.first_token_s = Some(secs(at));
                    }
                    if let Some(prev) = last_text {
                        rec.chunk_gaps_s.push(at.duration_since(prev).as_secs_f64());
                    }
                    last_text = Some(at);
                    rec.chunks += 1;
                }
                Event::NoText => {}
                Event::Usage { prompt, completion } => {
                    // A running count right after a chunk with text: that chunk's tokens.
                    if let (Some(now), true) = (completion, rec.chunk_tokens.len() as u64 + 1 == rec.chunks) {
                        let before: u64 = rec.chunk_tokens.iter().sum();
                        rec.chunk_tokens.push(now.saturating_sub(before));
                    }
                    rec.usage_prompt_tokens = prompt;
                    rec.usage_completion_tokens = completion;
                }
                Event::Finish(reason) => {
                    rec.finish_reason = Some(reason);
                    complete = true;
                }
                Event::OllamaDone(c) => {
                    rec.finish_reason = c.done_reason;
                    rec.ollama_eval_count = c.eval_count;
                    rec.ollama_eval_duration_ns = c.eval_duration;
                    rec.ollama_prompt_eval_count = c.prompt_eval_count;
                    rec.ollama_prompt_eval_duration_ns = c.prompt_eval_duration;
                    complete = true;
                }
                Event::Done => complete = true,
                Event::Error(m) => return Err((ErrorClass::ErrorEvent, m)),
                Event::BadJson(m) => return Err((ErrorClass::BadJson, m)),
            }
        }
        if ended {
            break;
        }
    }
    if rec.chunk_tokens.len() as u64 != rec.chunks {
        rec.chunk_tokens.clear(); // not every chunk had its count: per chunk only
    }
    match (complete, rec.first_token_s) {
        (true, Some(_)) => Ok(()),
        (true, None) => Err((ErrorClass::EmptyStream, "the stream ended well but carried no generated text".into())),
        (false, _) => Err((ErrorClass::TruncatedStream, "the stream ended before its final event".into())),
    }
}

/// The answer to `spec` with [`crate::record::PROBE_CANDIDATES`] log-probabilities per token: the
/// request as measured, sent whole (not streamed), within the run's total timeout. OpenAI's chat
/// shape (`logprobs.content`, which llama-server gives on either endpoint) and its legacy
/// completions shape (`tokens`, `token_logprobs`, `top_logprobs`) are both read. `Err` says, on
/// one line, why none came.
pub async fn logprobs(
    client: &Http,
    target: &Runtime,
    spec: &Spec<'_>,
    timeouts: &Timeouts,
) -> Result<Vec<crate::record::TokenChoice>, String> {
    if target.kind == Kind::Ollama {
        return Err("Ollama's API gives this client no log-probabilities".into());
    }
    let (endpoint, mut body) = request_body(target, spec);
    let n = crate::record::PROBE_CANDIDATES;
    if let Some(fields) = body.as_object_mut() {
        fields.remove("stream_options");
        fields.insert("stream".into(), json!(false));
        match spec.options.endpoint {
            Endpoint::Chat => fields.extend([("logprobs".into(), json!(true)), ("top_logprobs".into(), json!(n))]),
            Endpoint::Completions => _ = fields.insert("logprobs".into(), json!(n)),
        }
    }
    let answer = fetch_json(client.post(&endpoint).json(&body), &endpoint, timeouts.total).await;
    let value = answer.map_err(|e| e.to_string())?;
    token_choices(value.pointer("/choices/0/logprobs").unwrap_or(&Value::Null))
        .ok_or_else(|| "the answer carries no log-probabilities in either of OpenAI's shapes".into())
}

/// A `logprobs` object's tokens, in either of OpenAI's shapes.
fn token_choices(logprobs: &Value) -> Option<Vec<crate::record::TokenChoice>> {
    let candidate = |token: &Value, logprob: &Value| {
        Some(crate::record::Candidate { token: token.as_str()?.to_string(), logprob: logprob.as_f64()? })
    };
    if let Some(content) = logprobs.get("content").and_then(Value::as_array) {
        return content
            .iter()
            .map(|t| {
                let top = t.get("top_logprobs")?.as_array()?;
                Some(crate::record::TokenChoice {
                    chosen: candidate(t.get("token")?, t.get("logprob")?)?,
                    top: top.iter().map(|c| candidate(c.get("token")?, c.get("logprob")?)).collect::<Option<_>>()?,
                })
            })
            .collect();
    }
    let tokens = logprobs.get("tokens")?.as_array()?;
    let chosen = logprobs.get("token_logprobs")?.as_array()?;
    let tops = logprobs.get("top_logprobs")?.as_array()?;
    if tokens.len() != chosen.len() || tokens.len() != tops.len() {
        return None;
    }
    tokens
        .iter()
        .zip(chosen)
        .zip(tops)
        .map(|((token, logprob), top)| {
            let mut top: Vec<crate::record::Candidate> =
                top.as_object()?.iter().map(|(t, l)| candidate(&json!(t), l)).collect::<Option<_>>()?;
            // A JSON object has no order: best first.
            top.sort_by(|a, b| b.logprob.total_cmp(&a.logprob));
            Some(crate::record::TokenChoice { chosen: candidate(token, logprob)?, top })
        })
        .collect()
}

/// Which timeout ran out, by the deadlines' order.
fn timeout_class(start: Instant, t: &Timeouts, had_token: bool, what: &str) -> (ErrorClass, String) {
    let elapsed = start.elapsed();
    if elapsed >= t.total {
        (ErrorClass::TotalTimeout, format!("{what}: total timeout of {:?}", t.total))
    } else if !had_token && elapsed >= t.first_token {
        (ErrorClass::FirstTokenTimeout, format!("{what}: no generated text within {:?}", t.first_token))
    } else {
        (ErrorClass::IdleTimeout, format!("{what}: nothing for {:?}", t.idle))
    }
}

/// Whether the connection closed before any byte of an answer came (hyper's "incomplete
/// message" while the request was being sent): the mark of a kept-alive connection the server
/// had just closed.
pub(crate) fn closed_before_an_answer(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_incomplete_message) {
            return true;
        }
        source = cause.source();
    }
    false
}

/// A reqwest error with its causes on one line (its own message leaves them out), without the
/// URL it names (which may carry credentials; callers name the target).
fn first_line(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(&format!(" for url ({url})"), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests;
