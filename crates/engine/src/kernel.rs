//! Our own product of activation rows with a weight matrix, for every projection: decode steps,
//! batches of sessions and prefill chunks alike, where candle's general matrix multiply leaves
//! memory bandwidth unused (a few rows) or half the multipliers idle (many rows).
//!
//! The layers' matrices are stored in panels ([`Layout`]): a task owns one panel of outputs and
//! walks it once, in one sequential stream, for a group of up to eight activation rows; each
//! activation value, broadcast once, feeds the 32 outputs of the panel, every output summed in
//! its own vector lane. The head is stored as rows, because its rows are also looked up and
//! scored one by one; its product streams each weight row once and reuses it for every
//! activation row.
//!
//! Determinism is the contract: the value of `y[r][j]` depends only on weight row `j` and
//! activation row `r`, never on how many rows are in the batch, which group or panel they fall
//! in, or which vector width the CPU has. In panels, every output is one fused multiply-add per
//! input, in input order; in rows, one fixed-order dot product (eight lanes, fused multiply-add,
//! one fixed horizontal sum, then the scalar tail). So a session decoded alone or batched with
//! others computes bit-identical logits, a row's products are the same inside a prefill chunk as
//! alone, and batching cannot change greedy ids.
//!
//! Also here, for the same steps: the exact integer products that screen the head for greedy ids
//! ([`int_products`], used by `crate::greedy`), and attention of each decoding session's new
//! position over its cache ([`attend_each`]).

use half::{bf16, f16};
use rayon::prelude::*;

/// Weight rows per parallel task of a product in rows (the head): small enough to balance two to
/// sixteen threads, large enough that scheduling costs little.
const BLOCK: usize = 32;

/// Outputs per panel of a matrix stored in panels ([`Layout::panels`]): two 512-bit vectors of F32
/// accumulators per activation row, so a group of eight rows takes half the 32 registers.
pub const PANEL: usize = 32;

/// How a weight matrix (`out × k`, a linear layer's) lies in memory: as rows (row-major), or in
/// panels of [`PANEL`] rows (the last one narrower when `PANEL` does not divide `out`), each panel
/// input by input: the panel's weights for input 0, then for input 1, and so on.
///
/// Why panels: in rows, a product of several activation rows reloads the activations for every
/// weight row, one load per multiply-add, and sums each output across vector lanes at its end:
/// four rows from memory cost 35-90% more than one (the loads and the weight stream compete),
/// and a prefill chunk, which went to candle's multiply, ran at half the multipliers' rate. In
/// panels, a task streams its panel once per group of up to eight rows; each activation value is
/// loaded once and feeds the panel's 32 outputs; each output accumulates in its own lane, with
/// no horizontal sum. Measured, the 24 layers' products from memory in a quiet minute: one row
/// 18.9-20.7 ms (in rows: 19.7-21.4), four rows 22.1-23.9 ms (in rows: 29.3-30.6); a prefill
/// chunk of 258 rows at twice candle's rate (gate and up, 9728 × 896: 9.5-10.9 ms against
/// 19.7-25.9 ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    k: usize,
    panels: bool,
}

impl Layout {
    /// Row-major.
    pub fn rows(k: usize) -> Self {
        Layout { k, panels: false }
    }

    /// In panels of [`PANEL`] rows.
    pub fn panels(k: usize) -> Self {
        Layout { k, panels: true }
    }

    /// Columns (inputs) of the matrix.
    pub fn k(self) -> usize {
        self.k
    }

    /// Row-major `w` (`out × k`) rearranged into this layout.
    pub fn arrange<W: Copy>(self, w: &[W]) -> Vec<W> {
        if !self.panels {
            return w.to_vec();
        }
        let mut laid = Vec::with_capacity(w.len());
        for panel in w.chunks(PANEL * self.k) {
            for i in 0..self.k {
                laid.extend(panel.chunks_exact(self.k).map(|row| row[i]));
            }
        }
        laid
    }
}

/// Element types a weight matrix may be stored in. Accumulation is always F32.
pub trait Weight: Copy + Send + Sync + 'static {
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
}

/// The weight types differ only in how a value widens and which SIMD functions they use (F16
/// also needs F16C).
macro_rules! weight {
    ($ty:ty, $block:ident, needs_f16c: $f16c:expr, |$v:ident| $to_f32:expr) => {
        impl Weight for $ty {
            fn to_f32(self) -> f32 {
                let $v = self;
                $to_f32
            }
            fn block_simd(w: &[$ty], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) -> bool {
                #[cfg(target_arch = "x86_64")]
                if simd::available() && (!$f16c || std::arch::is_x86_feature_detected!("f16c")) {
                    // SAFETY: the CPU has the instructions (checked above); `linear` checked the
                    // shapes.
                    unsafe { simd::$block::best(w, k, first, x, rows, yt) };
                    return true;
                }
                let _ = (w, k, first, x, rows, yt);
                false
            }
            unsafe fn panel_simd(w: &[$ty], x: &[f32], rows: usize, y: *mut f32, stride: usize) -> bool {
                #[cfg(target_arch = "x86_64")]
                if simd::available() && (!$f16c || std::arch::is_x86_feature_detected!("f16c")) {
                    // SAFETY: the CPU has the instructions (checked above); the caller vouches for
                    // the shapes and `y`.
                    unsafe { simd::$block::panel_best(w, x, rows, y, stride) };
                    return true;
                }
                let _ = (w, x, rows, y, stride);
                false
            }
        }
    };
}

weight!(f32, block_f32, needs_f16c: false, |v| v);
weight!(f16, block_f16, needs_f16c: true, |v| f16::to_f32(v));
weight!(bf16, block_bf16, needs_f16c: false, |v| bf16::to_f32(v));

/// `y = x · wᵀ (+ bias)`: `x` is `rows × k`, `w` is `out × k` (a linear layer's weight) in
/// `layout`, `y` is `rows × out`; `x` and `y` row-major. Any number of rows.
pub fn linear<W: Weight>(w: &[W], layout: Layout, bias: Option<&[f32]>, x: &[f32], rows: usize) -> Vec<f32> {
    let k = layout.k;
    assert!(k > 0 && w.len().is_multiple_of(k) && x.len() == rows * k, "linear: shapes do not agree");
    if rows == 0 {
        return Vec::new();
    }
    let out = w.len() / k;
    let mut y = if layout.panels { in_panels(w, k, x, rows) } else { in_rows(w, k, x, rows) };
    // Bias added after the product, as candle's Linear adds it.
    if let Some(b) = bias {
        y.chunks_exact_mut(out).for_each(|row| row.iter_mut().zip(b).for_each(|(y, b)| *y += b));
    }
    y
}

