//! What a server says about itself before any request is measured: its version, its model,
//! and which model it serves when none is named.

use super::{describe, redacted, url, Http, Timeouts};
use crate::record::{Kind, Runtime};
use serde_json::{json, Value};
use std::time::Duration;

/// Why a server's metadata gave no JSON. URLs are shown with their credentials redacted.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{}: {}", redacted(url), describe(cause))]
    Request { url: String, cause: reqwest::Error },
    #[error("{}: no answer within {} s (--timeout)", redacted(url), timeout.as_secs_f64())]
    Silent { url: String, timeout: Duration },
    #[error("{}: HTTP {status}", redacted(url))]
    Status { url: String, status: reqwest::StatusCode },
    #[error("{} lists no model; pass --model-name", redacted(url))]
    NoModel { url: String },
}

impl FetchError {
    /// Whether the server never answered: nothing listened, or it accepted and stayed silent.
    fn unanswered(&self) -> bool {
        match self {
            FetchError::Silent { .. } => true,
            FetchError::Request { cause, .. } => cause.is_connect() || cause.is_timeout(),
            _ => false,
        }
    }
}

/// The model a server serves when none was named: the first it lists (the call bounded by the
/// run's `--timeout`).
pub async fn discover_model(client: &Http, kind: Kind, base: &str, timeouts: &Timeouts) -> Result<String, FetchError> {
    let (path, pointer) = match kind {
        Kind::OpenAi => ("/v1/models", "/data/0/id"),
        Kind::Ollama => ("/api/tags", "/models/0/name"),
    };
    let v: Value = fetch_json(client.get(url(base, path)), &url(base, path), timeouts.total).await?;
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| FetchError::NoModel { url: format!("{base}{path}") })
}

/// One metadata call, headers and body together within `limit`: a server that accepts the
/// connection and never answers costs the run `limit`, not forever.
pub(super) async fn fetch_json(
    request: reqwest::RequestBuilder,
    url: &str,
    limit: Duration,
) -> Result<Value, FetchError> {
    let call = async {
        let request_error = |cause| FetchError::Request { url: url.to_string(), cause };
        let r = request.send().await.map_err(request_error)?;
        if !r.status().is_success() {
            return Err(FetchError::Status { url: url.to_string(), status: r.status() });
        }
        r.json().await.map_err(request_error)
    };
    tokio::time::timeout(limit, call).await.unwrap_or(Err(FetchError::Silent { url: url.to_string(), timeout: limit }))
}

/// The server's version and what it says about the model (recorded as given; `null` with the
/// reason when a server does not say). The calls run side by side, each within `--timeout`. A
/// target that answers none of them (nothing listens, or it accepts and stays silent) is an
/// error: measuring it would only time out, request after request.
pub async fn metadata(client: &Http, target: &Runtime, timeouts: &Timeouts) -> Result<(Value, Value), FetchError> {
    let limit = timeouts.total;
    let get = |path: &str| {
        let url = url(&target.base_url, path);
        async move { fetch_json(client.get(&url), &url, limit).await }
    };
    let (version, about) = match target.kind {
        Kind::OpenAi => {
            let version = async {
                match get("/version").await {
                    // llama.cpp's server has no /version; it says its build under /props.
                    Err(e @ FetchError::Status { .. }) => match get("/props").await {
                        Ok(props) if props.get("build_info").is_some() => {
                            Ok(json!({"build_info": props["build_info"]}))
                        }
                        _ => Err(e),
                    },
                    other => other,
                }
            };
            tokio::join!(version, get("/v1/models"))
        }
        Kind::Ollama => {
            let show_url = url(&target.base_url, "/api/show");
            let show = fetch_json(client.post(&show_url).json(&json!({"model": target.model})), &show_url, limit);
            tokio::join!(get("/api/version"), show)
        }
    };
    match (version, about) {
        (Err(e), Err(other)) if e.unanswered() && other.unanswered() => Err(e),
        (version, about) => {
            let note = |e: FetchError| json!({"unavailable": e.to_string()});
            Ok((version.unwrap_or_else(note), about.unwrap_or_else(note)))
        }
    }
}
