//! The weight product of activation rows with a matrix, in rows (the head) or in panels (the
//! layers), for F32, F16 and BF16 weights: each output's value depends only on its own rows.

use super::dispatch::cpu;
#[cfg(target_arch = "x86_64")]
use super::x86 as simd;
use super::{on_cache_lines, Outputs, BLOCK};
use half::{bf16, f16};
use rayon::prelude::*;

/// Outputs per panel of a matrix stored in panels ([`Layout::panels`]): two 512-bit vectors of F32
/// accumulators per activation row, so a group of twelve rows takes 24 of the 32 registers.
pub(crate) const PANEL: usize = 32;

/// How a weight matrix (`out × k`, a linear layer's) lies in memory: as rows (row-major), or in
/// panels of [`PANEL`] rows (the last one narrower when `PANEL` does not divide `out`), each panel
/// input by input: the panel's weights for input 0, then for input 1, and so on.
///
/// Why panels: in rows, a product of several activation rows reloads the activations for every
/// weight row, one load per multiply-add, and sums each output across vector lanes at its end:
/// four rows from memory cost 35-90% more than one (the loads and the weight stream compete),
/// and a prefill chunk, which went to candle's multiply, ran at half the multipliers' rate. In
/// panels, a task streams its panel once per group of rows (up to twelve); each activation value is
/// loaded once and feeds the panel's 32 outputs; each output accumulates in its own lane, with
/// no horizontal sum. Measured, the 24 layers' products from memory in a quiet minute: one row
/// 18.9-20.7 ms (in rows: 19.7-21.4), four rows 22.1-23.9 ms (in rows: 29.3-30.6); a prefill
/// chunk of 258 rows at twice candle's rate (gate and up, 9728 × 896: 9.5-10.9 ms against
/// 19.7-25.9 ms).
///
/// BF16 weights in panels go one step further ([`Layout::paired_panels`]): the inputs in pairs,
/// each row's two weights of a pair side by side, the operand of a BF16 dot product
/// ([`super::paired`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    k: usize,
    panels: bool,
    pairs: bool,
}

impl Layout {
    /// Row-major.
    pub fn rows(k: usize) -> Self {
        Layout { k, panels: false, pairs: false }
    }

    /// In panels of [`PANEL`] rows.
    pub fn panels(k: usize) -> Self {
        Layout { k, panels: true, pairs: false }
    }

    /// In panels of [`PANEL`] rows, input pairs interleaved: for each pair of inputs `(2i, 2i+1)`,
    /// the panel's rows' two weights, row by row. For BF16 weights, with an even `k` (panics
    /// otherwise); [`linear`] then rounds the activations to BF16 ([`super::paired`] says why).
    pub fn paired_panels(k: usize) -> Self {
        assert!(k.is_multiple_of(2), "paired panels need an even number of inputs");
        Layout { k, panels: true, pairs: true }
    }

    /// Whether this layout pairs the inputs ([`Self::paired_panels`]).
    pub fn paired(self) -> bool {
        self.pairs
    }

    /// Columns (inputs) of the matrix.
    pub fn k(self) -> usize {
        self.k
    }

    /// Row-major `w` (`out × k`) rearranged into this layout.
    pub fn arrange<W: Copy + Default + Send + Sync>(self, w: &[W]) -> Vec<W> {
        let mut laid = w.to_vec();
        self.arrange_into(w, &mut laid);
        laid
    }

    /// [`Self::arrange`] into `out` (as long as `w`), where the matrix is to live: a load then
    /// makes no copy in between.
    pub fn arrange_into<W: Copy + Default + Send + Sync>(self, w: &[W], out: &mut [W]) {
        let k = self.k;
        self.fill_into(out, |first, rows| rows.copy_from_slice(&w[first * k..first * k + rows.len()]));
    }

