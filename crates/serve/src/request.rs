//! Reading a generation request: its content type, its JSON body and every field the server
//! acts on, checked without touching the model. Each problem is a [`Rejection`] that names the
//! field, never a panic: the property tests feed this generated and mutated bodies.
//!
//! Fields the server has no use for are ignored, as other servers do; fields that would change
//! the answer in a way this single-choice server cannot honour (`n` > 1, `tools`, `echo`, a
//! non-zero presence penalty, ...) are refused rather than silently dropped.
//!
//! Sampling: temperature 0 (greedy) unless a request sets one, as the checkpoints'
//! `generation_config.json` says (`do_sample` false), not OpenAI's 1: an answer is reproducible
//! unless its request asks otherwise. A sampling request without a `seed` gets one from the clock.

use common::sample::Sampling;
use serde_json::{Map, Value};

/// The four generation endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`
    OpenAiChat,
    /// `/v1/completions`
    OpenAiCompletions,
    /// `/api/chat`
    OllamaChat,
    /// `/api/generate`
    OllamaGenerate,
}

impl Endpoint {
    pub(crate) fn is_openai(self) -> bool {
        matches!(self, Endpoint::OpenAiChat | Endpoint::OpenAiCompletions)
    }
}

/// Why a request is refused: the HTTP status, the field (`param`) and a one-line message that
/// says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    pub param: String,
    pub message: String,
}

impl Rejection {
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        Rejection { status: 400, param: param.into(), message: message.into() }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Rendered through the checkpoint's chat template.
    Messages(Vec<ChatMessage>),
    /// Tokenized as it is (completions, and Ollama's `raw` generate).
    Text(String),
    /// Token ids as given (completions).
    Tokens(Vec<u32>),
}

/// A generation request with every field checked.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub model: String,
    pub input: Input,
    /// The cap on new tokens, if the client set one.
    pub max_tokens: Option<u64>,
    /// The field the cap came from, for messages about it.
    pub max_tokens_field: &'static str,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    /// vLLM's `stream_options.continuous_usage_stats`: usage counts with every chunk.
    pub continuous_usage: bool,
    /// vLLM's `ignore_eos`: generate up to the cap whatever the model emits.
    pub ignore_eos: bool,
    /// How the next ids are picked (checked).
    pub sampling: Sampling,
    /// Texts that end the answer where they first appear (never sent themselves).
    pub stop: Vec<String>,
    /// Report each generated token's log-probability with this many alternatives (OpenAI chat's
    /// `logprobs` and `top_logprobs`, completions' `logprobs`).
    pub logprobs: Option<usize>,
}

/// The most alternatives a token's log-probability comes with (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The most stop strings a request may give (OpenAI's limit).
pub const MAX_STOPS: usize = 4;

/// Checks the declared content type: a JSON type, none at all, or (for Ollama's API, whose own
/// documentation posts with plain `curl -d`) curl's form default. Anything else is a 415.
pub(crate) fn check_content_type(endpoint: Endpoint, content_type: Option<&str>) -> Result<(), Rejection> {
    let Some(declared) = content_type else { return Ok(()) };
    let mime = declared.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let json = mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"));
    let curl_default = !endpoint.is_openai() && mime == "application/x-www-form-urlencoded";
    if json || curl_default {
        Ok(())
    } else {
        Err(Rejection {
            status: 415,
            param: "content-type".into(),
            message: format!("Content-Type `{declared}` is not JSON; send the body as application/json"),
        })
    }
}

