//! The greedy choice over the vocabulary, exactly, without computing every logit.
//!
//! Why: the head is the largest matrix a small model streams per step (Qwen2.5-0.5B: 151936 ×
//! 896, 545 MB of F32, over a quarter of a decode step's bytes), and greedy decoding wants only
//! the index of its largest output. So a [`Screen`] holds the head quantized to eight bits per
//! weight (a quarter of F32's bytes, half of F16's), reads that instead, and knows for every row
//! how far its approximate logit can be from the exact one. Only the rows whose upper bound
//! reaches the best lower bound (a handful, usually) are then computed from the head as stored,
//! by the same kernel as a full product and so with the same bits. The id is the first index of
//! the largest exact logit, as over the full product: a screen, not an approximation.
//!
//! The approximation is integer arithmetic: the activations are quantized too, to sixteen bits
//! (`x ≈ t·p`), and `q·p` is an exact 32-bit sum (eight-bit times sixteen-bit products, a
//! dozen times cheaper per weight than widening to F32 when several sessions share a step).
//!
//! The bound. For a weight row `w` (as stored, finite), its quantized copy `s·q`, and activations
//! `x = t·p + ε`: the kernel's dot product of `k` terms is within `γ·Σ|wᵢ·xᵢ|` of the exact sum,
//! whatever the order of its roundings, fused or not (`γ = k·u / (1 − k·u)`, `u = 2⁻²⁴`), and
//! `w·x − s·t·(q·p) = (w − s·q)·x + s·q·ε`. So, with Cauchy-Schwarz,
//!
//! `|fl(w·x) − s·t·(q·p)| ≤ (‖w − s·q‖ + γ·‖w‖)·‖x‖ + s·‖q‖·‖ε‖`
//!
//! plus underflow's absolute error. The factors' largest values over the rows are computed once,
//! in f64; a step multiplies them by `‖x‖` and `‖ε‖` into one bound for every row (per-row
//! bounds would leave fewer candidates, but reading them cost more than the candidates they
//! saved). Every f64 rounding on the way is covered by a relative margin far above f64's
//! precision.

use crate::kernel::{self, Weight};
use rayon::prelude::*;

/// F32's unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// Relative margin for the f64 arithmetic of norms and bounds (its roundings are ~1e-16).
const MARGIN: f64 = 1e-9;
/// Below this, no partial sum of a bounded dot product can overflow F32 (whose largest is 3.4e38).
const NO_OVERFLOW: f64 = 1e37;

/// The first index of the largest value, as torch.argmax picks it (NaN is never the largest
/// unless it comes first).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// A head matrix (`rows × k`) quantized to eight bits per weight, with what bounds its rows' error.
pub(crate) struct Screen {
    /// Row `r` is approximately `q[r] · scale[r]`, every `q` within ±127.
    q: Vec<i8>,
    scale: Vec<f32>,
    /// The factor of `‖x‖` in the bound, the largest over the rows: `‖w − s·q‖ + γ·‖w‖`.
    slack: f64,
    /// The factor of `‖ε‖` in the bound, the largest over the rows: `s·‖q‖`.
    slack_eps: f64,
    /// Underflow's absolute error, at most, in a row's exact dot product.
    floor: f64,
    /// The largest `‖w‖` of any row: with `‖x‖`, it rules out overflow.
    max_norm: f64,
    k: usize,
    /// The largest `|p|` an activation is quantized to: `k · 127 · limit` fits a 32-bit sum.
    limit: f64,
}

/// One row of activations quantized: `x = t·p + ε`.
struct Quantized {
    p: Vec<i16>,
    t: f64,
    /// `‖x‖` and `‖ε‖`, each rounded up by the margin.
    norm: f64,
    eps_norm: f64,
}

