//! The HTTP handlers: read and check a request, tokenize it, queue it for the engine, and relay
//! the engine's events in the API's own format (server-sent events for OpenAI, newline-delimited
//! JSON for Ollama), one chunk per event as it comes.
// Handlers return `Result<_, Response>` so that every rejection is a finished HTTP answer; the
// size of axum's Response is the price of that and is paid only on the error path.
#![allow(clippy::result_large_err)]

use super::engine::{Event, Finished, Job, Logprob};
use super::request::{self, Endpoint, GenerationRequest, Input, Rejection};
use super::AppState;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::qwen::KvPool;
use common::session::FinishReason;
use common::template::Message;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

pub(super) fn router(state: Arc<AppState>) -> Router {
    let openai_at = |endpoint| move |state, headers, body| openai(state, headers, body, endpoint);
    let ollama_at = |endpoint| move |state, headers, body| ollama(state, headers, body, endpoint);
    Router::new()
        .route("/v1/chat/completions", post(openai_at(Endpoint::OpenAiChat)))
        .route("/v1/completions", post(openai_at(Endpoint::OpenAiCompletions)))
        .route("/v1/models", get(openai_models))
        .route("/version", get(version))
        .route("/api/chat", post(ollama_at(Endpoint::OllamaChat)))
        .route("/api/generate", post(ollama_at(Endpoint::OllamaGenerate)))
        .route("/api/version", get(version))
        .route("/api/tags", get(ollama_tags))
        .route("/api/show", post(ollama_show))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// A rejection as the API in use writes it: OpenAI's error object with a type by status, or
/// Ollama's `{"error": ...}`. A 503 says when to retry.
fn error(openai: bool, status: u16, param: &str, message: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = match status.as_u16() {
        503 => "overloaded_error",
        500..=599 => "server_error",
        404 => "not_found_error",
        _ => "invalid_request_error",
    };
    let body = if openai {
        json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}})
    } else {
        json!({"error": message, "param": param})
    };
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn reject(endpoint: Endpoint, r: Rejection) -> Response {
    error(endpoint.is_openai(), r.status, &r.param, r.message)
}

/// A request the engine can take: tokenized, its cap fitted to the context.
struct Prepared {
    request: GenerationRequest,
    prompt_ids: Vec<u32>,
    max_tokens: usize,
}

/// Everything before the answer starts: body, checks, tokens, queue.
async fn accept(
    state: &AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Prepared, mpsc::UnboundedReceiver<Event>), Response> {
    let limit = state.config.max_body_bytes;
    let read = tokio::time::timeout(state.config.header_timeout, axum::body::to_bytes(body, limit)).await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let message = format!("request body rejected ({e}); the limit is {limit} bytes");
            return Err(reject(endpoint, Rejection::bad("body", message)));
        }
        Err(_) => {
            let message = format!("the body did not arrive within {:?}", state.config.header_timeout);
            return Err(reject(endpoint, Rejection { status: 408, param: "body".into(), message }));
        }
    };
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("(not text)"));
    let request = request::parse(endpoint, content_type, &bytes).map_err(|r| reject(endpoint, r))?;
    if request.model != state.config.model_name {
        let message = format!("model `{}` not found; this server serves `{}`", request.model, state.config.model_name);
        return Err(reject(endpoint, Rejection { status: 404, param: "model".into(), message }));
    }
    let prepared = prepare(state, endpoint, request).map_err(|r| reject(endpoint, r))?;
    let rx = submit(state, &prepared).map_err(|r| reject(endpoint, r))?;
    Ok((prepared, rx))
}