/// Parses and checks a generation request body for `endpoint`.
pub fn parse(endpoint: Endpoint, content_type: Option<&str>, body: &[u8]) -> Result<GenerationRequest, Rejection> {
    check_content_type(endpoint, content_type)?;
    let value: Value =
        serde_json::from_slice(body).map_err(|e| Rejection::bad("body", format!("body is not JSON: {e}")))?;
    let obj = value.as_object().ok_or_else(|| Rejection::bad("body", "body must be a JSON object"))?;
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(Rejection::bad("model", "`model` must be the name of the served model (GET /v1/models)")),
    };
    match endpoint {
        Endpoint::OpenAiChat | Endpoint::OpenAiCompletions => {
            refuse_unsupported(obj)?;
            let input = if endpoint == Endpoint::OpenAiChat {
                if obj.get("prompt").is_some() {
                    return Err(Rejection::bad(
                        "prompt",
                        "chat completions take `messages`; send `prompt` to /v1/completions",
                    ));
                }
                Input::Messages(messages(obj)?)
            } else {
                if obj.get("messages").is_some() {
                    return Err(Rejection::bad(
                        "messages",
                        "completions take `prompt`; send `messages` to /v1/chat/completions",
                    ));
                }
                openai_prompt(obj)?
            };
            let (max_tokens_field, max_tokens) = match obj.get("max_completion_tokens") {
                Some(v) if !v.is_null() => ("max_completion_tokens", v),
                _ => ("max_tokens", obj.get("max_tokens").unwrap_or(&Value::Null)),
            };
            let max_tokens = optional_count(max_tokens_field, max_tokens)?;
            let stream = optional_bool("stream", obj.get("stream"))?.unwrap_or(false);
            let (include_usage, continuous_usage) = match obj.get("stream_options") {
                None | Some(Value::Null) => (false, false),
                Some(Value::Object(o)) => (
                    optional_bool("stream_options.include_usage", o.get("include_usage"))?.unwrap_or(false),
                    optional_bool("stream_options.continuous_usage_stats", o.get("continuous_usage_stats"))?
                        .unwrap_or(false),
                ),
                Some(_) => return Err(Rejection::bad("stream_options", "`stream_options` must be an object")),
            };
            let ignore_eos = optional_bool("ignore_eos", obj.get("ignore_eos"))?.unwrap_or(false);
            let (sampling, stop) = sampling(obj, false)?;
            let logprobs = logprobs(obj, endpoint == Endpoint::OpenAiChat)?;
            Ok(GenerationRequest {
                model,
                input,
                max_tokens,
                max_tokens_field,
                stream,
                include_usage,
                continuous_usage,
                ignore_eos,
                sampling,
                stop,
                logprobs,
            })
        }
        Endpoint::OllamaChat | Endpoint::OllamaGenerate => {
            for field in ["images", "context", "template", "format", "tools"] {
                if obj.get(field).is_some_and(|v| !is_empty(v)) {
                    return Err(Rejection::bad(
                        field,
                        format!("`{field}` is not supported by this server; leave it out"),
                    ));
                }
            }
            let input = if endpoint == Endpoint::OllamaChat {
                Input::Messages(messages(obj)?)
            } else {
                let prompt = match obj.get("prompt") {
                    Some(Value::String(p)) if !p.is_empty() => p.clone(),
                    _ => return Err(Rejection::bad("prompt", "`prompt` must be a non-empty string")),
                };
                let system = match obj.get("system") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(_) => return Err(Rejection::bad("system", "`system` must be a string")),
                };
                if optional_bool("raw", obj.get("raw"))?.unwrap_or(false) {
                    if system.is_some() {
                        return Err(Rejection::bad("system", "a `raw` prompt takes no `system`: put it in the prompt"));
                    }
                    Input::Text(prompt)
                } else {
                    let mut turns = Vec::new();
                    if let Some(content) = system {
                        turns.push(ChatMessage { role: "system".into(), content });
                    }
                    turns.push(ChatMessage { role: "user".into(), content: prompt });
                    Input::Messages(turns)
                }
            };
            let stream = optional_bool("stream", obj.get("stream"))?.unwrap_or(true); // Ollama streams by default
            let (mut sampling_settings, mut stop) = (Sampling::GREEDY, Vec::new());
            let max_tokens = match obj.get("options") {
                None | Some(Value::Null) => None,
                Some(Value::Object(options)) => {
                    (sampling_settings, stop) = sampling(options, true)?;
                    match options.get("num_predict") {
                        Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0) => {
                            return Err(Rejection::bad(
                                "options.num_predict",
                                format!(
                                    "`options.num_predict` {n}: this server needs a finite cap; give an integer >= 1"
                                ),
                            ))
                        }
                        other => optional_count("options.num_predict", other.unwrap_or(&Value::Null))?,
                    }
                }
                Some(_) => return Err(Rejection::bad("options", "`options` must be an object")),
            };
            Ok(GenerationRequest {
                model,
                input,
                max_tokens,
                max_tokens_field: "options.num_predict",
                stream,
                include_usage: false,
                continuous_usage: false,
                ignore_eos: false,
                sampling: sampling_settings,
                stop,
                logprobs: None,
            })
        }
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// OpenAI fields that would change the answer in ways this server cannot honour.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), Rejection> {
    for field in ["n", "best_of"] {
        match obj.get(field) {
            None | Some(Value::Null) => {}
            Some(v) if v.as_u64() == Some(1) => {}
            Some(_) => {
                return Err(Rejection::bad(field, format!("`{field}` must be 1: this server returns one choice")))
            }
        }
    }
    for field in ["echo", "suffix", "tools", "functions", "response_format", "logit_bias"] {
        if obj.get(field).is_some_and(|v| !is_empty(v) && v != &Value::Bool(false)) {
            return Err(Rejection::bad(field, format!("`{field}` is not supported by this server; leave it out")));
        }
    }
    Ok(())
}