impl Screen {
    /// Quantizes `w` (`rows × k`, as stored), each row to its own scale. None when a weight is
    /// not finite: no bound holds then.
    pub fn new<W: Weight>(w: &[W], k: usize) -> Option<Screen> {
        assert!(k > 0 && w.len().is_multiple_of(k), "Screen::new: shapes do not agree");
        let mut q = vec![0i8; w.len()];
        let rows: Vec<Row> =
            q.par_chunks_mut(k).zip(w.par_chunks(k)).map(|(q, w)| quantize(w, q)).collect::<Option<_>>()?;
        Some(Screen {
            q,
            scale: rows.iter().map(|r| r.scale).collect(),
            slack: rows.iter().map(|r| r.slack).fold(0.0, f64::max),
            slack_eps: rows.iter().map(|r| r.slack_eps).fold(0.0, f64::max),
            // Each of a dot product's 2k operations can lose at most 2⁻¹⁵⁰ to underflow.
            floor: 2.0 * k as f64 * 2f64.powi(-150),
            max_norm: rows.iter().map(|r| r.norm).fold(0.0, f64::max),
            limit: (i32::MAX as usize / (127 * k)).min(i16::MAX as usize) as f64,
            k,
        })
    }

    /// Bytes a screening reads: the eight-bit rows and their scales.
    pub fn bytes(&self) -> usize {
        self.q.len() + std::mem::size_of_val(self.scale.as_slice())
    }

    /// The greedy id of each activation row of `xs` (`rows × k`) against `w`, the matrix this
    /// screen was built from, as stored. None for a row the screen cannot decide (activations
    /// not finite, or outputs that could overflow): full logits decide it.
    pub fn argmax<W: Weight>(&self, w: &[W], xs: &[f32]) -> Vec<Option<u32>> {
        let top = self.top(w, xs, 1).into_iter();
        top.map(|c| c.map(|(ids, exact)| ids[argmax(&exact) as usize] as u32)).collect()
    }

    /// For each activation row of `xs`, every row of `w` whose exact output could be among its
    /// `n` largest (ties included), in index order, with those exact outputs (the same bits as a
    /// full product's): what top-k sampling needs, without every logit. None where the screen
    /// cannot decide, as for [`Self::argmax`].
    pub fn top<W: Weight>(&self, w: &[W], xs: &[f32], n: usize) -> Vec<Option<(Vec<usize>, Vec<f32>)>> {
        let quantized: Vec<Option<Quantized>> = xs.chunks_exact(self.k).map(|x| self.quantize_x(x)).collect();
        let screened: Vec<(&[f32], &Quantized)> =
            xs.chunks_exact(self.k).zip(&quantized).filter_map(|(x, q)| Some((x, q.as_ref()?))).collect();
        let p: Vec<i16> = screened.iter().flat_map(|(_, q)| q.p.iter().copied()).collect();
        // `dots[j][m]`: weight row j against the m-th screened row.
        let dots = kernel::int_products(&self.q, &p, screened.len(), self.k);
        let acts: Vec<&Quantized> = screened.iter().map(|(_, q)| *q).collect();
        let top: Vec<(Vec<usize>, Vec<f32>)> = screened
            .par_iter()
            .zip(self.candidates(&acts, &dots, n))
            .map(|((x, _), candidates)| {
                let exact = kernel::selected_rows(w, self.k, x, &candidates);
                tracing::trace!(candidates = candidates.len(), "greedy screen");
                (candidates, exact)
            })
            .collect();
        let mut top = top.into_iter();
        quantized.iter().map(|q| q.as_ref().and_then(|_| top.next())).collect()
    }

    /// How far any row's exact logit against `x` can be from its approximation `s·t·(q·p)`
    /// (the module docs derive it), before the margin for the f64 arithmetic.
    fn bound(&self, x: &Quantized) -> f64 {
        self.slack * x.norm + self.slack_eps * x.eps_norm + self.floor
    }

    /// `x` quantized to sixteen bits (`x ≈ t·p`, `|p| ≤ limit`); None when no bound holds.
    fn quantize_x(&self, x: &[f32]) -> Option<Quantized> {
        let norm = x.iter().map(|v| *v as f64 * *v as f64).sum::<f64>().sqrt() * (1.0 + MARGIN);
        if !norm.is_finite() || self.max_norm * norm >= NO_OVERFLOW {
            return None;
        }
        let max = x.iter().fold(0f64, |m, v| m.max((*v as f64).abs()));
        let t = if max > 0.0 { max / self.limit } else { 1.0 };
        let mut eps2 = 0f64;
        let p = x
            .iter()
            .map(|v| {
                let n = (*v as f64 / t).round().clamp(-self.limit, self.limit);
                let e = *v as f64 - t * n;
                eps2 += e * e;
                n as i16
            })
            .collect();
        Some(Quantized { p, t, norm, eps_norm: eps2.sqrt() * (1.0 + MARGIN) })
    }

