//! The embedded inference server: OpenAI-compatible (`/v1/chat/completions`, `/v1/models`,
//! `/version`) and Ollama-compatible (`/api/chat`, `/api/generate`, `/api/version`, `/api/show`,
//! `/api/tags`) over the project's engine, streaming token by token.
//!
//! One worker thread owns the computation: it admits queued requests up to `max_active`, steps
//! them in turn (the scheduler's `interleave` policy), and sends each request its tokens. The
//! queue in front of it is bounded; a full queue answers 503 with Retry-After at once. A client
//! that goes away closes its token channel, and the worker drops its session (and KV cache) at
//! the next step.
// Handlers return `Result<_, Response>` so that every rejection is a finished HTTP answer; the
// size of axum's Response is the price of that and is paid only on the error path.
#![allow(clippy::result_large_err)]

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::engine::{FinishReason, Session, StepKind};
use common::load::LoadedModel;
use common::policy::{Candidate, Policy};
use common::template::Message;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients must use for the model.
    pub model_name: String,
    /// Requests computed at once (their steps interleave).
    pub max_active: usize,
    /// Requests waiting beyond those; more get 503.
    pub queue: usize,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Prefill chunk size; `None`: whole prompt in one step.
    pub chunk_size: Option<usize>,
}

/// What the worker tells one request.
#[derive(Debug)]
enum Event {
    Text(String),
    Done(Finished),
    Error(String),
}

#[derive(Debug, Clone)]
struct Finished {
    reason: FinishReason,
    prompt_tokens: usize,
    completion_tokens: usize,
    prompt_eval: Duration,
    eval: Duration,
    total: Duration,
}

struct Job {
    prompt_ids: Vec<u32>,
    max_tokens: usize,
    tx: mpsc::UnboundedSender<Event>,
    received: Instant,
}

/// Live counters, served at `/health`.
#[derive(Debug, Default)]
pub struct Counters {
    pub active: AtomicUsize,
    pub queued: AtomicUsize,
    pub completed: AtomicUsize,
    pub cancelled: AtomicUsize,
    pub rejected: AtomicUsize,
}

struct AppState {
    model: Arc<LoadedModel>,
    config: ServerConfig,
    jobs: mpsc::Sender<Job>,
    counters: Arc<Counters>,
    started: chrono::DateTime<chrono::Utc>,
}

/// Builds the router and starts the worker thread. The worker ends when the router (and with it
/// every queue sender) is dropped.
pub fn app(model: Arc<LoadedModel>, config: ServerConfig) -> (Router, Arc<Counters>) {
    let (tx, rx) = mpsc::channel(config.queue.max(1));
    let counters = Arc::new(Counters::default());
    let worker_model = model.clone();
    let worker_counters = counters.clone();
    let chunk = config.chunk_size;
    let max_active = config.max_active.max(1);
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || worker(worker_model, rx, max_active, chunk, worker_counters))
        .expect("spawn the engine thread");
    let state = Arc::new(AppState {
        model,
        jobs: tx,
        counters: counters.clone(),
        started: chrono::Utc::now(),
        config: config.clone(),
    });
    let router = Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/models", get(openai_models))
        .route("/version", get(version))
        .route("/api/chat", post(ollama_chat))
        .route("/api/generate", post(ollama_generate))
        .route("/api/version", get(version))
        .route("/api/tags", get(ollama_tags))
        .route("/api/show", post(ollama_show))
        .route("/health", get(health))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(state);
    (router, counters)
}

