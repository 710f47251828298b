//! The kernels' tests: against plain f64 arithmetic, and bit for bit across every path (AVX2,
//! AVX-512, portable) and every batch composition.

use super::attention::*;
use super::blocks;
use super::dispatch::cpu;
use super::int::*;
use super::linear::*;
use super::mlp::*;
use super::quant;
#[cfg(target_arch = "x86_64")]
use super::x86 as simd;
use super::*;
use half::{bf16, f16};

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
    if !(cpu().avx512 && cpu().f16c) {
        eprintln!("skipped: this CPU lacks AVX2/FMA/F16C or AVX-512F, so it runs one path only");
        return;
    }
    use simd::{avx2, avx512};
    // In rows: widths with whole 32-blocks, a leftover 8-block and a scalar tail; one to six
    // rows.
    for (out, k, rows) in [(5, 64, 1), (7, 75, 4), (3, 131, 6), (4, 896, 2)] {
        let (w, x) = (data(out * k, 15), data(rows * k, 16));
        same_bits((avx2::block_f32, avx512::block_f32), &w, k, &x, "f32");
        same_bits((avx2::block_f16, avx512::block_f16), &to(&w, f16::from_f32), k, &x, "f16");
        same_bits((avx2::block_bf16, avx512::block_bf16), &to(&w, bf16::from_f32), k, &x, "bf16");
    }
    // In panels: two whole panels; groups of one to eight rows and past them.
    for (k, rows) in [(33, 1), (75, 3), (8, 8), (131, 11)] {
        let (w, x) = (Layout::panels(k).arrange(&data(2 * PANEL * k, 17)), data(rows * k, 18));
        same_panel_bits((avx2::panel_f32, avx512::panel_f32), &w, k, &x, "f32");
        let (w16, wb16) = (to(&w, f16::from_f32), to(&w, bf16::from_f32));
        same_panel_bits((avx2::panel_f16, avx512::panel_f16), &w16, k, &x, "f16");
        same_panel_bits((avx2::panel_bf16, avx512::panel_bf16), &wb16, k, &x, "bf16");
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

/// The BF16 dot product of paired panels, one scalar step at a time from the row-major matrix:
/// activations rounded to BF16 (subnormals to zero), then per input pair the odd input's product
/// added, then the even one's, each a fused multiply-add whose subnormal result is a signed zero.
fn bf16_dot_reference(w: &[bf16], x: &[f32]) -> f32 {
    let flush = |v: f32| if v.abs() < f32::MIN_POSITIVE { 0f32.copysign(v) } else { v };
    let round = |v: f32| flush(bf16::from_f32(v).to_f32());
    let mut acc = 0f32;
    for (w, x) in w.chunks_exact(2).zip(x.chunks_exact(2)) {
        acc = flush(round(x[1]).mul_add(flush(w[1].to_f32()), acc));
        acc = flush(round(x[0]).mul_add(flush(w[0].to_f32()), acc));
    }
    acc
}

#[test]
fn paired_panels_compute_bf16_dot_products_in_the_instructions_order() {
    // Whole and narrow panels, groups of one to eight rows and past them; then values so small
    // that products and sums fall below F32's normal range and are flushed.
    for (out, k, rows, scale) in [(64, 2, 1, 1.0), (70, 76, 11, 1.0), (40, 136, 8, 1.0), (33, 40, 3, 1e-19)] {
        let w: Vec<bf16> = data(out * k, 40).iter().map(|v| bf16::from_f32(v * scale)).collect();
        let x: Vec<f32> = data(rows * k, 41).iter().map(|v| v * scale).collect();
        let layout = Layout::paired_panels(k);
        let y = linear(&layout.arrange(&w), layout, None, &x, rows);
        for r in 0..rows {
            for j in 0..out {
                let want = bf16_dot_reference(&w[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
                assert_eq!(y[r * out + j].to_bits(), want.to_bits(), "{out}x{k}x{rows} y[{r}][{j}]");
            }
        }
        // A row alone computes its bits in the batch.
        let alone = linear(&layout.arrange(&w), layout, None, &x[(rows - 1) * k..], 1);
        assert_eq!(alone, y[(rows - 1) * out..]);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_bf16_dot_product_instruction_computes_the_portable_bits() {
    if !cpu().bf16dot {
        eprintln!("skipped: this CPU lacks AVX-512 BF16, so it runs the portable path only");
        return;
    }
    for (k, rows, scale) in [(2, 1, 1.0f32), (76, 11, 1.0), (136, 8, 1e-19), (896, 3, 1.0)] {
        let w: Vec<bf16> = data(PANEL * k, 42).iter().map(|v| bf16::from_f32(v * scale)).collect();
        let x: Vec<f32> = data(rows * k, 43).iter().map(|v| v * scale).collect();
        let (w, xp) = (Layout::paired_panels(k).arrange(&w), super::paired::round_pairs(&x));
        let mut plain = vec![0f32; rows * PANEL];
        super::paired::panel_dots_with(&w, &xp, k / 2, &mut plain);
        let mut simd = vec![0f32; rows * PANEL];
        // SAFETY: the CPU has AVX-512 BF16 (checked above); one whole panel; `simd` holds
        // `rows` rows of `PANEL`.
        unsafe { simd::avx512::panel_pairs(&w, &xp, rows, k / 2, simd.as_mut_ptr(), PANEL) };
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&simd), bits(&plain), "{k}x{rows} scale {scale}");
    }
}

/// One session's cache for the attention tests: `len` filled positions in blocks of a pool laid
/// out backwards (so that a tile's block is not its index), and the queries of its last `rows`.
struct Session {
    q: Vec<f32>,
    plain_keys: Vec<f32>,
    plain_values: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    blocks: Vec<u32>,
    shape: AttentionShape,
}

fn session(heads: usize, kv_heads: usize, d: usize, len: usize, rows: usize, seed: u32) -> Session {
    let tiles = len.div_ceil(TILE);
    // Keys and values as computed: `kv_heads × len × d`.
    let (q, plain_keys, plain_values) =
        (data(rows * heads * d, seed), data(kv_heads * len * d, seed + 1), data(kv_heads * len * d, seed + 2));
    let blocks: Vec<u32> = (0..tiles as u32).rev().collect();
    let mut k = vec![0f32; tiles * kv_heads * d * TILE];
    let mut v = vec![0f32; tiles * kv_heads * TILE * d];
    store_keys(&mut k, &blocks, &plain_keys, kv_heads, d, 0);
    store_values(&mut v, &blocks, &plain_values, kv_heads, d, 0);
    Session { q, plain_keys, plain_values, k, v, blocks, shape: AttentionShape { heads, kv_heads, len, rows, d } }
}

impl Session {
    /// Its tiles of keys and of values, KV head by KV head, for its first `len` positions.
    fn tiles(&self, len: usize) -> (Vec<&[f32]>, Vec<&[f32]>) {
        let AttentionShape { kv_heads, d, .. } = self.shape;
        let used = &self.blocks[..len.div_ceil(TILE)];
        let at = |h: usize, b: u32| (b as usize * kv_heads + h) * TILE * d;
        let keys = (0..kv_heads).flat_map(|h| used.iter().map(move |&b| &self.k[at(h, b)..][..TILE * d])).collect();
        let values = (0..kv_heads).flat_map(|h| used.iter().map(move |&b| &self.v[at(h, b)..][..TILE * d])).collect();
        (keys, values)
    }

    /// Attention of its rows `from..to` (of its `rows`) as an item of their own: what a chunk of
    /// them computes.
    fn attend(&self, from: usize, to: usize, scale: f32) -> Vec<f32> {
        let AttentionShape { heads, d, len, rows, .. } = self.shape;
        let len = len - rows + to;
        let (keys, values) = self.tiles(len);
        let shape = AttentionShape { len, rows: to - from, ..self.shape };
        let q = &self.q[from * heads * d..to * heads * d];
        attend_each(&[Attending { q, keys: &keys, values: &values, shape }], scale)
    }

    fn key(&self, kv: usize, j: usize) -> &[f32] {
        let AttentionShape { len, d, .. } = self.shape;
        &self.plain_keys[(kv * len + j) * d..][..d]
    }

    fn value(&self, kv: usize, j: usize) -> &[f32] {
        let AttentionShape { len, d, .. } = self.shape;
        &self.plain_values[(kv * len + j) * d..][..d]
    }
}

#[test]
fn attention_matches_a_plain_f64_causal_softmax() {
    // Head widths through every slice width of the weighted sums (64, 16, 1); contexts through
    // every slice width of the scores and several tiles; one row (decoding) and chunks that
    // start inside tiles and span blocks of rows.
    for (d, len, rows) in [(16, 37, 1), (72, 150, 1), (64, 129, 20), (64, 337, 70), (40, 64, 64)] {
        let s = session(6, 2, d, len, rows, 10);
        let out = s.attend(0, rows, 0.25);
        for r in 0..rows {
            let position = len - rows + r;
            for h in 0..6 {
                let kv = h / 3;
                let q = &s.q[(r * 6 + h) * d..][..d];
                let scores: Vec<f64> = (0..=position)
                    .map(|j| s.key(kv, j).iter().zip(q).map(|(k, q)| *k as f64 * *q as f64).sum::<f64>() * 0.25)
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                for i in 0..d {
                    let exact: f64 =
                        (0..=position).map(|j| (scores[j] - max).exp() / sum * s.value(kv, j)[i] as f64).sum();
                    let got = out[(r * 6 + h) * d + i] as f64;
                    assert!((got - exact).abs() < 1e-5, "d {d} len {len} row {r} head {h} [{i}]: {got} vs {exact}");
                }
            }
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_alone_in_any_chunk_and_beside_any_session() {
    let d = 64;
    let s = session(6, 2, d, 337, 70, 40);
    let whole = s.attend(0, 70, 0.125);
    let row_width = 6 * d;
    // Token by token, as decoding would, and in chunks that start and end inside tiles and blocks.
    for cuts in [(0..=70).collect::<Vec<_>>(), vec![0, 5, 22, 23, 64, 70], vec![0, 17, 70]] {
        let mut pieces = Vec::new();
        for w in cuts.windows(2) {
            pieces.extend(s.attend(w[0], w[1], 0.125));
        }
        assert_eq!(pieces, whole, "chunks cut at {cuts:?}");
    }
    // Beside other sessions, decoding or prefilling, in one call.
    let (a, b) = (session(6, 2, d, 1, 1, 50), session(6, 2, d, 200, 3, 60));
    let tiles = [a.tiles(1), s.tiles(337), b.tiles(200)];
    let items: Vec<Attending> = [&a, &s, &b]
        .iter()
        .zip(&tiles)
        .map(|(x, (keys, values))| Attending { q: &x.q, keys, values, shape: x.shape })
        .collect();
    let together = attend_each(&items, 0.125);
    assert_eq!(together[..row_width], a.attend(0, 1, 0.125));
    assert_eq!(together[row_width..row_width * 71], whole);
    assert_eq!(together[row_width * 71..], b.attend(0, 3, 0.125));
}

#[test]
fn every_build_of_the_attention_block_gives_the_same_bits() {
    let (d, groups) = (64, 3);
    let s = session(groups, 1, d, 337, 40, 70);
    let first = 337 - 40;
    let (keys, values) = s.tiles(337);
    let mut dispatched = vec![0f32; 40 * groups * d];
    attend_block(&s.q, groups * d, &keys, &values, d, 40, first, 0.125, &mut dispatched);
    let mut plain = vec![0f32; 40 * groups * d];
    attend_block_with(&s.q, groups * d, &keys, &values, d, 40, first, 0.125, &mut plain);
    assert_eq!(plain, dispatched);
}

#[test]
fn the_online_softmax_matches_the_exact_one_over_tiles() {
    // Scores in three tiles, the largest in the middle one, the last tile's end masked as the
    // causal edge masks it: the running sum, rescaled, is the whole sum of the exponentials
    // relative to the largest, and a masked position adds nothing.
    let p: Vec<f32> = data(3 * TILE, 19).iter().map(|v| v * 30.0).collect();
    let seen = 2 * TILE + 40;
    let mut running = [Running::START];
    for (k, tile) in p.chunks(TILE).enumerate() {
        let mut t = [<[f32; TILE]>::try_from(tile).unwrap()];
        t[0].iter_mut().enumerate().filter(|(i, _)| k * TILE + i >= seen).for_each(|(_, x)| *x = f32::NEG_INFINITY);
        online(&mut t, &mut running);
    }
    let p = &p[..seen];
    let exact_max = p.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let exact: f64 = p.iter().map(|v| ((v - exact_max) as f64).exp()).sum();
    let sum = running[0].sum();
    assert_eq!(running[0].max(), exact_max);
    assert!((sum as f64 - exact).abs() <= 1e-5 * exact, "{sum} vs {exact}");
}

#[test]
fn keys_and_values_land_in_their_blocks_stored_at_once_or_in_pieces() {
    let (kv_heads, len, d) = (2, 3 * TILE, 8);
    let blocks = [2u32, 0, 1];
    let (plain_keys, plain_values) = (data(kv_heads * len * d, 26), data(kv_heads * len * d, 27));
    let mut keys = vec![0f32; 3 * kv_heads * d * TILE];
    let mut values = vec![0f32; 3 * kv_heads * TILE * d];
    store_keys(&mut keys, &blocks, &plain_keys, kv_heads, d, 0);
    store_values(&mut values, &blocks, &plain_values, kv_heads, d, 0);
    for h in 0..kv_heads {
        for p in 0..len {
            let tile = (blocks[p / TILE] as usize * kv_heads + h) * TILE * d;
            for i in 0..d {
                let computed = (h * len + p) * d + i;
                assert_eq!(keys[tile + i * TILE + p % TILE], plain_keys[computed], "key: head {h} position {p} [{i}]");
                assert_eq!(
                    values[tile + p % TILE * d + i],
                    plain_values[computed],
                    "value: head {h} position {p} [{i}]"
                );
            }
        }
    }
    // The same positions written in pieces that start and end inside tiles.
    let (mut key_pieces, mut value_pieces) = (vec![0f32; keys.len()], vec![0f32; values.len()]);
    for (from, to) in [(0, 5), (5, 70), (70, 71), (71, len)] {
        let part = |plain: &[f32]| -> Vec<f32> {
            (0..kv_heads).flat_map(|h| plain[(h * len + from) * d..(h * len + to) * d].to_vec()).collect()
        };
        store_keys(&mut key_pieces, &blocks, &part(&plain_keys), kv_heads, d, from);
        store_values(&mut value_pieces, &blocks, &part(&plain_values), kv_heads, d, from);
    }
    assert_eq!((key_pieces, value_pieces), (keys, values));
}

#[test]
fn silu_mul_is_close_to_exact_and_the_same_bits_in_every_path() {
    let (rows, inter) = (3, 2500);
    // Values over the range where the exponential saturates either way.
    let gate_up: Vec<f32> = data(rows * 2 * inter, 27).iter().map(|v| v * 40.0).collect();
    let ours = silu_mul(&gate_up, rows);
    let mut plain = vec![0f32; rows * inter];
    for (r, gate_up) in gate_up.chunks_exact(2 * inter).enumerate() {
        let (gate, up) = gate_up.split_at(inter);
        super::mlp::silu_mul_with(gate, up, &mut plain[r * inter..][..inter]);
        for (i, (&g, &u)) in gate.iter().zip(up).enumerate() {
            let exact = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
            let got = ours[r * inter + i] as f64;
            // Two roundings and the exponential's two units, relative to the value.
            assert!(
                (got - exact).abs() <= 4.0 * f32::EPSILON as f64 * exact.abs() + 1e-30,
                "silu({g})·{u}: {got} against {exact}"
            );
        }
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&ours), bits(&plain), "the dispatched and plain paths");
    // One row alone gives that row's bits within three.
    assert_eq!(bits(&silu_mul(&gate_up[2 * inter..4 * inter], 1)), bits(&ours[inter..2 * inter]));
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

/// Random blocks of `F`: scales and minimums of either sign within F16's normal range, every
/// byte value (Q8_0's -128 included).
fn quant_blocks<F: blocks::QBlock>(blocks: usize, seed: u32) -> Vec<u8> {
    let (scales, bytes) = (data(2 * blocks, seed), data(blocks * F::BYTES, seed + 1));
    let mut out = Vec::with_capacity(blocks * F::BYTES);
    for (b, bytes) in bytes.chunks_exact(F::BYTES).enumerate() {
        out.extend(f16::from_f32(scales[2 * b] * 0.02).to_le_bytes());
        let rest = if F::MIN {
            out.extend(f16::from_f32(scales[2 * b + 1] * 0.1).to_le_bytes());
            F::BYTES - 4
        } else {
            F::BYTES - 2
        };
        out.extend(bytes[..rest].iter().map(|v| ((v + 1.0) * 127.99) as u8));
    }
    out
}

/// Every format's tests, run once per format.
fn for_each_format(check: impl Fn(&dyn Fn(usize, u32) -> Vec<u8>, blocks::Format, &str)) {
    check(&quant_blocks::<blocks::Q8_0>, blocks::Format::Q8_0, "q8_0");
    check(&quant_blocks::<blocks::Q4_0>, blocks::Format::Q4_0, "q4_0");
    check(&quant_blocks::<blocks::Q4_1>, blocks::Format::Q4_1, "q4_1");
}

#[test]
fn activations_quantize_to_within_half_a_step() {
    let mut x = data(4 * 64, 40);
    x[64..96].fill(0.0);
    x[100] = -3.0;
    let a = blocks::Q8Rows::quantize(&x, 64);
    for (b, (xs, qs)) in x.chunks_exact(blocks::QK).zip(a.qs.chunks_exact(blocks::QK)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(a.d[b], amax / 127.0, "block {b}'s scale");
        assert!(qs.iter().all(|q| (-127..=127).contains(q)), "block {b}: {qs:?}");
        for (x, q) in xs.iter().zip(qs) {
            assert!((x - a.d[b] * f32::from(*q)).abs() <= a.d[b] * 0.5001, "block {b}: {x} as {q}");
        }
        let sum: i32 = qs.iter().map(|q| i32::from(*q)).sum();
        assert_eq!(a.s[b], a.d[b] * sum as f32, "block {b}'s sum");
    }
    assert!(a.qs[64..96].iter().all(|q| *q == 0) && a.d[2] == 0.0, "a zero block stays zero");
    assert_eq!(a.qs[100], -127, "the block's largest magnitude is ±127");
}

#[test]
fn activations_quantize_to_the_same_bits_in_every_path_ties_to_even() {
    // Enough blocks for several tasks and a short last one; block 1 holds exact ties.
    let mut x = data(70 * 2 * blocks::QK, 44);
    let tie = [127.0f32, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5];
    x[blocks::QK..blocks::QK + tie.len()].copy_from_slice(&tie);
    let a = blocks::Q8Rows::quantize(&x, 2 * blocks::QK);
    let (mut q, mut d, mut s) = (vec![0i8; x.len()], vec![0f32; a.d.len()], vec![0f32; a.s.len()]);
    super::blocks::quantize_with(&x, &mut q, &mut d, &mut s);
    assert!(a.qs == q && a.d == d && a.s == s, "the dispatched path differs from the plain one");
    assert_eq!(&a.qs[blocks::QK..blocks::QK + tie.len()], &[127, 0, 2, 2, 0, -2, 126], "ties round to even");
}

#[test]
fn quantized_products_match_the_f64_product_of_the_dequantized_values() {
    for_each_format(|blocks, format, label| {
        let (out, k, rows) = (37, 96, 5);
        let w = blocks(out * k / blocks::QK, 41);
        let x = data(rows * k, 42);
        let m = QuantMatrix { bytes: &w, format, rows: out, k, order: None };
        let y = quant_linear(&[m], None, &x, rows);
        let a = blocks::Q8Rows::quantize(&x, k);
        let bb = format.block_bytes();
        for j in 0..out {
            for r in 0..rows {
                let (mut exact, mut size) = (0f64, 0f64);
                for b in 0..k / blocks::QK {
                    let block = &w[(j * k / blocks::QK + b) * bb..][..bb];
                    let (d, min) = (
                        blocks::half_at(block, 0) as f64,
                        if format == blocks::Format::Q4_1 { blocks::half_at(block, 2) as f64 } else { 0.0 },
                    );
                    let values = match format {
                        blocks::Format::Q8_0 => <blocks::Q8_0 as blocks::QBlock>::values(block),
                        blocks::Format::Q4_0 => <blocks::Q4_0 as blocks::QBlock>::values(block),
                        blocks::Format::Q4_1 => <blocks::Q4_1 as blocks::QBlock>::values(block),
                    };
                    let at = r * k / blocks::QK + b;
                    for (v, q) in values.iter().zip(&a.qs[at * blocks::QK..][..blocks::QK]) {
                        let term = (d * *v as f64 + min) * (a.d[at] as f64 * *q as f64);
                        exact += term;
                        size += term.abs();
                    }
                }
                let got = y[r * out + j] as f64;
                assert!((got - exact).abs() <= 1e-5 * size + 1e-30, "{label} y[{r}][{j}]: {got} vs {exact}");
            }
        }
    });
}

#[test]
fn quantized_products_have_the_same_bits_in_every_path_and_batch() {
    use blocks::{Q4_0, Q4_1, Q8_0};
    // One to three blocks per row and eighteen (a 576-wide row); one to thirteen activation rows,
    // through the groups of four and eight and their leftovers.
    for nb in [1, 2, 3, 18] {
        let k = nb * blocks::QK;
        for rows in [1, 3, 4, 5, 8, 9, 13] {
            let x = data(rows * k, 50 + rows as u32);
            let a = blocks::Q8Rows::quantize(&x, k);
            let alone: Vec<blocks::Q8Rows> = x.chunks_exact(k).map(|x| blocks::Q8Rows::quantize(x, k)).collect();
            same::<Q8_0>(&quant_blocks::<Q8_0>(nb, 60), &a, &alone, "q8_0");
            same::<Q4_0>(&quant_blocks::<Q4_0>(nb, 61), &a, &alone, "q4_0");
            same::<Q4_1>(&quant_blocks::<Q4_1>(nb, 62), &a, &alone, "q4_1");
        }
    }

    fn same<F: blocks::QBlock>(w: &[u8], a: &blocks::Q8Rows, alone: &[blocks::Q8Rows], label: &str) {
        let rows = a.rows();
        let plain: Vec<f32> = (0..rows).map(|r| quant::dot_plain::<F>(w, a, r)).collect();
        let mut dispatched = vec![0f32; rows];
        quant::row_dots::<F>(w, a, &mut dispatched);
        assert_eq!(bits(&plain), bits(&dispatched), "{label}: the dispatched path, {rows} rows of {}", a.k);
        for (r, one) in alone.iter().enumerate() {
            let mut y = [0f32];
            quant::row_dots::<F>(w, one, &mut y);
            assert_eq!(y[0].to_bits(), plain[r].to_bits(), "{label}: row {r} alone");
        }
        #[cfg(target_arch = "x86_64")]
        {
            let mut paths = Vec::new();
            if cpu().avx2 && cpu().f16c {
                let mut y = vec![0f32; rows];
                // SAFETY: the CPU has the instructions (checked above); `w` holds a row's blocks.
                unsafe { simd::avx2::q_row_dots::<F>(w, a, &mut y) };
                paths.push(("avx2", y));
            }
            if cpu().avx512 && cpu().vnni && cpu().f16c {
                let mut y = vec![0f32; rows];
                // SAFETY: as above.
                unsafe { simd::avx512::q_row_dots::<F>(w, a, &mut y) };
                paths.push(("avx512", y));
            }
            for (path, y) in paths {
                assert_eq!(bits(&plain), bits(&y), "{label}: {path}, {rows} rows of {}", a.k);
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }
}

#[test]
fn stacked_and_reordered_quantized_rows_are_read_where_they_lie() {
    for_each_format(|blocks, format, label| {
        let (k, rows) = (64, 3);
        let (first, second) = (blocks(5 * k / blocks::QK, 70), blocks(4 * k / blocks::QK, 71));
        let x = data(rows * k, 72);
        let order = [2u32, 0, 3, 1];
        let parts = [
            QuantMatrix { bytes: &first, format, rows: 5, k, order: None },
            QuantMatrix { bytes: &second, format, rows: 4, k, order: Some(&order) },
        ];
        let y = quant_linear(&parts, None, &x, rows);
        let alone =
            |bytes: &[u8], n| quant_linear(&[QuantMatrix { bytes, format, rows: n, k, order: None }], None, &x, rows);
        let (a, b) = (alone(&first, 5), alone(&second, 4));
        for r in 0..rows {
            assert_eq!(y[r * 9..r * 9 + 5], a[r * 5..r * 5 + 5], "{label}: row {r}, first part");
            for (j, o) in order.iter().enumerate() {
                assert_eq!(y[r * 9 + 5 + j], b[r * 4 + *o as usize], "{label}: row {r}, output {j} of the second");
            }
        }
    });
}
