//! The committed JSON Schemas match the Rust types that write the JSON.

mod support;

use common::manifest::ExperimentManifest;
use common::pin::ModelPin;
use common::provenance::Provenance;
use common::scheduler::study::{Expectations, Parameters, SchedulerArtifact};
use common::schema::check_committed;
use common::serving::{Parameters as ServingParameters, ServingArtifact};

#[test]
fn committed_schemas_match_the_code() {
    let root = support::workspace().root;
    let results = [
        check_committed::<ModelPin>(&root, "model-pin.v1"),
        check_committed::<Provenance>(&root, "provenance.v1"),
        check_committed::<ExperimentManifest<Parameters, Expectations>>(&root, "scheduler-manifest.v1"),
        check_committed::<SchedulerArtifact>(&root, "scheduler-artifact.v1"),
        check_committed::<ExperimentManifest<ServingParameters, serde_json::Value>>(&root, "serving-bench-manifest.v1"),
        check_committed::<ServingArtifact>(&root, "serving-bench-artifact.v1"),
    ];
    let problems: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
