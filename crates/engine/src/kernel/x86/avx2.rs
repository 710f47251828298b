//! AVX2 with FMA: dot products of weight rows in 256-bit vectors (four accumulators per output)
//! and panels in groups of two activation rows. [`super::avx512`] ends its rows through
//! [`end`], so both reduce each output the same way.

use super::super::blocks::{Q8Rows, QBlock, QK};
use super::super::Weight;
use super::{prefetch, prefetch_panel, prefetch_row, rows_at, PANEL};
use half::{bf16, f16};
use std::arch::x86_64::*;

/// The fixed reduction of one output's accumulators ([`super::super::reduce`]'s operations, in vector
/// registers), then the scalar tail of its row from `from` on.
#[inline(always)]
unsafe fn finish<W: Weight>(acc: [__m256; 4], w: *const W, x: &[f32], from: usize) -> f32 {
    // Lane-wise (a0 + a1) + (a2 + a3); lanes i + (i + 4); then (0 + 2, 1 + 3); then 0 + 1.
    let l = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let q = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps::<1>(l));
    let p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    let mut s = _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps::<1>(p, p)));
    for (i, x) in x.iter().enumerate().skip(from) {
        // SAFETY: the weight row is as long as the activation row.
        s += (*w.add(i)).to_f32() * x;
    }
    s
}

/// One weight row `w` against `R` activation rows: each eight weights are loaded (and widened
/// by `load8`) once and feed `R` rows' FMAs; four accumulators per row keep independent FMA
/// chains in flight even for one row. Per row, the order of operations is the same whatever
/// `R` is.
///
/// (No closures in these functions' bodies: a closure does not inherit the target features
/// of the function it is inlined into, so its intrinsics would become calls.)
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indices name the lanes and rows, as in the prose
unsafe fn dots<W: Weight, const R: usize>(
    w: *const W,
    xs: [&[f32]; R],
    load8: impl Fn(*const W, usize) -> __m256 + Copy,
) -> [f32; R] {
    let blocks = xs[0].len() / 32 * 32;
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let mut i = 0;
    while i < blocks {
        if R > 1 {
            prefetch(w, i);
        }
        for a in 0..4 {
            let v = load8(w, i + 8 * a);
            for r in 0..R {
                acc[r][a] = _mm256_fmadd_ps(v, _mm256_loadu_ps(xs[r].as_ptr().add(i + 8 * a)), acc[r][a]);
            }
        }
        i += 32;
    }
    end(w, xs, acc, load8)
}

/// The end of a row's dot products after its 32-blocks: the whole eights left into the first
/// accumulator, the fixed reduction, the scalar tail.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn end<W: Weight, const R: usize>(
    w: *const W,
    xs: [&[f32]; R],
    mut acc: [[__m256; 4]; R],
    load8: impl Fn(*const W, usize) -> __m256,
) -> [f32; R] {
    let (blocks, eights) = (xs[0].len() / 32 * 32, xs[0].len() / 8 * 8);
    let mut i = blocks;
    while i < eights {
        let v = load8(w, i);
        for r in 0..R {
            acc[r][0] = _mm256_fmadd_ps(v, _mm256_loadu_ps(xs[r].as_ptr().add(i)), acc[r][0]);
        }
        i += 8;
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = finish(acc[r], w, xs[r], eights);
    }
    out
}

/// [`super::avx512`]'s panel in 256-bit vectors: four accumulators per row, the same operations per lane.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn panel<W: Weight, const G: usize>(
    w: *const W,
    k: usize,
    x: *const f32,
    y: *mut f32,
    stride: usize,
    load8: impl Fn(*const W, usize) -> __m256,
) {
    let mut acc = [[_mm256_setzero_ps(); 4]; G];
    for i in 0..k {
        let at = w.add(i * PANEL);
        if G > 1 {
            prefetch_panel(at);
        }
        for q in 0..4 {
            let v = load8(at, 8 * q);
            for g in 0..G {
                acc[g][q] = _mm256_fmadd_ps(v, _mm256_set1_ps(*x.add(g * k + i)), acc[g][q]);
            }
        }
    }
    for g in 0..G {
        for q in 0..4 {
            _mm256_storeu_ps(y.add(g * stride + 8 * q), acc[g][q]);
        }
    }
}

/// [`super::avx512`]'s `panel_rows` in 256-bit vectors: groups of two rows (sixteen registers hold no more
/// accumulators), then the odd one.
#[inline(always)]
unsafe fn panel_rows<W: Weight>(
    w: &[W],
    x: &[f32],
    rows: usize,
    y: *mut f32,
    stride: usize,
    load8: impl Fn(*const W, usize) -> __m256 + Copy,
) {
    let k = x.len() / rows;
    let mut r = 0;
    while r < rows {
        let (w, x, y) = (w.as_ptr(), x[r * k..].as_ptr(), y.add(r * stride));
        if rows - r >= 2 {
            panel::<W, 2>(w, k, x, y, stride, load8);
            r += 2;
        } else {
            panel::<W, 1>(w, k, x, y, stride, load8);
            r += 1;
        }
    }
}