    /// Lays a matrix out into `out` (its size) from its rows, which `rows(first, buf)` writes
    /// into `buf` (whole row-major rows from row `first`) a panel at a time: a load that
    /// produces rows (dequantized from a file) then holds only the laid-out matrix, not a
    /// row-major copy too. Panels are filled side by side; in rows, `buf` is `out` itself.
    pub fn fill_into<W: Copy + Default + Send + Sync>(self, out: &mut [W], rows: impl Fn(usize, &mut [W]) + Sync) {
        let k = self.k.max(1);
        if !self.panels {
            out.par_chunks_mut(PANEL * k).enumerate().for_each(|(p, chunk)| rows(p * PANEL, chunk));
            return;
        }
        let step = if self.pairs { 2 } else { 1 };
        // Panels are laid out side by side: each fills its own part of `out`.
        out.par_chunks_mut(PANEL * k).enumerate().for_each_init(Vec::new, |panel, (p, laid)| {
            panel.resize(laid.len(), W::default());
            rows(p * PANEL, panel);
            // Input `i·step + s` of the panel's row `r` goes to `(i·n + r)·step + s`; the two
            // cases written apart so that each copies values, not slices of a runtime length.
            let n = panel.len() / k;
            for (r, row) in panel.chunks_exact(k).enumerate() {
                if step == 1 {
                    row.iter().enumerate().for_each(|(i, v)| laid[i * n + r] = *v);
                } else {
                    for (i, pair) in row.chunks_exact(2).enumerate() {
                        laid[2 * (i * n + r)] = pair[0];
                        laid[2 * (i * n + r) + 1] = pair[1];
                    }
                }
            }
        });
    }
}

/// Element types a weight matrix may be stored in. Accumulation is always F32.
pub trait Weight: Copy + Default + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// One task's products in rows (the portable `block`) through the SIMD path; false when the
    /// CPU lacks its instructions (the portable path then runs).
    fn block_simd(w: &[Self], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) -> bool;
    /// One whole panel's products (the portable `panel_plain`) through the SIMD path; false when
    /// the CPU lacks its instructions.
    ///
    /// # Safety
    /// `w` is one panel of `PANEL` rows of `x.len() / rows` inputs, and `y` may be written at
    /// `PANEL` values from each of `y`, `y + stride`, ..., one per row of `x`.
    unsafe fn panel_simd(w: &[Self], x: &[f32], rows: usize, y: *mut f32, stride: usize) -> bool;
    /// The weights as BF16, when they are (the only type [`Layout::paired_panels`] holds).
    fn as_bf16(w: &[Self]) -> Option<&[bf16]>;
}

/// The weight types differ only in how a value widens and which SIMD functions they use (F16
/// also needs F16C).
macro_rules! weight {
    ($ty:ty, $block:ident, $panel:ident, needs_f16c: $f16c:expr, |$v:ident| $to_f32:expr, as_bf16: $as_bf16:expr) => {
        impl Weight for $ty {
            fn as_bf16(w: &[$ty]) -> Option<&[bf16]> {
                $as_bf16(w)
            }
            fn to_f32(self) -> f32 {
                let $v = self;
                $to_f32
            }
            fn block_simd(w: &[$ty], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) -> bool {
                #[cfg(target_arch = "x86_64")]
                if cpu().avx2 && (!$f16c || cpu().f16c) {
                    // SAFETY: the CPU has the instructions (checked above); `linear` checked the
                    // shapes.
                    unsafe { simd::$block(w, k, first, x, rows, yt) };
                    return true;
                }
                let _ = (w, k, first, x, rows, yt);
                false
            }
            unsafe fn panel_simd(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) -> bool {
                #[cfg(target_arch = "x86_64")]
                if cpu().avx2 && (!$f16c || cpu().f16c) {
                    // SAFETY: the CPU has the instructions (checked above); the caller vouches for
                    // the shapes and `y`.
                    unsafe { simd::$panel(w, x, rows, y, stride) };
                    return true;
                }
                let _ = (w, x, rows, y, stride);
                false
            }
        }
    };
}

