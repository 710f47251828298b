//! The serving benchmark (seed 001): a strict streaming client against OpenAI- and
//! Ollama-compatible servers, and the embedded server (the `serve` crate) it measures by default.
//!
//! The binary (`main.rs`) runs it; the load generator it measures with is the `loadgen` crate.
//! This library holds the run ([`measure`]: targets up, groups sent, records kept) and what the
//! workspace tools know of it, through
//! [`ServingBench`]'s [`Experiment`] implementation: its manifest and artifact types
//! ([`serving`]), its command line ([`cli`]), its invariants, its reading of the predecessor's
//! seed and its report section.

mod checks;
mod claims;
pub mod cli;
pub mod export;
pub mod measure;
mod report;
pub mod serving;
pub mod table;

use common::chart::{CompareRow, Section};
use common::claim::Vocabulary;
use common::evidence::Observation;
use common::experiment::{Experiment, ExperimentError, ReportOptions};
use common::finding::Findings;
use common::manifest::Invalid;
use serde_json::Value;

/// The experiment's name.
pub const EXPERIMENT: &str = "serving-bench";

/// The serving benchmark, as the workspace tools see it.
pub struct ServingBench;

impl Experiment for ServingBench {
    const NAME: &'static str = EXPERIMENT;
    type Parameters = serving::Parameters;
    type Expectations = Value;
    type Artifact = serving::ServingArtifact;
    type Args = cli::Cli;

    /// Without a manifest (external targets alone): the seed's parameters.
    fn default_parameters(&self) -> Option<serving::Parameters> {
        Some(cli::seed_parameters())
    }

    fn validate(&self, parameters: &serving::Parameters) -> Result<(), Invalid> {
        cli::check_run(parameters).map(|_| ())
    }

    fn audit(&self, artifact: &serving::ServingArtifact, _expectations: Option<&Value>, findings: &mut Findings) {
        checks::audit(artifact, findings)
    }

    fn rederive(&self, a: &mut serving::ServingArtifact) {
        a.summary = serving::summarize_artifact(a);
    }

    fn recognises(&self, foreign: &Value) -> bool {
        checks::recognises(foreign)
    }

    fn audit_foreign(&self, foreign: &Value, findings: &mut Findings) {
        checks::audit_foreign(foreign, findings)
    }

    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        _options: &ReportOptions,
    ) -> Result<Section, ExperimentError> {
        Ok(report::section(title, dir, artifact))
    }

    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow> {
        report::compare(a, b)
    }

    fn claim_vocabulary(&self, parameters: &serving::Parameters) -> Vocabulary {
        claims::vocabulary(parameters)
    }

    fn observations(&self, artifact: &Value) -> Vec<Observation> {
        claims::observations(artifact)
    }
}
