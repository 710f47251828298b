//! Digests alone, from memory and from a warm file (64 MiB), for both of the Hub's algorithms:
//! the hashing rate bounds how far checkpoint verification can keep up with reading (the
//! `verify` benchmark in `common` measures the whole verification against plain reads).
//! `cargo bench -p supply --bench digest`; `cargo test` runs each once.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use supply::digest::{bytes_digest, file_digest, Algorithm};

const SIZE: usize = 64 << 20;

fn digests(c: &mut Criterion) {
    let bytes: Vec<u8> = (0..SIZE).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("weights.bin");
    std::fs::write(&path, &bytes).expect("write the benchmark file");

    let mut group = c.benchmark_group("digest");
    group.throughput(Throughput::Bytes(SIZE as u64));
    for algo in [Algorithm::Sha256, Algorithm::GitSha1] {
        group.bench_function(BenchmarkId::new("memory", algo.name()), |b| {
            b.iter(|| bytes_digest(black_box(&bytes), algo))
        });
        group.bench_function(BenchmarkId::new("file", algo.name()), |b| {
            b.iter(|| file_digest(black_box(&path), algo).expect("read the benchmark file"))
        });
    }
    group.finish();
}

criterion_group! {
    name = digest;
    config = Criterion::default().sample_size(10);
    targets = digests
}
criterion_main!(digest);
