//! Attention of sessions' new positions over their caches, decoding (one position each) and
//! prefilling (a chunk of positions) alike, in one kernel: every KV head's tiles of keys and
//! values are read once for a block of query rows, and each row's softmax is taken online, tile
//! by tile, so memory is bounded by the block and the tile whatever the context; the scores,
//! softmax and weighted sums run in vector code with the same bits in every build.

use super::dispatch::compiled_for_vectors;
use super::CACHE_LINE;
use rayon::prelude::*;

/// New positions of one session to attend over its cache ([`attend_each`]): the last
/// `shape.rows` of the `shape.len` filled positions (their keys and values already stored). `q`
/// is their queries, `rows × heads × d`; `keys` and `values` are its tiles of [`TILE`]
/// positions covering the filled ones, KV head by KV head (`kv_heads × tiles` slices, tile `t`
/// of head `h` at `h · tiles + t`): a tile of keys is `d × TILE` values, one row per dimension
/// with the tile's positions along it ([`store_keys`]); a tile of values `TILE × d`, position
/// by position ([`store_values`]).
pub struct Attending<'a> {
    pub q: &'a [f32],
    pub keys: &'a [&'a [f32]],
    pub values: &'a [&'a [f32]],
    pub shape: AttentionShape,
}

/// Query rows a task takes at once: their keys and values are read once for all of them.
const BLOCK_ROWS: usize = 16;

/// Attention of each item's new positions over its cache, causal (position `p` sees positions
/// `0..=p`), for every query head; returns each item's `rows × heads × d` outputs, one item after
/// another. One parallel region for all: a task is one item's KV head for a block of its rows.
///
/// Every output row is computed the same way wherever it is: its key tiles in position order,
/// each tile's scores (fused multiply-adds in dimension order, then scaled; positions past the
/// row's own masked), the running maximum and sum of the online softmax updated with the tile's
/// exponentials (the sum in sixteen lanes kept across tiles), the row's running output rescaled
/// and added the tile's values weighted by them (fused multiply-adds in position order), and at
/// the end divided by the sum (its lanes added in one fixed order). So a row's bits
/// depend only on its query, its position and the cache, never on the other rows of its chunk,
/// the chunk's size, the other sessions or the vector width: a session prefilled whole, in
/// chunks or token by token, alone or batched, computes the same attention.
///
/// Why not candle's matmul and softmax: for a prefill chunk they materialise every row's scores
/// over the whole context (heads × rows × context values: gigabytes at 8k positions) and a mask
/// as large, and for a single decoding row they cost several times the bytes they read. Keys are
/// stored dimension by dimension in tiles so that scores are vector operations along positions,
/// like the weighted sums of the values along dimensions; a tile's keys are one contiguous 16 KB
/// stream that stays in L1 for all the query heads of a block.
pub fn attend_each(items: &[Attending], scale: f32) -> Vec<f32> {
    let Some(first) = items.first() else { return Vec::new() };
    let AttentionShape { heads, kv_heads, d, .. } = first.shape;
    let groups = heads / kv_heads;
    let mut offsets = Vec::with_capacity(items.len());
    let mut total = 0;
    for Attending { q, keys, values, shape } in items {
        let AttentionShape { len, rows, .. } = *shape;
        assert!((shape.heads, shape.kv_heads, shape.d) == (heads, kv_heads, d), "attend_each: one model's heads");
        assert!(heads.is_multiple_of(kv_heads) && rows >= 1 && rows <= len, "attend_each: shape");
        let tiles = len.div_ceil(TILE);
        assert!(q.len() == rows * heads * d && keys.len() == kv_heads * tiles && values.len() == keys.len());
        assert!(keys.iter().chain(values.iter()).all(|t| t.len() == TILE * d), "attend_each: whole tiles");
        offsets.push(total);
        total += rows * heads * d;
    }
    // (item, KV head, first row of the block, its rows): one task each, its outputs staged
    // contiguously in task order (for one row per item, that is already the result's order).
    let tasks: Vec<(usize, usize, usize, usize)> = items
        .iter()
        .enumerate()
        .flat_map(|(i, item)| {
            let rows = item.shape.rows;
            (0..kv_heads)
                .flat_map(move |h| (0..rows).step_by(BLOCK_ROWS).map(move |r| (i, h, r, BLOCK_ROWS.min(rows - r))))
        })
        .collect();
    let mut staged = vec![0f32; total];
    let mut parts = Vec::with_capacity(tasks.len());
    let mut rest = &mut staged[..];
    for &(_, _, _, n) in &tasks {
        let (part, tail) = rest.split_at_mut(n * groups * d);
        parts.push(part);
        rest = tail;
    }
    parts.into_par_iter().zip(&tasks).for_each(|(out, &(i, h, r0, n))| {
        let Attending { q, keys, values, shape } = &items[i];
        let AttentionShape { len, rows, .. } = *shape;
        let first_position = len - rows + r0;
        // This KV head's tiles up to the block's last row.
        let (tiles, seen) = (len.div_ceil(TILE), (first_position + n).div_ceil(TILE));
        let keys = &keys[h * tiles..h * tiles + seen];
        let values = &values[h * tiles..h * tiles + seen];
        // The block's queries of this KV head's group: each row's `groups × d`, a row of all the
        // heads apart.
        let q = &q[(r0 * heads + h * groups) * d..];
        attend_block(q, heads * d, keys, values, d, n, first_position, scale, out);
    });
    if items.iter().all(|item| item.shape.rows == 1) {
        return staged;
    }
    let mut out = vec![0f32; total];
    let mut at = 0;
    for &(i, h, r0, n) in &tasks {
        for r in r0..r0 + n {
            out[offsets[i] + (r * heads + h * groups) * d..][..groups * d]
                .copy_from_slice(&staged[at..at + groups * d]);
            at += groups * d;
        }
    }
    out
}