/// `$block` and `$panel` for weight type `$ty` (which also needs `$extra`).
macro_rules! entry_points {
    ($block:ident, $panel:ident, $ty:ident, $extra:literal) => {
        #[target_feature(enable = "avx2,fma")]
        #[target_feature(enable = $extra)]
        pub(in crate::kernel) unsafe fn $block(
            w: &[$ty],
            k: usize,
            first: usize,
            x: &[f32],
            rows: usize,
            yt: &mut [f32],
        ) {
            in_rows!((w, k, first, x, rows, yt), |wj, xs| dots(wj, xs, widen8!($ty)))
        }

        #[target_feature(enable = "avx2,fma")]
        #[target_feature(enable = $extra)]
        pub(in crate::kernel) unsafe fn $panel(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
            panel_rows(w, x, rows, y, stride, widen8!($ty))
        }
    };
}

entry_points!(block_f32, panel_f32, f32, "avx");
entry_points!(block_f16, panel_f16, f16, "f16c");
entry_points!(block_bf16, panel_bf16, bf16, "avx");

/// One quantized block's 32 values in value order as bytes (signed, or Q4_1's unsigned
/// nibbles), its scale, and its minimum (Q4_1's; zero otherwise).
#[inline(always)]
pub(super) unsafe fn q_unpack<F: QBlock>(b: *const u8) -> (__m256i, f32, f32) {
    // The scale (and Q4_1's minimum after it) widened by F16C here, in the caller's features:
    // `half`'s conversion checks the CPU on every call, which measured as a block's largest cost.
    let halves = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(b.cast::<i32>())));
    let (d, m) = (_mm_cvtss_f32(halves), _mm_cvtss_f32(_mm_movehdup_ps(halves)));
    let v = match F::NIBBLES {
        Some(at) => {
            let x = _mm_loadu_si128(b.add(at).cast::<__m128i>());
            let low = _mm_and_si128(x, _mm_set1_epi8(0x0f));
            let high = _mm_and_si128(_mm_srli_epi16::<4>(x), _mm_set1_epi8(0x0f));
            let v = _mm256_set_m128i(high, low);
            if F::OFFSET != 0 {
                _mm256_sub_epi8(v, _mm256_set1_epi8(F::OFFSET))
            } else {
                v
            }
        }
        None => _mm256_loadu_si256(b.add(2).cast::<__m256i>()),
    };
    (v, d, if F::MIN { m } else { 0.0 })
}

/// The eight exact partials (values `4l..4l+4` each) of a block's values `v` against 32
/// activation bytes `qa`: signed values as magnitudes times the activations with their signs,
/// pairs summed in 16 bits (at most 2·128·127, no saturation) and then in fours.
#[inline(always)]
pub(super) unsafe fn q_partials<F: QBlock>(v: __m256i, qa: __m256i) -> __m256i {
    let pairs = if F::SIGNED {
        _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(qa, v))
    } else {
        _mm256_maddubs_epi16(v, qa)
    };
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// Eight lanes summed in [`super::super::quant::reduce8`]'s order.
#[inline(always)]
pub(super) unsafe fn q_reduce(l: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps::<1>(l));
    let p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps::<1>(p, p)))
}

/// Block `b` of weight row `w` into accumulators `acc` (one per activation row from `first`)
/// and the minimum sums `min`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn q_step<F: QBlock, const R: usize>(
    w: *const u8,
    a: &Q8Rows,
    first: usize,
    b: usize,
    acc: &mut [__m256; R],
    min: &mut [f32; R],
) {
    let nb = a.blocks_per_row();
    let (v, d, m) = q_unpack::<F>(w.add(b * F::BYTES));
    for r in 0..R {
        let at = (first + r) * nb + b;
        let qa = _mm256_loadu_si256(a.qs.as_ptr().add(at * QK).cast::<__m256i>());
        let p = _mm256_cvtepi32_ps(q_partials::<F>(v, qa));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * *a.d.get_unchecked(at)), p, acc[r]);
        if F::MIN {
            min[r] = m.mul_add(*a.s.get_unchecked(at), min[r]);
        }
    }
}

/// Weight row `w` against activation rows `first..first + R`: even blocks into one
/// accumulator per row, odd ones into another.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn q_dots<F: QBlock, const R: usize>(w: *const u8, a: &Q8Rows, first: usize) -> [f32; R] {
    let nb = a.blocks_per_row();
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    let mut min = [0f32; R];
    let mut b = 0;
    while b + 2 <= nb {
        q_step::<F, R>(w, a, first, b, &mut even, &mut min);
        q_step::<F, R>(w, a, first, b + 1, &mut odd, &mut min);
        b += 2;
    }
    if b < nb {
        q_step::<F, R>(w, a, first, b, &mut even, &mut min);
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let sum = q_reduce(_mm256_add_ps(even[r], odd[r]));
        out[r] = if F::MIN { sum + min[r] } else { sum };
    }
    out
}

/// [`quant::row_dots`] in 256-bit vectors: the activation rows in groups of four, then the rest.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernel) unsafe fn q_row_dots<F: QBlock>(w: &[u8], a: &Q8Rows, out: &mut [f32]) {
    prefetch_row(w);
    let w = w.as_ptr();
    in_groups!(out, [4, 3, 2, 1], |r, R| q_dots::<F, R>(w, a, r));
}
