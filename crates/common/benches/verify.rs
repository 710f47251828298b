//! Verifying a checkpoint should cost about what reading it costs. Prints, from one run on the
//! generated `qwen2.5-0.5b` checkpoint (988 MB, generated on first use): plain block reads and a
//! full pin verification, from a cold page cache when this process may drop it (root on Linux),
//! and from a warm one, where the difference is the hashing alone.

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

#[cfg(target_arch = "x86_64")]
fn sha_extensions() -> &'static str {
    if std::arch::is_x86_feature_detected!("sha") {
        "yes"
    } else {
        "no"
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn sha_extensions() -> &'static str {
    "not an x86-64 CPU"
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
    // Dropping the page cache needs root; without it only warm numbers are shown.
    let drop_cache = || {
        let _ = std::process::Command::new("sync").status();
        std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
    };
    let mbs = |t: Duration| bytes / t.as_secs_f64() / 1e6;
    println!(
        "checkpoint verification, {:.0} MB of weights ({} files pinned), SHA extensions: {}",
        bytes / 1e6,
        pin.files.len(),
        sha_extensions()
    );
    if drop_cache() {
        let cold_read = best_of(1, read);
        drop_cache();
        let cold_verify = best_of(1, || pin.verify(&model.dir).unwrap());
        println!("  cold read           {:>8.3} s  {:>7.0} MB/s", cold_read.as_secs_f64(), mbs(cold_read));
        println!("  cold verify         {:>8.3} s  {:>7.0} MB/s", cold_verify.as_secs_f64(), mbs(cold_verify));
        println!("  cold verify / read  {:>8.2}x", cold_verify.as_secs_f64() / cold_read.as_secs_f64());
    } else {
        println!("  (page cache not droppable here: cold numbers skipped)");
    }
    read();
    let t_read = best_of(3, read);
    let t_sha = best_of(3, || file_digest(&weights, Algorithm::Sha256).unwrap());
    let t_verify = best_of(3, || pin.verify(&model.dir).unwrap());
    println!("  warm read           {:>8.3} s  {:>7.0} MB/s", t_read.as_secs_f64(), mbs(t_read));
    println!("  warm sha256         {:>8.3} s  {:>7.0} MB/s", t_sha.as_secs_f64(), mbs(t_sha));
    println!("  warm verify         {:>8.3} s  {:>7.0} MB/s", t_verify.as_secs_f64(), mbs(t_verify));
}
