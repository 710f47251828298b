//! The x86-64 instruction sets, one file each: [`avx2`] (256-bit, with FMA and F16C) and
//! [`avx512`] (512-bit, VNNI for the integer products), as `#[target_feature]` functions; this
//! module holds what both use (prefetching, the walk over activation rows, how each weight type
//! widens eight values) and picks the wider path where the CPU has it ([`super::dispatch`]).
//! Every path does the portable path's operations in the same order per lane.

use super::dispatch::cpu;
use super::{CACHE_LINE, PANEL};
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

/// Asks for the cache lines [`PREFETCH_BYTES`] past each of a quantized weight row's. Why:
/// quantized rows are read where they lie in the file's map, on 4 KiB pages, where the
/// hardware prefetcher stops at every page boundary; the products measured latency-bound on
/// the first load of each block without it.
#[inline(always)]
unsafe fn prefetch_row(w: &[u8]) {
    let mut line = 0;
    while line < w.len() {
        prefetch(w.as_ptr(), line);
        line += CACHE_LINE;
    }
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

/// Writes `$dots` (the values of activation rows `$r..$r + $R`, an array of `$R`) into `$out` at
/// those rows, for the rows in groups of each size in turn, widest first, while a whole group
/// is left: the walk every quantized row product shares ([`super::quant`]'s rows in groups).
macro_rules! in_groups {
    ($out:expr, [$($size:literal),+], |$r:ident, $R:ident| $dots:expr) => {{
        let out: &mut [f32] = $out;
        let mut $r = 0;
        $(
            while out.len() - $r >= $size {
                const $R: usize = $size;
                out[$r..$r + $R].copy_from_slice(&$dots);
                $r += $R;
            }
        )+
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

/// Eight weights of type `$ty` from index `i` of `p`, widened to F32, as a closure. A macro, not a
/// function, so that the closure is written inside each `#[target_feature]` function and
/// inherits its features (a closure does not inherit them from where it was defined).
macro_rules! widen8 {
    (f32) => {
        |p: *const f32, i| _mm256_loadu_ps(p.add(i))
    };
    // F16C widens eight halves in one instruction.
    (f16) => {
        |p: *const f16, i| _mm256_cvtph_ps(_mm_loadu_si128((p as *const u16).add(i) as *const __m128i))
    };
    // A BF16 value is the high half of the F32 with the same bits: zero-extend and shift.
    (bf16) => {
        |p: *const bf16, i| {
            let halves = _mm256_cvtepu16_epi32(_mm_loadu_si128((p as *const u16).add(i) as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(halves))
        }
    };
}

// Visible to the kernel's tests, which hold both paths to the same bits.
pub(super) mod avx2;
pub(super) mod avx512;

pub(super) use avx512::int_block_vnni;

/// `$block` ([`super::block`] for one weight type) and `$panel` ([`super::panel_plain`]) through
/// the widest path this CPU has. The caller has checked AVX2 and FMA (and F16C for F16).
macro_rules! widest {
    ($block:ident, $panel:ident, $ty:ty) => {
        pub(super) unsafe fn $block(w: &[$ty], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
            if cpu().avx512 {
                avx512::$block(w, k, first, x, rows, yt)
            } else {
                avx2::$block(w, k, first, x, rows, yt)
            }
        }

        pub(super) unsafe fn $panel(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
            if cpu().avx512 {
                avx512::$panel(w, x, rows, y, stride)
            } else {
                avx2::$panel(w, x, rows, y, stride)
            }
        }
    };
}

widest!(block_f32, panel_f32, f32);
widest!(block_f16, panel_f16, f16);
widest!(block_bf16, panel_bf16, bf16);