/// Renders and tokenizes the input, and fits the cap: the prompt plus the cap must fit the
/// context, checked without overflow whatever the client sent.
fn prepare(state: &AppState, endpoint: Endpoint, request: GenerationRequest) -> Result<Prepared, Rejection> {
    let model = &state.model;
    let tokenize = |field: &str, text: &str| {
        model
            .tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Rejection::bad(field, format!("does not tokenize: {e}")))
    };
    let (field, prompt_ids) = match &request.input {
        Input::Messages(turns) => {
            // Special tokens only where the template puts them: a message that spells
            // `<|im_end|>` cannot open a turn of its own.
            let turns: Vec<Message> = turns.iter().map(|t| Message { role: &t.role, content: &t.content }).collect();
            let (_, ids) = model.encode_chat(&turns, true).map_err(|e| Rejection::bad("messages", e.to_string()))?;
            ("messages", ids)
        }
        Input::Text(text) => ("prompt", tokenize("prompt", text)?),
        Input::Tokens(ids) => {
            let vocab = model.config.vocab_size;
            if let Some(i) = ids.iter().position(|&id| id as usize >= vocab) {
                let message = format!("token id {} is not in the model's vocabulary of {vocab}", ids[i]);
                return Err(Rejection::bad(format!("prompt[{i}]"), message));
            }
            ("prompt", ids.clone())
        }
    };
    if prompt_ids.is_empty() {
        return Err(Rejection::bad(field, "the prompt is empty after tokenizing; give some text"));
    }
    let context = model.config.max_position_embeddings;
    let room = context.saturating_sub(prompt_ids.len());
    if room == 0 {
        let message = format!("the prompt is {} tokens, the context {context}: shorten it", prompt_ids.len());
        return Err(Rejection::bad(field, message));
    }
    let max_tokens = match request.max_tokens {
        Some(cap) if cap > room as u64 => {
            let cap_field = request.max_tokens_field;
            let message = format!(
                "prompt of {} tokens plus {cap_field} {cap} exceeds the context of {context} tokens; at most {room} fit",
                prompt_ids.len()
            );
            return Err(Rejection::bad(cap_field, message));
        }
        Some(cap) => cap as usize,
        // OpenAI's completions default to 16 new tokens; the others get a bounded default
        // rather than the whole context, for which the KV cache would be allocated up front.
        None if endpoint == Endpoint::OpenAiCompletions => 16.min(room),
        None => DEFAULT_MAX_TOKENS.min(room),
    };
    // The whole request must fit the KV budget, or it could never finish.
    let needed = KvPool::blocks_for(prompt_ids.len() + max_tokens);
    if needed > state.kv.blocks() {
        let (field, budget) = (request.max_tokens_field, state.kv.positions());
        let message = format!(
            "prompt of {} tokens plus {field} {max_tokens} needs {} positions of KV cache, more than the server's budget of {budget}; lower {field} or raise the server's --kv-budget",
            prompt_ids.len(),
            needed * KvPool::BLOCK_POSITIONS
        );
        return Err(Rejection::bad(field, message));
    }
    Ok(Prepared { request, prompt_ids, max_tokens })
}

/// The cap on new tokens when a request sets none.
const DEFAULT_MAX_TOKENS: usize = 128;

