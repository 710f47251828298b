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

use super::dispatch::cpu;
#[cfg(target_arch = "x86_64")]
use super::x86 as simd;
use super::{Outputs, BLOCK};
use half::f16;
use rayon::prelude::*;

/// Values per block, in every format here and in the activations' blocks.
pub(crate) const QK: usize = 32;

/// The block formats the products read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// An F16 scale and 32 signed bytes: `d · q`.
    Q8_0,
    /// An F16 scale and 32 nibbles: `d · (q − 8)`.
    Q4_0,
    /// An F16 scale, an F16 minimum and 32 nibbles: `d · q + m`.
    Q4_1,
}

impl Format {
    /// Bytes of one block of [`QK`] values.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q8_0 => Q8_0::BYTES,
            Format::Q4_0 => Q4_0::BYTES,
            Format::Q4_1 => Q4_1::BYTES,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Q8_0 => "q8_0",
            Format::Q4_0 => "q4_0",
            Format::Q4_1 => "q4_1",
        }
    }
}

/// One format's block, as the plain path reads it and the vector paths unpack it.
pub(crate) trait QBlock: Send + Sync + 'static {
    const BYTES: usize;
    /// The values are signed (Q8_0, Q4_0 after its offset): the vector paths multiply their
    /// magnitudes by the activations with the values' signs. Unsigned ones (Q4_1) multiply as
    /// they are.
    const SIGNED: bool;
    /// Values packed two to a byte from this offset (low nibbles first, then high ones), rather
    /// than one signed byte each from offset 2.
    const NIBBLES: Option<usize>;
    /// What a nibble's value is less (Q4_0's 8).
    const OFFSET: i8;
    /// The block has a minimum (Q4_1), added as `m · Σ activations`.
    const MIN: bool;

    /// The block's 32 integer values, in value order.
    fn values(b: &[u8]) -> [i8; QK] {
        let mut v = [0i8; QK];
        match Self::NIBBLES {
            Some(at) => {
                for (i, byte) in b[at..at + QK / 2].iter().enumerate() {
                    v[i] = (byte & 0x0f) as i8 - Self::OFFSET;
                    v[i + QK / 2] = (byte >> 4) as i8 - Self::OFFSET;
                }
            }
            None => v.iter_mut().zip(&b[2..2 + QK]).for_each(|(v, b)| *v = *b as i8),
        }
        v
    }
}

/// An F16 at byte `at` of a block.
#[inline(always)]
pub(crate) fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

pub(crate) struct Q8_0;
pub(crate) struct Q4_0;
pub(crate) struct Q4_1;

impl QBlock for Q8_0 {
    const BYTES: usize = 2 + QK;
    const SIGNED: bool = true;
    const NIBBLES: Option<usize> = None;
    const OFFSET: i8 = 0;
    const MIN: bool = false;
}

impl QBlock for Q4_0 {
    const BYTES: usize = 2 + QK / 2;
    const SIGNED: bool = true;
    const NIBBLES: Option<usize> = Some(2);
    const OFFSET: i8 = 8;
    const MIN: bool = false;
}

impl QBlock for Q4_1 {
    const BYTES: usize = 4 + QK / 2;
    const SIGNED: bool = false;
    const NIBBLES: Option<usize> = Some(4);
    const OFFSET: i8 = 0;
    const MIN: bool = true;
}

/// Activation rows quantized to blocks of [`QK`]: per block a scale `d = max|x| / 127`, the
/// values `round(x / d)` (ties to even) in `-127..=127`, and `s = d · Σ q` (Q4_1's minimum term).
pub(crate) struct Q8Rows {
    pub(crate) k: usize,
    pub(crate) qs: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
}

impl Q8Rows {
    /// `x` (rows of `k`, a multiple of [`QK`]) quantized block by block.
    pub(crate) fn quantize(x: &[f32], k: usize) -> Self {
        assert!(k > 0 && k.is_multiple_of(QK) && x.len().is_multiple_of(k), "Q8Rows: shapes do not agree");
        let blocks = x.len() / QK;
        let (mut qs, mut d, mut s) = (vec![0i8; x.len()], vec![0f32; blocks], vec![0f32; blocks]);
        qs.par_chunks_mut(QK)
            .zip(d.par_iter_mut().zip(s.par_iter_mut()))
            .zip(x.par_chunks(QK))
            .with_min_len(64)
            .for_each(|((q, (d, s)), x)| {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                let mut sum = 0i32;
                for (q, x) in q.iter_mut().zip(x) {
                    *q = (x * inv).round_ties_even() as i8;
                    sum += i32::from(*q);
                }
                *d = amax / 127.0;
                *s = *d * sum as f32;
            });
        Q8Rows { k, qs, d, s }
    }

    pub(crate) fn blocks_per_row(&self) -> usize {
        self.k / QK
    }

    pub(crate) fn rows(&self) -> usize {
        self.qs.len() / self.k
    }
}

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
