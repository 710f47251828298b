//! The headers every request carries, and how a header is shown where it is recorded.

/// Why the headers to send could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("--header {0}: write NAME:VALUE with a valid header name and value")]
    Malformed(String),
    #[error("--api-key-env {0}: the variable is not set")]
    NoKey(String),
    #[error("--api-key-env {0}: the key cannot be a header value")]
    BadKey(String),
}

/// The headers every request carries: each `NAME:VALUE` of `specs`, and `Authorization: Bearer`
/// with the API key from the variable `api_key_env` (default `OPENAI_API_KEY`, when set) unless
/// a header gives one. No value is recorded: the second value lists the headers' names, which
/// the artifact records, and the command line is recorded with each value redacted
/// ([`recorded_header`]) unless its name is in `recorded` (`--record-header`). Unrecorded values
/// of six characters or more, and the key, are also redacted wherever else they would appear
/// (a server's error message echoing one); shorter ones would match ordinary words.
pub fn request_headers(
    specs: &[String],
    recorded: &[String],
    api_key_env: Option<&str>,
) -> Result<(reqwest::header::HeaderMap, Vec<String>), HeaderError> {
    use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
    let mut headers = HeaderMap::new();
    for spec in specs {
        let malformed = || HeaderError::Malformed(recorded_header(spec, recorded));
        let (name, value) = spec.split_once(':').ok_or_else(malformed)?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| malformed())?;
        let value = value.trim();
        if !is_recorded(name.as_str(), recorded) && value.len() >= 6 {
            records::artifact::keep_secret(value);
        }
        headers.append(name, HeaderValue::from_str(value).map_err(|_| malformed())?);
    }
    let variable = api_key_env.unwrap_or("OPENAI_API_KEY");
    match std::env::var(variable) {
        Ok(key) if !key.is_empty() => {
            records::artifact::keep_secret(&key);
            if !headers.contains_key(AUTHORIZATION) {
                let value = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| HeaderError::BadKey(variable.to_string()))?;
                headers.insert(AUTHORIZATION, value);
            }
        }
        _ if api_key_env.is_some() => return Err(HeaderError::NoKey(variable.to_string())),
        _ => {}
    }
    let mut names: Vec<String> = headers.keys().map(|k| k.as_str().to_string()).collect();
    names.dedup();
    Ok((headers, names))
}

fn is_recorded(name: &str, recorded: &[String]) -> bool {
    recorded.iter().any(|r| r.trim().eq_ignore_ascii_case(name.trim()))
}

/// A `--header NAME:VALUE` as artifacts and printed lines show it: `NAME:<redacted>`, unless
/// NAME is one the user marked with `--record-header`. A header value can be anything a server
/// takes as a credential (`X-Password`, `X-Signature`, a session id), and no list of
/// credential-like names is complete, so none is recorded unless asked.
pub fn recorded_header(spec: &str, recorded: &[String]) -> String {
    match spec.split_once(':') {
        Some((name, _)) if is_recorded(name, recorded) => spec.to_string(),
        Some((name, _)) => format!("{name}:<redacted>"),
        None => spec.to_string(),
    }
}
