//! The client's stream parsers alone: a 256-token response as OpenAI server-sent events and as
//! Ollama's newline-delimited JSON, fed whole and in the small reads a slow network gives (16
//! bytes), so a change to the parsers shows its cost per chunk before it shows in a serving run.
//! `cargo bench -p loadgen --bench parsers`; `cargo test` runs each once.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use loadgen::stream::{Event, NdjsonParser, SseParser};
use std::hint::black_box;

const TOKENS: usize = 256;

fn sse_stream() -> Vec<u8> {
    let mut s = String::from(": keep-alive\r\n\r\n");
    s += "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    for i in 0..TOKENS {
        s += &format!(
            "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}}}}]}}\n\n"
        );
    }
    s += "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n";
    s += &format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{TOKENS}}}}}\n\n");
    s += "data: [DONE]\n\n";
    s.into_bytes()
}

fn ndjson_stream() -> Vec<u8> {
    let mut s = String::new();
    for i in 0..TOKENS {
        s += &format!(
            "{{\"model\":\"m\",\"message\":{{\"role\":\"assistant\",\"content\":\" word{i}\"}},\"done\":false}}\n"
        );
    }
    s += &format!("{{\"model\":\"m\",\"done\":true,\"done_reason\":\"length\",\"eval_count\":{TOKENS},\"eval_duration\":1000,\"prompt_eval_count\":12,\"prompt_eval_duration\":10}}\n");
    s.into_bytes()
}

/// Feeds `stream` in reads of `read` bytes; returns the events (so the work is not optimised away).
fn parse(stream: &[u8], read: usize, sse: bool) -> Vec<Event> {
    let mut out = Vec::with_capacity(TOKENS + 8);
    if sse {
        let mut p = SseParser::default();
        stream.chunks(read).for_each(|c| p.feed(c, &mut out));
        p.finish(&mut out);
    } else {
        let mut p = NdjsonParser::default();
        stream.chunks(read).for_each(|c| p.feed(c, &mut out));
        p.finish(&mut out);
    }
    out
}

fn parsers(c: &mut Criterion) {
    for (name, stream, sse) in [("sse", sse_stream(), true), ("ndjson", ndjson_stream(), false)] {
        // The parsers' own check: every token arrives as text, whatever the reads.
        for read in [stream.len(), 16, 1] {
            let texts = parse(&stream, read, sse).iter().filter(|e| matches!(e, Event::Text(_))).count();
            assert_eq!(texts, TOKENS, "{name} in reads of {read} bytes");
        }
        let mut group = c.benchmark_group(format!("parse/{name}"));
        group.throughput(Throughput::Elements(TOKENS as u64));
        for (label, read) in [("whole", stream.len()), ("reads-of-16", 16)] {
            group.bench_function(BenchmarkId::from_parameter(label), |b| {
                b.iter(|| parse(black_box(&stream), read, sse))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, parsers);
criterion_main!(benches);
