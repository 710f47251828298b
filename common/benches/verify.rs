//! Verifying a checkpoint should cost about what reading it costs. Prints, from one run on the
//! generated `qwen2.5-0.5b` checkpoint (988 MB, generated on first use): plain block reads, SHA-256
//! of the weights file, and a full pin verification, each the best of three after a warm-up read
//! (so all three read from the page cache and the difference is the hashing).

use common::digest::{file_digest, Algorithm};
use common::resolve::{resolve, ResolveOptions};
use common::workspace::Workspace;
use std::io::Read;
use std::time::{Duration, Instant};

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> Duration {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn main() {
    let ws = Workspace::discover().expect("run from the workspace");
    let pin = ws.model_pin("qwen2.5-0.5b").unwrap();
    let model = resolve(&ws, &pin, &ResolveOptions { generate_missing: true, offline: true, ..Default::default() })
        .expect("generate or verify the qwen2.5-0.5b checkpoint");
    let weights = model.dir.join("model.safetensors");
    let bytes = std::fs::metadata(&weights).unwrap().len() as f64;

    let read = || {
        let mut f = std::fs::File::open(&weights).unwrap();
        let mut buf = vec![0u8; 4 << 20];
        let mut n = 0usize;
        loop {
            let k = f.read(&mut buf).unwrap();
            if k == 0 {
                break n;
            }
            n += k;
        }
    };
    read(); // warm the page cache
    let t_read = best_of(3, read);
    let t_sha = best_of(3, || file_digest(&weights, Algorithm::Sha256).unwrap());
    let t_verify = best_of(3, || pin.verify(&model.dir).unwrap());
    let mbs = |t: Duration| bytes / t.as_secs_f64() / 1e6;
    println!("checkpoint verification, {:.0} MB of weights ({} files pinned)", bytes / 1e6, pin.files.len());
    println!("  read only           {:>8.3} s  {:>7.0} MB/s", t_read.as_secs_f64(), mbs(t_read));
    println!("  sha256 weights      {:>8.3} s  {:>7.0} MB/s", t_sha.as_secs_f64(), mbs(t_sha));
    println!("  verify all files    {:>8.3} s  {:>7.0} MB/s", t_verify.as_secs_f64(), mbs(t_verify));
    println!("  verify / read       {:>8.2}x", t_verify.as_secs_f64() / t_read.as_secs_f64());
}