fn worker(
    model: Arc<LoadedModel>,
    mut rx: mpsc::Receiver<Job>,
    max_active: usize,
    chunk: Option<usize>,
    counters: Arc<Counters>,
) {
    struct Active {
        job: Job,
        session: Session,
        /// Incremental detokenization: ids before `sent_from` are streamed and need no decoding;
        /// `sent_from..sent_to` is the text already sent of the current window.
        sent_from: usize,
        sent_to: usize,
        prompt_eval: Duration,
        eval: Duration,
    }
    let mut active: Vec<Active> = Vec::new();
    let mut cursor = 0usize;
    loop {
        while active.len() < max_active {
            let job = if active.is_empty() {
                match rx.blocking_recv() {
                    Some(j) => j,
                    None => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            counters.queued.fetch_sub(1, Ordering::SeqCst);
            match Session::new(&model, job.prompt_ids.clone(), job.max_tokens) {
                Ok(session) => {
                    counters.active.fetch_add(1, Ordering::SeqCst);
                    active.push(Active {
                        job,
                        session,
                        sent_from: 0,
                        sent_to: 0,
                        prompt_eval: Duration::ZERO,
                        eval: Duration::ZERO,
                    });
                }
                Err(e) => {
                    let _ = job.tx.send(Event::Error(e.to_string()));
                }
            }
        }
        // A client that went away has closed its channel: free its session now.
        let before = active.len();
        active.retain(|a| !a.job.tx.is_closed());
        let gone = before - active.len();
        if gone > 0 {
            counters.active.fetch_sub(gone, Ordering::SeqCst);
            counters.cancelled.fetch_add(gone, Ordering::SeqCst);
            continue;
        }
        if active.is_empty() {
            continue;
        }
        let candidates: Vec<Candidate> = active.iter().map(|a| a.session.candidate()).collect();
        let i = Policy::Interleave.plan(&candidates, cursor, chunk)[0].0;
        let a = &mut active[i];
        let t = Instant::now();
        let step = a.session.step(chunk);
        let took = t.elapsed();
        match step {
            Err(e) => {
                let _ = a.job.tx.send(Event::Error(e.to_string()));
                active.remove(i);
                counters.active.fetch_sub(1, Ordering::SeqCst);
                cursor = i;
                continue;
            }
            Ok(outcome) => {
                // Prefill time is prompt evaluation; every step that yields a token counts as
                // generation time too (the last prefill chunk yields the first token).
                if outcome.kind == StepKind::Prefill {
                    a.prompt_eval += took;
                }
                if outcome.token.is_some() {
                    a.eval += took;
                    // Decode only the window since the last text sent (not the whole output, which
                    // would make each step cost more than the last), and send only whole
                    // characters: a trailing partial UTF-8 sequence waits for its next token.
                    let ids = a.session.output();
                    let sent = model.decode(&ids[a.sent_from..a.sent_to]);
                    let text = model.decode(&ids[a.sent_from..]);
                    if text.len() > sent.len() && text.starts_with(&sent) && !text.ends_with('\u{fffd}') {
                        let _ = a.job.tx.send(Event::Text(text[sent.len()..].to_string()));
                        a.sent_from = a.sent_to;
                        a.sent_to = ids.len();
                    }
                }
            }
        }
        if let Some(reason) = a.session.finish_reason() {
            let done = Finished {
                reason,
                prompt_tokens: a.session.prompt_len(),
                completion_tokens: a.session.output().len(),
                prompt_eval: a.prompt_eval,
                eval: a.eval,
                total: a.job.received.elapsed(),
            };
            let _ = a.job.tx.send(Event::Done(done));
            active.remove(i);
            counters.active.fetch_sub(1, Ordering::SeqCst);
            counters.completed.fetch_add(1, Ordering::SeqCst);
            cursor = i;
        } else {
            cursor = i + 1;
        }
    }
}

/// A request error as the API in use writes it.
#[derive(Clone, Copy)]
enum Api {
    OpenAi,
    Ollama,
}

fn error(api: Api, status: StatusCode, param: &str, message: String) -> Response {
    let body = match api {
        Api::OpenAi => {
            json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": status.as_u16()}})
        }
        Api::Ollama => json!({"error": message, "param": param}),
    };
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

/// A parsed, validated generation request.
struct Request {
    prompt_ids: Vec<u32>,
    max_tokens: usize,
    stream: bool,
}

/// Validates the common fields; every problem is a 400 naming the field.
fn parse(state: &AppState, api: Api, body: &Bytes, chat: bool) -> Result<Request, Response> {
    let bad = |param: &str, msg: String| error(api, StatusCode::BAD_REQUEST, param, msg);
    let value: Value = serde_json::from_slice(body).map_err(|e| bad("body", format!("body is not JSON: {e}")))?;
    let obj = value.as_object().ok_or_else(|| bad("body", "body must be a JSON object".into()))?;
    let model =
        obj.get("model").and_then(Value::as_str).ok_or_else(|| bad("model", "`model` must be a string".into()))?;
    if model != state.config.model_name {
        return Err(error(
            api,
            StatusCode::NOT_FOUND,
            "model",
            format!("model `{model}` not found; this server serves `{}`", state.config.model_name),
        ));
    }
    let text = if chat {
        let messages = obj
            .get("messages")
            .and_then(Value::as_array)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| bad("messages", "`messages` must be a non-empty array".into()))?;
        let mut parsed = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .filter(|r| ["system", "user", "assistant"].contains(r))
                .ok_or_else(|| bad(&format!("messages[{i}].role"), "role must be system, user or assistant".into()))?;
            let content = m
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("messages[{i}].content"), "content must be a string".into()))?;
            parsed.push(Message { role, content });
        }
        state.model.template.render(&parsed, true).map_err(|e| bad("messages", e.to_string()))?
    } else {
        let prompt = obj
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("prompt", "`prompt` must be a string".into()))?;
        state.model.template.render_user(prompt).map_err(|e| bad("prompt", e.to_string()))?
    };
    let (max_field, max_value) = match api {
        Api::OpenAi => match obj.get("max_completion_tokens") {
            Some(v) => ("max_completion_tokens", Some(v)),
            None => ("max_tokens", obj.get("max_tokens")),
        },
        Api::Ollama => ("options.num_predict", obj.get("options").and_then(|o| o.get("num_predict"))),
    };
    let max_tokens = match max_value {
        None | Some(Value::Null) => 128,
        Some(v) => {
            v.as_u64()
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad(max_field, format!("`{max_field}` must be an integer >= 1")))? as usize
        }
    };
    let stream = match obj.get("stream") {
        None => matches!(api, Api::Ollama), // Ollama streams by default, OpenAI does not
        Some(v) => v.as_bool().ok_or_else(|| bad("stream", "`stream` must be a boolean".into()))?,
    };
    let ids = state
        .model
        .tokenizer
        .encode(text.as_str(), false)
        .map_err(|e| bad("messages", e.to_string()))?
        .get_ids()
        .to_vec();
    let context = state.model.config.max_position_embeddings;
    if ids.len() + max_tokens > context {
        let field = if chat { "messages" } else { "prompt" };
        return Err(bad(
            field,
            format!(
                "prompt of {} tokens plus {max_field} {max_tokens} exceeds the context of {context} tokens",
                ids.len()
            ),
        ));
    }
    Ok(Request { prompt_ids: ids, max_tokens, stream })
}