    /// For each quantized activation row `m` of `acts`, the rows whose exact logit could reach
    /// the `top`-th largest lower bound, so the `top` largest (and their ties) are among them, in
    /// index order (ties then resolve as over the full product); `dots[j][m]` is the exact
    /// integer product `q_j·p_m`.
    ///
    /// Every row's logit is within `bound` of its approximation `s·t·(q·p)`. The rows of the
    /// `top` largest approximations are all at least the `top`-th of them less `bound`, so the
    /// `top`-th largest logit is too, and a row that reaches it has an approximation within
    /// `2·bound` of that `top`-th approximation. Two passes in units of `t` (> 0), each over
    /// blocks of rows on every thread: the `top`-th largest approximation, then the rows near it.
    /// (One pass keeping rows near the largest so far ran on one thread per activation row, and
    /// each row's comparison waited on the last: a few percent of a four-session step.)
    fn candidates(&self, acts: &[&Quantized], dots: &[i32], top: usize) -> Vec<Vec<usize>> {
        const BLOCK: usize = 4096;
        let n = acts.len();
        if n == 0 {
            return Vec::new();
        }
        let widths: Vec<f64> = acts.iter().map(|x| 2.0 * self.bound(x) * (1.0 + MARGIN) / x.t).collect();
        let blocks = || dots.par_chunks(BLOCK * n).zip(self.scale.par_chunks(BLOCK));
        let best: Vec<f64> = if top <= 1 {
            blocks()
                .map(|(dots, scale)| (0..n).map(|m| largest_approximation(scale, dots, n, m)).collect::<Vec<f64>>())
                .reduce(|| vec![f64::NEG_INFINITY; n], |a, b| a.iter().zip(&b).map(|(a, b)| a.max(*b)).collect())
        } else {
            // Each block's `top` largest, then the `top` largest of those; fewer rows than
            // `top` in all make every row a candidate.
            let largest = |mut a: Vec<f64>| {
                if a.len() > top {
                    a.select_nth_unstable_by(top - 1, |x, y| y.total_cmp(x));
                    a.truncate(top);
                }
                a
            };
            let per_block = blocks().map(|(dots, scale)| {
                (0..n)
                    .map(|m| largest((0..scale.len()).map(|j| approximation(scale[j], dots[j * n + m])).collect()))
                    .collect::<Vec<Vec<f64>>>()
            });
            let merged = per_block.reduce(
                || vec![Vec::new(); n],
                |a, b| {
                    a.into_iter()
                        .zip(b)
                        .map(|(mut a, b)| {
                            largest({
                                a.extend(b);
                                a
                            })
                        })
                        .collect()
                },
            );
            merged
                .into_iter()
                .map(|a| if a.len() < top { f64::NEG_INFINITY } else { a.into_iter().fold(f64::INFINITY, f64::min) })
                .collect()
        };
        let kept: Vec<Vec<Vec<usize>>> = blocks()
            .enumerate()
            .map(|(b, (dots, scale))| {
                let kept_of = |m: usize| {
                    let lowest = best[m] - MARGIN * best[m].abs() - widths[m];
                    let near = scale.iter().enumerate().filter(move |&(j, s)| {
                        let a = approximation(*s, dots[j * n + m]);
                        a + MARGIN * a.abs() >= lowest
                    });
                    near.map(|(j, _)| b * BLOCK + j).collect()
                };
                (0..n).map(kept_of).collect()
            })
            .collect();
        (0..n).map(|m| kept.iter().flat_map(|kept| kept[m].iter().copied()).collect()).collect()
    }
}

/// A row's approximate logit in units of `t`: `s·d` rounds once in f64 (a 24-bit times a
/// 31-bit integer), which the margin covers.
#[inline(always)]
fn approximation(s: f32, d: i32) -> f64 {
    s as f64 * d as f64
}

/// The largest approximation of activation row `m` over a block of rows (`scale`, and `dots`
/// holding `n` products per row), in eight lanes so that no comparison waits on the one before.
fn largest_approximation(scale: &[f32], dots: &[i32], n: usize, m: usize) -> f64 {
    let mut lanes = [f64::NEG_INFINITY; 8];
    for (c, eight) in scale.chunks(8).enumerate() {
        for (l, (s, lane)) in eight.iter().zip(&mut lanes).enumerate() {
            let a = approximation(*s, dots[(c * 8 + l) * n + m]);
            *lane = if a > *lane { a } else { *lane };
        }
    }
    lanes.into_iter().fold(f64::NEG_INFINITY, f64::max)
}