/// Queues the request; a full queue is a 503 at once, and so is a dead engine.
fn submit(state: &AppState, prepared: &Prepared) -> Result<mpsc::UnboundedReceiver<Event>, Rejection> {
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt_ids: prepared.prompt_ids.clone(),
        max_tokens: prepared.max_tokens,
        ignore_eos: prepared.request.ignore_eos,
        sampling: prepared.request.sampling,
        stop: prepared.request.stop.clone(),
        logprobs: prepared.request.logprobs,
        tx,
        received: Instant::now(),
    };
    state.engine.queued.fetch_add(1, Ordering::SeqCst);
    match state.jobs.try_send(job) {
        Ok(()) => Ok(rx),
        Err(e) => {
            state.engine.queued.fetch_sub(1, Ordering::SeqCst);
            let message = match e {
                mpsc::error::TrySendError::Full(_) => {
                    state.engine.rejected.fetch_add(1, Ordering::SeqCst);
                    "the request queue is full; retry later".to_string()
                }
                mpsc::error::TrySendError::Closed(_) => "the engine has stopped; see the server's log".to_string(),
            };
            Err(Rejection { status: 503, param: String::new(), message })
        }
    }
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A fresh id for a response: unique within the process.
fn response_id(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!("{prefix}-{:x}{:06x}", now_secs(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Why a whole (not streamed) answer has no text to send.
#[derive(Debug, thiserror::Error)]
enum Unanswered {
    /// The engine's own message.
    #[error("{0}")]
    Engine(String),
    #[error("the engine stopped before the answer ended")]
    Stopped,
}

/// Waits for the whole answer: its text, its tokens' log-probabilities (when asked) and how it
/// ended.
async fn collect(rx: &mut mpsc::UnboundedReceiver<Event>) -> Result<(String, Vec<Logprob>, Finished), Unanswered> {
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text { text: t, logprobs: l, .. } => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            Event::Error(e) => return Err(Unanswered::Engine(e)),
            Event::Done(d) => return Ok((text, logprobs, d)),
        }
    }
    Err(Unanswered::Stopped)
}

/// Log-probabilities as OpenAI's chat completions give them (`choices[].logprobs`), or `null`
/// when not asked.
fn chat_logprobs(asked: bool, logprobs: &[Logprob]) -> Value {
    let entry = |token: &str, logprob: f64| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let content: Vec<Value> = logprobs
        .iter()
        .map(|l| {
            let mut e = entry(&l.token, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|(t, lp)| entry(t, *lp)).collect();
            e
        })
        .collect();
    if asked {
        json!({"content": content})
    } else {
        Value::Null
    }
}

/// Log-probabilities as OpenAI's (legacy) completions give them, `offset` being the characters
/// of the answer before these tokens; `null` when not asked.
fn completion_logprobs(asked: bool, logprobs: &[Logprob], offset: usize) -> Value {
    if !asked {
        return Value::Null;
    }
    let mut offsets = Vec::with_capacity(logprobs.len());
    let mut at = offset;
    for l in logprobs {
        offsets.push(at);
        at += l.token.chars().count();
    }
    json!({
        "tokens": logprobs.iter().map(|l| &l.token).collect::<Vec<_>>(),
        "token_logprobs": logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": logprobs.iter().map(|l| l.top.iter().map(|(t, lp)| (t.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// A streaming body: one chunk per engine event, written as it arrives. Dropping the body (the
/// client left) closes the channel, which tells the engine to drop the session.
fn stream_body(
    rx: mpsc::UnboundedReceiver<Event>,
    first: Option<Bytes>,
    mut render: impl FnMut(Event) -> Vec<Bytes> + Send + 'static,
) -> Body {
    let events = futures_util::stream::unfold((rx, false), |(mut rx, ended)| async move {
        if ended {
            return None;
        }
        let event = rx.recv().await?;
        let last = matches!(event, Event::Done(_) | Event::Error(_));
        Some((event, (rx, last)))
    });
    let head = futures_util::stream::iter(first.into_iter().map(Ok::<_, std::convert::Infallible>));
    let chunks = events.flat_map(move |e| futures_util::stream::iter(render(e).into_iter().map(Ok)));
    Body::from_stream(head.chain(chunks))
}

fn streaming(content_type: &'static str, body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The final counts, with OpenAI's `prompt_tokens_details.cached_tokens`: prompt tokens the
/// prefix cache held.
fn usage(d: &Finished) -> Value {
    let mut usage = usage_counts(d.prompt_tokens, d.output_ids.len());
    usage["prompt_tokens_details"] = json!({"cached_tokens": d.cached_tokens});
    usage
}

fn usage_counts(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt.saturating_add(completion)})
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// An error inside an OpenAI stream, as vLLM writes it: a data event with an error object.
fn sse_error(message: &str) -> Bytes {
    sse(&json!({"error": {"message": message, "type": "server_error", "code": 500}}))
}

async fn openai(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body, endpoint: Endpoint) -> Response {
    let (prepared, mut rx) = match accept(&state, endpoint, &headers, body).await {
        Ok(accepted) => accepted,
        Err(e) => return e,
    };
    let chat = endpoint == Endpoint::OpenAiChat;
    let (id, object) =
        if chat { (response_id("chatcmpl"), "chat.completion") } else { (response_id("cmpl"), "text_completion") };
    let model = state.config.model_name.clone();
    let created = now_secs();
    let asked = prepared.request.logprobs.is_some();
    if !prepared.request.stream {
        return match collect(&mut rx).await {
            Err(e) => error(true, 500, "", e.to_string()),
            Ok((text, logprobs, d)) => {
                let choice = if chat {
                    json!({"index": 0, "message": {"role": "assistant", "content": text},
                           "logprobs": chat_logprobs(asked, &logprobs), "finish_reason": finish_reason(d.reason)})
                } else {
                    json!({"index": 0, "text": text, "logprobs": completion_logprobs(asked, &logprobs, 0),
                           "finish_reason": finish_reason(d.reason)})
                };
                Json(json!({"id": id, "object": object, "created": created, "model": model,
                            "choices": [choice], "usage": usage(&d)}))
                .into_response()
            }
        };
    }
    let object = if chat { "chat.completion.chunk" } else { "text_completion" };
    let include_usage = prepared.request.include_usage;
    // vLLM's continuous usage: every chunk carries the counts so far, so a client can tell how
    // many tokens each chunk holds (its inter-token latency per token).
    let continuous = prepared.request.continuous_usage.then_some(prepared.prompt_ids.len());
    let chunk = move |text: Option<&str>, finish: Option<&str>| {
        let choice = match (chat, text) {
            (true, Some(t)) => json!({"index": 0, "delta": {"content": t}, "finish_reason": finish}),
            (true, None) => json!({"index": 0, "delta": {}, "finish_reason": finish}),
            (false, t) => json!({"index": 0, "text": t.unwrap_or(""), "logprobs": null, "finish_reason": finish}),
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    };
    // Chat streams open with the assistant's role, as OpenAI's do.
    let first = chat.then(|| {
        let mut v = chunk(None, None);
        v["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
        sse(&v)
    });
    // Characters sent so far, for completions' text offsets.
    let mut sent_chars = 0;
    let body = stream_body(rx, first, move |event| match event {
        Event::Text { text, tokens, logprobs } => {
            let mut v = chunk(Some(&text), None);
            if asked {
                v["choices"][0]["logprobs"] = if chat {
                    chat_logprobs(true, &logprobs)
                } else {
                    completion_logprobs(true, &logprobs, sent_chars)
                };
            }
            sent_chars += text.chars().count();
            if let Some(prompt) = continuous {
                v["usage"] = usage_counts(prompt, tokens);
            }
            vec![sse(&v)]
        }
        Event::Done(d) => {
            let mut last = chunk(None, Some(finish_reason(d.reason)));
            if continuous.is_some() {
                last["usage"] = usage(&d);
            }
            let mut out = vec![sse(&last)];
            if include_usage {
                let mut v = chunk(None, None);
                v["choices"] = json!([]);
                v["usage"] = usage(&d);
                out.push(sse(&v));
            }
            out.push(Bytes::from_static(b"data: [DONE]\n\n"));
            out
        }
        Event::Error(e) => vec![sse_error(&e)],
    });
    streaming("text/event-stream", body)
}

async fn ollama(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body, endpoint: Endpoint) -> Response {
    let (prepared, mut rx) = match accept(&state, endpoint, &headers, body).await {
        Ok(accepted) => accepted,
        Err(e) => return e,
    };
    let chat = endpoint == Endpoint::OllamaChat;
    let model = state.config.model_name.clone();
    let prompt_ids = prepared.prompt_ids;
    let line = move |text: &str, done: Option<&Finished>| {
        let created_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let mut v = if chat {
            json!({"model": model, "created_at": created_at, "message": {"role": "assistant", "content": text}, "done": done.is_some()})
        } else {
            json!({"model": model, "created_at": created_at, "response": text, "done": done.is_some()})
        };
        if let (Some(d), Some(o)) = (done, v.as_object_mut()) {
            let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            o.insert("done_reason".into(), json!(finish_reason(d.reason)));
            // Ollama's generate answers carry the conversation's token ids, prompt and answer.
            if !chat {
                o.insert("context".into(), json!(prompt_ids.iter().chain(&d.output_ids).collect::<Vec<_>>()));
            }
            o.insert("total_duration".into(), json!(nanos(d.total)));
            o.insert("load_duration".into(), json!(0));
            o.insert("prompt_eval_count".into(), json!(d.prompt_tokens));
            o.insert("prompt_eval_duration".into(), json!(nanos(d.prompt_eval)));
            o.insert("eval_count".into(), json!(d.output_ids.len()));
            o.insert("eval_duration".into(), json!(nanos(d.eval)));
        }
        Bytes::from(format!("{v}\n"))
    };
    if !prepared.request.stream {
        return match collect(&mut rx).await {
            Err(e) => error(false, 500, "", e.to_string()),
            Ok((text, _, d)) => ([(header::CONTENT_TYPE, "application/json")], line(&text, Some(&d))).into_response(),
        };
    }
    let body = stream_body(rx, None, move |event| match event {
        Event::Text { text, .. } => vec![line(&text, None)],
        Event::Done(d) => vec![line("", Some(&d))],
        Event::Error(e) => vec![Bytes::from(format!("{}\n", json!({"error": e})))],
    });
    streaming("application/x-ndjson", body)
}

async fn openai_models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": state.config.model_name, "object": "model", "created": state.started.timestamp(), "owned_by": "lab",
        "max_model_len": state.model.config.max_position_embeddings
    }]}))
}

