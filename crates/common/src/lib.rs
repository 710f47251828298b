//! What every experiment depends on: one facade over the layers below it ([`supply`], [`engine`],
//! [`records`]), re-exported under their module names, plus the two things that join the layers:
//! the shared start and end of an experiment binary ([`experiment::prepare`]) and the
//! [`experiment::Experiment`] trait through which the workspace tools (reproduce, audit, pin,
//! report) handle an experiment without naming it.
//!
//! Layers, bottom up (ARCHITECTURE.md has the rule): `supply` (model files), `engine` (the forward
//! and the stepping loop) and `records` (provenance, artifacts, findings) beside it, then this
//! crate, then the experiments, then the tools.

pub use engine::{
    greedy, kernel, load, memory, policy, prefix, qwen, sample, schedule, session, stepper, stock, template,
};
pub use records::{artifact, budget, build_facts, chart, columns, evidence, finding, provenance, schema, stats};
pub use supply::{claim, config, digest, generate, gguf, manifest, pin, resolve, weights, workspace};

pub use engine::threads as engine_threads;

pub mod experiment;

/// Logs to stderr, `info` by default, `RUST_LOG` to change; in colour only where [`colour`]
/// says, so that a log written to a file or a pipe reads as plain text.
pub fn init_tracing() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Whether to write colour codes: only to a terminal, and never when `NO_COLOR` is set to
/// anything but the empty string (the no-color.org convention).
pub fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(super::colour(true, None));
        assert!(super::colour(true, Some("".into())));
        assert!(!super::colour(true, Some("1".into())));
        assert!(!super::colour(false, None));
    }
}