weight!(f32, block_f32, panel_f32, needs_f16c: false, |v| v, as_bf16: |_| None);
weight!(f16, block_f16, panel_f16, needs_f16c: true, |v| f16::to_f32(v), as_bf16: |_| None);
weight!(bf16, block_bf16, panel_bf16, needs_f16c: false, |v| bf16::to_f32(v), as_bf16: Some);

/// `y = x · wᵀ (+ bias)`: `x` is `rows × k`, `w` is `out × k` (a linear layer's weight) in
/// `layout`, `y` is `rows × out`; `x` and `y` row-major. Any number of rows.
pub fn linear<W: Weight>(w: &[W], layout: Layout, bias: Option<&[f32]>, x: &[f32], rows: usize) -> Vec<f32> {
    let k = layout.k;
    assert!(k > 0 && w.len().is_multiple_of(k) && x.len() == rows * k, "linear: shapes do not agree");
    if rows == 0 {
        return Vec::new();
    }
    let out = w.len() / k;
    let mut y = match (layout.pairs, W::as_bf16(w)) {
        (true, Some(w)) => super::paired::in_panels(w, k, x, rows),
        (true, None) => panic!("linear: paired panels hold BF16 weights"),
        (false, _) if layout.panels => in_panels(w, k, x, rows),
        (false, _) => in_rows(w, k, x, rows),
    };
    // Bias added after the product, as candle's Linear adds it.
    if let Some(b) = bias {
        y.chunks_exact_mut(out).for_each(|row| row.iter_mut().zip(b).for_each(|(y, b)| *y += b));
    }
    y
}

/// [`linear`]'s product for weights in rows: tasks of [`BLOCK`] weight rows.
pub(super) fn in_rows<W: Weight>(w: &[W], k: usize, x: &[f32], rows: usize) -> Vec<f32> {
    let out = w.len() / k;
    // Computed transposed (`out × rows`) so every task owns one contiguous piece of the output.
    let mut yt = vec![0f32; out * rows];
    on_cache_lines(x, |x| {
        yt.par_chunks_mut(BLOCK * rows).enumerate().for_each(|(b, yt)| products(w, k, b * BLOCK, x, rows, yt))
    });
    if rows == 1 {
        // One row: the transposed layout is the layout.
        return yt;
    }
    let mut y = vec![0f32; rows * out];
    for (j, yt) in yt.chunks_exact(rows).enumerate() {
        for (r, v) in yt.iter().enumerate() {
            y[r * out + j] = *v;
        }
    }
    y
}

/// [`linear`]'s product for weights in panels: one task per panel, which writes its columns of
/// every output row.
pub(super) fn in_panels<W: Weight>(w: &[W], k: usize, x: &[f32], rows: usize) -> Vec<f32> {
    let out = w.len() / k;
    let mut y = vec![0f32; rows * out];
    let outputs = Outputs(y.as_mut_ptr());
    w.par_chunks(PANEL * k).enumerate().for_each(|(p, w)| {
        // SAFETY: panel `p` is `w`; its outputs are columns `p·PANEL..` (as many as its rows) of
        // each of `y`'s `rows` rows of `out`: inside `y`, which outlives this region, and written
        // by no other task.
        unsafe { panel(w, x, rows, outputs.at(p * PANEL), out) }
    });
    y
}

/// One panel's products: `y[r][j] = w[j] · x[r]` for the panel's rows `j` (as [`Layout`] stores
/// them in `w`) and every row `r` of `x`, written at `y + r · stride + j`.
///
/// # Safety
/// `y` may be written at as many values as the panel has rows from each of `y`, `y + stride`,
/// ..., one per row of `x`.
pub(super) unsafe fn panel<W: Weight>(w: &[W], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
    // A narrow last panel goes the portable way: the same operations, so the same bits.
    if w.len() == PANEL * (x.len() / rows) && W::panel_simd(w, x, rows, y, stride) {
        return;
    }
    panel_plain(w, x, rows, y, stride)
}

