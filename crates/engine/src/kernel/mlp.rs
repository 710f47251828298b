//! The MLP's activation, `silu(gate) · up`, in vector code on every thread.

use rayon::prelude::*;

use super::attention::exp;
use super::dispatch::compiled_for_vectors;

/// `silu(gate) · up` for each row of `gate_up` (`rows × 2·inter`: a row's `inter` gate values,
/// then its `inter` up values): `v / (1 + e⁻ᵛ)`, rounded, times `up`, rounded, with the
/// attention's vector `exp` (within two units in the last place). Why not candle's `silu`: it
/// calls libm's `exp` one value at a time, on one thread, which measured a twelfth of a
/// 256-token prefill. A value's result depends only on its own gate and up, never on its row,
/// chunk or the CPU's vector width (the builds do the same operations).
pub fn silu_mul(gate_up: &[f32], rows: usize) -> Vec<f32> {
    assert!(rows > 0 && gate_up.len().is_multiple_of(2 * rows), "silu_mul: shapes do not agree");
    let inter = gate_up.len() / (2 * rows);
    // Values per task: a decode step's one row still spreads over every thread.
    const CHUNK: usize = 1024;
    let mut out = vec![0f32; rows * inter];
    out.par_chunks_mut(inter).zip(gate_up.par_chunks(2 * inter)).for_each(|(out, gate_up)| {
        let (gate, up) = gate_up.split_at(inter);
        out.par_chunks_mut(CHUNK)
            .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
            .for_each(|(out, (gate, up))| silu_mul_vectors(gate, up, out));
    });
    out
}

compiled_for_vectors!(
    /// [`silu_mul`]'s values in plain loops the compiler vectorizes.
    fn silu_mul_vectors(gate: &[f32], up: &[f32], out: &mut [f32]) => silu_mul_with
);

#[inline(always)]
pub(super) fn silu_mul_with(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((out, &gate), &up) in out.iter_mut().zip(gate).zip(up) {
        *out = gate / (1.0 + exp(-gate)) * up;
    }
}
