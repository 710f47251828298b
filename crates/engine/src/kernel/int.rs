//! Exact integer products for the head's greedy screen: AVX-512 VNNI where present, else plain
//! loops the compiler vectorizes; exact integers are the same in any order.

use super::dispatch::{compiled_for_vectors, cpu};
#[cfg(target_arch = "x86_64")]
use super::x86 as simd;
use super::{int_dot, on_cache_lines, BLOCK};
use rayon::prelude::*;

/// `yt[j][r] = Σ_i q[j][i] · p[r][i]` in 32-bit integers, exact: `q` is `out × k` eight-bit
/// weights, `p` is `rows × k` sixteen-bit activations. The caller keeps `k · 127 · max|p|` below
/// 2³¹, so no sum can overflow. Computed transposed (`out × rows`), in parallel over blocks of
/// weight rows. Exact integers are the same in any order, so every build gives the same result.
pub fn int_products(q: &[i8], p: &[i16], rows: usize, k: usize) -> Vec<i32> {
    assert!(k > 0 && q.len().is_multiple_of(k) && p.len() == rows * k, "int_products: shapes do not agree");
    let mut yt = vec![0i32; q.len() / k * rows];
    if rows == 0 {
        return yt;
    }
    on_cache_lines(p, |p| {
        yt.par_chunks_mut(BLOCK * rows).enumerate().for_each(|(b, yt)| {
            int_block(&q[b * BLOCK * k..(b * BLOCK + yt.len() / rows) * k], p, k, yt);
        })
    });
    yt
}

/// One task of [`int_products`]: through AVX-512 VNNI where the CPU has it (one instruction
/// multiplies sixteen pairs of sixteen-bit values and adds each pair's sum to a 32-bit lane),
/// else through plain loops the compiler vectorizes.
pub(super) fn int_block(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if cpu().vnni {
        // SAFETY: the CPU has the instructions (checked above); `int_products` checked the shapes.
        return unsafe { simd::int_block_vnni(q, p, k, yt) };
    }
    int_block_plain(q, p, k, yt)
}

compiled_for_vectors!(
    /// [`int_block`] in plain loops (widen, multiply, add).
    fn int_block_plain(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) => int_block_with
);

#[inline(always)]
pub(super) fn int_block_with(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) {
    let rows = p.len() / k;
    for (qj, yt) in q.chunks_exact(k).zip(yt.chunks_exact_mut(rows)) {
        for (y, p) in yt.iter_mut().zip(p.chunks_exact(k)) {
            *y = int_dot(qj, p);
        }
    }
}