async fn version() -> Json<Value> {
    Json(json!({"version": concat!("lab-embedded ", env!("CARGO_PKG_VERSION"))}))
}

fn quantization(state: &AppState) -> String {
    state.model.model.weight_dtype().name().to_uppercase()
}

/// Ollama's `details` of the served model.
fn details(state: &AppState) -> Value {
    let format = match state.model.format {
        common::load::Format::Gguf => "gguf",
        common::load::Format::Safetensors => "safetensors",
    };
    json!({"family": state.model.architecture.name(), "format": format, "quantization_level": quantization(state)})
}

async fn ollama_tags(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(
        json!({"models": [{"name": state.config.model_name, "model": state.config.model_name, "details": details(&state)}]}),
    )
}

/// A body for a route that is neither API's generation: checked, and held to the served model
/// when it names one.
fn body_of<T>(
    state: &AppState,
    body: &Bytes,
    parse: fn(&[u8]) -> Result<T, Rejection>,
    model: fn(&T) -> Option<&String>,
) -> Result<T, Response> {
    let value = parse(body).map_err(|r| error(true, r.status, &r.param, r.message))?;
    match model(&value) {
        Some(name) if name != &state.config.model_name => Err(error(
            true,
            404,
            "model",
            format!("model `{name}` not found; this server serves `{}`", state.config.model_name),
        )),
        _ => Ok(value),
    }
}

