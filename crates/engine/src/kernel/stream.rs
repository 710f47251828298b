//! How fast this machine's threads can read memory: the ceiling that a decode step, which streams
//! every weight once, is judged against (`engine-bench` records both, pair by pair).

use super::dispatch::compiled_for_vectors;
use rayon::prelude::*;
use std::time::Instant;

/// Values summed per parallel task: 256 KiB, enough that scheduling costs nothing next to the
/// read, small enough that both threads finish together.
const CHUNK: usize = 1 << 16;
/// Independent running sums: four 512-bit vectors, so the adds never wait on each other and the
/// loop asks for lines as fast as the memory can deliver them.
const LANES: usize = 64;

/// A buffer larger than any cache, resident (every page written), on huge pages like the weights.
pub struct ReadProbe {
    buf: Vec<f32>,
    offset: usize,
}

impl ReadProbe {
    /// The bytes a probe asked for `bytes` reads: whole chunks, at least one.
    pub fn bytes_for(bytes: usize) -> usize {
        (bytes / std::mem::size_of::<f32>() / CHUNK).max(1) * CHUNK * std::mem::size_of::<f32>()
    }

    /// A probe of `bytes` ([`Self::bytes_for`]).
    pub fn new(bytes: usize) -> candle_core::Result<Self> {
        let len = Self::bytes_for(bytes) / std::mem::size_of::<f32>();
        let (mut buf, offset) = crate::memory::aligned_buffer::<f32>(len)?;
        // Written, not only allocated: an untouched page reads as the kernel's shared zero page,
        // from cache, and would flatter the rate.
        buf[offset..].fill(1.0);
        Ok(ReadProbe { buf, offset })
    }

    /// The bytes one pass reads.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&self.buf[self.offset..])
    }

    /// One pass over the whole buffer on the engine's threads, as a forward runs: bytes per second.
    pub fn read_rate(&self) -> f64 {
        let values = &self.buf[self.offset..];
        let start = Instant::now();
        let total: f32 = super::on_pool(|| {
            values
                .par_chunks(CHUNK)
                .map(|c| {
                    let mut s = 0.0;
                    sum(c, &mut s);
                    s
                })
                .sum()
        });
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(total);
        self.bytes() as f64 / seconds
    }
}

compiled_for_vectors!(
    /// The sum of `x` into `out`, in `LANES` independent sums (vector lanes in every build).
    fn sum(x: &[f32], out: &mut f32) => sum_plain
);

fn sum_plain(x: &[f32], out: &mut f32) {
    let mut acc = [0f32; LANES];
    let mut rows = x.chunks_exact(LANES);
    for row in &mut rows {
        for (a, v) in acc.iter_mut().zip(row) {
            *a += v;
        }
    }
    *out = acc.iter().sum::<f32>() + rows.remainder().iter().sum::<f32>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_reads_every_value_of_the_buffer_once() {
        let probe = ReadProbe::new(3 * CHUNK * 4 + 100).unwrap();
        assert_eq!(probe.bytes(), 3 * CHUNK * 4, "rounded down to whole chunks");
        // Ones sum exactly (well below 2^24 per lane), so the sum counts the values read.
        let values = &probe.buf[probe.offset..];
        let mut s = 0.0;
        sum(values, &mut s);
        assert_eq!(s, values.len() as f32);
        assert!(probe.read_rate() > 0.0);
    }
}