/// What a setting's value may be.
#[derive(Clone, Copy)]
enum Range {
    /// A number from `.0` to `.1`.
    Number(f64, f64),
    /// A number above 0 and at most `.0`.
    Positive(f64),
    /// An integer from `.0` to `.1`.
    Integer(i64, i64),
    /// Any integer (a seed: signed or unsigned 64 bits).
    AnyInteger,
    /// true or false.
    Bool,
    /// Zero, or absent: the server cannot honour another value, and dropping it would change the
    /// answer silently.
    Zero,
    /// A string or a list of at most [`MAX_STOPS`] non-empty strings.
    Stops,
}

/// The sampling settings both APIs take, by their names in OpenAI's body (vLLM's extensions
/// included) and in Ollama's `options`: one rule for both, so the same value is accepted or
/// refused whichever API carries it.
const SAMPLING: [(&str, &str, Range); 9] = [
    ("temperature", "temperature", Range::Number(0.0, 2.0)),
    ("top_p", "top_p", Range::Positive(1.0)),
    // vLLM's -1 (and 0) keep every id.
    ("top_k", "top_k", Range::Integer(-1, i32::MAX as i64)),
    ("min_p", "min_p", Range::Number(0.0, 1.0)),
    ("seed", "seed", Range::AnyInteger),
    ("repetition_penalty", "repeat_penalty", Range::Positive(10.0)),
    ("presence_penalty", "presence_penalty", Range::Zero),
    ("frequency_penalty", "frequency_penalty", Range::Zero),
    ("stop", "stop", Range::Stops),
];

/// Ollama's other documented options: checked for type, then unused (this server's context,
/// threads and memory are its own). Options Ollama does not know are ignored, as Ollama does.
const OLLAMA_OPTIONS: [(&str, Range); 19] = [
    ("num_ctx", Range::Integer(1, i32::MAX as i64)),
    ("num_keep", Range::Integer(-1, i32::MAX as i64)),
    ("num_batch", Range::Integer(1, i32::MAX as i64)),
    ("num_gpu", Range::Integer(-1, i32::MAX as i64)),
    ("main_gpu", Range::Integer(0, i32::MAX as i64)),
    ("num_thread", Range::Integer(0, i32::MAX as i64)),
    ("repeat_last_n", Range::Integer(-1, i32::MAX as i64)),
    ("typical_p", Range::Number(0.0, 1.0)),
    ("mirostat", Range::Integer(0, 2)),
    ("mirostat_tau", Range::Number(0.0, 100.0)),
    ("mirostat_eta", Range::Number(0.0, 100.0)),
    ("numa", Range::Bool),
    ("low_vram", Range::Bool),
    ("f16_kv", Range::Bool),
    ("logits_all", Range::Bool),
    ("vocab_only", Range::Bool),
    ("use_mmap", Range::Bool),
    ("use_mlock", Range::Bool),
    ("penalize_newline", Range::Bool),
];

