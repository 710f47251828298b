//! The committed JSON Schemas match the Rust types that write the JSON: the shared ones (model
//! pins, provenance) and every registered experiment's, through its trait.

use common::manifest::ExperimentManifest;
use common::pin::ModelPin;
use common::provenance::Provenance;
use common::schema::{check_committed, check_committed_value};
use common::workspace::Workspace;
use std::path::Path;
use tools::registry::EXPERIMENTS;

#[test]
fn committed_schemas_match_the_code() {
    let root = Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap().root;
    let mut results =
        vec![check_committed::<ModelPin>(&root, "model-pin.v1"), check_committed::<Provenance>(&root, "provenance.v1")];
    for experiment in EXPERIMENTS {
        let schemas = experiment.schemas();
        assert!(
            schemas.iter().any(|(name, _)| name == &format!("{}-artifact.v1", experiment.name())),
            "{} gives no artifact schema",
            experiment.name()
        );
        results.extend(schemas.iter().map(|(name, schema)| check_committed_value(&root, name, schema)));
    }
    let problems: Vec<String> = results.into_iter().filter_map(Result::err).map(|e| e.to_string()).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_committed_manifest_reads_as_its_experiments_types() {
    let ws = Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    let manifests: Vec<(std::path::PathBuf, ExperimentManifest<serde_json::Value, serde_json::Value>)> =
        ws.experiment_manifests().unwrap();
    assert!(!manifests.is_empty());
    for (path, manifest) in manifests {
        let kind = EXPERIMENTS.iter().find(|e| e.name() == manifest.experiment);
        let kind =
            kind.unwrap_or_else(|| panic!("{}: no registered experiment `{}`", path.display(), manifest.experiment));
        kind.check_manifest(&manifest).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        common::experiment::check_claims(*kind, &manifest).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
