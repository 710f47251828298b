//! AVX-512 (F, VL; BW and VNNI for the integer products): the same dot products and panels as
//! [`super::avx2`] in 512-bit vectors, each lane doing the arithmetic its 256-bit counterpart
//! does, so both give the same bits; and the screen's exact integer products.

use super::super::blocks::{Q8Rows, QBlock, QK};
use super::super::Weight;
use super::{avx2, prefetch, prefetch_panel, prefetch_row, rows_at, PANEL};
use half::{bf16, f16};
use std::arch::x86_64::*;

/// [`avx2`]'s `dots` in 512-bit vectors: each vector holds two of its eight-lane accumulators side
/// by side (lanes 0-7 one, 8-15 the next), so every lane does exactly the arithmetic it does
/// there, in half the instructions. (Tried: two weight rows per pass, each activation load
/// feeding both: for four rows, a fifth faster in cache but a quarter slower from memory on
/// the huge pages the weights live on, so not kept; eight activation rows per pass: slower,
/// the accumulators spill; prefetching whole weight rows ahead into L2: slower.)
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn dots<W: Weight, const R: usize>(
    w: *const W,
    xs: [&[f32]; R],
    load8: impl Fn(*const W, usize) -> __m256 + Copy,
    load16: impl Fn(*const W, usize) -> __m512,
) -> [f32; R] {
    let blocks = xs[0].len() / 32 * 32;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut i = 0;
    while i < blocks {
        if R > 1 {
            prefetch(w, i);
        }
        for h in 0..2 {
            let v = load16(w, i + 16 * h);
            for r in 0..R {
                acc[r][h] = _mm512_fmadd_ps(v, _mm512_loadu_ps(xs[r].as_ptr().add(i + 16 * h)), acc[r][h]);
            }
        }
        i += 32;
    }
    end(w, xs, acc, load8)
}

/// [`avx2::end`] for [`dots`]'s accumulators, split back into the four eight-lane ones of
/// each output.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn end<W: Weight, const R: usize>(
    w: *const W,
    xs: [&[f32]; R],
    acc: [[__m512; 2]; R],
    load8: impl Fn(*const W, usize) -> __m256,
) -> [f32; R] {
    let mut acc8 = [[_mm256_setzero_ps(); 4]; R];
    for r in 0..R {
        for h in 0..2 {
            let v = _mm512_castps_pd(acc[r][h]);
            acc8[r][2 * h] = _mm256_castpd_ps(_mm512_castpd512_pd256(v));
            acc8[r][2 * h + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(v));
        }
    }
    avx2::end(w, xs, acc8, load8)
}

/// One whole panel (`w`, [`super::super::Layout`]) against `G` activation rows from `x` (rows of `k`):
/// per input, the panel's 32 weights are loaded (widened by `load16`) once, and each row's
/// activation value, broadcast, multiplies them into that row's two accumulators, one output
/// per lane. Row `g`'s outputs go to `y + g · stride`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn panel<W: Weight, const G: usize>(
    w: *const W,
    k: usize,
    x: *const f32,
    y: *mut f32,
    stride: usize,
    load16: impl Fn(*const W, usize) -> __m512,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; G];
    for i in 0..k {
        let at = w.add(i * PANEL);
        if G > 1 {
            prefetch_panel(at);
        }
        let v = [load16(at, 0), load16(at, 16)];
        for g in 0..G {
            let b = _mm512_set1_ps(*x.add(g * k + i));
            for h in 0..2 {
                acc[g][h] = _mm512_fmadd_ps(v[h], b, acc[g][h]);
            }
        }
    }
    for g in 0..G {
        for h in 0..2 {
            _mm512_storeu_ps(y.add(g * stride + 16 * h), acc[g][h]);
        }
    }
}

/// Activation rows one pass over a panel takes: twelve rows' two accumulators each are 24 of the
/// 32 registers, beside the panel's two weight vectors and a broadcast, and each weight load
/// feeds twelve rows' multiply-adds. Why twelve: eight left the multipliers waiting on loads (a
/// 64-row product took 15% longer), and fourteen spill accumulators to the stack. The group
/// changes how many outputs a pass computes, never an output's operations.
const GROUP: usize = 12;

/// Runs `$body` with the constant `$G` bound to `$g` (1 to [`GROUP`]): a group's size as the
/// const parameter the kernels keep their accumulators in registers by.
macro_rules! by_group {
    ($g:expr, $G:ident => $body:expr) => {
        by_group!(@ $g, $G, $body; 1 2 3 4 5 6 7 8 9 10 11)
    };
    (@ $g:expr, $G:ident, $body:expr; $($n:literal)*) => {
        match $g {
            $($n => {
                const $G: usize = $n;
                $body
            })*
            _ => {
                const $G: usize = GROUP;
                $body
            }
        }
    };
}