/// [`linear`]'s product for weights in rows: tasks of [`BLOCK`] weight rows.
fn in_rows<W: Weight>(w: &[W], k: usize, x: &[f32], rows: usize) -> Vec<f32> {
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
fn in_panels<W: Weight>(w: &[W], k: usize, x: &[f32], rows: usize) -> Vec<f32> {
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

/// A product's output buffer, shared by tasks that write disjoint values of it ([`in_panels`]).
#[derive(Clone, Copy)]
struct Outputs(*mut f32);

// SAFETY: only moved between the threads of one parallel region, while the buffer lives, by
// tasks that write disjoint values.
unsafe impl Send for Outputs {}
unsafe impl Sync for Outputs {}

impl Outputs {
    /// The value at `offset`. (A method, so that a closure captures the whole `Outputs`, not its
    /// pointer alone, which is neither `Send` nor `Sync`.)
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// One panel's products: `y[r][j] = w[j] · x[r]` for the panel's rows `j` (as [`Layout`] stores
/// them in `w`) and every row `r` of `x`, written at `y + r · stride + j`.
///
/// # Safety
/// `y` may be written at as many values as the panel has rows from each of `y`, `y + stride`,
/// ..., one per row of `x`.
unsafe fn panel<W: Weight>(w: &[W], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
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
unsafe fn panel_plain<W: Weight>(w: &[W], x: &[f32], rows: usize, y: *mut f32, stride: usize) {
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
pub fn selected_rows<W: Weight>(w: &[W], k: usize, x: &[f32], js: &[usize]) -> Vec<f32> {
    assert!(x.len() == k && js.iter().all(|j| (j + 1) * k <= w.len()), "selected_rows: shapes do not agree");
    let mut y = vec![0f32; js.len()];
    on_cache_lines(x, |x| {
        y.par_iter_mut().zip(js).with_min_len(BLOCK).for_each(|(y, j)| {
            products(w, k, *j, x, 1, std::slice::from_mut(y));
        })
    });
    y
}

/// The bytes of a cache line on the CPUs the vector paths serve.
const CACHE_LINE: usize = 64;

/// Runs `work` on `x`'s values starting on a cache-line boundary: `x` itself when it does, else
/// an aligned copy. Why: a 512-bit load from an address off a line boundary reads two lines, and
/// a product of several rows loads the activations as often as the weights (which start on huge
/// pages, every row on a line boundary for these models' widths). Four rows measured a third
/// faster in cache, and a quarter faster from memory, from aligned activations; the copy is a
/// few kilobytes. The values and so the results are the same either way.
fn on_cache_lines<T: Copy + Default, R>(x: &[T], work: impl FnOnce(&[T]) -> R) -> R {
    if (x.as_ptr() as usize).is_multiple_of(CACHE_LINE) {
        return work(x);
    }
    let size = std::mem::size_of::<T>();
    let mut buf = vec![T::default(); x.len() + CACHE_LINE / size];
    let address = buf.as_ptr() as usize;
    let at = (address.next_multiple_of(CACHE_LINE) - address) / size;
    buf[at..at + x.len()].copy_from_slice(x);
    work(&buf[at..at + x.len()])
}

/// Runs `work` on a thread of the rayon pool (at once when already on one).
///
/// Why: a forward opens a parallel region per projection and per attention, about a hundred per
/// decode step. Opened from outside the pool, each region hands the work to the pool's threads
/// and puts the caller to sleep until they finish: two thread wake-ups per region, measured at
/// 6% of a decode step on two cores. Opened from a pool thread, that thread works on the region
/// itself while the others, still spinning from the last region, take their share.
pub fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| work())
}

/// `silu(gate) · up` for each row of `gate_up` (`rows × 2·inter`: a row's `inter` gate values,
/// then its `inter` up values), with candle's arithmetic: `v / (1 + e⁻ᵛ)` through libm's `exp`,
/// rounded, then the product, rounded. So the same bits as candle's `silu` followed by its `mul`,
/// on every thread and without their two intermediate tensors. Why: candle runs the
/// exponentials on one thread, a millisecond of a four-session decode step with the other
/// thread idle.
pub fn silu_mul(gate_up: &[f32], rows: usize) -> Vec<f32> {
    assert!(rows > 0 && gate_up.len().is_multiple_of(2 * rows), "silu_mul: shapes do not agree");
    let inter = gate_up.len() / (2 * rows);
    const CHUNK: usize = 1024;
    let mut out = vec![0f32; rows * inter];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let (mut row, mut i) = (c * CHUNK / inter, c * CHUNK % inter);
        for out in out {
            let (gate, up) = (gate_up[2 * row * inter + i], gate_up[(2 * row + 1) * inter + i]);
            *out = gate / (1.0 + (-gate).exp()) * up;
            i += 1;
            if i == inter {
                (row, i) = (row + 1, 0);
            }
        }
    });
    out
}

/// One new position of a session to attend over its cache ([`attend_each`]): `q` is `heads × d`;
/// `k` is one layer's keys in tiles of [`TILE`] positions, `kv_heads × (capacity / TILE) × d ×
/// TILE` (per KV head and tile, one row per dimension, the tile's positions along it; see
/// [`store_keys`]); `v` its values, `kv_heads × capacity × d`; both filled up to `shape.len`
/// positions (the new one included). `capacity` is a whole number of tiles.
pub struct Attending<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub shape: AttentionShape,
}

