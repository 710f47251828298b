//! AVX2 with FMA: dot products of weight rows in 256-bit vectors (four accumulators per output)
//! and panels in groups of two activation rows. [`super::avx512`] ends its rows through
//! [`end`], so both reduce each output the same way.

use super::super::Weight;
use super::{prefetch, prefetch_panel, rows_at, PANEL};
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
