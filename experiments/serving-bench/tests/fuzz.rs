//! Property tests of the client's SSE and NDJSON stream parsers, on what a server can send:
//! valid streams cut at random places, streams with bytes flipped, arbitrary bytes. None may
//! panic, and a valid stream must parse the same however it is cut. (The server's request
//! validation has its own, in the `serve` crate.)
//!
//! `just test` runs a sample (proptest's default of 256 cases per property, or `PROPTEST_CASES`);
//! `just fuzz` runs 100,000 per property.

use loadgen::stream::{Event, NdjsonParser, SseParser};
use proptest::prelude::*;
use serde_json::json;

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
