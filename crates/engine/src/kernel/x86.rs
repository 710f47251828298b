//! The x86-64 instruction sets: AVX2 (256-bit, with FMA and F16C) and AVX-512 (512-bit, VNNI for
//! the integer products), as `#[target_feature]` functions that [`super::dispatch`] chooses
//! between. Every path does the portable path's operations in the same order per lane.

use super::dispatch::cpu;
use super::{Weight, CACHE_LINE, PANEL};
use half::{bf16, f16};
use std::arch::x86_64::*;

/// How far ahead of the weights being multiplied a product of several rows asks for them.
/// Why: with several rows, the multiplications between weight loads slow the stream of
/// demand misses the hardware prefetcher learns from; asking explicitly measured 3-10% faster
/// for four and eight rows, and nothing for one row, which is left alone.
const PREFETCH_BYTES: usize = 2048;

#[inline(always)]
unsafe fn prefetch<W>(row: *const W, i: usize) {
    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(i).cast::<i8>().wrapping_add(PREFETCH_BYTES));
}

/// The fixed reduction of one output's accumulators ([`super::reduce`]'s operations, in vector
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
unsafe fn dots_256<W: Weight, const R: usize>(
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
    end_256(w, xs, acc, load8)
}

/// The end of a row's dot products after its 32-blocks: the whole eights left into the first
/// accumulator, the fixed reduction, the scalar tail.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn end_256<W: Weight, const R: usize>(
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

/// [`dots_256`] in 512-bit vectors: each vector holds two of its eight-lane accumulators side
/// by side (lanes 0-7 one, 8-15 the next), so every lane does exactly the arithmetic it does
/// there, in half the instructions. (Tried: two weight rows per pass, each activation load
/// feeding both: for four rows, a fifth faster in cache but a quarter slower from memory on
/// the huge pages the weights live on, so not kept; eight activation rows per pass: slower,
/// the accumulators spill; prefetching whole weight rows ahead into L2: slower.)
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn dots_512<W: Weight, const R: usize>(
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
    end_512(w, xs, acc, load8)
}

/// [`end_256`] for [`dots_512`]'s accumulators, split back into the four eight-lane ones of
/// each output.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn end_512<W: Weight, const R: usize>(
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
    end_256(w, xs, acc8, load8)
}

/// Asks for the panel's weights [`PREFETCH_BYTES`] ahead of `at`, every cache line of one
/// input's `PANEL` weights.
#[inline(always)]
unsafe fn prefetch_panel<W>(at: *const W) {
    let mut line = 0;
    while line < PANEL * std::mem::size_of::<W>() {
        prefetch(at.cast::<u8>(), line);
        line += CACHE_LINE;
    }
}

/// One whole panel (`w`, [`super::Layout`]) against `G` activation rows from `x` (rows of `k`):
/// per input, the panel's 32 weights are loaded (widened by `load16`) once, and each row's
/// activation value, broadcast, multiplies them into that row's two accumulators, one output
/// per lane. Row `g`'s outputs go to `y + g · stride`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn panel_512<W: Weight, const G: usize>(
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

/// [`panel_512`] in 256-bit vectors: four accumulators per row, the same operations per lane.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn panel_256<W: Weight, const G: usize>(
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

/// [`super::panel`] in 512-bit vectors: the activation rows in groups of up to eight (the
/// accumulators of eight fill half the registers), each group one pass over the panel.
#[inline(always)]
unsafe fn panel_rows_512<W: Weight>(
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
        let g = (rows - r).min(8);
        match g {
            1 => panel_512::<W, 1>(w, k, x, y, stride, load16),
            2 => panel_512::<W, 2>(w, k, x, y, stride, load16),
            3 => panel_512::<W, 3>(w, k, x, y, stride, load16),
            4 => panel_512::<W, 4>(w, k, x, y, stride, load16),
            5 => panel_512::<W, 5>(w, k, x, y, stride, load16),
            6 => panel_512::<W, 6>(w, k, x, y, stride, load16),
            7 => panel_512::<W, 7>(w, k, x, y, stride, load16),
            _ => panel_512::<W, 8>(w, k, x, y, stride, load16),
        }
        r += g;
    }
}

/// [`panel_rows_512`] in 256-bit vectors: groups of two rows (sixteen registers hold no more
/// accumulators), then the odd one.
#[inline(always)]
unsafe fn panel_rows_256<W: Weight>(
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
            panel_256::<W, 2>(w, k, x, y, stride, load8);
            r += 2;
        } else {
            panel_256::<W, 1>(w, k, x, y, stride, load8);
            r += 1;
        }
    }
}

/// [`super::int_block`] with AVX-512 VNNI: each 32 weights are widened to sixteen bits once
/// and feed every activation row of a group of four.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn int_block_vnni(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) {
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
        out[r] = _mm512_reduce_add_epi32(acc[r]) + super::int::int_dot(&q[whole..], tail);
    }
    out
}

