//! What the quantized products read: GGUF's block formats (Q8_0, Q4_0, Q4_1), each a
//! [`QBlock`] that the plain path reads and the vector paths unpack, and the activations'
//! 8-bit blocks ([`Q8Rows`]). Apart from [`super::quant`], which runs the products, so that the
//! vector paths in [`super::x86`] read the formats without reaching back into the products that
//! dispatch to them.

use super::dispatch::compiled_for_vectors;
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
        qs.par_chunks_mut(QK * CHUNK)
            .zip(d.par_chunks_mut(CHUNK).zip(s.par_chunks_mut(CHUNK)))
            .zip(x.par_chunks(QK * CHUNK))
            .for_each(|((q, (d, s)), x)| quantize_vectors(x, q, d, s));
        Q8Rows { k, qs, d, s }
    }

    pub(crate) fn blocks_per_row(&self) -> usize {
        self.k / QK
    }

    pub(crate) fn rows(&self) -> usize {
        self.qs.len() / self.k
    }
}

/// Activation blocks per task of [`Q8Rows::quantize`].
const CHUNK: usize = 64;

compiled_for_vectors!(
    /// [`Q8Rows::quantize`]'s blocks in plain loops the compiler vectorizes (rounding to even
    /// is one instruction in the vector builds, a libm call per value in the plain one; the
    /// same bits either way, as rounding to an integer is exact).
    fn quantize_vectors(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) => quantize_with
);

#[inline(always)]
pub(super) fn quantize_with(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((x, q), d), s) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(d).zip(s) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, x) in q.iter_mut().zip(x) {
            *q = (x * inv).round_ties_even() as i8;
            sum += i32::from(*q);
        }
        *d = amax / 127.0;
        *s = *d * sum as f32;
    }
}
