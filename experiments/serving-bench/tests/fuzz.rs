//! Property tests of everything the benchmark and the server parse from the network: the
//! server's request validation, and the client's SSE and NDJSON stream parsers. Inputs are
//! generated (arbitrary bytes and JSON) and mutated (valid requests and streams with fields
//! replaced, bytes flipped, pieces cut at random places). None may panic; every rejection must be
//! a one-line error that names its field; a valid stream must parse the same however it is cut.
//!
//! `just test` runs a sample (proptest's default of 256 cases per property, or `PROPTEST_CASES`);
//! `just fuzz` runs 100,000 per property.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use serving_bench::server::request::{parse, Endpoint, Input};
use serving_bench::stream::{Event, NdjsonParser, SseParser};

const ENDPOINTS: [Endpoint; 4] =
    [Endpoint::OpenAiChat, Endpoint::OpenAiCompletions, Endpoint::OllamaChat, Endpoint::OllamaGenerate];

/// Numbers at the edges a client can send: around zero, the integer limits, past them, floats.
fn edge_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-3i64..=3).prop_map(|n| json!(n)),
        Just(json!(u64::MAX)),
        Just(json!(u64::MAX - 1)),
        Just(json!(i64::MIN)),
        Just(json!(u32::MAX as u64 + 1)),
        Just(json!(1e300)),
        Just(json!(-0.0)),
        Just(json!(2.5)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(|f| json!(f)),
    ]
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        edge_number(),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid request for one of the endpoints.
fn valid_request() -> impl Strategy<Value = (Endpoint, Map<String, Value>)> {
    (0..4usize, 1u64..5000, any::<bool>(), ".{1,40}").prop_map(|(e, max, stream, text)| {
        let endpoint = ENDPOINTS[e];
        let mut m = Map::new();
        m.insert("model".into(), json!("m"));
        match endpoint {
            Endpoint::OpenAiChat => {
                m.insert("messages".into(), json!([{"role": "user", "content": text}]));
                m.insert("max_tokens".into(), json!(max));
                m.insert("stream_options".into(), json!({"include_usage": true}));
            }
            Endpoint::OpenAiCompletions => {
                m.insert("prompt".into(), json!(text));
                m.insert("max_tokens".into(), json!(max));
            }
            Endpoint::OllamaChat => {
                m.insert("messages".into(), json!([{"role": "user", "content": text}]));
                m.insert("options".into(), json!({"num_predict": max, "temperature": 0}));
            }
            Endpoint::OllamaGenerate => {
                m.insert("prompt".into(), json!(text));
                m.insert("options".into(), json!({"num_predict": max}));
            }
        }
        m.insert("stream".into(), json!(stream));
        (endpoint, m)
    })
}

/// Checks one parse result: no rejection without a field, a status and one line of text.
fn check(endpoint: Endpoint, body: &[u8]) -> Result<(), TestCaseError> {
    match parse(endpoint, Some("application/json"), body) {
        Ok(r) => {
            prop_assert!(r.max_tokens.is_none_or(|n| n >= 1));
            match &r.input {
                Input::Messages(m) => prop_assert!(!m.is_empty()),
                Input::Text(t) => prop_assert!(!t.is_empty()),
                Input::Tokens(ids) => prop_assert!(!ids.is_empty()),
            }
        }
        Err(e) => {
            prop_assert!([400, 415].contains(&e.status), "{e:?}");
            prop_assert!(!e.param.is_empty() && !e.message.is_empty(), "{e:?}");
            prop_assert!(!e.message.contains('\n'), "{e:?}");
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn arbitrary_bytes_are_refused_with_a_named_field(bytes in prop::collection::vec(any::<u8>(), 0..256), e in 0..4usize) {
        check(ENDPOINTS[e], &bytes)?;
    }

    #[test]
    fn arbitrary_json_is_refused_or_accepted_never_a_panic(value in any_json(), e in 0..4usize) {
        check(ENDPOINTS[e], value.to_string().as_bytes())?;
    }

    #[test]
    fn valid_requests_with_a_field_replaced_name_that_field(
        (endpoint, body) in valid_request(),
        pick in any::<prop::sample::Index>(),
        replacement in any_json(),
        nested in any::<bool>(),
    ) {
        prop_assert!(parse(endpoint, None, Value::Object(body.clone()).to_string().as_bytes()).is_ok());
        let mut mutated = body.clone();
        let key = body.keys().nth(pick.index(body.len())).unwrap().clone();
        // Replace the field itself, or one level inside it (a message's role, an option).
        match (nested, mutated.get_mut(&key)) {
            (true, Some(Value::Object(inner))) if !inner.is_empty() => {
                let k = inner.keys().next().unwrap().clone();
                inner.insert(k, replacement);
            }
            (true, Some(Value::Array(items))) if !items.is_empty() => items[0] = replacement,
            _ => { mutated.insert(key.clone(), replacement); }
        }
        let text = Value::Object(mutated).to_string();
        check(endpoint, text.as_bytes())?;
        if let Err(e) = parse(endpoint, None, text.as_bytes()) {
            // The rejection names the replaced field or something inside it.
            prop_assert!(e.param.starts_with(key.as_str()) || e.param == "body", "replaced `{key}`, rejected `{}`", e.param);
        }
    }

    #[test]
    fn valid_requests_with_bytes_flipped_never_panic(
        (endpoint, body) in valid_request(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = Value::Object(body).to_string().into_bytes();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        check(endpoint, &bytes)?;
    }
}

/// A stream event as a server writes it, and what the parser must make of it.
fn sse_event() -> impl Strategy<Value = (String, Event)> {
    prop_oneof![
        ".{1,16}".prop_map(|t| (
            format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]})),
            Event::Text(t)
        )),
        ".{1,16}"
            .prop_map(|t| (format!("data: {}\n\n", json!({"choices": [{"index": 0, "text": t}]})), Event::Text(t))),
        Just((": keep-alive\n\n".to_string(), Event::NoText)),
        (0u64..1_000_000, 0u64..1_000_000).prop_map(|(p, c)| (
            format!("data: {}\r\n\r\n", json!({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c}})),
            Event::Usage { prompt: Some(p), completion: Some(c) }
        )),
    ]
}

