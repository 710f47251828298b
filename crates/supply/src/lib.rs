//! Model supply, the bottom layer: what a model and a run must be, where things live, and how a
//! pinned model's files are found (or made) and verified before anything loads them.
//!
//! - [`digest`], [`pin`], [`manifest`], [`workspace`]: digests, model pins, experiment manifests,
//!   the workspace's folders; [`claim`]: the findings a manifest states; a value out of range is a
//!   [`manifest::Invalid`].
//! - [`resolve`], [`generate`]: finding (or generating) a pinned model's files, verified (`package`:
//!   a file taken from a pinned Python package).
//! - [`config`], [`weights`]: a checkpoint's `config.json`, and the precision its weights are held in.
//! - [`gguf`]: export of a checkpoint for llama.cpp.
//!
//! Knows nothing of the engine or of any experiment.

pub mod claim;
pub mod config;
pub mod digest;
pub mod generate;
pub mod gguf;
mod invalid;
pub mod manifest;
mod package;
pub mod pin;
pub mod resolve;
pub mod weights;
pub mod workspace;
