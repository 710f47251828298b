//! Property tests of the server's request validation, on what a client can send: arbitrary bytes
//! and JSON, and valid requests with a field replaced or bytes flipped. None may panic; every
//! rejection must be a one-line error that names its field.
//!
//! `just test` runs a sample (proptest's default of 256 cases per property, or `PROPTEST_CASES`);
//! `just fuzz` runs 100,000 per property.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use serve::request::{parse, Endpoint, Input};

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