/// Feeds `bytes` to a parser in the pieces `cuts` (ascending) makes, then ends the stream.
fn in_pieces(
    bytes: &[u8],
    cuts: &[usize],
    mut feed: impl FnMut(&[u8], &mut Vec<Event>),
    finish: impl FnOnce(&mut Vec<Event>),
) -> Vec<Event> {
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let cut = cut.clamp(from, bytes.len());
        feed(&bytes[from..cut], &mut out);
        from = cut;
    }
    finish(&mut out);
    out
}

fn parse_sse(bytes: &[u8], cuts: &[usize]) -> Vec<Event> {
    let parser = std::cell::RefCell::new(SseParser::default());
    let mut out =
        in_pieces(bytes, cuts, |b, out| parser.borrow_mut().feed(b, out), |out| parser.borrow_mut().finish(out));
    out.retain(|e| *e != Event::NoText); // comments make no event
    out
}

fn parse_ndjson(bytes: &[u8], cuts: &[usize]) -> Vec<Event> {
    let parser = std::cell::RefCell::new(NdjsonParser::default());
    in_pieces(bytes, cuts, |b, out| parser.borrow_mut().feed(b, out), |out| parser.borrow_mut().finish(out))
}

proptest! {
    #[test]
    fn sse_streams_parse_the_same_however_they_are_cut(
        events in prop::collection::vec(sse_event(), 0..12),
        mut cuts in prop::collection::vec(0usize..2048, 0..24),
    ) {
        let mut text: String = events.iter().map(|(t, _)| t.as_str()).collect();
        text.push_str("data: [DONE]\n\n");
        let mut want: Vec<Event> = events.into_iter().map(|(_, e)| e).filter(|e| *e != Event::NoText).collect();
        want.push(Event::Done);
        cuts.sort();
        prop_assert_eq!(parse_sse(text.as_bytes(), &cuts), want);
    }

    #[test]
    fn ndjson_streams_parse_the_same_however_they_are_cut(
        texts in prop::collection::vec(".{1,16}", 0..12),
        counts in (0u64..100_000, 0u64..10_000_000_000),
        mut cuts in prop::collection::vec(0usize..2048, 0..24),
    ) {
        let mut text: String = texts.iter().map(|t| format!("{}\n", json!({"message": {"role": "assistant", "content": t}, "done": false}))).collect();
        text.push_str(&json!({"message": {"content": ""}, "done": true, "eval_count": counts.0, "eval_duration": counts.1}).to_string());
        cuts.sort();
        let out = parse_ndjson(text.as_bytes(), &cuts);
        prop_assert_eq!(out.len(), texts.len() + 1);
        for (event, t) in out.iter().zip(&texts) {
            prop_assert_eq!(event, &Event::Text(t.clone()));
        }
        match out.last() {
            Some(Event::OllamaDone(c)) => prop_assert_eq!((c.eval_count, c.eval_duration), (Some(counts.0), Some(counts.1))),
            other => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn mutated_streams_never_panic_either_parser(
        events in prop::collection::vec(sse_event(), 0..8),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        mut cuts in prop::collection::vec(0usize..1024, 0..16),
    ) {
        let mut bytes: Vec<u8> = events.iter().flat_map(|(t, _)| t.bytes()).collect();
        if !bytes.is_empty() {
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
        }
        cuts.sort();
        let _ = parse_sse(&bytes, &cuts);
        let _ = parse_ndjson(&bytes, &cuts);
    }

    #[test]
    fn arbitrary_bytes_never_panic_either_parser(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        mut cuts in prop::collection::vec(0usize..512, 0..16),
    ) {
        cuts.sort();
        let _ = parse_sse(&bytes, &cuts);
        let _ = parse_ndjson(&bytes, &cuts);
    }
}
