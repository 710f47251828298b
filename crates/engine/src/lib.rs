//! The engine: a checkpoint folder in, greedy (or reproducibly sampled) ids out, as fast as this CPU allows and bit-faithful
//! to the references.
//!
//! - [`template`], [`load`], [`gguf`]: the chat template and the loaded model with its
//!   tokenizer, from a checkpoint folder or a GGUF file (whose tokenizer `vocab` builds).
//! - [`qwen`], [`kernel`], [`greedy`], [`memory`]: the Qwen2 forward, its CPU kernels, the greedy
//!   screen, and where weights and caches live (`weights`: where the load reads them from).
//! - [`sample`]: the next id drawn from a step's logits, reproducibly, when a request is not greedy.
//! - [`session`], [`prefix`], [`policy`], [`stepper`], [`schedule`]: one request's KV cache, the
//!   prefix cache's index, which requests step next, the one stepping loop, and a job list
//!   replayed through it on a timeline.
//!
//! Imports only [`supply`]; knows nothing of records or experiments.

mod gguf;
pub mod greedy;
pub mod kernel;
pub mod load;
pub mod memory;
pub mod policy;
pub mod prefix;
pub mod qwen;
pub mod sample;
pub mod schedule;
pub mod session;
pub mod stepper;
pub mod stock;
pub mod template;
mod vocab;
mod weights;

/// The worker threads a forward runs on (recorded in every artifact's provenance).
pub fn threads() -> usize {
    candle_core::utils::get_num_threads()
}
