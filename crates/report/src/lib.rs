//! Reports from artifacts alone: timelines, policy and latency comparisons, side-by-side
//! comparisons of two artifacts, as SVG and PNG plus one Markdown page.
//!
//! What it draws comes from each experiment's [`common::experiment::Experiment::report`] (chart
//! data, `common::chart`); this crate only reads artifacts ([`load`]), draws the charts and joins
//! the sections ([`section`], [`compare`]).

mod charts;
mod page;
mod view;

pub use charts::{init_font, DrawError};
pub use page::{compare, section};
pub use view::{load, Artifact};

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("{path}: not JSON: {cause}")]
    NotJson { path: String, cause: serde_json::Error },
    #[error("{path}: {cause}")]
    Unpack { path: String, cause: common::columns::UnpackError },
    #[error("{path}: not an artifact of a registered experiment ({known})")]
    Unknown { path: String, known: String },
    #[error("{a} and {b} are artifacts of different experiments; compare like with like")]
    Unlike { a: String, b: String },
    #[error("{name}: {cause}")]
    Section { name: String, cause: common::experiment::ExperimentError },
    #[error("{path}: cannot draw: {cause}")]
    Draw { path: String, cause: DrawError },
}