compiled_for_vectors!(
    /// One task of [`attend_each`]: `rows` query rows (each `groups × d` values of `q`, rows
    /// `q_stride` apart; the first at `first_position`) over one KV head's tiles of `keys` and
    /// `values` up to the last row's position; `out` (zeroed, `rows × groups × d`) gets their
    /// outputs.
    fn attend_block(
        q: &[f32],
        q_stride: usize,
        keys: &[&[f32]],
        values: &[&[f32]],
        d: usize,
        rows: usize,
        first_position: usize,
        scale: f32,
        out: &mut [f32]
    ) => attend_block_with
);

#[inline(always)]
#[allow(clippy::too_many_arguments)] // one block's whole description
pub(super) fn attend_block_with(
    q: &[f32],
    q_stride: usize,
    keys: &[&[f32]],
    values: &[&[f32]],
    d: usize,
    rows: usize,
    first_position: usize,
    scale: f32,
    out: &mut [f32],
) {
    let groups = out.len() / (rows * d);
    // The block's query vectors side by side, `d` apart: the scores' inner loop then reads its
    // vectors' coefficients at fixed distances from one address (four separate rows of `q` cost
    // it registers, and it spilled).
    let qs: Vec<f32> = (0..rows).flat_map(|r| &q[r * q_stride..][..groups * d]).copied().collect();
    // Each query vector's running maximum and sum.
    let mut running = vec![Running::START; rows * groups];
    let end = first_position + rows;
    for (t, start) in (0..end).step_by(TILE).enumerate() {
        let tile = Tile { keys: keys[t], values: &values[t][..((start + TILE).min(end) - start) * d], d, scale };
        if let (Some(next_keys), Some(next_values)) = (keys.get(t + 1), values.get(t + 1)) {
            prefetch(next_keys);
            prefetch(next_values);
        }
        if start + TILE <= first_position + 1 {
            // Every row of the block sees the whole tile: all its vectors in one sweep.
            tile.sweep(&qs, 0..rows * groups, TILE, &mut running, out);
        } else {
            // The causal edge: each row sees the tile up to its own position.
            for r in start.saturating_sub(first_position)..rows {
                let seen = TILE.min(first_position + r + 1 - start);
                tile.sweep(&qs, r * groups..(r + 1) * groups, seen, &mut running, out);
            }
        }
    }
    for (o, running) in out.chunks_exact_mut(d).zip(&running) {
        let sum = running.sum();
        o.iter_mut().for_each(|x| *x /= sum);
    }
}

/// Lanes of a running sum: the sum of a query vector's exponentials is kept in this many
/// separate sums, tile after tile, and added up once at its end. Why: one total per tile was a
/// chain of dependent scalar adds for every vector and tile.
const LANES: usize = 16;
const _: () = assert!(TILE.is_multiple_of(LANES), "a tile is whole lanes");

/// One query vector's online softmax so far: the largest score seen and the sum of every
/// exponential relative to it, in [`LANES`] lanes (lane `l` holds the positions `l` modulo
/// sixteen of every tile).
#[derive(Clone, Copy)]
pub(super) struct Running {
    max: f32,
    lanes: [f32; LANES],
}

impl Running {
    pub(super) const START: Running = Running { max: f32::NEG_INFINITY, lanes: [0.0; LANES] };

    /// The sum of the exponentials: its lanes in a fixed order.
    pub(super) fn sum(&self) -> f32 {
        self.lanes.iter().sum()
    }

    #[cfg(test)]
    pub(super) fn max(&self) -> f32 {
        self.max
    }
}

/// One tile of one KV head's keys (in its dimension-major layout) and values, as a block's query
/// vectors take it.
struct Tile<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    d: usize,
    scale: f32,
}