/// Runs `$body` for the activation rows in groups of four, then the leftover group, with
/// `$r` the group's first row and `$xs` its rows.
macro_rules! in_fours {
    ($rows:expr, $x:expr, $k:expr, |$r:ident, $xs:ident| $body:expr) => {{
        let mut $r = 0;
        while $r + 4 <= $rows {
            let $xs = rows_at::<4>($x, $k, $r);
            $body;
            $r += 4;
        }
        match $rows - $r {
            1 => {
                let $xs = rows_at::<1>($x, $k, $r);
                $body
            }
            2 => {
                let $xs = rows_at::<2>($x, $k, $r);
                $body
            }
            3 => {
                let $xs = rows_at::<3>($x, $k, $r);
                $body
            }
            _ => {}
        }
    }};
}

/// Rows `first..first + R` of `x` (rows of `k`). A plain function rather than closures, which
/// measured as calls in the loop over weight rows.
#[inline(always)]
fn rows_at<const R: usize>(x: &[f32], k: usize, first: usize) -> [&[f32]; R] {
    let mut out = [&x[..0]; R];
    for (i, row) in out.iter_mut().enumerate() {
        *row = &x[(first + i) * k..(first + i + 1) * k];
    }
    out
}

/// One task's products in rows ([`super::products`]): its weight rows in memory order, each
/// against the activation rows in groups of four through `dots`.
macro_rules! in_rows {
    (($w:expr, $k:expr, $first:expr, $x:expr, $rows:expr, $yt:expr), |$wj:ident, $xs:ident| $dots:expr) => {{
        let (w, k, first, x, rows, yt): (_, usize, usize, &[f32], usize, &mut [f32]) = ($w, $k, $first, $x, $rows, $yt);
        let n = yt.len() / rows;
        for (wj, yt) in w[first * k..(first + n) * k].chunks_exact(k).zip(yt.chunks_exact_mut(rows)) {
            in_fours!(rows, x, k, |r, xs| {
                let ($wj, $xs) = (wj.as_ptr(), xs);
                let out = $dots;
                yt[r..r + out.len()].copy_from_slice(&out);
            });
        }
    }};
}

/// `block_<type>::{avx2, avx512, best}`: [`super::block`] for one weight type through
/// [`dots_256`] or [`dots_512`], `best` picking the wider where the CPU has it; and
/// `panel_{avx2, avx512, best}`: [`super::panel_plain`] through [`panel_rows_256`] or
/// [`panel_rows_512`]. `$load8` and `$load16` widen eight or sixteen weights at an index to
/// F32; closures written here, so that they inherit the functions' target features and
/// inline into the loops.
macro_rules! block_for {
    ($name:ident, $ty:ty, $extra:literal, $load8:expr, $load16:expr) => {
        pub mod $name {
            use super::*;

            #[target_feature(enable = "avx2,fma")]
            #[target_feature(enable = $extra)]
            pub unsafe fn avx2(w: &[$ty], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
                in_rows!((w, k, first, x, rows, yt), |wj, xs| dots_256(wj, xs, $load8))
            }

            #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
            #[target_feature(enable = $extra)]
            pub unsafe fn avx512(w: &[$ty], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
                in_rows!((w, k, first, x, rows, yt), |wj, xs| dots_512(wj, xs, $load8, $load16))
            }

            pub unsafe fn best(w: &[$ty], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
                if cpu().avx512 {
                    avx512(w, k, first, x, rows, yt)
                } else {
                    avx2(w, k, first, x, rows, yt)
                }
            }

            #[target_feature(enable = "avx2,fma")]
            #[target_feature(enable = $extra)]
            pub unsafe fn panel_avx2(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
                panel_rows_256(w, x, rows, y, stride, $load8)
            }

            #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
            #[target_feature(enable = $extra)]
            pub unsafe fn panel_avx512(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
                panel_rows_512(w, x, rows, y, stride, $load16)
            }

            pub unsafe fn panel_best(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
                if cpu().avx512 {
                    panel_avx512(w, x, rows, y, stride)
                } else {
                    panel_avx2(w, x, rows, y, stride)
                }
            }
        }
    };
}

block_for!(block_f32, f32, "avx", |p: *const f32, i| _mm256_loadu_ps(p.add(i)), |p: *const f32, i| _mm512_loadu_ps(
    p.add(i)
));
// F16C widens eight halves in one instruction, AVX-512F sixteen.
block_for!(
    block_f16,
    f16,
    "f16c",
    |p: *const f16, i| _mm256_cvtph_ps(_mm_loadu_si128((p as *const u16).add(i) as *const __m128i)),
    |p: *const f16, i| _mm512_cvtph_ps(_mm256_loadu_si256((p as *const u16).add(i) as *const __m256i))
);
// A BF16 value is the high half of the F32 with the same bits: zero-extend and shift.
block_for!(
    block_bf16,
    bf16,
    "avx",
    |p: *const bf16, i| {
        let halves = _mm256_cvtepu16_epi32(_mm_loadu_si128((p as *const u16).add(i) as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(halves))
    },
    |p: *const bf16, i| {
        let halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256((p as *const u16).add(i) as *const __m256i));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(halves))
    }
);