/// [`super::super::linear`]'s panel product in 512-bit vectors: the activation rows in groups of
/// up to [`GROUP`], each group one pass over the panel.
#[inline(always)]
unsafe fn panel_rows<W: Weight>(
    w: &[W],
    x: &[f32],
    rows: usize,
    y: *mut f32,
    stride: usize,
    load16: impl Fn(*const W, usize) -> __m512 + Copy,
) {
    let k = x.len() / rows;
    let mut r = 0;
    while r < rows {
        let (w, x, y) = (w.as_ptr(), x[r * k..].as_ptr(), y.add(r * stride));
        let g = (rows - r).min(GROUP);
        by_group!(g, G => panel::<W, G>(w, k, x, y, stride, load16));
        r += g;
    }
}

/// [`super::super::paired`]'s panel with AVX-512 BF16: the activation rows in groups of up to
/// [`GROUP`], each group one pass over the panel; per input pair, the panel's 64 weights (two
/// vectors, each row's pair side by side) are loaded once, and each row's pair of activations,
/// broadcast, meets them in two `vdpbf16ps`, one output per lane.
///
/// # Safety
/// The CPU has AVX-512 BF16; `w` is one whole panel of `pairs` input pairs; `y` may be written
/// at `PANEL` values from each of `y`, `y + stride`, ..., one per row of `xp`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(in crate::kernel) unsafe fn panel_pairs(
    w: &[bf16],
    xp: &[u32],
    rows: usize,
    pairs: usize,
    y: *mut f32,
    stride: usize,
) {
    let mut r = 0;
    while r < rows {
        let (w, x, y) = (w.as_ptr(), xp[r * pairs..].as_ptr(), y.add(r * stride));
        let g = (rows - r).min(GROUP);
        by_group!(g, G => pairs_group::<G>(w, pairs, x, y, stride));
        r += g;
    }
}

#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn pairs_group<const G: usize>(w: *const bf16, pairs: usize, x: *const u32, y: *mut f32, stride: usize) {
    let mut acc = [[_mm512_setzero_ps(); 2]; G];
    for p in 0..pairs {
        let at = w.add(p * 2 * PANEL);
        if G > 1 {
            prefetch_panel(at);
            prefetch_panel(at.add(PANEL));
        }
        let v: [__m512bh; 2] = [
            std::mem::transmute(_mm512_loadu_si512(at.cast())),
            std::mem::transmute(_mm512_loadu_si512(at.add(PANEL).cast())),
        ];
        for g in 0..G {
            let b: __m512bh = std::mem::transmute(_mm512_set1_epi32(*x.add(g * pairs + p) as i32));
            for h in 0..2 {
                acc[g][h] = _mm512_dpbf16_ps(acc[g][h], v[h], b);
            }
        }
    }
    for g in 0..G {
        for h in 0..2 {
            _mm512_storeu_ps(y.add(g * stride + 16 * h), acc[g][h]);
        }
    }
}

/// `kernel::int`'s `int_block` with AVX-512 VNNI: each 32 weights are widened to sixteen bits once
/// and feed every activation row of a group of four.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(in super::super) unsafe fn int_block_vnni(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) {
    let rows = p.len() / k;
    for (qj, yt) in q.chunks_exact(k).zip(yt.chunks_exact_mut(rows)) {
        let mut r = 0;
        while r + 4 <= rows {
            yt[r..r + 4].copy_from_slice(&int_dots::<4>(qj, p, k, r));
            r += 4;
        }
        match rows - r {
            1 => yt[r..].copy_from_slice(&int_dots::<1>(qj, p, k, r)),
            2 => yt[r..].copy_from_slice(&int_dots::<2>(qj, p, k, r)),
            3 => yt[r..].copy_from_slice(&int_dots::<3>(qj, p, k, r)),
            _ => {}
        }
    }
}

/// Weight row `q` against activation rows `first..first + R` of `p` (rows of `k`).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn int_dots<const R: usize>(q: &[i8], p: &[i16], k: usize, first: usize) -> [i32; R] {
    let whole = k / 32 * 32;
    let mut acc = [_mm512_setzero_si512(); R];
    let mut i = 0;
    while i < whole {
        let w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(q.as_ptr().add(i) as *const __m256i));
        for r in 0..R {
            let x = _mm512_loadu_si512(p.as_ptr().add((first + r) * k + i) as *const __m512i);
            acc[r] = _mm512_dpwssd_epi32(acc[r], w, x);
        }
        i += 32;
    }
    let mut out = [0i32; R];
    for r in 0..R {
        let tail = &p[(first + r) * k + whole..(first + r + 1) * k];
        out[r] = _mm512_reduce_add_epi32(acc[r]) + super::super::int_dot(&q[whole..], tail);
    }
    out
}

/// Sixteen weights of type `$ty` from index `i` of `p`, widened to F32 ([`widen8`]'s sixteen-lane
/// counterpart).
macro_rules! widen16 {
    (f32) => {
        |p: *const f32, i| _mm512_loadu_ps(p.add(i))
    };
    (f16) => {
        |p: *const f16, i| _mm512_cvtph_ps(_mm256_loadu_si256((p as *const u16).add(i) as *const __m256i))
    };
    (bf16) => {
        |p: *const bf16, i| {
            let halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256((p as *const u16).add(i) as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(halves))
        }
    };
}

