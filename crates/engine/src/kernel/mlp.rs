//! The MLP's activation, `silu(gate) · up`, on every thread with candle's bits.

use rayon::prelude::*;

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