/// Checks one setting (`field` as the client wrote it) against its range; `null` is absent.
fn check_setting(field: &str, value: &Value, range: Range) -> Result<(), Rejection> {
    if value.is_null() {
        return Ok(());
    }
    let (ok, want) = match range {
        Range::Number(lo, hi) => {
            (value.as_f64().is_some_and(|x| (lo..=hi).contains(&x)), format!("a number from {lo} to {hi}"))
        }
        Range::Positive(hi) => {
            (value.as_f64().is_some_and(|x| x > 0.0 && x <= hi), format!("a number above 0 and at most {hi}"))
        }
        Range::Integer(lo, hi) => {
            (value.as_i64().is_some_and(|x| (lo..=hi).contains(&x)), format!("an integer from {lo} to {hi}"))
        }
        Range::AnyInteger => (value.as_i64().is_some() || value.as_u64().is_some(), "an integer".to_string()),
        Range::Bool => (value.is_boolean(), "true or false".to_string()),
        Range::Zero if value.as_f64() == Some(0.0) => (true, String::new()),
        Range::Zero => {
            let message = format!("`{field}` other than 0 is not supported by this server; use repetition_penalty");
            return Err(Rejection::bad(field, message));
        }
        Range::Stops => {
            let strings: Vec<&Value> = match value {
                Value::Array(items) => items.iter().collect(),
                one => vec![one],
            };
            let ok = strings.len() <= MAX_STOPS && strings.iter().all(|s| s.as_str().is_some_and(|s| !s.is_empty()));
            (ok, format!("a non-empty string or a list of at most {MAX_STOPS} of them"))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(Rejection::bad(field, format!("`{field}` must be {want}, not {value}")))
    }
}

/// Sampling settings and stop strings, in an OpenAI body (`ollama` false) or Ollama's `options`
/// (named `options.<name>`): checked for type and range by one rule for both APIs.
fn sampling(obj: &Map<String, Value>, ollama: bool) -> Result<(Sampling, Vec<String>), Rejection> {
    let prefix = if ollama { "options." } else { "" };
    let mut settings = Map::new();
    for (openai, in_options, range) in SAMPLING {
        let name = if ollama { in_options } else { openai };
        if let Some(v) = obj.get(name).filter(|v| !v.is_null()) {
            check_setting(&format!("{prefix}{name}"), v, range)?;
            settings.insert(openai.to_string(), v.clone());
        }
    }
    if ollama {
        for (name, range) in OLLAMA_OPTIONS {
            if let Some(v) = obj.get(name) {
                check_setting(&format!("options.{name}"), v, range)?;
            }
        }
    }
    // Checked above: every number is in its range and every conversion below exact enough.
    let number = |name: &str, default: f64| settings.get(name).and_then(Value::as_f64).unwrap_or(default);
    let seed = match settings.get("seed") {
        Some(v) => v.as_u64().or_else(|| v.as_i64().map(|s| s as u64)).unwrap_or_default(),
        None => clock_seed(),
    };
    let sampling = Sampling {
        temperature: number("temperature", 0.0),
        top_k: settings.get("top_k").and_then(Value::as_i64).map_or(0, |k| k.max(0) as u32),
        top_p: number("top_p", 1.0),
        min_p: number("min_p", 0.0),
        repetition_penalty: number("repetition_penalty", 1.0),
        seed,
    };
    // A value that passed its range but not the engine's (none should) is still named.
    sampling.check().map_err(|e| Rejection::bad(format!("{prefix}{}", e.field), e.to_string()))?;
    let stop = match settings.get("stop") {
        Some(Value::String(one)) => vec![one.clone()],
        Some(Value::Array(list)) => list.iter().filter_map(|s| s.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    };
    Ok((sampling, stop))
}

/// A seed for a sampling request that gave none: different for every request.
fn clock_seed() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed).rotate_left(32)
}

