//! The workspace tools' shared part: the registry of experiments that `reproduce`, `audit`,
//! `pin` and `report` dispatch through.

pub mod bytes_bar;
pub mod registry;

/// What every tool exits with: 0 when all is well; [`CHECK_FAILED`] when what it checked is not
/// (an artifact wrong or stale, a run or a claim that failed); [`TOOL_FAILED`] when it could not
/// do its job (a bad flag, a missing file, an I/O error), as clap's own usage errors do.
pub const CHECK_FAILED: i32 = 1;
/// See [`CHECK_FAILED`].
pub const TOOL_FAILED: i32 = 2;

/// A tool's whole `main`: its command line, then `run`; an error is one line and [`TOOL_FAILED`].
pub fn main<A: clap::Parser, T: common::experiment::ExitStatus>(run: impl FnOnce(A) -> anyhow::Result<T>) -> ! {
    common::experiment::main_with(TOOL_FAILED, run)
}