/// The ids of a text, as llama-server's `/tokenize` writes them: `{"tokens": [id, ...]}`, or
/// with `with_pieces` each id with its piece (the text, or its bytes where they are not UTF-8).
async fn tokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let body = match body_of(&state, &body, request::parse_tokenize, |b| b.model.as_ref()) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let ids = match state.model.tokenize(&body.content, body.add_special, body.parse_special) {
        Ok(ids) => ids,
        Err(e) => return error(true, 400, "content", e.to_string()),
    };
    if !body.with_pieces {
        return Json(json!({"tokens": ids})).into_response();
    }
    let pieces: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = state.model.token_bytes(id).unwrap_or_default();
            let piece = match String::from_utf8(bytes) {
                Ok(text) => json!(text),
                Err(e) => json!(e.into_bytes()),
            };
            json!({"id": id, "piece": piece})
        })
        .collect();
    Json(json!({"tokens": pieces})).into_response()
}

/// The text of ids, special tokens written out: `{"content": ...}`.
async fn detokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let body = match body_of(&state, &body, request::parse_detokenize, |b| b.model.as_ref()) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let vocab = state.model.config.vocab_size;
    if let Some(i) = body.tokens.iter().position(|&id| id as usize >= vocab) {
        let message = format!("token id {} is not in the model's vocabulary of {vocab}", body.tokens[i]);
        return error(true, 400, &format!("tokens[{i}]"), message);
    }
    let mut bytes = Vec::new();
    for &id in &body.tokens {
        bytes.extend(state.model.token_bytes(id).unwrap_or_default());
    }
    Json(json!({"content": String::from_utf8_lossy(&bytes)})).into_response()
}

