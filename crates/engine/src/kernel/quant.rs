//! Weight products straight from GGUF's block formats (Q8_0, Q4_0, Q4_1), with no dequantized
//! copy of the weights: the activations are quantized to 8-bit blocks of 32 once per product
//! ([`Q8Rows`]), and each weight block meets its activation block in an exact integer dot
//! product, scaled once per block.
//!
//! Why 8-bit activations rather than widening the weights to F32: a decode step is bound by
//! the bytes it streams, and a 4-bit weight widened to F32 costs a conversion and an FMA per
//! value, where an integer dot product multiplies 32 (AVX2) or 64 (VNNI) pairs per instruction;
//! it is also the arithmetic llama.cpp runs on these files, so greedy ids stay close to its
//! ids. The price is the activations' rounding (at most half a step of `max|x| / 127` per value
//! within each block of 32), recorded in every artifact as the arithmetic of `native` weights.
//!
//! Determinism, as for every product here: `y[r][j]` depends only on weight row `j` and
//! activation row `r`. Per block, the integer partials are exact, so any instruction that
//! computes them gives the same integers; the floating-point order is fixed and written once
//! ([`dot_plain`]): eight lanes, lane `l` taking the partial of the block's values
//! `4l..4l+4`; even blocks into one eight-lane accumulator and odd blocks into another, each
//! step one fused multiply-add of (weight scale · activation scale) and the partial; the two
//! accumulators added lane-wise, then reduced as every row product here is (lanes `i + (i+4)`,
//! then `(0+2, 1+3)`, then `0+1`); Q4_1's minimum term summed apart, block by block, and added
//! last. The AVX2 path holds the two accumulators in two registers, the AVX-512 path side by
//! side in one (even blocks in lanes 0-7, odd in 8-15); both do each lane's operations in this
//! order.

pub use super::blocks::Format;
use super::blocks::{half_at, Q8Rows, QBlock, Q4_0, Q4_1, Q8_0, QK};
use super::dispatch::cpu;
#[cfg(target_arch = "x86_64")]
use super::x86 as simd;
use super::{Outputs, BLOCK};
use rayon::prelude::*;

/// A quantized matrix as stored: `rows` rows of `k` values in whole blocks of `format`, row
/// after row in `bytes`; output `j` is stored row `order[j]` where an order is given (a
/// Llama's q and k rows, stored in llama.cpp's rotary order).
#[derive(Clone, Copy)]
pub struct QuantMatrix<'a> {
    pub bytes: &'a [u8],
    pub format: Format,
    pub rows: usize,
    pub k: usize,
    pub order: Option<&'a [u32]>,
}

impl QuantMatrix<'_> {
    fn row_bytes(&self) -> usize {
        self.k / QK * self.format.block_bytes()
    }

    /// Stored row `j`'s bytes.
    fn row(&self, j: usize) -> &[u8] {
        let stored = self.order.map_or(j, |o| o[j] as usize);
        &self.bytes[stored * self.row_bytes()..][..self.row_bytes()]
    }
}