/// Queues the request; a full queue is a 503 at once.
fn submit(state: &AppState, api: Api, req: &Request) -> Result<mpsc::UnboundedReceiver<Event>, Response> {
    let (tx, rx) = mpsc::unbounded_channel();
    state.counters.queued.fetch_add(1, Ordering::SeqCst);
    let job = Job { prompt_ids: req.prompt_ids.clone(), max_tokens: req.max_tokens, tx, received: Instant::now() };
    match state.jobs.try_send(job) {
        Ok(()) => Ok(rx),
        Err(_) => {
            state.counters.queued.fetch_sub(1, Ordering::SeqCst);
            state.counters.rejected.fetch_add(1, Ordering::SeqCst);
            Err(error(api, StatusCode::SERVICE_UNAVAILABLE, "", "the request queue is full; retry later".into()))
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

/// The body, or a 400 naming it when it is too large or unreadable (axum would answer 413 text).
type RawBody = Result<Bytes, axum::extract::rejection::BytesRejection>;

fn read_body(api: Api, body: RawBody, limit: usize) -> Result<Bytes, Response> {
    body.map_err(|e| {
        error(api, StatusCode::BAD_REQUEST, "body", format!("request body rejected ({e}); the limit is {limit} bytes"))
    })
}

/// Reads, validates and queues a generation request: everything before the answer starts.
fn accept(
    state: &AppState,
    api: Api,
    body: RawBody,
    chat: bool,
) -> Result<(Bytes, Request, mpsc::UnboundedReceiver<Event>), Response> {
    let body = read_body(api, body, state.config.max_body_bytes)?;
    let req = parse(state, api, &body, chat)?;
    let rx = submit(state, api, &req)?;
    Ok((body, req, rx))
}

async fn openai_chat(State(state): State<Arc<AppState>>, body: RawBody) -> Response {
    let (body, req, mut rx) = match accept(&state, Api::OpenAi, body, true) {
        Ok(accepted) => accepted,
        Err(e) => return e,
    };
    let include_usage = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/stream_options/include_usage").and_then(Value::as_bool))
        .unwrap_or(false);
    let id = format!("chatcmpl-{:x}", now_secs() ^ (rx.len() as u64) ^ std::process::id() as u64);
    let model = state.config.model_name.clone();
    let created = now_secs();
    if !req.stream {
        let mut text = String::new();
        while let Some(event) = rx.recv().await {
            match event {
                Event::Text(t) => text.push_str(&t),
                Event::Error(e) => return error(Api::OpenAi, StatusCode::INTERNAL_SERVER_ERROR, "", e),
                Event::Done(d) => {
                    return Json(json!({
                        "id": id, "object": "chat.completion", "created": created, "model": model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason(d.reason)}],
                        "usage": {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens, "total_tokens": d.prompt_tokens + d.completion_tokens}
                    }))
                    .into_response()
                }
            }
        }
        return error(Api::OpenAi, StatusCode::INTERNAL_SERVER_ERROR, "", "the engine stopped".into());
    }
    let chunk = move |delta: Value, finish: Option<&str>| {
        let v = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        Bytes::from(format!("data: {v}\n\n"))
    };
    let first = chunk(json!({"role": "assistant", "content": ""}), None);
    let stream = async_stream(
        rx,
        move |event| match event {
            Event::Text(t) => vec![chunk(json!({"content": t}), None)],
            Event::Done(d) => {
                let mut out = vec![chunk(json!({}), Some(finish_reason(d.reason)))];
                if include_usage {
                    let usage = json!({"id": "usage", "object": "chat.completion.chunk", "created": created, "choices": [],
                    "usage": {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens, "total_tokens": d.prompt_tokens + d.completion_tokens}});
                    out.push(Bytes::from(format!("data: {usage}\n\n")));
                }
                out.push(Bytes::from_static(b"data: [DONE]\n\n"));
                out
            }
            Event::Error(e) => {
                vec![Bytes::from(format!("event: error\ndata: {}\n\n", json!({"error": {"message": e}})))]
            }
        },
        Some(first),
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(stream)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A streaming body from the worker's events; dropping it (client gone) closes the channel.
fn async_stream(
    rx: mpsc::UnboundedReceiver<Event>,
    render: impl Fn(Event) -> Vec<Bytes> + Send + 'static,
    first: Option<Bytes>,
) -> Body {
    let events = futures_util::stream::unfold((rx, false), move |(mut rx, done)| async move {
        if done {
            return None;
        }
        let event = rx.recv().await?;
        let last = matches!(event, Event::Done(_) | Event::Error(_));
        Some((event, (rx, last)))
    });
    use futures_util::StreamExt;
    let head = futures_util::stream::iter(first.into_iter().map(Ok::<_, std::convert::Infallible>));
    let body = events.flat_map(move |e| futures_util::stream::iter(render(e).into_iter().map(Ok)));
    Body::from_stream(head.chain(body))
}

async fn ollama_chat(state: State<Arc<AppState>>, body: RawBody) -> Response {
    ollama(state, body, true).await
}

async fn ollama_generate(state: State<Arc<AppState>>, body: RawBody) -> Response {
    ollama(state, body, false).await
}

async fn ollama(State(state): State<Arc<AppState>>, body: RawBody, chat: bool) -> Response {
    let (_, req, mut rx) = match accept(&state, Api::Ollama, body, chat) {
        Ok(accepted) => accepted,
        Err(e) => return e,
    };
    let model = state.config.model_name.clone();
    let line = move |text: &str, done: Option<&Finished>| {
        let created_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let mut v = if chat {
            json!({"model": model, "created_at": created_at, "message": {"role": "assistant", "content": text}, "done": done.is_some()})
        } else {
            json!({"model": model, "created_at": created_at, "response": text, "done": done.is_some()})
        };
        if let Some(d) = done {
            let o = v.as_object_mut().expect("object");
            o.insert("done_reason".into(), json!(finish_reason(d.reason)));
            o.insert("total_duration".into(), json!(d.total.as_nanos() as u64));
            o.insert("load_duration".into(), json!(0));
            o.insert("prompt_eval_count".into(), json!(d.prompt_tokens));
            o.insert("prompt_eval_duration".into(), json!(d.prompt_eval.as_nanos() as u64));
            o.insert("eval_count".into(), json!(d.completion_tokens));
            o.insert("eval_duration".into(), json!(d.eval.as_nanos() as u64));
        }
        format!("{v}\n")
    };
    if !req.stream {
        let mut text = String::new();
        while let Some(event) = rx.recv().await {
            match event {
                Event::Text(t) => text.push_str(&t),
                Event::Error(e) => return error(Api::Ollama, StatusCode::INTERNAL_SERVER_ERROR, "", e),
                Event::Done(d) => {
                    let body = line(&text, Some(&d));
                    return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
                }
            }
        }
        return error(Api::Ollama, StatusCode::INTERNAL_SERVER_ERROR, "", "the engine stopped".into());
    }
    let stream = async_stream(
        rx,
        move |event| match event {
            Event::Text(t) => vec![Bytes::from(line(&t, None))],
            Event::Done(d) => vec![Bytes::from(line("", Some(&d)))],
            Event::Error(e) => vec![Bytes::from(format!("{}\n", json!({"error": e})))],
        },
        None,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(stream)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
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

async fn ollama_tags(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"models": [{"name": state.config.model_name, "model": state.config.model_name,
        "details": {"family": "qwen2", "format": "safetensors", "quantization_level": "F32"}}]}))
}

async fn ollama_show(State(state): State<Arc<AppState>>) -> Json<Value> {
    let c = &state.model.config;
    Json(json!({
        "details": {"family": "qwen2", "format": "safetensors", "quantization_level": "F32"},
        "model_info": {
            "general.architecture": "qwen2",
            "qwen2.context_length": c.max_position_embeddings,
            "qwen2.embedding_length": c.hidden_size,
            "qwen2.block_count": c.num_hidden_layers,
            "qwen2.attention.head_count": c.num_attention_heads,
            "qwen2.attention.head_count_kv": c.num_key_value_heads,
            "qwen2.vocab_size": c.vocab_size
        }
    }))
}

async fn health(State(state): State<Arc<AppState>>) -> Json<Value> {
    let c = &state.counters;
    Json(json!({
        "active": c.active.load(Ordering::SeqCst), "queued": c.queued.load(Ordering::SeqCst),
        "completed": c.completed.load(Ordering::SeqCst), "cancelled": c.cancelled.load(Ordering::SeqCst),
        "rejected": c.rejected.load(Ordering::SeqCst)
    }))
}

/// A server running on a background task (the benchmark's embedded target, and tests).
pub struct Running {
    pub addr: std::net::SocketAddr,
    pub counters: Arc<Counters>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting, lets open streams finish, and waits.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = self.task.await;
    }
}

/// Binds `addr` (port 0 picks a free one) and serves until [`Running::stop`].
pub async fn spawn(
    addr: std::net::SocketAddr,
    model: Arc<LoadedModel>,
    config: ServerConfig,
) -> std::io::Result<Running> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (router, counters) = app(model, config);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await;
    });
    Ok(Running { addr, counters, shutdown: Some(tx), task })
}
