//! Attention of each decoding session's new position over its cache, all sessions' KV heads in
//! one parallel region; keys stored in tiles; scores, softmax and weighted sums in vector code
//! with the same bits in every build.

use super::dispatch::compiled_for_vectors;
use super::{scratch, CACHE_LINE};
use rayon::prelude::*;

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
pub(crate) fn store_keys(keys: &mut [f32], new: &[f32], kv_heads: usize, d: usize, pos: usize) {
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
pub(super) fn softmax_with(p: &mut [f32]) {
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
pub(super) fn exp(x: f32) -> f32 {
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
pub(super) fn scores_with(q: &[f32], keys: &[f32], d: usize, scale: f32, probs: &mut [f32]) {
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
pub(super) fn scores_of(coefs: &[&[f32]], keys: &[f32], scale: f32, outs: &mut [&mut [f32]]) {
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
pub(super) fn weighted_sums_with(probs: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
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
pub(super) fn prefetch_tile(rows: &[f32], next: usize, d: usize) {
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
pub(super) struct Pairs<I>(I);

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
pub(super) fn in_slices(coefs: &[&[f32]], rows: &[f32], stride: usize, outs: &mut [&mut [f32]]) {
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
pub(super) fn accumulate<const L: usize, const H: usize>(
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
