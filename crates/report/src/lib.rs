//! Reports from artifacts alone: timelines, policy and latency comparisons, side-by-side
//! comparisons of two artifacts, as SVG and PNG plus one Markdown page.

pub mod charts;
pub mod page;
pub mod view;
