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
//! The bound. For a weight row `w` (as stored, finite), its quantized copy `s·q` and activations
//! `x`, the kernel's dot product of `k` terms is within `γ·Σ|wᵢ·xᵢ|` of the exact sum, whatever
//! the order of its roundings, fused or not (`γ = k·u / (1 − k·u)`, `u = 2⁻²⁴`). So, with
//! Cauchy-Schwarz,
//!
//! `|fl(w·x) − s·fl(q·x)| ≤ |fl(w·x) − w·x| + |(w − s·q)·x| + s·|q·x − fl(q·x)|
//!                        ≤ (γ·(‖w‖ + s·‖q‖) + ‖w − s·q‖)·‖x‖`
//!
//! plus underflow's absolute error. The row's factor is computed once, in f64; a step multiplies
//! it by `‖x‖`. `s·fl(q·x)` is exact in f64 (two 24-bit significands), and every f64 rounding
//! on the way is covered by a relative margin far above f64's precision.

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

/// A head matrix (`rows × k`) quantized to eight bits per weight, with each row's error bound.
pub struct Screen {
    /// Row `r` is approximately `q[r] · scale[r]`.
    q: Vec<i8>,
    scale: Vec<f32>,
    /// Per row, the factor of `‖x‖` that bounds `|exact − approximate|` (see the module docs).
    slack: Vec<f64>,
    /// Underflow's absolute error, at most, in any row's two dot products.
    floor: f64,
    /// The largest `‖w‖` or `‖q‖` of any row: with `‖x‖`, it rules out overflow.
    max_norm: f64,
    k: usize,
}

impl Screen {
    /// Quantizes `w` (`rows × k`, as stored), each row to its own scale. None when a weight is
    /// not finite: no bound holds then.
    pub fn new<W: Weight>(w: &[W], k: usize) -> Option<Screen> {
        assert!(k > 0 && w.len().is_multiple_of(k), "Screen::new: shapes do not agree");
        let mut q = vec![0i8; w.len()];
        let rows: Vec<Row> =
            q.par_chunks_mut(k).zip(w.par_chunks(k)).map(|(q, w)| quantize(w, q)).collect::<Option<_>>()?;
        let max_scale = rows.iter().map(|r| r.scale as f64).fold(0.0, f64::max);
        Some(Screen {
            q,
            scale: rows.iter().map(|r| r.scale).collect(),
            slack: rows.iter().map(|r| r.slack).collect(),
            // Each of a dot product's 2k operations can lose at most 2⁻¹⁵⁰ to underflow.
            floor: 2.0 * k as f64 * 2f64.powi(-150) * (1.0 + max_scale),
            max_norm: rows.iter().map(|r| r.norm).fold(0.0, f64::max),
            k,
        })
    }

    /// The greedy id of each activation row of `xs` (`rows × k`) against `w`, the matrix this
    /// screen was built from, as stored. None for a row the screen cannot decide (activations
    /// not finite, or outputs that could overflow): full logits decide it.
    pub fn argmax<W: Weight>(&self, w: &[W], xs: &[f32]) -> Vec<Option<u32>> {
        let rows = xs.len() / self.k;
        let approx = kernel::linear(&self.q, None, xs, rows, self.k);
        let vocab = self.scale.len();
        xs.chunks_exact(self.k)
            .zip(approx.chunks_exact(vocab))
            .map(|(x, d)| {
                let candidates = self.candidates(x, d)?;
                let exact = kernel::selected_rows(w, self.k, x, &candidates);
                tracing::trace!(candidates = candidates.len(), "greedy screen");
                Some(candidates[argmax(&exact) as usize] as u32)
            })
            .collect()
    }

    /// The rows whose exact logit against `x` could reach the best lower bound, so the largest
    /// is among them, in index order (ties then resolve as over the full product); `d` holds the
    /// approximate dot products with `q`. None when no bound holds.
    fn candidates(&self, x: &[f32], d: &[f32]) -> Option<Vec<usize>> {
        let norm = x.iter().map(|v| *v as f64 * *v as f64).sum::<f64>().sqrt() * (1.0 + MARGIN);
        if !norm.is_finite() || self.max_norm * norm >= NO_OVERFLOW || d.is_empty() {
            return None;
        }
        // Each row's approximate logit and how far the exact one can be from it.
        let bounds = d.iter().zip(&self.scale).zip(&self.slack).map(|((d, s), slack)| {
            let approx = *s as f64 * *d as f64;
            (approx, (slack * norm + self.floor) * (1.0 + MARGIN) + MARGIN * approx.abs())
        });
        let best_low = bounds.clone().map(|(a, b)| a - b).fold(f64::NEG_INFINITY, f64::max);
        Some(bounds.enumerate().filter(|(_, (a, b))| a + b >= best_low).map(|(r, _)| r).collect())
    }
}

/// One row's scale and bound factors.
struct Row {
    scale: f32,
    slack: f64,
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
    let (w_norm, q_norm) = (w2.sqrt(), q2.sqrt());
    Some(Row { scale, slack: err2.sqrt() + gamma * (w_norm + s * q_norm), norm: w_norm.max(q_norm) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Deterministic values in [-1, 1).
    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// The id the full product's logits give.
    fn full<W: Weight>(w: &[W], x: &[f32], k: usize) -> u32 {
        argmax(&kernel::linear(w, None, x, 1, k))
    }

    #[test]
    fn the_screen_picks_the_full_products_id_for_many_rows() {
        let (vocab, k, rows) = (3000, 96, 40);
        let w = data(vocab * k, 1);
        let xs = data(rows * k, 2);
        let screen = Screen::new(&w, k).unwrap();
        let ids = screen.argmax(&w, &xs);
        let approx = kernel::linear(&screen.q, None, &xs, rows, k);
        for (r, x) in xs.chunks_exact(k).enumerate() {
            assert_eq!(ids[r], Some(full(&w, x, k)), "row {r}");
            // A screen, not a full product in disguise: few rows are left to compute exactly.
            let left = screen.candidates(x, &approx[r * vocab..(r + 1) * vocab]).unwrap().len();
            assert!((1..=vocab / 20).contains(&left), "row {r}: {left} candidates of {vocab}");
        }
    }

    #[test]
    fn every_exact_logit_lies_within_its_bound() {
        let (vocab, k) = (500, 200);
        // Rows of very different scales, one with a single large weight.
        let mut w = data(vocab * k, 3);
        w.chunks_exact_mut(k)
            .enumerate()
            .for_each(|(r, row)| row.iter_mut().for_each(|v| *v *= 10f32.powi(r as i32 % 7 - 3)));
        w[7 * k + 5] = 40.0;
        let x = data(k, 4);
        let screen = Screen::new(&w, k).unwrap();
        let exact = kernel::linear(&w, None, &x, 1, k);
        let approx = kernel::linear(&screen.q, None, &x, 1, k);
        let norm = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        for r in 0..vocab {
            let a = screen.scale[r] as f64 * approx[r] as f64;
            let bound = screen.slack[r] * norm + screen.floor;
            assert!((exact[r] as f64 - a).abs() <= bound, "row {r}: {} vs {a}, bound {bound}", exact[r]);
        }
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
        x[3] = 1e36;
        assert_eq!(screen.argmax(&w, &x), vec![None], "outputs that could overflow");
        w[4] = f32::INFINITY;
        assert!(Screen::new(&w, k).is_none(), "non-finite weights");
    }
}
