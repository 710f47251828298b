//! Strict streaming parsers for the two wire formats: OpenAI's server-sent events and Ollama's
//! newline-delimited JSON. Both are fed raw bytes as they arrive, in pieces of any size (one byte
//! at a time included), and emit protocol events; they never panic on input.
//!
//! SSE (per the HTML standard's event-stream grammar): lines end in CRLF, LF or CR, even when a
//! CR and its LF arrive in different reads; `:` starts a comment; `data:` lines accumulate until
//! a blank line dispatches the event; `event: error` marks an error event; `data: [DONE]` ends
//! the stream. An event left undispatched at end of stream is dropped, as the standard says.

/// What one protocol event told us.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Generated text, non-empty.
    Text(String),
    /// A chunk without generated text (role-only, usage-only, empty content).
    NoText,
    /// OpenAI usage: prompt and completion tokens.
    Usage { prompt: Option<u64>, completion: Option<u64> },
    /// The choice finished, with this reason.
    Finish(String),
    /// Ollama's final object with its counters.
    OllamaDone(OllamaCounters),
    /// SSE's `[DONE]` marker.
    Done,
    /// The server reported an error inside the stream.
    Error(String),
    /// A line or event that is not the promised JSON.
    BadJson(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct OllamaCounters {
    pub done_reason: Option<String>,
    pub eval_count: Option<u64>,
    pub eval_duration: Option<u64>,
    pub prompt_eval_count: Option<u64>,
    pub prompt_eval_duration: Option<u64>,
}

/// Splits bytes into lines ending in CRLF, LF or CR, across reads.
#[derive(Debug, Default)]
struct Lines {
    buf: Vec<u8>,
    /// The previous read ended in CR: a leading LF now belongs to it.
    pending_cr: bool,
}

impl Lines {
    fn feed(&mut self, mut bytes: &[u8], mut line: impl FnMut(&[u8])) {
        if self.pending_cr {
            self.pending_cr = false;
            if bytes.first() == Some(&b'\n') {
                bytes = &bytes[1..];
            }
        }
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\n' | b'\r' => {
                    self.buf.extend_from_slice(&bytes[start..i]);
                    line(&self.buf);
                    self.buf.clear();
                    if bytes[i] == b'\r' {
                        if i + 1 == bytes.len() {
                            self.pending_cr = true;
                        } else if bytes[i + 1] == b'\n' {
                            i += 1;
                        }
                    }
                    start = i + 1;
                }
                _ => {}
            }
            i += 1;
        }
        self.buf.extend_from_slice(&bytes[start..]);
    }

    /// What is left after the last line break.
    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// OpenAI-style server-sent events.
#[derive(Debug, Default)]
pub struct SseParser {
    lines: Lines,
    data: Vec<String>,
    event: Option<String>,
}

impl SseParser {
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        let (data, event) = (&mut self.data, &mut self.event);
        self.lines.feed(bytes, |line| sse_line(line, data, event, out));
    }

    /// End of stream: an undispatched event is dropped (the standard's rule).
    pub fn finish(&mut self, _out: &mut [Event]) {
        self.lines.rest();
        self.data.clear();
        self.event = None;
    }
}

fn sse_line(line: &[u8], data: &mut Vec<String>, event: &mut Option<String>, out: &mut Vec<Event>) {
    let line = String::from_utf8_lossy(line);
    if line.is_empty() {
        if !data.is_empty() {
            let payload = data.join("\n");
            data.clear();
            let is_error = event.as_deref() == Some("error");
            *event = None;
            dispatch_sse(&payload, is_error, out);
        } else {
            *event = None;
        }
        return;
    }
    if line.starts_with(':') {
        return; // comment
    }
    let (field, value) = match line.split_once(':') {
        Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
        None => (line.as_ref(), ""),
    };
    match field {
        "data" => data.push(value.to_string()),
        "event" => *event = Some(value.to_string()),
        _ => {} // id, retry and unknown fields carry nothing we measure
    }
}

fn dispatch_sse(payload: &str, is_error: bool, out: &mut Vec<Event>) {
    if payload.trim() == "[DONE]" {
        return out.push(Event::Done);
    }
    let value: serde_json::Value = match serde_json::from_str(payload) {
        Ok(v) => v,
        Err(e) if is_error => return out.push(Event::Error(format!("{payload} ({e})"))),
        Err(e) => return out.push(Event::BadJson(format!("{e}: {}", clip(payload)))),
    };
    if is_error || value.get("error").is_some_and(|e| !e.is_null()) {
        return out.push(Event::Error(error_message(&value)));
    }
    let before = out.len();
    if let Some(choice) = value.get("choices").and_then(|c| c.as_array()).and_then(|c| c.first()) {
        let text =
            choice.pointer("/delta/content").or_else(|| choice.get("text")).and_then(|t| t.as_str()).unwrap_or("");
        if !text.is_empty() {
            out.push(Event::Text(text.to_string()));
        }
        if let Some(reason) = choice.get("finish_reason").and_then(|r| r.as_str()) {
            out.push(Event::Finish(reason.to_string()));
        }
    }
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        out.push(Event::Usage {
            prompt: usage.get("prompt_tokens").and_then(|v| v.as_u64()),
            completion: usage.get("completion_tokens").and_then(|v| v.as_u64()),
        });
    }
    if out.len() == before {
        out.push(Event::NoText);
    }
}