async fn ollama_show(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let name = value.get("model").or_else(|| value.get("name")).and_then(Value::as_str);
    match name {
        None => return error(false, 400, "model", "`model` must name the served model".into()),
        Some(name) if name != state.config.model_name => {
            return error(false, 404, "model", format!("model '{name}' not found"));
        }
        Some(_) => {}
    }
    let c = &state.model.config;
    let arch = state.model.architecture.name();
    Json(json!({
        "details": details(&state),
        "model_info": {
            "general.architecture": arch,
            format!("{arch}.context_length"): c.max_position_embeddings,
            format!("{arch}.embedding_length"): c.hidden_size,
            format!("{arch}.block_count"): c.num_hidden_layers,
            format!("{arch}.attention.head_count"): c.num_attention_heads,
            format!("{arch}.attention.head_count_kv"): c.num_key_value_heads,
            format!("{arch}.vocab_size"): c.vocab_size
        }
    }))
    .into_response()
}

/// The prefix cache's counts as `/health` reports them; `enabled` false with `--no-prefix-cache`.
fn prefix_cache(kv: &common::qwen::KvPool) -> serde_json::Value {
    let mut counts = serde_json::to_value(kv.prefix_stats()).unwrap_or_default();
    counts["enabled"] = json!(kv.reuses_prefixes());
    counts
}

/// The Prometheus exposition ([`super::metrics`]).
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let (content_type, text) = state.metrics.render();
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

/// The engine's real state: 200 while its thread runs, 503 once it has ended.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let e = &state.engine;
    let c = &state.connections;
    let alive = e.alive.load(Ordering::SeqCst);
    let last_error = e.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let body = json!({
        "status": if alive { "ok" } else { "down" },
        "engine": {
            "alive": alive, "policy": state.config.engine.policy.name(),
            "max_active": state.config.engine.max_active, "chunk_size": state.config.engine.chunk_size, "steps": e.steps.load(Ordering::SeqCst), "last_error": last_error,
        },
        "active": e.active.load(Ordering::SeqCst), "queued": e.queued.load(Ordering::SeqCst),
        "waiting_for_blocks": e.waiting_for_blocks.load(Ordering::SeqCst),
        "completed": e.completed.load(Ordering::SeqCst), "cancelled": e.cancelled.load(Ordering::SeqCst),
        "rejected": e.rejected.load(Ordering::SeqCst), "failed": e.failed.load(Ordering::SeqCst),
        "kv": {
            "blocks": state.kv.blocks(), "used": state.kv.used_blocks(), "block_positions": KvPool::BLOCK_POSITIONS,
            "block_bytes": state.kv.block_bytes(), "budget_bytes": state.kv.blocks() * state.kv.block_bytes(),
            "peak_bytes": state.kv.peak_bytes(), "preemptions": e.preemptions.load(Ordering::SeqCst),
        },
        "prefix_cache": prefix_cache(&state.kv),
        "connections": {
            "open": c.open.load(Ordering::SeqCst), "max": c.max.load(Ordering::SeqCst),
            "refused": c.refused.load(Ordering::SeqCst), "timed_out": c.timed_out.load(Ordering::SeqCst),
        },
    });
    let status = if alive { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}
