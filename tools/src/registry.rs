//! Every experiment of the workspace, one line each (`just new-experiment` appends one, and its
//! crate to this crate's `Cargo.toml`). The tools know experiments only through this list.

use common::experiment::AnyExperiment;

#[rustfmt::skip] // one line per experiment, so that adding one is a one-line change
pub static EXPERIMENTS: &[&dyn AnyExperiment] = &[
    &scheduler::Scheduler,
    &serving_bench::ServingBench,
    &decode_scaling::DecodeScaling,
    &engine_bench::EngineBench,
    &prefix_cache::PrefixCache,
];