fn error_message(value: &serde_json::Value) -> String {
    let e = value.get("error").unwrap_or(value);
    e.get("message")
        .and_then(|m| m.as_str())
        .map(str::to_string)
        .or_else(|| e.as_str().map(str::to_string))
        .unwrap_or_else(|| e.to_string())
}

fn clip(s: &str) -> String {
    s.chars().take(120).collect()
}

/// Ollama's newline-delimited JSON.
#[derive(Debug, Default)]
pub struct NdjsonParser {
    lines: Lines,
}

impl NdjsonParser {
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        self.lines.feed(bytes, |line| ndjson_line(line, out));
    }

    /// End of stream: a last line without a newline still counts.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        let rest = self.lines.rest();
        ndjson_line(&rest, out);
    }
}

fn ndjson_line(line: &[u8], out: &mut Vec<Event>) {
    let text = String::from_utf8_lossy(line);
    if text.trim().is_empty() {
        return;
    }
    let value: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return out.push(Event::BadJson(format!("{e}: {}", clip(&text)))),
    };
    if value.get("error").is_some_and(|e| !e.is_null()) {
        return out.push(Event::Error(error_message(&value)));
    }
    let content =
        value.pointer("/message/content").or_else(|| value.get("response")).and_then(|c| c.as_str()).unwrap_or("");
    if !content.is_empty() {
        out.push(Event::Text(content.to_string()));
    }
    if value.get("done").and_then(|d| d.as_bool()) == Some(true) {
        let n = |k: &str| value.get(k).and_then(|v| v.as_u64());
        out.push(Event::OllamaDone(OllamaCounters {
            done_reason: value.get("done_reason").and_then(|d| d.as_str()).map(str::to_string),
            eval_count: n("eval_count"),
            eval_duration: n("eval_duration"),
            prompt_eval_count: n("prompt_eval_count"),
            prompt_eval_duration: n("prompt_eval_duration"),
        }));
    } else if content.is_empty() {
        out.push(Event::NoText);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAI: &str = ": keep-alive comment\r\n\r\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\r\n\r\n\
        event: message\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\r\n\r\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"length\"}]}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\r\r\
        data: [DONE]\n\n";

    fn expected_openai() -> Vec<Event> {
        vec![
            Event::NoText,
            Event::Text("Hel".into()),
            Event::Text("lo".into()),
            Event::Finish("length".into()),
            Event::Usage { prompt: Some(9), completion: Some(2) },
            Event::Done,
        ]
    }

    fn sse_in_pieces(input: &[u8], piece: usize) -> Vec<Event> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            p.feed(chunk, &mut out);
        }
        p.finish(&mut out);
        out
    }

    #[test]
    fn sse_is_the_same_whatever_the_fragmentation() {
        for piece in [1, 2, 3, 7, 64, OPENAI.len()] {
            assert_eq!(sse_in_pieces(OPENAI.as_bytes(), piece), expected_openai(), "pieces of {piece}");
        }
    }

    #[test]
    fn sse_errors_bad_json_and_multiline_data() {
        let input = "event: error\ndata: {\"message\":\"overloaded\"}\n\n\
                     data: {\"error\":{\"message\":\"boom\"}}\n\n\
                     data: {not json\n\n\
                     data: {\"choices\":[{\"delta\":{\"content\":\n\
                     data: \"x\"}}]}\n\n\
                     data: {\"choices\":[{\"delta\":{\"content\":\"lost\"}}]}";
        let out = sse_in_pieces(input.as_bytes(), 5);
        assert_eq!(out[0], Event::Error("overloaded".into()));
        assert_eq!(out[1], Event::Error("boom".into()));
        assert!(matches!(out[2], Event::BadJson(_)));
        assert_eq!(out[3], Event::Text("x".into()));
        assert_eq!(out.len(), 4, "an event without its blank line is dropped at the end: {out:?}");
    }

    #[test]
    fn ndjson_in_any_pieces_with_counters() {
        let input = "{\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\r\n\
                     {\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":false}\n\
                     {\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"eval_count\":3,\"eval_duration\":1000,\"prompt_eval_count\":7,\"prompt_eval_duration\":500}";
        for piece in [1, 4, input.len()] {
            let mut p = NdjsonParser::default();
            let mut out = Vec::new();
            for c in input.as_bytes().chunks(piece) {
                p.feed(c, &mut out);
            }
            p.finish(&mut out);
            assert_eq!(out.len(), 3, "{out:?}");
            assert_eq!(out[0], Event::Text("Hi".into()));
            assert_eq!(out[1], Event::NoText);
            let Event::OllamaDone(c) = &out[2] else { panic!("{out:?}") };
            assert_eq!(
                (c.eval_count, c.prompt_eval_duration, c.done_reason.as_deref()),
                (Some(3), Some(500), Some("stop"))
            );
        }
        let mut p = NdjsonParser::default();
        let mut out = Vec::new();
        p.feed(b"{\"error\":\"model not found\"}\n{oops}\n", &mut out);
        assert_eq!(out[0], Event::Error("model not found".into()));
        assert!(matches!(out[1], Event::BadJson(_)));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 7u64;
        for _ in 0..200 {
            let bytes: Vec<u8> = (0..64)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    const ALPHABET: &[u8] = b"data: {}[]\r\n:\"event error DONE";
                    ALPHABET[(seed >> 33) as usize % ALPHABET.len()]
                })
                .collect();
            let mut out = Vec::new();
            SseParser::default().feed(&bytes, &mut out);
            NdjsonParser::default().feed(&bytes, &mut out);
        }
    }
}