/// Attention of each item's new position over its cache, for every query head; returns each
/// item's `heads × d` outputs, one item after another. Every item's KV heads are one parallel
/// region's tasks: one region per layer for a batch of decoding sessions, not one per session.
/// An item's outputs do not depend on the others.
///
/// Why not candle's matmul and softmax: for a single query row they cost several times the
/// bytes they read, so a decode step grew ~30% slower from context 64 to 4096. Here each KV
/// head's keys and values are read once for the query heads that share it, in tiles that stay
/// in L1 across those heads. Keys are stored dimension by dimension so that a query's scores are
/// vector operations over positions (`scores`), like the weighted sums of the values over
/// dimensions (`weighted_sums`); with the keys as rows, every score was a dot product of 64
/// values ending in its own horizontal sum, which cost more than the multiplies. In tiles rather
/// than as whole rows of `capacity` positions, a tile's keys are one contiguous 16 KB stream:
/// rows of a whole capacity made a tile sixty-four streams a row apart, which measured 14%
/// slower at context 4096, and 30% slower at capacities that are multiples of 1024 (every row
/// then falls in the same L1 sets). The softmax runs in vector registers too (`softmax`).
pub fn attend_each(items: &[Attending], scale: f32) -> Vec<f32> {
    let Some(first) = items.first() else { return Vec::new() };
    let AttentionShape { heads, kv_heads, d, .. } = first.shape;
    let groups = heads / kv_heads;
    for Attending { q, k, v, shape } in items {
        let AttentionShape { capacity, len, .. } = *shape;
        assert!((shape.heads, shape.kv_heads, shape.d) == (heads, kv_heads, d), "attend_each: one model's heads");
        assert!(q.len() == heads * d && k.len() == kv_heads * capacity * d && v.len() == k.len() && len <= capacity);
        assert!(capacity.is_multiple_of(TILE), "attend_each: a capacity of whole tiles");
    }
    let mut out = vec![0f32; items.len() * heads * d];
    out.par_chunks_mut(groups * d).enumerate().for_each(|(task, out)| {
        let (item, h) = (&items[task / kv_heads], task % kv_heads);
        let (Attending { q, k, v, .. }, AttentionShape { capacity, len, .. }) = (item, item.shape);
        // The tiles that hold the first `len` positions.
        let keys = &k[h * capacity * d..(h * capacity + len.next_multiple_of(TILE)) * d];
        let values = &v[h * capacity * d..(h * capacity + len) * d];
        let q = &q[h * groups * d..(h + 1) * groups * d];
        scratch(len * groups, |probs| {
            // probs[g][j]: query head g's score at position j, then its softmax over the positions.
            scores(q, keys, d, scale, probs);
            probs.chunks_exact_mut(len).for_each(softmax);
            weighted_sums(probs, values, d, out);
        });
    });
    out
}

/// Writes the keys of positions `pos..pos + n` into one layer's keys in tiles ([`attend_each`]'s
/// layout, `keys.len() / (kv_heads · d)` positions per KV head): `new` is `kv_heads × n × d`, as
/// the projection computes them. Position `p`'s dimension `i` goes to row `i` of tile `p / TILE`,
/// at `p % TILE`.
pub fn store_keys(keys: &mut [f32], new: &[f32], kv_heads: usize, d: usize, pos: usize) {
    let (capacity, n) = (keys.len() / (kv_heads * d), new.len() / (kv_heads * d));
    assert!(keys.len() == kv_heads * capacity * d && new.len() == kv_heads * n * d, "store_keys: shapes do not agree");
    assert!(capacity.is_multiple_of(TILE) && pos + n <= capacity, "store_keys: positions past the capacity");
    for (h, head) in new.chunks_exact(n * d).enumerate() {
        for (t, key) in head.chunks_exact(d).enumerate() {
            let p = pos + t;
            let tile = &mut keys[(h * capacity + p / TILE * TILE) * d..][..d * TILE];
            for (i, value) in key.iter().enumerate() {
                tile[i * TILE + p % TILE] = *value;
            }
        }
    }
}

/// Runs `work` on this thread's scratch buffer, grown to at least `len` values (contents
/// unspecified). Why: attention's buffers are a few hundred kilobytes at long contexts; allocated
/// per call, each one is fresh pages from the kernel (faults, then a TLB shootdown on free): about
/// a third of attention's time at context 4096.
fn scratch<R>(len: usize, work: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buf| {
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        work(&mut buf[..len])
    })
}

/// Defines `$name` as the function `$with` compiled three times, plain, for AVX2 (with FMA) and
/// for AVX-512 (F and BW), and chosen at run time. `$with` is written in plain loops that the
/// compiler turns into vector code, so the three builds do the same operations in the same order
/// and give the same bits, in wider vectors: the compiler never fuses a multiply and an add by
/// itself, and a written `mul_add` rounds once in every build (an FMA instruction, or libm's
/// `fmaf` in the plain build).
macro_rules! compiled_for_vectors {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) => $with:ident) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("fma")
            {
                #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
                unsafe fn avx512($($arg: $ty),*) {
                    $with($($arg),*)
                }
                // SAFETY: the CPU has AVX-512F/BW and FMA (checked above).
                return unsafe { avx512($($arg),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    $with($($arg),*)
                }
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                return unsafe { avx2($($arg),*) };
            }
            $with($($arg),*)
        }
    };
}

compiled_for_vectors!(
    /// `out[g] = Σ_j probs[g][j] · values[j]` for every query head `g` of a group, each output
    /// element summed in position order by fused multiply-adds.
    ///
    /// Why tiles: the plain loop stores every output after every position and reads all the
    /// values once per query head. Here a tile of positions' values stays in L1 for all the
    /// heads, and a slice of outputs stays in registers across the tile.
    fn weighted_sums(probs: &[f32], values: &[f32], d: usize, out: &mut [f32]) => weighted_sums_with
);

compiled_for_vectors!(
    /// Softmax of `p` in place: the largest value, the exponential of each value's difference to
    /// it ([`exp`]), their sum, and each divided by the sum; the largest and the sum kept in
    /// sixteen lanes. Why not libm's `exp` in a scalar loop, as candle does: at context 4096 that
    /// loop was a quarter of attention's time; here it is vector code.
    fn softmax(p: &mut [f32]) => softmax_with
);