/// The alternatives asked for with each token's log-probability: chat's `logprobs` (true or
/// false) with `top_logprobs`, or completions' `logprobs` (a count).
fn logprobs(obj: &Map<String, Value>, chat: bool) -> Result<Option<usize>, Rejection> {
    let count = |field: &str, v: &Value| match v.as_u64() {
        Some(n) if n <= MAX_TOP_LOGPROBS as u64 => Ok(n as usize),
        _ => Err(Rejection::bad(field, format!("`{field}` must be an integer from 0 to {MAX_TOP_LOGPROBS}, not {v}"))),
    };
    let top = obj.get("top_logprobs").filter(|v| !v.is_null());
    if !chat {
        if top.is_some() {
            return Err(Rejection::bad(
                "top_logprobs",
                "completions take `logprobs` as a count; leave out `top_logprobs`",
            ));
        }
        return obj.get("logprobs").filter(|v| !v.is_null()).map(|v| count("logprobs", v)).transpose();
    }
    let asked = optional_bool("logprobs", obj.get("logprobs"))?.unwrap_or(false);
    match (asked, top) {
        (false, Some(_)) => Err(Rejection::bad("top_logprobs", "`top_logprobs` needs `logprobs`: true")),
        (false, None) => Ok(None),
        (true, top) => Ok(Some(top.map(|v| count("top_logprobs", v)).transpose()?.unwrap_or(0))),
    }
}

fn optional_bool(field: &str, v: Option<&Value>) -> Result<Option<bool>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(Rejection::bad(field, format!("`{field}` must be true or false"))),
    }
}

/// A count of tokens: absent, or an integer >= 1 (a float, a negative number or one past u64
/// is refused, never wrapped).
fn optional_count(field: &str, v: &Value) -> Result<Option<u64>, Rejection> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(Rejection::bad(field, format!("`{field}` must be an integer >= 1, not {n}"))),
        },
        _ => Err(Rejection::bad(field, format!("`{field}` must be an integer >= 1"))),
    }
}

/// `messages`: a non-empty array of system, user and assistant turns whose content is a string
/// or a list of text parts.
fn messages(obj: &Map<String, Value>) -> Result<Vec<ChatMessage>, Rejection> {
    let list = match obj.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        _ => return Err(Rejection::bad("messages", "`messages` must be a non-empty array of {role, content}")),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.get("role") {
                Some(Value::String(r)) if ["system", "user", "assistant"].contains(&r.as_str()) => r.clone(),
                _ => {
                    return Err(Rejection::bad(format!("messages[{i}].role"), "role must be system, user or assistant"))
                }
            };
            let field = format!("messages[{i}].content");
            let content = match m.get("content") {
                Some(Value::String(c)) => c.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.iter().enumerate() {
                        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(t)) => text.push_str(t),
                            _ => {
                                return Err(Rejection::bad(
                                    format!("{field}[{j}]"),
                                    "only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                                ))
                            }
                        }
                    }
                    text
                }
                _ => return Err(Rejection::bad(field, "content must be a string or a list of text parts")),
            };
            Ok(ChatMessage { role, content })
        })
        .collect()
}

/// A completions `prompt`: a string, or token ids, alone or as a list of one.
fn openai_prompt(obj: &Map<String, Value>) -> Result<Input, Rejection> {
    let one_prompt = || Rejection::bad("prompt", "this server takes one prompt per request");
    let value = match obj.get("prompt") {
        Some(Value::Array(items)) if items.len() == 1 && (items[0].is_string() || items[0].is_array()) => &items[0],
        Some(Value::Array(items)) if items.iter().any(|v| v.is_string() || v.is_array()) => return Err(one_prompt()),
        Some(v) => v,
        None => return Err(Rejection::bad("prompt", "`prompt` must be a string or a list of token ids")),
    };
    match value {
        Value::String(s) if !s.is_empty() => Ok(Input::Text(s.clone())),
        Value::Array(ids) if !ids.is_empty() => ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                id.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
                    Rejection::bad(format!("prompt[{i}]"), "a token id must be an integer from 0 to 4294967295")
                })
            })
            .collect::<Result<Vec<u32>, _>>()
            .map(Input::Tokens),
        _ => Err(Rejection::bad("prompt", "`prompt` must be a non-empty string or a non-empty list of token ids")),
    }
}

/// A `POST /tokenize` body, as llama-server reads it: `content` and three switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizeRequest {
    pub content: String,
    /// Put the model's BOS first, where it adds one (default false).
    pub add_special: bool,
    /// Split out special tokens (default true); false reads them as text.
    pub parse_special: bool,
    /// Each id with its piece (default false).
    pub with_pieces: bool,
    pub model: Option<String>,
}

/// A `POST /detokenize` body: `tokens`, a list of ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
    pub model: Option<String>,
}

