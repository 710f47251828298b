//! The kernels alone, on the 0.5B model's shapes: a projection in rows (the head's way) and in
//! panels (the layers' way; BF16's paired) for one, four and 64 activation rows (a decode step, a
//! batch, a prefill chunk) and each weight type, the same from each GGUF block format, the head
//! screen's integer products, attention of one new position over a 1024-position cache, and the
//! MLP activation. `cargo bench -p engine --bench kernels` (criterion keeps the history under
//! `target/criterion/` and reports the change from the last run); `cargo test` runs each once.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::kernel::{
    attend_each, int_products, linear, quant_linear, silu_mul, Attending, AttentionShape, Format, Layout, QuantMatrix,
    Weight, TILE,
};
use half::{bf16, f16};
use std::hint::black_box;

/// The 0.5B shape: hidden 896, MLP 4864 (gate and up: 9728 outputs), 14 query and 2 KV heads of 64.
const HIDDEN: usize = 896;
const GATE_UP: usize = 9728;

/// Deterministic values in [-1, 1): the kernels' cost does not depend on them.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn projection<W: Weight>(c: &mut Criterion, name: &str, widen: fn(f32) -> W, panels: Layout) {
    let mut group = c.benchmark_group(format!("linear/{name}"));
    let w: Vec<W> = data(GATE_UP * HIDDEN, 1).into_iter().map(widen).collect();
    group.throughput(Throughput::Bytes((w.len() * std::mem::size_of::<W>()) as u64));
    for (label, layout) in [("rows", Layout::rows(HIDDEN)), ("panels", panels)] {
        let laid = layout.arrange(&w);
        for rows in [1, 4, 64] {
            let x = data(rows * HIDDEN, 2);
            group.bench_function(BenchmarkId::new(label, rows), |b| {
                b.iter(|| linear(black_box(&laid), layout, None, black_box(&x), rows))
            });
        }
    }
    group.finish();
}

fn projections(c: &mut Criterion) {
    projection::<f32>(c, "f32", |v| v, Layout::panels(HIDDEN));
    projection::<f16>(c, "f16", f16::from_f32, Layout::panels(HIDDEN));
    projection::<bf16>(c, "bf16", bf16::from_f32, Layout::paired_panels(HIDDEN));
}

/// The gate and up projection from blocks of each format, the bytes random but for each block's
/// scale (and minimum), which are kept finite and small.
fn quantized(c: &mut Criterion) {
    for format in [Format::Q8_0, Format::Q4_0, Format::Q4_1] {
        let mut group = c.benchmark_group(format!("quant/{}", format.name()));
        let block = format.block_bytes();
        let blocks = GATE_UP * HIDDEN / 32;
        let mut bytes: Vec<u8> = data(blocks * block, 9).iter().map(|v| (v * 127.0) as i8 as u8).collect();
        for b in bytes.chunks_exact_mut(block) {
            b[..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            if format == Format::Q4_1 {
                b[2..4].copy_from_slice(&f16::from_f32(-0.05).to_le_bytes());
            }
        }
        let m = QuantMatrix { bytes: &bytes, format, rows: GATE_UP, k: HIDDEN, order: None };
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        for rows in [1, 4, 64] {
            let x = data(rows * HIDDEN, 2);
            group.bench_function(BenchmarkId::new("rows", rows), |b| {
                b.iter(|| quant_linear(std::slice::from_ref(&m), None, black_box(&x), rows))
            });
        }
        group.finish();
    }
}

fn screen(c: &mut Criterion) {
    // The head's screen: 151,936 vocabulary rows of eight-bit weights against one sixteen-bit row.
    let (vocab, rows) = (151_936, 1);
    let q: Vec<i8> = data(vocab * HIDDEN, 3).iter().map(|v| (v * 127.0) as i8).collect();
    let p: Vec<i16> = data(rows * HIDDEN, 4).iter().map(|v| (v * 1000.0) as i16).collect();
    let mut group = c.benchmark_group("int_products");
    group.throughput(Throughput::Bytes(q.len() as u64));
    group.bench_function("head", |b| b.iter(|| int_products(black_box(&q), black_box(&p), rows, HIDDEN)));
    group.finish();
}

fn attention(c: &mut Criterion) {
    let (heads, kv_heads, d, capacity) = (14, 2, 64, 4096usize);
    let q = data(capacity * heads * d, 5);
    let (k, v) = (data(kv_heads * capacity * d, 6), data(kv_heads * capacity * d, 7));
    // The tiles of blocks laid out one after another, KV head by KV head.
    fn tiles(all: &[f32], d: usize) -> Vec<&[f32]> {
        all.chunks_exact(TILE * d).collect()
    }
    let (key_tiles, value_tiles) = (tiles(&k, d), tiles(&v, d));
    let mut group = c.benchmark_group("attend_each");
    // One decoding row at three contexts, and whole prefills of 1024 and 4096 positions.
    for (len, rows) in [(128, 1), (1024, 1), (capacity, 1), (1024, 1024), (capacity, capacity)] {
        let shape = AttentionShape { heads, kv_heads, len, rows, d };
        let (n, per_head) = (len.div_ceil(TILE), capacity / TILE);
        let pick = |all: &[&[f32]]| -> Vec<f32> {
            (0..kv_heads).flat_map(|h| all[h * per_head..h * per_head + n].concat()).collect()
        };
        let (key_data, value_data) = (pick(&key_tiles), pick(&value_tiles));
        let (keys, values) = (tiles(&key_data, d), tiles(&value_data, d));
        let item = Attending { q: &q[..rows * heads * d], keys: &keys, values: &values, shape };
        group.bench_function(BenchmarkId::new(format!("rows-{rows}"), len), |b| {
            b.iter(|| attend_each(black_box(std::slice::from_ref(&item)), 0.125))
        });
    }
    group.finish();
}

fn activation(c: &mut Criterion) {
    // A decode step of four sessions, and a prefill chunk.
    for rows in [4, 256] {
        let gate_up = data(rows * GATE_UP, 8);
        c.bench_function(&format!("silu_mul/{rows}"), |b| b.iter(|| silu_mul(black_box(&gate_up), rows)));
    }
}

criterion_group! {
    name = kernels;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(500));
    targets = projections, quantized, screen, attention, activation
}
criterion_main!(kernels);