#[inline(always)]
#[allow(clippy::needless_range_loop)] // the lanes, as in the prose
fn softmax_with(p: &mut [f32]) {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    for c in p.chunks_exact(L) {
        for l in 0..L {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    let tail = p.len() / L * L;
    let max = lanes.iter().chain(&p[tail..]).fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let mut sums = [0f32; L];
    for c in p.chunks_exact_mut(L) {
        for l in 0..L {
            c[l] = exp(c[l] - max);
            sums[l] += c[l];
        }
    }
    let mut sum = sums.iter().sum::<f32>();
    for v in &mut p[tail..] {
        *v = exp(*v - max);
        sum += *v;
    }
    p.iter_mut().for_each(|v| *v /= sum);
}

/// `eˣ` in F32, within two units in the last place of the exact value, from operations a vector
/// unit has (so a loop over it compiles to vector code). Results below F32's normal range
/// (x < -87.6) are zero: in a softmax, whose largest term is 1, that changes nothing.
///
/// How: x = n·ln 2 + r with n whole and |r| ≤ ln 2 / 2 (ln 2 in two parts, the first short
/// enough that n times it is exact), eʳ from its Taylor series to r⁷ (the rest is below 6e-9
/// of it), and 2ⁿ written straight into an F32's exponent bits.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4; // 355/512: nine significant bits
    const LN2_LO: f32 = -2.121_944_4e-4; // ln 2 - LN2_HI
    let clamped = x.clamp(-87.6, 88.0);
    let n = (clamped * std::f32::consts::LOG2_E + 0.5).floor();
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let mut e = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        e = e * r + c;
    }
    // 2ⁿ from n's bits: n (whole, |n| ≤ 127) plus 1.5·2²³ is exact and holds 0x4B40_0000 + n
    // as an integer. Why not `n as i32`: Rust's saturating conversion compiles to scalar code,
    // lane by lane, which took most of the softmax's time.
    let biased = (n + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000 - 127);
    let two_n = f32::from_bits(biased << 23);
    if x.is_nan() {
        x
    } else if x < -87.6 {
        0.0
    } else {
        e * two_n
    }
}

compiled_for_vectors!(
    /// `probs[g][j] = scale · Σ_i q[g][i] · key_j[i]`: every query head `g`'s score at every
    /// position `j` over `d` dimensions, the keys in tiles ([`attend_each`]); each summed in
    /// dimension order by fused multiply-adds, then scaled.
    fn scores(q: &[f32], keys: &[f32], d: usize, scale: f32, probs: &mut [f32]) => scores_with
);

#[inline(always)]
fn scores_with(q: &[f32], keys: &[f32], d: usize, scale: f32, probs: &mut [f32]) {
    let len = probs.len() / (q.len() / d);
    for first in (0..len).step_by(TILE) {
        let last = (first + TILE).min(len);
        prefetch_tile(keys, first + TILE, d);
        let heads = q.chunks_exact(d).zip(probs.chunks_exact_mut(len).map(|p| &mut p[first..last]));
        for ((c0, o0), second) in Pairs(heads) {
            match second {
                Some((c1, o1)) => scores_of(&[c0, c1], &keys[first * d..], scale, &mut [o0, o1]),
                None => scores_of(&[c0], &keys[first * d..], scale, &mut [o0]),
            }
        }
    }
}

/// One tile of [`scores`] for one or two heads: `keys` from the tile's first row on.
#[inline(always)]
fn scores_of(coefs: &[&[f32]], keys: &[f32], scale: f32, outs: &mut [&mut [f32]]) {
    for o in outs.iter_mut() {
        o.fill(0.0);
    }
    in_slices(coefs, keys, TILE, outs);
    for o in outs.iter_mut() {
        for v in o.iter_mut() {
            *v *= scale;
        }
    }
}

#[inline(always)]
fn weighted_sums_with(probs: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
    let len = values.len() / d;
    for first in (0..len).step_by(TILE) {
        let last = (first + TILE).min(len);
        let tile = &values[first * d..last * d];
        prefetch_tile(values, first + TILE, d);
        let heads = probs.chunks_exact(len).map(|p| &p[first..last]).zip(out.chunks_exact_mut(d));
        for ((c0, o0), second) in Pairs(heads) {
            match second {
                Some((c1, o1)) => in_slices(&[c0, c1], tile, d, &mut [o0, o1]),
                None => in_slices(&[c0], tile, d, &mut [o0]),
            }
        }
    }
}

/// Asks for the tile of positions from `next` on (as many as `rows`, `d` values a position, holds)
/// while the previous tile's are multiplied. Why: the hardware prefetcher alone left each tile's
/// first loads waiting on memory; measured at context 4096, the 24 layers' attention of one
/// session took 2.41-2.52 ms with this against 2.88-3.25 ms without.
#[inline(always)]
fn prefetch_tile(rows: &[f32], next: usize, d: usize) {
    let tile = &rows[(next * d).min(rows.len())..((next + TILE) * d).min(rows.len())];
    #[cfg(target_arch = "x86_64")]
    for line in tile.chunks(CACHE_LINE / std::mem::size_of::<f32>()) {
        // SAFETY: a prefetch reads nothing; it only hints at an address inside a live slice.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = tile;
}

/// Positions per tile of the cached keys ([`attend_each`]), and of the weighted sums: a tile's keys
/// (or values) stay in L1 for every query head of their group.
pub const TILE: usize = 64;

/// The heads two at a time, then the last alone when their number is odd. Why pairs: each load
/// of a row then feeds two heads' multiply-adds, and two heads' outputs are twice the
/// independent add chains. (An iterator, not a function taking a closure: a closure is compiled
/// without the vector features of the function it sits in unless it is inlined, and then its
/// fused multiply-adds become library calls.)
struct Pairs<I>(I);

impl<I: Iterator> Iterator for Pairs<I> {
    type Item = (I::Item, Option<I::Item>);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let first = self.0.next()?;
        Some((first, self.0.next()))
    }
}

/// `outs[h][c] += Σ_t coefs[h][t] · rows[t · stride + c]` for every head `h` (one or two) and
/// output `c`, each in `t` order by fused multiply-adds: the shared inner loop of [`scores`] and
/// [`weighted_sums`]. Wide slices of outputs first, each held in registers across all the rows:
/// sixty-four outputs of two heads are eight independent chains of 512-bit multiply-adds (their
/// latency, not their count, bounds a narrower slice).
#[inline(always)]
fn in_slices(coefs: &[&[f32]], rows: &[f32], stride: usize, outs: &mut [&mut [f32]]) {
    match (coefs, outs) {
        ([c0, c1], [o0, o1]) => {
            let c = accumulate::<64, 2>([c0, c1], rows, stride, 0, [o0, o1]);
            let c = accumulate::<16, 2>([c0, c1], rows, stride, c, [o0, o1]);
            accumulate::<1, 2>([c0, c1], rows, stride, c, [o0, o1]);
        }
        ([c0], [o0]) => {
            let c = accumulate::<64, 1>([c0], rows, stride, 0, [o0]);
            let c = accumulate::<16, 1>([c0], rows, stride, c, [o0]);
            accumulate::<1, 1>([c0], rows, stride, c, [o0]);
        }
        _ => unreachable!("one or two heads"),
    }
}