/// [`panel`] without SIMD: each output one fused multiply-add per input, in input order (libm's
/// `fmaf` where the CPU lacks the instruction), as the SIMD path does in each lane.
///
/// # Safety
/// As [`panel`].
pub(super) unsafe fn panel_plain<W: Weight>(w: &[W], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
    let k = x.len() / rows;
    let width = w.len() / k;
    for (r, x) in x.chunks_exact(k).enumerate() {
        let mut acc = [0f32; PANEL];
        for (ws, x) in w.chunks_exact(width).zip(x) {
            acc.iter_mut().zip(ws).for_each(|(a, w)| *a = w.to_f32().mul_add(*x, *a));
        }
        // SAFETY: the caller lets us write `width` values at row `r`'s place.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), y.add(r * stride), width) };
    }
}

/// `w[j] · x` for the weight rows `js` only (`w` row-major, `x` one row of `k`): the same bits as
/// the `j`th output of [`linear`] without bias, since each output depends only on its own rows.
pub(crate) fn selected_rows<W: Weight>(w: &[W], k: usize, x: &[f32], js: &[usize]) -> Vec<f32> {
    assert!(x.len() == k && js.iter().all(|j| (j + 1) * k <= w.len()), "selected_rows: shapes do not agree");
    let mut y = vec![0f32; js.len()];
    on_cache_lines(x, |x| {
        y.par_iter_mut().zip(js).with_min_len(BLOCK).for_each(|(y, j)| {
            products(w, k, *j, x, 1, std::slice::from_mut(y));
        })
    });
    y
}

/// One task's share of a product in rows, on one thread: `yt[j][r] = w[first + j] · x[r]` for
/// `yt.len() / rows` weight rows from `first`, through the SIMD path where the CPU has it. The
/// SIMD path walks them in memory order (one sequential stream the prefetcher follows).
pub(super) fn products<W: Weight>(w: &[W], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
    if !W::block_simd(w, k, first, x, rows, yt) {
        block(w, k, first, x, rows, yt);
    }
}

/// [`products`] without SIMD: each weight row against each activation row.
pub(super) fn block<W: Weight>(w: &[W], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
    for (wj, yt) in w[first * k..].chunks_exact(k).zip(yt.chunks_exact_mut(rows)) {
        for (y, x) in yt.iter_mut().zip(x.chunks_exact(k)) {
            *y = portable_dot(wj, x);
        }
    }
}

/// The SIMD path's order of operations for one row (four accumulators of eight lanes over
/// blocks of 32, whole blocks of 8 left over into the first, a fixed reduction, then the scalar
/// tail) without fused multiply-add: the fallback for CPUs without AVX2/FMA.
pub(super) fn portable_dot<W: Weight>(w: &[W], x: &[f32]) -> f32 {
    let mut acc = [[0f32; 8]; 4];
    let (blocks, eights) = (w.len() / 32 * 32, w.len() / 8 * 8);
    for (wc, xc) in w[..blocks].chunks_exact(32).zip(x[..blocks].chunks_exact(32)) {
        for (a, (w8, x8)) in acc.iter_mut().zip(wc.chunks_exact(8).zip(xc.chunks_exact(8))) {
            for l in 0..8 {
                a[l] += w8[l].to_f32() * x8[l];
            }
        }
    }
    for (w8, x8) in w[blocks..eights].chunks_exact(8).zip(x[blocks..eights].chunks_exact(8)) {
        for l in 0..8 {
            acc[0][l] += w8[l].to_f32() * x8[l];
        }
    }
    let mut sum = reduce(acc);
    for (a, b) in w[eights..].iter().zip(&x[eights..]) {
        sum += a.to_f32() * b;
    }
    sum
}

/// The reduction both paths use: lane-wise (a0 + a1) + (a2 + a3), then lanes (0+4, 1+5, 2+6,
/// 3+7), then pairs, then the last two.
pub(super) fn reduce(acc: [[f32; 8]; 4]) -> f32 {
    let l: [f32; 8] = std::array::from_fn(|i| (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]));
    let q = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}