impl Tile<'_> {
    /// The tile's step for query vectors `vectors` (of `q`, `d` values each), each seeing its
    /// first `seen` positions: four vectors at a time, then two, then one. Why four: each load of
    /// a key or value row then feeds four vectors' multiply-adds, which keeps the loads from
    /// bounding the multiplies. A vector's bits do not depend on its company.
    #[inline(always)]
    fn sweep(&self, q: &[f32], vectors: std::ops::Range<usize>, seen: usize, running: &mut [Running], out: &mut [f32]) {
        let mut v = vectors.start;
        while v + 4 <= vectors.end {
            self.step::<4>(q, v, seen, running, out);
            v += 4;
        }
        if v + 2 <= vectors.end {
            self.step::<2>(q, v, seen, running, out);
            v += 2;
        }
        if v < vectors.end {
            self.step::<1>(q, v, seen, running, out);
        }
    }

    /// Vectors `v..v + H`: their scores over the tile (those past `seen` masked out), the online
    /// softmax, the running outputs rescaled and added the weighted values of the `seen`
    /// positions.
    #[inline(always)]
    fn step<const H: usize>(&self, q: &[f32], v: usize, seen: usize, running: &mut [Running], out: &mut [f32]) {
        let d = self.d;
        let mut scores = [[0f32; TILE]; H];
        let coefs: [&[f32]; H] = std::array::from_fn(|h| &q[(v + h) * d..][..d]);
        // Scores for the whole tile even at the causal edge: sixty-four outputs are whole vectors,
        // where `seen` of them took a scalar tail. The positions past `seen` become -inf, whose
        // exponential is exactly 0, so they add nothing to the sum and are left out of the
        // weighted values: a row's bits do not depend on what the tile holds past its position.
        in_slices(coefs, self.keys, TILE, &mut scores.each_mut().map(|s| &mut s[..]));
        for s in &mut scores {
            s.iter_mut().for_each(|x| *x *= self.scale);
            s[seen..].fill(f32::NEG_INFINITY);
        }
        let running: &mut [Running; H] = (&mut running[v..v + H]).try_into().expect("H running sums");
        let corrections = online(&mut scores, running);
        let mut rows = out[v * d..(v + H) * d].chunks_exact_mut(d);
        let mut outs: [&mut [f32]; H] = std::array::from_fn(|_| rows.next().expect("H rows of d"));
        for h in 0..H {
            rescale(outs[h], corrections[h]);
        }
        let weights: [&[f32]; H] = scores.each_ref().map(|p| &p[..seen]);
        in_slices(weights, self.values, d, &mut outs);
    }
}

/// The online softmax's step for `H` query vectors and one tile: each vector's scores become
/// their exponentials relative to its new running maximum, and its running sum's lanes are
/// rescaled and added them; returns the factors the running outputs are rescaled by (0 on the
/// first tile, whose running maximum is -inf). The tile's maximum is taken lane by lane, then
/// halving (a maximum is exact in any order); the sums stay in their lanes.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the vectors and lanes, as in the prose
pub(super) fn online<const H: usize>(scores: &mut [[f32; TILE]; H], running: &mut [Running; H]) -> [f32; H] {
    let mut maxes = [0f32; H];
    for h in 0..H {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        for c in scores[h].chunks_exact(LANES) {
            for l in 0..LANES {
                lanes[l] = larger(lanes[l], c[l]);
            }
        }
        let mut width = LANES / 2;
        while width > 0 {
            for l in 0..width {
                lanes[l] = larger(lanes[l], lanes[l + width]);
            }
            width /= 2;
        }
        maxes[h] = larger(running[h].max, lanes[0]);
    }
    let corrections: [f32; H] = std::array::from_fn(|h| exp(running[h].max - maxes[h]));
    for h in 0..H {
        let mut tile = [0f32; LANES];
        for c in scores[h].chunks_exact_mut(LANES) {
            for l in 0..LANES {
                c[l] = exp(c[l] - maxes[h]);
                tile[l] += c[l];
            }
        }
        for l in 0..LANES {
            running[h].lanes[l] = running[h].lanes[l] * corrections[h] + tile[l];
        }
        running[h].max = maxes[h];
    }
    corrections
}

/// The larger of two scores, as one vector instruction: `f32::max`'s care for a NaN (returning
/// the other operand) costs a compare and a blend per use. A NaN score is not hidden by this: its
/// exponential is NaN, and so is the row's output.
#[inline(always)]
fn larger(a: f32, b: f32) -> f32 {
    if b > a {
        b
    } else {
        a
    }
}

/// Multiplies a running output by the online softmax's correction.
#[inline(always)]
fn rescale(o: &mut [f32], by: f32) {
    o.iter_mut().for_each(|v| *v *= by);
}