/// [`in_slices`] for `H` heads and outputs `c..` in slices of `L`. Returns where the whole
/// slices end.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the heads and lanes, as in the prose
fn accumulate<const L: usize, const H: usize>(
    coefs: [&[f32]; H],
    rows: &[f32],
    stride: usize,
    mut c: usize,
    outs: [&mut [f32]; H],
) -> usize {
    let n = outs[0].len();
    while c + L <= n {
        let mut acc = [[0f32; L]; H];
        for h in 0..H {
            acc[h].copy_from_slice(&outs[h][c..c + L]);
        }
        for t in 0..coefs[0].len() {
            let row = &rows[t * stride + c..t * stride + c + L];
            for h in 0..H {
                let coef = coefs[h][t];
                for (a, x) in acc[h].iter_mut().zip(row) {
                    *a = coef.mul_add(*x, *a);
                }
            }
        }
        for h in 0..H {
            outs[h][c..c + L].copy_from_slice(&acc[h]);
        }
        c += L;
    }
    c
}

/// `yt[j][r] = Σ_i q[j][i] · p[r][i]` in 32-bit integers, exact: `q` is `out × k` eight-bit
/// weights, `p` is `rows × k` sixteen-bit activations. The caller keeps `k · 127 · max|p|` below
/// 2³¹, so no sum can overflow. Computed transposed (`out × rows`), in parallel over blocks of
/// weight rows. Exact integers are the same in any order, so every build gives the same result.
pub fn int_products(q: &[i8], p: &[i16], rows: usize, k: usize) -> Vec<i32> {
    assert!(k > 0 && q.len().is_multiple_of(k) && p.len() == rows * k, "int_products: shapes do not agree");
    let mut yt = vec![0i32; q.len() / k * rows];
    if rows == 0 {
        return yt;
    }
    on_cache_lines(p, |p| {
        yt.par_chunks_mut(BLOCK * rows).enumerate().for_each(|(b, yt)| {
            int_block(&q[b * BLOCK * k..(b * BLOCK + yt.len() / rows) * k], p, k, yt);
        })
    });
    yt
}

/// One task of [`int_products`]: through AVX-512 VNNI where the CPU has it (one instruction
/// multiplies sixteen pairs of sixteen-bit values and adds each pair's sum to a 32-bit lane),
/// else through plain loops the compiler vectorizes.
fn int_block(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
    {
        // SAFETY: the CPU has the instructions (checked above); `int_products` checked the shapes.
        return unsafe { simd::int_block_vnni(q, p, k, yt) };
    }
    int_block_plain(q, p, k, yt)
}

compiled_for_vectors!(
    /// [`int_block`] in plain loops (widen, multiply, add).
    fn int_block_plain(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) => int_block_with
);

#[inline(always)]
fn int_block_with(q: &[i8], p: &[i16], k: usize, yt: &mut [i32]) {
    let rows = p.len() / k;
    for (qj, yt) in q.chunks_exact(k).zip(yt.chunks_exact_mut(rows)) {
        for (y, p) in yt.iter_mut().zip(p.chunks_exact(k)) {
            *y = int_dot(qj, p);
        }
    }
}

#[inline(always)]
fn int_dot(q: &[i8], p: &[i16]) -> i32 {
    q.iter().zip(p).map(|(a, b)| i32::from(*a) * i32::from(*b)).sum()
}

/// The dimensions [`attend_each`] works in.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub capacity: usize,
    /// Filled positions, the new one included.
    pub len: usize,
    /// Head dimension.
    pub d: usize,
}

/// One task's share of a product in rows, on one thread: `yt[j][r] = w[first + j] · x[r]` for
/// `yt.len() / rows` weight rows from `first`, through the SIMD path where the CPU has it. The
/// SIMD path walks them in memory order (one sequential stream the prefetcher follows).
fn products<W: Weight>(w: &[W], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
    if !W::block_simd(w, k, first, x, rows, yt) {
        block(w, k, first, x, rows, yt);
    }
}

/// [`products`] without SIMD: each weight row against each activation row.
fn block<W: Weight>(w: &[W], k: usize, first: usize, x: &[f32], rows: usize, yt: &mut [f32]) {
    for (wj, yt) in w[first * k..].chunks_exact(k).zip(yt.chunks_exact_mut(rows)) {
        for (y, x) in yt.iter_mut().zip(x.chunks_exact(k)) {
            *y = portable_dot(wj, x);
        }
    }
}