/// `$block` and `$panel` for weight type `$ty` (which also needs `$extra`).
macro_rules! entry_points {
    ($block:ident, $panel:ident, $ty:ident, $extra:literal) => {
        #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
        #[target_feature(enable = $extra)]
        pub(in crate::kernel) unsafe fn $block(
            w: &[$ty],
            k: usize,
            first: usize,
            x: &[f32],
            rows: usize,
            yt: &mut [f32],
        ) {
            in_rows!((w, k, first, x, rows, yt), |wj, xs| dots(wj, xs, widen8!($ty), widen16!($ty)))
        }

        #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
        #[target_feature(enable = $extra)]
        pub(in crate::kernel) unsafe fn $panel(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
            panel_rows(w, x, rows, y, stride, widen16!($ty))
        }
    };
}

entry_points!(block_f32, panel_f32, f32, "avx");
entry_points!(block_f16, panel_f16, f16, "f16c");
entry_points!(block_bf16, panel_bf16, bf16, "avx");

/// [`avx2`]'s quantized blocks two at a time: blocks `b` and `b + 1` side by side (lanes 0-7
/// the even block's accumulator, 8-15 the odd one's), each block's exact partials from one
/// VNNI instruction (four unsigned-by-signed byte products summed into each 32-bit lane).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn q_pair<F: QBlock, const R: usize>(
    w: *const u8,
    a: &Q8Rows,
    first: usize,
    b: usize,
    acc: &mut [__m512; R],
    min: &mut [f32; R],
) {
    let nb = a.blocks_per_row();
    let (v0, d0, m0) = avx2::q_unpack::<F>(w.add(b * F::BYTES));
    let (v1, d1, m1) = avx2::q_unpack::<F>(w.add((b + 1) * F::BYTES));
    let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v0), v1);
    let (unsigned, negative) = if F::SIGNED { (_mm512_abs_epi8(v), _mm512_movepi8_mask(v)) } else { (v, 0) };
    for r in 0..R {
        let at = (first + r) * nb + b;
        let qa = _mm512_loadu_si512(a.qs.as_ptr().add(at * QK).cast());
        let signed = if F::SIGNED { _mm512_mask_sub_epi8(qa, negative, _mm512_setzero_si512(), qa) } else { qa };
        let p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), unsigned, signed));
        let (da, db) = (*a.d.get_unchecked(at), *a.d.get_unchecked(at + 1));
        let scale = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(d0 * da))),
            _mm256_castps_pd(_mm256_set1_ps(d1 * db)),
        ));
        acc[r] = _mm512_fmadd_ps(scale, p, acc[r]);
        if F::MIN {
            min[r] = m0.mul_add(*a.s.get_unchecked(at), min[r]);
            min[r] = m1.mul_add(*a.s.get_unchecked(at + 1), min[r]);
        }
    }
}

/// Weight row `w` against activation rows `first..first + R`, in [`super::super::quant`]'s
/// order: pairs of blocks, then a last odd block into the even accumulator.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn q_dots<F: QBlock, const R: usize>(w: *const u8, a: &Q8Rows, first: usize) -> [f32; R] {
    let nb = a.blocks_per_row();
    let mut acc = [_mm512_setzero_ps(); R];
    let mut min = [0f32; R];
    let mut b = 0;
    while b + 2 <= nb {
        q_pair::<F, R>(w, a, first, b, &mut acc, &mut min);
        b += 2;
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let (mut even, odd) = (
            _mm256_castpd_ps(_mm512_castpd512_pd256(_mm512_castps_pd(acc[r]))),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[r]))),
        );
        let mut m = min[r];
        if b < nb {
            let (v, d, mb) = avx2::q_unpack::<F>(w.add(b * F::BYTES));
            let at = (first + r) * nb + b;
            let qa = _mm256_loadu_si256(a.qs.as_ptr().add(at * QK).cast());
            let p = _mm256_cvtepi32_ps(avx2::q_partials::<F>(v, qa));
            even = _mm256_fmadd_ps(_mm256_set1_ps(d * *a.d.get_unchecked(at)), p, even);
            if F::MIN {
                m = mb.mul_add(*a.s.get_unchecked(at), m);
            }
        }
        let sum = avx2::q_reduce(_mm256_add_ps(even, odd));
        out[r] = if F::MIN { sum + m } else { sum };
    }
    out
}

/// [`super::super::quant::row_dots`] in 512-bit vectors: the activation rows in groups of
/// eight, then the rest.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(in crate::kernel) unsafe fn q_row_dots<F: QBlock>(w: &[u8], a: &Q8Rows, out: &mut [f32]) {
    prefetch_row(w);
    let w = w.as_ptr();
    in_groups!(out, [8, 4, 3, 2, 1], |r, R| q_dots::<F, R>(w, a, r));
}
