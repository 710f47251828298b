//! Our own product of activation rows with a weight matrix, for every projection: decode steps,
//! batches of sessions and prefill chunks alike, where candle's general matrix multiply leaves
//! memory bandwidth unused (a few rows) or half the multipliers idle (many rows).
//!
//! The layers' matrices are stored in panels ([`Layout`]): a task owns one panel of outputs and
//! walks it once, in one sequential stream, for a group of activation rows (up to twelve with
//! AVX-512, two with AVX2); each
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
//! ([`int_products`], used by `crate::greedy`), and attention of sessions' new positions over
//! their caches, decoding and prefilling alike ([`attend_each`]); and, to judge them by, the
//! machine's own read bandwidth ([`ReadProbe`]).
//!
//! One module per kernel ([`linear`], [`paired`] (BF16 dot products), [`attention`], [`int`], [`mlp`], [`stream`]), one per instruction set
//! (`x86/avx2.rs` and `x86/avx512.rs`, the intrinsics, behind `x86/mod.rs`; the portable paths
//! sit beside each kernel), and one
//! dispatch ([`dispatch`]): the CPU's vector features detected once, and every kernel choosing its
//! path through them.

mod attention;
mod blocks;
mod dispatch;
mod int;
mod linear;
mod mlp;
mod paired;
mod quant;
mod stream;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attention::{attend_each, Attending, AttentionShape, TILE};
pub(crate) use attention::{store_keys, store_values};
pub use int::int_products;
pub use linear::{linear, Layout, Weight};
pub(crate) use linear::{selected_rows, PANEL};
pub use mlp::silu_mul;
pub use quant::{quant_linear, Format, QuantMatrix};
pub use stream::ReadProbe;

/// Weight rows per parallel task of a product in rows (the head): small enough to balance two to
/// sixteen threads, large enough that scheduling costs little.
const BLOCK: usize = 32;

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
pub(crate) fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| work())
}

/// A product's output buffer, shared by tasks that write disjoint values of it (the weight
/// products of `linear` and `paired`, which both write through it).
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

/// The exact integer dot product of eight-bit weights and sixteen-bit activations, in plain
/// loops: `int`'s portable path, and the tail past the last whole vector of its VNNI path.
#[inline(always)]
fn int_dot(q: &[i8], p: &[i16]) -> i32 {
    q.iter().zip(p).map(|(a, b)| i32::from(*a) * i32::from(*b)).sum()
}