/// The SIMD path's order of operations for one row (four accumulators of eight lanes over
/// blocks of 32, whole blocks of 8 left over into the first, a fixed reduction, then the scalar
/// tail) without fused multiply-add: the fallback for CPUs without AVX2/FMA.
fn portable_dot<W: Weight>(w: &[W], x: &[f32]) -> f32 {
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
fn reduce(acc: [[f32; 8]; 4]) -> f32 {
    let l: [f32; 8] = std::array::from_fn(|i| (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]));
    let q = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{Weight, CACHE_LINE, PANEL};
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    /// AVX-512F: 512-bit vectors and thirty-two registers.
    pub fn wide_vectors() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

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
            out[r] = _mm512_reduce_add_epi32(acc[r]) + super::int_dot(&q[whole..], tail);
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
            let (w, k, first, x, rows, yt): (_, usize, usize, &[f32], usize, &mut [f32]) =
                ($w, $k, $first, $x, $rows, $yt);
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
                    if wide_vectors() {
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
                    if wide_vectors() {
                        panel_avx512(w, x, rows, y, stride)
                    } else {
                        panel_avx2(w, x, rows, y, stride)
                    }
                }
            }
        };
    }

    block_for!(
        block_f32,
        f32,
        "avx",
        |p: *const f32, i| _mm256_loadu_ps(p.add(i)),
        |p: *const f32, i| _mm512_loadu_ps(p.add(i))
    );
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
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic test values in [-1, 1) (also the screen's tests').
    pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
        // A small xorshift generator.
        let mut s = seed.wrapping_mul(2654435761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_a_plain_f64_product_within_rounding() {
        // Heights and widths that exercise the four-row groups in rows, the groups of eight in
        // panels, a narrow last panel, a partial parallel block and the scalar tail of a row.
        for (out, k, rows) in [(7, 13, 1), (37, 24, 3), (70, 67, 5), (130, 896, 2), (40, 50, 19)] {
            let (w, x, b) = (data(out * k, 1), data(rows * k, 2), data(out, 3));
            for layout in [Layout::rows(k), Layout::panels(k)] {
                let y = linear(&layout.arrange(&w), layout, Some(&b), &x, rows);
                for r in 0..rows {
                    for j in 0..out {
                        let exact: f64 =
                            (0..k).map(|i| w[j * k + i] as f64 * x[r * k + i] as f64).sum::<f64>() + b[j] as f64;
                        let got = y[r * out + j] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                            "{layout:?} y[{r}][{j}] = {got}, exact {exact}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_computes_the_same_bits_alone_or_in_any_batch() {
        // Twenty rows: groups of four in rows; two groups of eight and one of four in panels.
        let (out, k, rows) = (69, 136, 20);
        let w = data(out * k, 4);
        let x = data(rows * k, 5);
        for layout in [Layout::rows(k), Layout::panels(k)] {
            let w = layout.arrange(&w);
            let batch = linear(&w, layout, None, &x, rows);
            assert!(linear(&w, layout, None, &[], 0).is_empty(), "{layout:?}: no rows");
            for r in [0, 3, 9, 17, rows - 1] {
                let alone = linear(&w, layout, None, &x[r * k..(r + 1) * k], 1);
                assert_eq!(alone, batch[r * out..(r + 1) * out], "{layout:?} row {r}");
            }
        }
    }

    #[test]
    fn activations_give_the_same_bits_wherever_they_start() {
        let (out, k, rows) = (40, 136, 4);
        let n = rows * k;
        let w = data(out * k, 24);
        let q: Vec<i8> = w.iter().map(|v| (v * 127.0) as i8).collect();
        let x = data(n, 25);
        let p: Vec<i16> = x.iter().map(|v| (v * 16000.0) as i16).collect();
        let expected = (linear(&w, Layout::rows(k), None, &x, rows), int_products(&q, &p, rows, k));
        let (mut xs, mut ps) = (vec![0f32; n + 16], vec![0i16; n + 32]);
        for at in 0..16 {
            xs[at..at + n].copy_from_slice(&x);
            ps[at..at + n].copy_from_slice(&p);
            let (x, p) = (&xs[at..at + n], &ps[at..at + n]);
            // What the products see starts on a cache line and holds the caller's values.
            on_cache_lines(x, |seen| assert!((seen.as_ptr() as usize).is_multiple_of(CACHE_LINE) && seen == x));
            on_cache_lines(p, |seen| assert!((seen.as_ptr() as usize).is_multiple_of(CACHE_LINE) && seen == p));
            let moved = (linear(&w, Layout::rows(k), None, x, rows), int_products(&q, p, rows, k));
            assert_eq!(moved, expected, "activations moved by {at} values");
        }
    }

    #[test]
    fn integer_products_are_exact_in_every_path() {
        // Widths with whole 32-blocks and a tail; one to six activation rows (groups of four
        // and the rest).
        for (out, k, rows) in [(70, 100, 5), (33, 64, 1), (40, 896, 6)] {
            let q: Vec<i8> = data(out * k, 22).iter().map(|v| (v * 127.0) as i8).collect();
            let p: Vec<i16> = data(rows * k, 23).iter().map(|v| (v * 16000.0) as i16).collect();
            let dots = int_products(&q, &p, rows, k);
            let mut plain = vec![0i32; out * rows];
            int_block_with(&q, &p, k, &mut plain);
            assert_eq!(dots, plain, "{out}x{k}x{rows}: the SIMD and plain paths");
            for j in 0..out {
                for r in 0..rows {
                    let exact: i64 = (0..k).map(|i| q[j * k + i] as i64 * p[r * k + i] as i64).sum();
                    assert_eq!(dots[j * rows + r] as i64, exact, "{out}x{k}x{rows}: row {j}, activations {r}");
                }
            }
        }
    }

    /// Each output of a product in panels, as it must be computed: one fused multiply-add per
    /// input, in input order, from zero.
    fn fused_in_order<W: Weight>(w: &[W], x: &[f32]) -> f32 {
        w.iter().zip(x).fold(0f32, |acc, (w, x)| w.to_f32().mul_add(*x, acc))
    }

    fn to<H>(w: &[f32], narrow: fn(f32) -> H) -> Vec<H> {
        w.iter().map(|v| narrow(*v)).collect()
    }

    #[test]
    fn panels_compute_each_output_by_fused_multiply_adds_in_input_order() {
        // Whole panels only, a narrow last panel, a lone narrow panel; widths with and without
        // whole vectors; every group size of eight rows and past it; every weight type.
        for (out, k) in [(64, 33), (70, 75), (5, 896), (33, 8)] {
            let (w, x) = (data(out * k, 26), data(20 * k, 27));
            for rows in [1, 2, 3, 4, 5, 6, 7, 8, 9, 20] {
                let x = &x[..rows * k];
                let label = format!("{out}x{k}x{rows}");
                check(&w, k, x, &label);
                check(&to(&w, f16::from_f32), k, x, &format!("f16 {label}"));
                check(&to(&w, bf16::from_f32), k, x, &format!("bf16 {label}"));
            }
        }

        fn check<W: Weight>(w: &[W], k: usize, x: &[f32], label: &str) {
            let (out, rows, layout) = (w.len() / k, x.len() / k, Layout::panels(k));
            let laid = layout.arrange(w);
            let y = linear(&laid, layout, None, x, rows);
            for r in 0..rows {
                for j in 0..out {
                    let exact = fused_in_order(&w[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
                    assert_eq!(y[r * out + j].to_bits(), exact.to_bits(), "{label}: y[{r}][{j}]");
                }
            }
            // The portable path, panel by panel, gives the same bits.
            let mut plain = vec![0f32; rows * out];
            for (p, panel) in laid.chunks(PANEL * k).enumerate() {
                // SAFETY: panel `p`'s columns of `plain`, `rows × out`.
                unsafe { panel_plain(panel, x, rows, plain.as_mut_ptr().add(p * PANEL), out) };
            }
            assert_eq!(plain, y, "{label}: the portable path");
        }
    }

    #[test]
    fn selected_rows_give_the_full_products_bits() {
        let (out, k) = (100, 200);
        let (w, x) = (data(out * k, 17), data(k, 18));
        let full = linear(&w, Layout::rows(k), None, &x, 1);
        let js = [0, 31, 32, 57, 99];
        assert_eq!(selected_rows(&w, k, &x, &js), js.map(|j| full[j]));
    }

    #[test]
    fn the_portable_path_agrees_with_the_simd_path_within_rounding() {
        let (out, k, rows) = (9, 75, 3);
        let (w, x) = (data(out * k, 8), data(rows * k, 9));
        let fast = linear(&w, Layout::rows(k), None, &x, rows);
        let mut yt = vec![0f32; out * rows];
        block(&w, k, 0, &x, rows, &mut yt);
        for j in 0..out {
            for r in 0..rows {
                let (a, b) = (fast[r * out + j], yt[j * rows + r]);
                assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "y[{r}][{j}]: {a} vs {b}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_256_and_512_bit_paths_compute_the_same_bits() {
        if !(simd::available() && simd::wide_vectors() && std::arch::is_x86_feature_detected!("f16c")) {
            eprintln!("skipped: this CPU lacks AVX2/FMA/F16C or AVX-512F, so it runs one path only");
            return;
        }
        use simd::{block_bf16, block_f16, block_f32};
        // In rows: widths with whole 32-blocks, a leftover 8-block and a scalar tail; one to six
        // rows.
        for (out, k, rows) in [(5, 64, 1), (7, 75, 4), (3, 131, 6), (4, 896, 2)] {
            let (w, x) = (data(out * k, 15), data(rows * k, 16));
            same_bits((block_f32::avx2, block_f32::avx512), &w, k, &x, "f32");
            same_bits((block_f16::avx2, block_f16::avx512), &to(&w, f16::from_f32), k, &x, "f16");
            same_bits((block_bf16::avx2, block_bf16::avx512), &to(&w, bf16::from_f32), k, &x, "bf16");
        }
        // In panels: two whole panels; groups of one to eight rows and past them.
        for (k, rows) in [(33, 1), (75, 3), (8, 8), (131, 11)] {
            let (w, x) = (Layout::panels(k).arrange(&data(2 * PANEL * k, 17)), data(rows * k, 18));
            same_panel_bits((block_f32::panel_avx2, block_f32::panel_avx512), &w, k, &x, "f32");
            let (w16, wb16) = (to(&w, f16::from_f32), to(&w, bf16::from_f32));
            same_panel_bits((block_f16::panel_avx2, block_f16::panel_avx512), &w16, k, &x, "f16");
            same_panel_bits((block_bf16::panel_avx2, block_bf16::panel_avx512), &wb16, k, &x, "bf16");
        }

        type Path<W> = unsafe fn(&[W], usize, usize, &[f32], usize, &mut [f32]);
        fn same_bits<W>(paths: (Path<W>, Path<W>), w: &[W], k: usize, x: &[f32], label: &str) {
            let (rows, out) = (x.len() / k, w.len() / k);
            let (mut a, mut b) = (vec![0f32; out * rows], vec![0f32; out * rows]);
            // SAFETY: the CPU has the instructions (checked by the caller) and the shapes agree.
            unsafe { (paths.0(w, k, 0, x, rows, &mut a), paths.1(w, k, 0, x, rows, &mut b)) };
            assert_eq!(a, b, "{label} {out}x{k}x{rows}");
        }

        type PanelPath<W> = unsafe fn(&[W], &[f32], usize, *mut f32, usize);
        fn same_panel_bits<W>(paths: (PanelPath<W>, PanelPath<W>), w: &[W], k: usize, x: &[f32], label: &str) {
            let (rows, out) = (x.len() / k, w.len() / k);
            let (mut a, mut b) = (vec![0f32; out * rows], vec![0f32; out * rows]);
            for (p, panel) in w.chunks_exact(PANEL * k).enumerate() {
                // SAFETY: the CPU has the instructions (checked by the caller); panel `p`'s
                // columns of `rows × out` outputs.
                unsafe {
                    paths.0(panel, x, rows, a.as_mut_ptr().add(p * PANEL), out);
                    paths.1(panel, x, rows, b.as_mut_ptr().add(p * PANEL), out);
                }
            }
            assert_eq!(a, b, "{label} {out}x{k}x{rows}");
        }
    }

    #[test]
    fn single_row_attention_matches_a_plain_f64_softmax_over_the_filled_positions() {
        // Head widths through every slice width of the weighted sums (64, 16, 1), contexts through
        // every slice width of the scores (64, 16, 1) and spanning several tiles.
        for (d, capacity, len) in [(16, 64, 37), (72, 192, 150), (64, 192, 129), (64, 448, 337)] {
            let shape = AttentionShape { heads: 6, kv_heads: 2, capacity, len, d };
            // Keys and values as computed: position j's at [kv][j].
            let (q, plain_keys, v) = (data(6 * d, 10), data(2 * capacity * d, 11), data(2 * capacity * d, 12));
            let mut k = vec![0f32; 2 * capacity * d];
            store_keys(&mut k, &plain_keys, 2, d, 0);
            let out = attend_each(&[Attending { q: &q, k: &k, v: &v, shape }], 0.25);
            for h in 0..6 {
                let kv = h / 3;
                let key = |j: usize, i: usize| plain_keys[(kv * capacity + j) * d + i] as f64;
                let row = |t: &[f32], j: usize| -> Vec<f64> {
                    t[(kv * capacity + j) * d..(kv * capacity + j + 1) * d].iter().map(|&x| x as f64).collect()
                };
                let scores: Vec<f64> =
                    (0..len).map(|j| (0..d).map(|i| key(j, i) * q[h * d + i] as f64).sum::<f64>() * 0.25).collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for i in 0..d {
                    let exact: f64 = (0..len).map(|j| (scores[j] - max).exp() / sum * row(&v, j)[i]).sum();
                    let got = out[h * d + i] as f64;
                    assert!((got - exact).abs() < 1e-5, "d {d}, head {h} [{i}]: {got} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn sessions_attended_together_get_their_bits_alone() {
        // Different capacities and lengths (one position, several tiles), one model's heads.
        let d = 64;
        let sessions: Vec<_> = [(64, 1), (192, 129), (448, 337)]
            .into_iter()
            .enumerate()
            .map(|(i, (capacity, len))| {
                let seed = 40 + 3 * i as u32;
                let (q, v) = (data(6 * d, seed), data(2 * capacity * d, seed + 1));
                let mut k = vec![0f32; 2 * capacity * d];
                store_keys(&mut k, &data(2 * capacity * d, seed + 2), 2, d, 0);
                (q, k, v, AttentionShape { heads: 6, kv_heads: 2, capacity, len, d })
            })
            .collect();
        let items: Vec<Attending> =
            sessions.iter().map(|(q, k, v, shape)| Attending { q, k, v, shape: *shape }).collect();
        let together = attend_each(&items, 0.125);
        for (i, item) in items.iter().enumerate() {
            let alone = attend_each(std::slice::from_ref(item), 0.125);
            assert_eq!(together[i * 6 * d..(i + 1) * 6 * d], alone, "session {i}");
        }
    }

    #[test]
    fn keys_land_in_their_tile_row_and_column_stored_at_once_or_in_pieces() {
        let (kv_heads, capacity, d) = (2, 3 * TILE, 8);
        let plain = data(kv_heads * capacity * d, 26);
        let mut at_once = vec![0f32; kv_heads * capacity * d];
        store_keys(&mut at_once, &plain, kv_heads, d, 0);
        for h in 0..kv_heads {
            for p in 0..capacity {
                for i in 0..d {
                    let stored = at_once[(h * capacity + p / TILE * TILE) * d + i * TILE + p % TILE];
                    assert_eq!(stored, plain[(h * capacity + p) * d + i], "head {h} position {p} dimension {i}");
                }
            }
        }
        // The same positions written in pieces that start and end inside tiles.
        let mut pieces = vec![0f32; kv_heads * capacity * d];
        for (from, to) in [(0, 5), (5, 70), (70, 71), (71, capacity)] {
            let new: Vec<f32> = (0..kv_heads)
                .flat_map(|h| plain[(h * capacity + from) * d..(h * capacity + to) * d].to_vec())
                .collect();
            store_keys(&mut pieces, &new, kv_heads, d, from);
        }
        assert_eq!(pieces, at_once);
    }

    #[test]
    fn silu_mul_gives_candles_silu_then_mul_bits() {
        use candle_core::{Device, Tensor};
        let (rows, inter) = (3, 2500);
        // Values over the range where the exponential saturates either way.
        let gate_up: Vec<f32> = data(rows * 2 * inter, 27).iter().map(|v| v * 40.0).collect();
        let t = Tensor::from_vec(gate_up.clone(), (rows, 2 * inter), &Device::Cpu).unwrap();
        let gate = candle_nn::ops::silu(&t.narrow(1, 0, inter).unwrap()).unwrap();
        let candle = (gate * t.narrow(1, inter, inter).unwrap()).unwrap().flatten_all().unwrap();
        let ours = silu_mul(&gate_up, rows);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours), bits(&candle.to_vec1::<f32>().unwrap()));
    }

    #[test]
    fn exp_is_within_two_units_in_the_last_place() {
        let mut worst = 0f64;
        for i in 0..=2_000_000 {
            let x = -87.5 + 87.5 * 1.0005 * i as f32 / 2_000_000.0; // to a little above 0
            let exact = (x as f64).exp();
            let got = exp(x) as f64;
            let ulp = (exact as f32).abs().next_up() as f64 - (exact as f32).abs() as f64;
            worst = worst.max((got - exact).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} units in the last place");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_matches_f64_and_every_build_gives_the_same_bits() {
        for len in [1, 15, 16, 37, 4100] {
            let p: Vec<f32> = data(len, 19).iter().map(|v| v * 30.0).collect();
            let mut got = p.clone();
            softmax(&mut got);
            // Against the exact exponentials of the F32 differences (which every softmax rounds).
            let max = p.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            let sum: f64 = p.iter().map(|v| ((v - max) as f64).exp()).sum();
            for (g, v) in got.iter().zip(&p) {
                let exact = ((v - max) as f64).exp() / sum;
                assert!((*g as f64 - exact).abs() <= 1e-6 * exact + 1e-30, "len {len}: {g} vs {exact}");
            }
            let mut plain = p.clone();
            softmax_with(&mut plain);
            assert_eq!(plain, got, "len {len}: the plain build's bits");
        }
    }

    #[test]
    fn tiled_scores_give_the_plain_loops_bits() {
        // Positions through every slice width (64, 16, 1) and several tiles, the last one partly
        // filled.
        let (groups, len, d) = (3, 337usize, 40);
        let capacity = len.next_multiple_of(TILE);
        let (q, plain_keys) = (data(groups * d, 20), data(capacity * d, 21));
        let mut keys = vec![0f32; capacity * d];
        store_keys(&mut keys, &plain_keys, 1, d, 0);
        let mut probs = vec![0f32; groups * len];
        scores(&q, &keys, d, 0.3, &mut probs);
        for g in 0..groups {
            for j in 0..len {
                let key = &plain_keys[j * d..(j + 1) * d];
                let plain = (0..d).fold(0f32, |acc, i| q[g * d + i].mul_add(key[i], acc)) * 0.3;
                assert_eq!(plain.to_bits(), probs[g * len + j].to_bits(), "head {g} position {j}");
            }
        }
    }

    #[test]
    fn tiled_weighted_sums_give_the_plain_loops_bits() {
        let (groups, len, d) = (3, 200, 88);
        let (probs, values) = (data(groups * len, 13), data(len * d, 14));
        let mut out = vec![0f32; groups * d];
        weighted_sums(&probs, &values, d, &mut out);
        for g in 0..groups {
            let mut plain = vec![0f32; d];
            for (p, v) in probs[g * len..(g + 1) * len].iter().zip(values.chunks_exact(d)) {
                plain.iter_mut().zip(v).for_each(|(o, x)| *o = p.mul_add(*x, *o));
            }
            assert_eq!(plain, out[g * d..(g + 1) * d], "head {g}");
        }
    }

    #[test]
    fn f16_weights_accumulate_in_f32() {
        let (out, k) = (9, 64);
        let w = data(out * k, 6);
        let w16: Vec<f16> = w.iter().map(|v| f16::from_f32(*v)).collect();
        let x = data(k, 7);
        let y = linear(&w16, Layout::rows(k), None, &x, 1);
        for j in 0..out {
            let exact: f64 = (0..k).map(|i| w16[j * k + i].to_f64() * x[i] as f64).sum();
            assert!((y[j] as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "y[{j}] = {}, exact {exact}", y[j]);
        }
    }
}