fn object(body: &[u8]) -> Result<Map<String, Value>, Rejection> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(Rejection::bad("body", "the body must be a JSON object")),
        Err(e) => Err(Rejection::bad("body", format!("the body is not JSON: {e}"))),
    }
}

fn optional_model(obj: &Map<String, Value>) -> Result<Option<String>, Rejection> {
    match obj.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Rejection::bad("model", "`model` must be a string")),
    }
}

pub fn parse_tokenize(body: &[u8]) -> Result<TokenizeRequest, Rejection> {
    let obj = object(body)?;
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(Rejection::bad("content", "`content` must be the text to tokenize, a string")),
    };
    Ok(TokenizeRequest {
        content,
        add_special: optional_bool("add_special", obj.get("add_special"))?.unwrap_or(false),
        parse_special: optional_bool("parse_special", obj.get("parse_special"))?.unwrap_or(true),
        with_pieces: optional_bool("with_pieces", obj.get("with_pieces"))?.unwrap_or(false),
        model: optional_model(&obj)?,
    })
}

pub fn parse_detokenize(body: &[u8]) -> Result<DetokenizeRequest, Rejection> {
    let obj = object(body)?;
    let Some(Value::Array(items)) = obj.get("tokens") else {
        return Err(Rejection::bad("tokens", "`tokens` must be a list of token ids"));
    };
    let tokens = items
        .iter()
        .enumerate()
        .map(|(i, id)| {
            id.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
                Rejection::bad(format!("tokens[{i}]"), "a token id must be an integer from 0 to 4294967295")
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(DetokenizeRequest { tokens, model: optional_model(&obj)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(endpoint: Endpoint, body: &str) -> Rejection {
        parse(endpoint, Some("application/json"), body.as_bytes()).unwrap_err()
    }

    #[test]
    fn tokenize_bodies_read_like_llama_servers() {
        let t = parse_tokenize(br#"{"content":"hi <|im_end|>"}"#).unwrap();
        assert_eq!((t.add_special, t.parse_special, t.with_pieces, t.model), (false, true, false, None));
        let t = parse_tokenize(
            br#"{"content":"","add_special":true,"parse_special":false,"with_pieces":true,"model":"m"}"#,
        )
        .unwrap();
        assert_eq!((t.add_special, t.parse_special, t.with_pieces, t.model.as_deref()), (true, false, true, Some("m")));
        for (body, field) in [
            (&br#"{"prompt":"x"}"#[..], "content"),
            (br#"{"content":7}"#, "content"),
            (br#"{"content":"x","add_special":"yes"}"#, "add_special"),
            (br#"{"content":"x","model":1}"#, "model"),
            (br#"["content"]"#, "body"),
            (br#"{"content""#, "body"),
        ] {
            assert_eq!(parse_tokenize(body).unwrap_err().param, field, "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(parse_detokenize(br#"{"tokens":[1,2]}"#).unwrap().tokens, vec![1, 2]);
        for (body, field) in [
            (&br#"{"tokens":"1"}"#[..], "tokens"),
            (br#"{"tokens":[1,-2]}"#, "tokens[1]"),
            (br#"{"tokens":[4294967296]}"#, "tokens[0]"),
            (br#"{"tokens":[1.5]}"#, "tokens[0]"),
        ] {
            assert_eq!(parse_detokenize(body).unwrap_err().param, field, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn every_rejection_names_its_field() {
        let chat = |extra: &str| format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{extra}}}"#);
        let cases = [
            (chat(r#","max_tokens":18446744073709551615"#), None),
            (chat(r#","max_tokens":18446744073709551616"#), Some("max_tokens")),
            (chat(r#","max_tokens":-1"#), Some("max_tokens")),
            (chat(r#","max_tokens":2.5"#), Some("max_tokens")),
            (chat(r#","max_completion_tokens":0"#), Some("max_completion_tokens")),
            (chat(r#","n":2"#), Some("n")),
            (chat(r#","stop":["\n"]"#), None),
            (chat(r#","stop":["a","b","c","d","e"]"#), Some("stop")),
            (chat(r#","stop":[""]"#), Some("stop")),
            (chat(r#","presence_penalty":0.5"#), Some("presence_penalty")),
            (chat(r#","logprobs":true,"top_logprobs":5"#), None),
            (chat(r#","top_logprobs":5"#), Some("top_logprobs")),
            (chat(r#","logprobs":true,"top_logprobs":21"#), Some("top_logprobs")),
            (chat(r#","logprobs":3"#), Some("logprobs")),
            (chat(r#","temperature":3"#), Some("temperature")),
            (chat(r#","stream_options":{"include_usage":"yes"}"#), Some("stream_options.include_usage")),
            (chat(r#","stream_options":{"continuous_usage_stats":1}"#), Some("stream_options.continuous_usage_stats")),
            (chat(r#","max_tokens":18446744073709551615,"stream_options":{"continuous_usage_stats":true}"#), None),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#.into(),
                Some("messages[0].content[0]"),
            ),
            (r#"{"model":"m","prompt":"x"}"#.into(), Some("prompt")),
            (r#"{"messages":[]}"#.into(), Some("model")),
        ];
        for (body, field) in cases {
            match (parse(Endpoint::OpenAiChat, None, body.as_bytes()), field) {
                (Ok(r), None) => assert!([Some(u64::MAX), None].contains(&r.max_tokens), "{body}"),
                (Err(e), Some(field)) => assert_eq!((e.status, e.param.as_str()), (400, field), "{body}: {e:?}"),
                (other, _) => panic!("{body}: {other:?}"),
            }
        }
        let e = err(Endpoint::OllamaGenerate, r#"{"model":"m","prompt":"x","options":{"num_predict":-1}}"#);
        assert_eq!(e.param, "options.num_predict");
        assert!(e.message.contains("finite"), "{e:?}");
        let e = err(Endpoint::OpenAiCompletions, r#"{"model":"m","prompt":["a","b"]}"#);
        assert_eq!((e.param.as_str(), e.message.as_str()), ("prompt", "this server takes one prompt per request"));
        let e = err(Endpoint::OpenAiCompletions, r#"{"model":"m","prompt":[1,-2]}"#);
        assert_eq!(e.param, "prompt[1]");
    }

    #[test]
    fn sampling_settings_follow_one_rule_in_both_apis() {
        let openai = |field: &str, value: &str| {
            let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"{field}":{value}}}"#);
            parse(Endpoint::OpenAiChat, None, body.as_bytes()).map(|_| ())
        };
        let ollama = |field: &str, value: &str| {
            let body = format!(r#"{{"model":"m","prompt":"x","options":{{"{field}":{value}}}}}"#);
            parse(Endpoint::OllamaGenerate, None, body.as_bytes()).map(|_| ())
        };
        // (OpenAI name, Ollama name, value, accepted)
        let cases = [
            ("top_k", "top_k", "-2", false),
            ("top_k", "top_k", "-1", true),
            ("top_k", "top_k", "40", true),
            ("top_k", "top_k", "\"40\"", false),
            ("min_p", "min_p", "0.05", true),
            ("min_p", "min_p", "1.5", false),
            ("temperature", "temperature", "\"hot\"", false),
            ("repetition_penalty", "repeat_penalty", "1.1", true),
            ("repetition_penalty", "repeat_penalty", "0", false),
            ("seed", "seed", "-7", true),
            ("seed", "seed", "1.5", false),
            ("top_p", "top_p", "0", false),
            ("top_p", "top_p", "0.9", true),
            ("presence_penalty", "presence_penalty", "0", true),
            ("presence_penalty", "presence_penalty", "0.1", false),
            ("stop", "stop", "[\"\\n\"]", true),
            ("stop", "stop", "\"END\"", true),
            ("stop", "stop", "[]", true),
            ("stop", "stop", "[\"a\", 7]", false),
            ("stop", "stop", "\"\"", false),
        ];
        for (name, option, value, accepted) in cases {
            let (a, b) = (openai(name, value), ollama(option, value));
            assert_eq!(a.is_ok(), accepted, "openai {name}={value}: {a:?}");
            assert_eq!(b.is_ok(), accepted, "ollama {option}={value}: {b:?}");
            if let (Err(a), Err(b)) = (a, b) {
                assert_eq!((a.param, b.param), (name.to_string(), format!("options.{option}")));
                // The same words, but for the field's name.
                assert_eq!(a.message.replace(name, "F"), b.message.replace(&format!("options.{option}"), "F"));
            }
        }
        // Ollama's own options are checked for type; ones it does not know are ignored, as it does.
        for (option, value, accepted) in [
            ("num_ctx", "\"big\"", false),
            ("num_ctx", "0", false),
            ("num_ctx", "8192", true),
            ("use_mmap", "1", false),
            ("colour", "\"red\"", true),
        ] {
            let r = ollama(option, value);
            assert_eq!(r.is_ok(), accepted, "{option}={value}: {r:?}");
            if let Err(e) = r {
                assert_eq!(e.param, format!("options.{option}"));
            }
        }
    }

    #[test]
    fn both_apis_carry_the_same_settings_to_the_engine() {
        let openai = br#"{"model":"m","prompt":"x","temperature":0.7,"top_k":50,"top_p":0.9,"min_p":0.05,
                         "repetition_penalty":1.2,"seed":-1,"stop":"END"}"#;
        let ollama = br#"{"model":"m","prompt":"x","raw":true,"options":{"temperature":0.7,"top_k":50,"top_p":0.9,
                         "min_p":0.05,"repeat_penalty":1.2,"seed":18446744073709551615,"stop":["END"]}}"#;
        let a = parse(Endpoint::OpenAiCompletions, None, openai).unwrap();
        let b = parse(Endpoint::OllamaGenerate, None, ollama).unwrap();
        let expected =
            Sampling { temperature: 0.7, top_k: 50, top_p: 0.9, min_p: 0.05, repetition_penalty: 1.2, seed: u64::MAX };
        assert_eq!((a.sampling, b.sampling), (expected, expected));
        assert_eq!((a.stop, b.stop), (vec!["END".to_string()], vec!["END".to_string()]));
        let r = parse(Endpoint::OpenAiCompletions, None, br#"{"model":"m","prompt":"x","logprobs":3}"#).unwrap();
        assert_eq!(r.logprobs, Some(3));
        let r = parse(
            Endpoint::OpenAiChat,
            None,
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true}"#,
        );
        assert_eq!(r.unwrap().logprobs, Some(0));
        // Unset: greedy, no stops; vLLM's top_k -1 is every id.
        let r = parse(Endpoint::OpenAiCompletions, None, br#"{"model":"m","prompt":"x","top_k":-1}"#).unwrap();
        assert!(r.sampling.is_greedy() && r.sampling.top_k == 0 && r.stop.is_empty());
    }

    #[test]
    fn content_types_json_or_curls_default_for_ollama() {
        let body = br#"{"model":"m","prompt":"hi"}"#;
        assert!(parse(Endpoint::OllamaGenerate, Some("application/x-www-form-urlencoded"), body).is_ok());
        assert!(parse(Endpoint::OpenAiCompletions, Some("application/json; charset=utf-8"), body).is_ok());
        let e = parse(Endpoint::OpenAiCompletions, Some("application/x-www-form-urlencoded"), body).unwrap_err();
        assert_eq!((e.status, e.param.as_str()), (415, "content-type"));
        let e = parse(Endpoint::OllamaGenerate, Some("text/plain"), body).unwrap_err();
        assert_eq!(e.status, 415);
    }

    #[test]
    fn inputs_by_endpoint() {
        let r = parse(Endpoint::OpenAiCompletions, None, br#"{"model":"m","prompt":[[5,6]],"max_tokens":3}"#).unwrap();
        assert_eq!((r.input, r.max_tokens, r.stream), (Input::Tokens(vec![5, 6]), Some(3), false));
        let r = parse(Endpoint::OllamaGenerate, None, br#"{"model":"m","prompt":"hi","system":"be brief"}"#).unwrap();
        assert!(r.stream, "Ollama streams by default");
        let Input::Messages(turns) = r.input else { panic!() };
        assert_eq!(turns.iter().map(|t| t.role.as_str()).collect::<Vec<_>>(), ["system", "user"]);
        let r = parse(Endpoint::OllamaGenerate, None, br#"{"model":"m","prompt":"hi","raw":true}"#).unwrap();
        assert_eq!(r.input, Input::Text("hi".into()));
    }
}
