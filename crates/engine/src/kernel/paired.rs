//! BF16 weights in paired panels ([`super::Layout::paired_panels`]), their products as BF16 dot
//! products: the activations rounded to BF16, each pair of products added to an F32 accumulator,
//! the odd input's first, as AVX-512 BF16's `vdpbf16ps` computes them.
//!
//! Why: a prefill's products are bound by the multipliers, not by memory. With F32 activations a
//! BF16 weight is widened and takes one multiply-add per lane, as an F32 weight does, so BF16
//! weights prefilled no faster than F32 ones; `vdpbf16ps` does two products per lane in one
//! instruction. The price is the activations' precision in the product (eight bits of mantissa;
//! the sums stay F32): a BF16 model no longer computes an F32 model's logits on a BF16 checkpoint,
//! and the experiments record where its ids leave the F32 ids.
//!
//! The instruction's arithmetic, which every path here does exactly (the tests hold the
//! instruction to the portable path bit for bit): for lane `j`, `acc + a[2j+1]·b[2j+1]` rounded
//! to nearest, then that plus `a[2j]·b[2j]` rounded; a product of two BF16 values is exact in F32,
//! so each step is one fused multiply-add. Inputs below F32's normal range read as zero, and
//! results below it are written as a zero of their sign. The activations are rounded once, to
//! nearest even (subnormals to zero), so an output still depends only on its own rows: a row's
//! bits are the same alone, in any batch and in any chunk.

use super::dispatch::{compiled_for_vectors, cpu};
use super::Outputs;
use super::PANEL;
use half::bf16;
use rayon::prelude::*;

/// [`super::linear`]'s product for BF16 weights in paired panels: `x` (`rows × k`) rounded to
/// BF16, then one task per panel.
pub(super) fn in_panels(w: &[bf16], k: usize, x: &[f32], rows: usize) -> Vec<f32> {
    let (out, pairs) = (w.len() / k, k / 2);
    let xp = round_pairs(x);
    let mut y = vec![0f32; rows * out];
    let outputs = Outputs(y.as_mut_ptr());
    w.par_chunks(PANEL * k).enumerate().for_each(|(p, w)| {
        // SAFETY: panel `p` is `w`; its outputs are columns `p·PANEL..` (as many as its rows) of
        // each of `y`'s `rows` rows of `out`: inside `y`, which outlives this region, and written
        // by no other task.
        unsafe { panel(w, &xp, rows, pairs, outputs.at(p * PANEL), out) }
    });
    y
}

/// `x` rounded to BF16, two to a word: input `2i` in the low half, `2i + 1` in the high one (the
/// order of a dot product's operand).
pub(super) fn round_pairs(x: &[f32]) -> Vec<u32> {
    x.chunks_exact(2).map(|p| u32::from(to_bf16(p[0])) | u32::from(to_bf16(p[1])) << 16).collect()
}

/// `v` to BF16, nearest even; a subnormal result as the zero of its sign, as the dot product
/// would read it.
fn to_bf16(v: f32) -> u16 {
    let b = bf16::from_f32(v).to_bits();
    if b & 0x7f80 == 0 {
        b & 0x8000
    } else {
        b
    }
}

/// One panel's products, written at `y + r · stride` for each row `r` of `xp` (rows of `pairs`
/// words).
///
/// # Safety
/// `y` may be written at as many values as the panel has rows from each of `y`, `y + stride`,
/// ..., one per row.
pub(super) unsafe fn panel(w: &[bf16], xp: &[u32], rows: usize, pairs: usize, y: *mut f32, stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if cpu().bf16dot && w.len() == 2 * PANEL * pairs {
        // SAFETY: the CPU has AVX-512 BF16 (checked above); a whole panel; the caller vouches
        // for `y`.
        return unsafe { super::x86::avx512::panel_pairs(w, xp, rows, pairs, y, stride) };
    }
    let width = w.len() / (2 * pairs);
    let mut acc = vec![0f32; rows * width];
    panel_dots(w, xp, pairs, &mut acc);
    for (r, acc) in acc.chunks_exact(width).enumerate() {
        // SAFETY: the caller lets us write `width` values at row `r`'s place.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), y.add(r * stride), width) };
    }
}

compiled_for_vectors!(
    /// The instruction's arithmetic in plain loops ([`panel`] where the CPU lacks it, and a
    /// narrow last panel): `acc` (zeroed, rows of the panel's width) gets each row's outputs.
    fn panel_dots(w: &[bf16], xp: &[u32], pairs: usize, acc: &mut [f32]) => panel_dots_with
);

#[inline(always)]
pub(super) fn panel_dots_with(w: &[bf16], xp: &[u32], pairs: usize, acc: &mut [f32]) {
    let width = w.len() / (2 * pairs);
    for (x, acc) in xp.chunks_exact(pairs).zip(acc.chunks_exact_mut(width)) {
        for (pair, ws) in x.iter().zip(w.chunks_exact(2 * width)) {
            let (even, odd) = (widen(*pair as u16), widen((*pair >> 16) as u16));
            for (a, w) in acc.iter_mut().zip(ws.chunks_exact(2)) {
                *a = flush(odd.mul_add(flush(w[1].to_f32()), *a));
                *a = flush(even.mul_add(flush(w[0].to_f32()), *a));
            }
        }
    }
}

/// A BF16 value's bits as F32.
#[inline(always)]
fn widen(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `v`, or the zero of its sign when it is below F32's normal range.
#[inline(always)]
fn flush(v: f32) -> f32 {
    if v.abs() < f32::MIN_POSITIVE {
        0f32.copysign(v)
    } else {
        v
    }
}