/// One row's scale and bound factors.
struct Row {
    scale: f32,
    slack: f64,
    slack_eps: f64,
    norm: f64,
}

/// Quantizes one row into `q` (round to nearest, scale = largest magnitude / 127); None when a
/// value is not finite.
fn quantize<W: Weight>(w: &[W], q: &mut [i8]) -> Option<Row> {
    let mut max = 0f32;
    for v in w {
        let v = v.to_f32();
        if !v.is_finite() {
            return None;
        }
        max = max.max(v.abs());
    }
    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
    let s = scale as f64;
    let (mut err2, mut w2, mut q2) = (0f64, 0f64, 0f64);
    for (v, q) in w.iter().zip(q.iter_mut()) {
        let v = v.to_f32() as f64;
        let n = (v / s).round().clamp(-127.0, 127.0);
        *q = n as i8;
        let e = v - s * n;
        (err2, w2, q2) = (err2 + e * e, w2 + v * v, q2 + n * n);
    }
    let k = w.len() as f64;
    let gamma = k * U / (1.0 - k * U);
    let w_norm = w2.sqrt();
    Some(Row {
        scale,
        slack: (err2.sqrt() + gamma * w_norm) * (1.0 + MARGIN),
        slack_eps: s * q2.sqrt() * (1.0 + MARGIN),
        norm: w_norm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::tests::data;
    use half::{bf16, f16};

    /// The id the full product's logits give.
    fn full<W: Weight>(w: &[W], x: &[f32], k: usize) -> u32 {
        argmax(&kernel::linear(w, kernel::Layout::rows(k), None, x, 1))
    }

    /// The rows the screen leaves to compute exactly for activations `x`.
    fn candidates(screen: &Screen, x: &[f32]) -> Vec<usize> {
        let q = screen.quantize_x(x).unwrap();
        let dots = kernel::int_products(&screen.q, &q.p, 1, screen.k);
        screen.candidates(&[&q], &dots, 1).remove(0)
    }

    #[test]
    fn the_screen_picks_the_full_products_id_for_many_rows() {
        let (vocab, k, rows) = (3000, 96, 40);
        let w = data(vocab * k, 1);
        let xs = data(rows * k, 2);
        let screen = Screen::new(&w, k).unwrap();
        let ids = screen.argmax(&w, &xs);
        // Every row's candidates from one scan of all rows' products.
        let quantized: Vec<Quantized> = xs.chunks_exact(k).map(|x| screen.quantize_x(x).unwrap()).collect();
        let p: Vec<i16> = quantized.iter().flat_map(|q| q.p.iter().copied()).collect();
        let dots = kernel::int_products(&screen.q, &p, rows, k);
        let together = screen.candidates(&quantized.iter().collect::<Vec<_>>(), &dots, 1);
        for (r, x) in xs.chunks_exact(k).enumerate() {
            assert_eq!(ids[r], Some(full(&w, x, k)), "row {r}");
            // A screen, not a full product in disguise: few rows are left to compute exactly.
            let left = candidates(&screen, x);
            assert!((1..=vocab / 20).contains(&left.len()), "row {r}: {} candidates of {vocab}", left.len());
            assert_eq!(together[r], left, "row {r}: scanned with the others or alone");
        }
    }

    #[test]
    fn the_top_screen_keeps_every_row_that_reaches_the_nth_largest_with_its_full_products_bits() {
        let (vocab, k, rows) = (9000, 96, 5);
        let w = data(vocab * k, 1);
        let xs = data(rows * k, 6);
        let screen = Screen::new(&w, k).unwrap();
        for n in [1, 2, 50, 300] {
            for (r, got) in screen.top(&w, &xs, n).into_iter().enumerate() {
                let x = &xs[r * k..(r + 1) * k];
                let exact = kernel::linear(&w, kernel::Layout::rows(k), None, x, 1);
                let mut sorted = exact.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let nth = sorted[n - 1];
                let (ids, values) = got.expect("finite activations screen");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let full: Vec<f32> = ids.iter().map(|&j| exact[j]).collect();
                assert_eq!(bits(&values), bits(&full), "n {n} row {r}: the candidates' products");
                let reaching: Vec<usize> = (0..vocab).filter(|&j| exact[j] >= nth).collect();
                assert!(
                    reaching.iter().all(|j| ids.contains(j)),
                    "n {n} row {r}: a row of the top {n} was screened out"
                );
                assert!(ids.windows(2).all(|p| p[0] < p[1]), "in index order");
                // Still a screen: far fewer rows than the vocabulary.
                assert!(ids.len() <= (4 * n).max(vocab / 20), "n {n} row {r}: {} candidates", ids.len());
            }
        }
    }

    #[test]
    fn every_exact_logit_lies_within_its_bound() {
        let (vocab, k) = (500, 200);
        // Rows of very different scales, one with a single large weight; activations with one
        // large value too (the quantization steps of both are then coarse).
        let mut w = data(vocab * k, 3);
        w.chunks_exact_mut(k)
            .enumerate()
            .for_each(|(r, row)| row.iter_mut().for_each(|v| *v *= 10f32.powi(r as i32 % 7 - 3)));
        w[7 * k + 5] = 40.0;
        let mut x = data(k, 4);
        x[9] = 25.0;
        let screen = Screen::new(&w, k).unwrap();
        let exact = kernel::linear(&w, kernel::Layout::rows(k), None, &x, 1);
        let q = screen.quantize_x(&x).unwrap();
        let dots = kernel::int_products(&screen.q, &q.p, 1, k);
        let bound = screen.bound(&q);
        for r in 0..vocab {
            let approx = screen.scale[r] as f64 * q.t * dots[r] as f64;
            assert!((exact[r] as f64 - approx).abs() <= bound, "row {r}: {} vs {approx}, bound {bound}", exact[r]);
        }
        // Tight enough to screen: a small fraction of the largest any logit could be.
        assert!(bound <= 0.02 * screen.max_norm * q.norm, "bound {bound} is loose");
    }

    #[test]
    fn near_ties_below_the_quantization_step_resolve_exactly() {
        // Rows that differ from each other by far less than one quantization step, so their
        // approximations are identical: the exact products must decide, and equal rows resolve
        // to the first.
        let k = 64;
        let base = data(k, 5);
        let mut w = Vec::new();
        for r in 0..50 {
            let mut row = base.clone();
            row[(r * 7) % k] += (r % 5) as f32 * 1e-6;
            w.extend(row);
        }
        w.extend(&base); // row 50 equals row 0
        let screen = Screen::new(&w, k).unwrap();
        for seed in 0..20 {
            let x = data(k, 100 + seed);
            assert_eq!(screen.argmax(&w, &x), vec![Some(full(&w, &x, k))], "seed {seed}");
        }
        // All logits equal (zero activations): the first index.
        assert_eq!(screen.argmax(&w, &vec![0.0; k]), vec![Some(0)]);
    }

    #[test]
    fn half_precision_heads_screen_the_same_way() {
        let (vocab, k) = (700, 136);
        let w = data(vocab * k, 6);
        let (w16, wb16): (Vec<f16>, Vec<bf16>) = w.iter().map(|v| (f16::from_f32(*v), bf16::from_f32(*v))).unzip();
        for seed in 0..5 {
            let x = data(k, 200 + seed);
            assert_eq!(Screen::new(&w16, k).unwrap().argmax(&w16, &x), vec![Some(full(&w16, &x, k))]);
            assert_eq!(Screen::new(&wb16, k).unwrap().argmax(&wb16, &x), vec![Some(full(&wb16, &x, k))]);
        }
    }

    #[test]
    fn what_no_bound_covers_is_left_to_the_full_logits() {
        let k = 32;
        let mut w = data(10 * k, 7);
        let screen = Screen::new(&w, k).unwrap();
        let mut x = data(k, 8);
        x[3] = f32::NAN;
        assert_eq!(screen.argmax(&w, &x), vec![None], "non-finite activations");
        x[3] = 1e37;
        assert_eq!(screen.argmax(&w, &x), vec![None], "outputs that could overflow");
        w[4] = f32::INFINITY;
        assert!(Screen::new(&w, k).is_none(), "non-finite weights");
    }
}
