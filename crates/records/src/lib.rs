//! What a run records, and the vocabulary of checking it: provenance, sealed artifacts written
//! once, the memory its records may take (budget), statistics, JSON Schemas, audit findings,
//! claims judged on rounds (evidence), and chart data for reports.
//!
//! Imports only [`supply`] (a provenance block names the pinned model and manifest); knows nothing
//! of the engine or of any experiment.

pub mod artifact;
pub mod budget;
pub mod chart;
pub mod columns;
pub mod evidence;
pub mod finding;
pub mod provenance;
pub mod schema;
pub mod stats;