/// Writes the keys of positions `pos..pos + n` into one layer's keys in a pool of blocks: `new` is
/// `kv_heads × n × d`, as the projection computes them; position `p` goes to block
/// `blocks[p / TILE]`, whose keys for KV head `h` are a tile of `d × TILE` values at
/// `(block · kv_heads + h) · d · TILE`, dimension `i` in row `i`, at column `p % TILE`.
pub(crate) fn store_keys(keys: &mut [f32], blocks: &[u32], new: &[f32], kv_heads: usize, d: usize, pos: usize) {
    let n = new.len() / (kv_heads * d);
    assert!(new.len() == kv_heads * n * d && (pos + n).div_ceil(TILE) <= blocks.len(), "store_keys: shapes");
    for (h, head) in new.chunks_exact(n * d).enumerate() {
        for (t, key) in head.chunks_exact(d).enumerate() {
            let p = pos + t;
            let tile = &mut keys[(blocks[p / TILE] as usize * kv_heads + h) * d * TILE..][..d * TILE];
            for (i, value) in key.iter().enumerate() {
                tile[i * TILE + p % TILE] = *value;
            }
        }
    }
}

/// Writes the values of positions `pos..pos + n` into one layer's values in a pool of blocks:
/// `new` is `kv_heads × n × d`; position `p`'s values for KV head `h` go to row `p % TILE` of the
/// `TILE × d` tile at `(blocks[p / TILE] · kv_heads + h) · TILE · d`.
pub(crate) fn store_values(values: &mut [f32], blocks: &[u32], new: &[f32], kv_heads: usize, d: usize, pos: usize) {
    let n = new.len() / (kv_heads * d);
    assert!(new.len() == kv_heads * n * d && (pos + n).div_ceil(TILE) <= blocks.len(), "store_values: shapes");
    for (h, head) in new.chunks_exact(n * d).enumerate() {
        for (t, value) in head.chunks_exact(d).enumerate() {
            let p = pos + t;
            let tile = (blocks[p / TILE] as usize * kv_heads + h) * TILE * d;
            values[tile + p % TILE * d..][..d].copy_from_slice(value);
        }
    }
}

/// The dimensions [`attend_each`] works in.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    /// Filled positions, the new ones included.
    pub len: usize,
    /// New positions: the last `rows` of the `len`, whose queries attend.
    pub rows: usize,
    /// Head dimension.
    pub d: usize,
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
    // A NaN passes the clamp and makes `e` NaN, so the product is NaN without a test of its own.
    if x < -87.6 {
        0.0
    } else {
        e * two_n
    }
}

/// Asks for the next tile of keys or values while this one's are multiplied. Why: the hardware
/// prefetcher alone left each tile's first loads waiting on memory; measured at context 4096, the
/// 24 layers' attention of one session took 2.41-2.52 ms with this against 2.88-3.25 ms without.
#[inline(always)]
pub(super) fn prefetch(tile: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in tile.chunks(CACHE_LINE / std::mem::size_of::<f32>()) {
        // SAFETY: a prefetch reads nothing; it only hints at an address inside a live slice.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = tile;
}

/// Positions per tile of the cached keys ([`attend_each`]): a tile's keys (or values) stay in L1 for
/// every query vector of a block.
pub const TILE: usize = 64;

/// `outs[h][c] += Σ_t coefs[h][t] · rows[t · stride + c]` for every vector `h` of `H` and output
/// `c`, each in `t` order by fused multiply-adds: the inner loop of a tile's scores (the keys'
/// rows, dimension by dimension) and of its weighted sums (the values' rows, position by
/// position). Wide slices of outputs first, each held in registers across all the rows: sixty-four
/// outputs of several vectors are that many independent chains of 512-bit multiply-adds (their
/// latency, not their count, bounds a narrower slice). `t` runs over `coefs[0]`.
#[inline(always)]
pub(super) fn in_slices<const H: usize>(coefs: [&[f32]; H], rows: &[f32], stride: usize, outs: &mut [&mut [f32]; H]) {
    let c = accumulate::<64, H>(coefs, rows, stride, 0, outs.each_mut().map(|o| &mut **o));
    let c = accumulate::<16, H>(coefs, rows, stride, c, outs.each_mut().map(|o| &mut **o));
    accumulate::<1, H>(coefs, rows, stride, c, outs.each_mut().map(|o| &mut **o));
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
    // Every coefficient row as long as the first: no bounds checks in the loop.
    let steps = coefs[0].len();
    let coefs = coefs.map(|c| &c[..steps]);
    while c + L <= n {
        let mut acc = [[0f32; L]; H];
        for h in 0..H {
            acc[h].copy_from_slice(&outs[h][c..c + L]);
        }
        for t in 0..steps {
            let row = &rows[t * stride + c..][..L];
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
