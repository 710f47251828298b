//! The scheduler study (seed 000): jobs over per-request KV caches under each policy, every step
//! timed on one timeline, per-request TTFT, completion and largest gap derived from it.
//!
//! The binary (`main.rs`) runs it; this library is what the workspace tools know of it, through
//! [`Scheduler`]'s [`Experiment`] implementation: its manifest and artifact types ([`study`]),
//! its command line ([`cli`]), its invariants, its reading of the predecessor's seed, its pinned
//! ids and its report section.

mod checks;
pub mod claims;
pub mod cli;
mod report;
pub mod study;

use common::chart::{CompareRow, Section};
use common::claim::Vocabulary;
use common::evidence::Observation;
use common::experiment::{Experiment, ExperimentError, ReportOptions};
use common::finding::Findings;
use common::manifest::Invalid;
use serde_json::Value;

/// The experiment's name.
pub const EXPERIMENT: &str = "scheduler";

/// The scheduler study, as the workspace tools see it.
pub struct Scheduler;

impl Experiment for Scheduler {
    const NAME: &'static str = EXPERIMENT;
    type Parameters = study::Parameters;
    type Expectations = study::Expectations;
    type Artifact = study::SchedulerArtifact;
    type Args = cli::Args;

    /// Without a manifest (`--model-dir`): the seed's workload and runs.
    fn default_parameters(&self) -> Option<study::Parameters> {
        Some(study::Parameters::seed())
    }

    fn validate(&self, parameters: &study::Parameters) -> Result<(), Invalid> {
        parameters.validate()
    }

    fn audit(&self, artifact: &study::SchedulerArtifact, expectations: Option<&study::Expectations>, f: &mut Findings) {
        checks::audit(artifact, expectations, f)
    }

    fn rederive(&self, artifact: &mut study::SchedulerArtifact) {
        study::rederive(artifact)
    }

    fn recognises(&self, foreign: &Value) -> bool {
        checks::recognises(foreign)
    }

    fn audit_foreign(&self, foreign: &Value, findings: &mut Findings) {
        checks::audit_foreign(foreign, findings)
    }

    fn pin(
        &self,
        artifact: &study::SchedulerArtifact,
        current: Option<&study::Expectations>,
    ) -> Result<Option<study::Expectations>, ExperimentError> {
        checks::pin(artifact, current).map(Some)
    }

    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        options: &ReportOptions,
    ) -> Result<Section, ExperimentError> {
        Ok(report::section(title, dir, artifact, options.all_rounds))
    }

    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow> {
        report::compare(a, b)
    }

    fn claim_vocabulary(&self, parameters: &study::Parameters) -> Vocabulary {
        claims::vocabulary(parameters)
    }

    fn observations(&self, artifact: &Value) -> Vec<Observation> {
        claims::observations(artifact)
    }
}