/// `y = x · wᵀ (+ bias)` for the matrices `parts` stacked (their rows in order, one `out × k`
/// matrix; all of one format): `x` is `rows × k` (F32, row-major), `y` is `rows × out`. In
/// parallel over tasks of [`BLOCK`] weight rows, each row against every activation row.
pub fn quant_linear(parts: &[QuantMatrix<'_>], bias: Option<&[f32]>, x: &[f32], rows: usize) -> Vec<f32> {
    let k = parts.first().map_or(0, |p| p.k);
    let format = parts.first().map(|p| p.format);
    assert!(
        k > 0
            && x.len() == rows * k
            && parts.iter().all(|p| {
                p.k == k
                    && Some(p.format) == format
                    && p.bytes.len() >= p.rows * p.row_bytes()
                    && p.order.is_none_or(|o| o.len() == p.rows && o.iter().all(|&s| (s as usize) < p.rows))
            }),
        "quant_linear: shapes do not agree"
    );
    let out: usize = parts.iter().map(|p| p.rows).sum();
    if rows == 0 || out == 0 {
        return Vec::new();
    }
    let a = Q8Rows::quantize(x, k);
    let mut y = vec![0f32; rows * out];
    match format {
        Some(Format::Q8_0) => products::<Q8_0>(parts, &a, &mut y),
        Some(Format::Q4_0) => products::<Q4_0>(parts, &a, &mut y),
        Some(Format::Q4_1) => products::<Q4_1>(parts, &a, &mut y),
        None => unreachable!("parts checked above"),
    }
    if let Some(b) = bias {
        y.chunks_exact_mut(out).for_each(|row| row.iter_mut().zip(b).for_each(|(y, b)| *y += b));
    }
    y
}

/// Every output of the stacked `parts` against every row of `a`, into `y` (`rows × out`).
fn products<F: QBlock>(parts: &[QuantMatrix<'_>], a: &Q8Rows, y: &mut [f32]) {
    let rows = a.rows();
    let out = y.len() / rows;
    let outputs = Outputs(y.as_mut_ptr());
    (0..out.div_ceil(BLOCK)).into_par_iter().for_each(|t| {
        let mut column = vec![0f32; rows];
        for j in t * BLOCK..((t + 1) * BLOCK).min(out) {
            let (mut part, mut local) = (0, j);
            while local >= parts[part].rows {
                local -= parts[part].rows;
                part += 1;
            }
            row_dots::<F>(parts[part].row(local), a, &mut column);
            for (r, v) in column.iter().enumerate() {
                // SAFETY: output `j` of row `r` is inside `y` (which outlives this region), and
                // only this task writes output `j`.
                unsafe { *outputs.at(r * out + j) = *v };
            }
        }
    });
}

/// One stored weight row `w` against every row of `a`, into `out` (one value per row): through
/// the widest vector path the CPU has, else the plain one.
pub(super) fn row_dots<F: QBlock>(w: &[u8], a: &Q8Rows, out: &mut [f32]) {
    debug_assert_eq!(w.len(), a.blocks_per_row() * F::BYTES);
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = cpu();
        if cpu.avx512 && cpu.vnni && cpu.f16c {
            // SAFETY: the CPU has the instructions (checked above); `w` holds a row's blocks.
            return unsafe { simd::avx512::q_row_dots::<F>(w, a, out) };
        }
        if cpu.avx2 && cpu.f16c {
            // SAFETY: as above.
            return unsafe { simd::avx2::q_row_dots::<F>(w, a, out) };
        }
    }
    row_dots_plain::<F>(w, a, out)
}

/// [`row_dots`] without vector instructions.
pub(super) fn row_dots_plain<F: QBlock>(w: &[u8], a: &Q8Rows, out: &mut [f32]) {
    for (r, out) in out.iter_mut().enumerate() {
        *out = dot_plain::<F>(w, a, r);
    }
}

/// Weight row `w` against activation row `r` of `a`: the order of operations every path keeps
/// (the module's documentation says it in words).
pub(super) fn dot_plain<F: QBlock>(w: &[u8], a: &Q8Rows, r: usize) -> f32 {
    let nb = a.blocks_per_row();
    let mut acc = [[0f32; 8]; 2];
    let mut min = 0f32;
    for (b, block) in w.chunks_exact(F::BYTES).enumerate() {
        let at = r * nb + b;
        let values = F::values(block);
        let qa = &a.qs[at * QK..][..QK];
        let scale = half_at(block, 0) * a.d[at];
        for (l, lane) in acc[b % 2].iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4).map(|i| i32::from(values[i]) * i32::from(qa[i])).sum();
            *lane = scale.mul_add(p as f32, *lane);
        }
        if F::MIN {
            min = half_at(block, 2).mul_add(a.s[at], min);
        }
    }
    let lanes: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let sum = reduce8(lanes);
    if F::MIN {
        sum + min
    } else {
        sum
    }
}

/// Eight lanes summed as every vector path sums them: `i + (i + 4)`, then `(0 + 2, 1 + 3)`,
/// then `0 + 1`.
pub(super) fn reduce8(l: [f32; 8]) -> f32 {
    let q = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (q[0] + q[2]) + (q[1] + q[3])
}
