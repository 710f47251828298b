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
use common::experiment::{read_as, AnyManifest, Experiment, ExperimentError, Settings};
use common::finding::Findings;
use serde_json::Value;

/// The experiment's name.
pub const EXPERIMENT: &str = "scheduler";

/// The scheduler study, as the workspace tools see it.
pub struct Scheduler;

impl Experiment for Scheduler {
    fn name(&self) -> &'static str {
        EXPERIMENT
    }

    fn check_manifest(&self, manifest: &AnyManifest) -> Result<(), ExperimentError> {
        read_as::<study::Parameters>("parameters", &manifest.parameters)?.validate()?;
        if let Some(e) = &manifest.expectations {
            read_as::<study::Expectations>("expectations", e)?;
        }
        Ok(())
    }

    fn schemas(&self) -> Vec<(String, Value)> {
        common::experiment::schemas_of::<study::Parameters, study::Expectations, study::SchedulerArtifact>(EXPERIMENT)
    }

    fn settings(&self, argv: &[String], manifest_parameters: Option<&Value>) -> Result<Settings, ExperimentError> {
        common::experiment::settings::<cli::Args>(argv, manifest_parameters)
    }

    fn audit(&self, artifact: &Value, expectations: Option<&Value>, findings: &mut Findings) {
        checks::audit(artifact, expectations, findings)
    }

    fn rederive(&self, artifact: &mut Value) {
        common::experiment::rederive_as(artifact, study::rederive)
    }

    fn recognises(&self, foreign: &Value) -> bool {
        checks::recognises(foreign)
    }

    fn audit_foreign(&self, foreign: &Value, findings: &mut Findings) {
        checks::audit_foreign(foreign, findings)
    }

    fn pin(&self, artifact: &Value, current: Option<&Value>) -> Result<Option<Value>, ExperimentError> {
        checks::pin(artifact, current)
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
