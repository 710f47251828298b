//! The shared core of every experiment.
//!
//! Module map (see ARCHITECTURE.md for the invariants between them):
//! - [`pin`], [`digest`], [`manifest`], [`workspace`]: what a model and a run must be, and where
//!   things live.
//! - [`resolve`], [`generate`]: finding (or making) a pinned model's files, verified.
//! - [`config`], [`template`], [`load`]: turning a checkpoint folder into a runnable model.
//! - [`provenance`], [`artifact`], [`schema`], [`stats`]: recording what a run measured.

pub mod artifact;
pub mod audit;
pub mod config;
pub mod digest;
pub mod engine;
pub mod experiment;
pub mod generate;
pub mod gguf;
pub mod greedy;
pub mod kernel;
pub mod load;
pub mod manifest;
pub mod memory;
pub mod pin;
pub mod policy;
pub mod provenance;
pub mod qwen;
pub mod resolve;
pub mod scheduler;
pub mod schema;
pub mod serving;
pub mod stats;
pub mod stepper;
pub mod template;
pub mod workspace;

/// Logs to stderr, `info` by default, `RUST_LOG` to change.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_writer(std::io::stderr).try_init();
}
