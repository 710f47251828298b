//! The serving benchmark (seed 001): a strict streaming client against OpenAI- and
//! Ollama-compatible servers, and the embedded server it measures by default.
//!
//! The binary (`main.rs`) runs it; this library holds its parts (the wire-format parsers, the
//! client that measures, the embedded server) and what the workspace tools know of it, through
//! [`ServingBench`]'s [`Experiment`] implementation: its manifest and artifact types
//! ([`serving`]), its command line ([`cli`]), its invariants, its reading of the predecessor's
//! seed and its report section.

mod checks;
mod claims;
pub mod cli;
pub mod client;
pub mod export;
pub mod load;
mod report;
pub mod server;
pub mod serving;
pub mod stream;
pub mod workload;

use common::chart::{CompareRow, Section};
use common::claim::Vocabulary;
use common::evidence::Observation;
use common::experiment::{read_as, AnyManifest, Experiment, ExperimentError, Settings};
use common::finding::Findings;
use serde_json::Value;

/// The experiment's name.
pub const EXPERIMENT: &str = "serving-bench";

/// The serving benchmark, as the workspace tools see it.
pub struct ServingBench;

impl Experiment for ServingBench {
    fn name(&self) -> &'static str {
        EXPERIMENT
    }

    fn check_manifest(&self, manifest: &AnyManifest) -> Result<(), ExperimentError> {
        Ok(read_as::<serving::Parameters>("parameters", &manifest.parameters)?.validate()?)
    }

    fn schemas(&self) -> Vec<(String, Value)> {
        common::experiment::schemas_of::<serving::Parameters, Value, serving::ServingArtifact>(EXPERIMENT)
    }

    fn settings(&self, argv: &[String], manifest_parameters: Option<&Value>) -> Result<Settings, ExperimentError> {
        common::experiment::settings::<cli::Cli>(argv, manifest_parameters)
    }

    fn audit(&self, artifact: &Value, _expectations: Option<&Value>, findings: &mut Findings) {
        checks::audit(artifact, findings)
    }

    fn rederive(&self, artifact: &mut Value) {
        common::experiment::rederive_as(artifact, |a: &mut serving::ServingArtifact| {
            a.summary = serving::summarize_all(&a.arguments, &a.runtimes, &a.requests);
        })
    }

    fn recognises(&self, foreign: &Value) -> bool {
        checks::recognises(foreign)
    }

    fn audit_foreign(&self, foreign: &Value, findings: &mut Findings) {
        checks::audit_foreign(foreign, findings)
    }

    fn report(&self, title: &str, dir: &str, artifact: &Value) -> Result<Section, ExperimentError> {
        Ok(report::section(title, dir, artifact))
    }

    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow> {
        report::compare(a, b)
    }

    fn claim_vocabulary(&self, parameters: &Value) -> Result<Vocabulary, ExperimentError> {
        claims::vocabulary(parameters)
    }

    fn observations(&self, artifact: &Value) -> Vec<Observation> {
        claims::observations(artifact)
    }
}
