//! What the workspace tools see of an experiment: [`AnyExperiment`], which speaks JSON, so that
//! `reproduce`, the audit, `pin` and the report read every experiment's files without its types.
//! No experiment implements it by hand: every [`Experiment`] is one, through the blanket adapter
//! below, which reads each part as the experiment's type and writes the answer back.

use super::{read_as, CommandLine, Experiment, ExperimentError, ReportOptions};
use crate::chart::{CompareRow, Section};
use crate::claim::{Claim, Vocabulary};
use crate::evidence::{ClaimResult, Observation};
use crate::finding::Findings;
use crate::workspace::AnyManifest;
use serde_json::Value;

/// What a recorded command line gives (see [`AnyExperiment::settings`]).
pub struct Settings {
    pub requested: Value,
    /// `None` without a manifest.
    pub effective: Option<Value>,
}

/// One experiment, as the tools see it. Everything takes JSON: the tools read artifacts and
/// manifests of every experiment, and the adapter reads each with the experiment's own types.
pub trait AnyExperiment: Sync {
    /// Its name: the binary, `manifests/<name>/`, `artifacts/<name>/` and `provenance.experiment`.
    fn name(&self) -> &'static str;

    /// Whether `just reproduce` runs its manifests (see [`Experiment::REPRODUCED`]).
    fn reproduced(&self) -> bool;

    /// Reads a manifest's parameters and expectations as this experiment's types and checks them;
    /// the error names the field and the fix.
    fn check_manifest(&self, manifest: &AnyManifest) -> Result<(), ExperimentError>;

    /// Its JSON Schemas, as `(name, schema)`: `<name>-manifest.v1` and `<name>-artifact.v1`,
    /// committed under `schemas/` (a test of the registry keeps them in sync).
    fn schemas(&self) -> Vec<(String, Value)>;

    /// The settings a recorded command line gives: what `argv` asks for
    /// (`provenance.settings.requested`) and, given the manifest's parameters, the effective ones
    /// its overrides make of them (`provenance.settings.effective`). So the audit tells an edited
    /// `argv` or edited parameters from the run's own; the error says why `argv` does not parse.
    fn settings(&self, argv: &[String], manifest_parameters: Option<&Value>) -> Result<Settings, ExperimentError>;

    /// The invariants of one of its artifacts (the body, seal removed), and the expectations of
    /// the manifest it ran when its parameters were the manifest's.
    fn audit(&self, artifact: &Value, expectations: Option<&Value>, findings: &mut Findings);

    /// Whether a foreign artifact (the Python predecessor's) is of this experiment.
    fn recognises(&self, foreign: &Value) -> bool;

    /// The checks a foreign artifact's fields allow, and notes of what it lacks.
    fn audit_foreign(&self, foreign: &Value, findings: &mut Findings);

    /// New expectations for the manifest from a fresh, audited artifact; `Ok(None)`: this
    /// experiment pins nothing.
    fn pin(&self, artifact: &Value, current: Option<&Value>) -> Result<Option<Value>, ExperimentError>;

    /// Its section of the report page for one artifact (ours or foreign).
    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        options: &ReportOptions,
    ) -> Result<Section, ExperimentError>;

    /// The metrics of two of its artifacts side by side, for `report --compare`.
    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow>;

    /// Recomputes every part of `artifact` its binary derives from what it recorded; one that
    /// does not read as this experiment's artifact is left as it is.
    fn rederive(&self, artifact: &mut Value);

    /// The names a manifest's claims may use, given its parameters.
    fn claim_vocabulary(&self, parameters: &Value) -> Result<Vocabulary, ExperimentError>;

    /// The values claims are judged on, read from one of its artifacts or a foreign one.
    fn observations(&self, artifact: &Value) -> Vec<Observation>;
}

impl<E: Experiment> AnyExperiment for E {
    fn name(&self) -> &'static str {
        E::NAME
    }

    fn reproduced(&self) -> bool {
        E::REPRODUCED
    }

    fn check_manifest(&self, manifest: &AnyManifest) -> Result<(), ExperimentError> {
        self.validate(&read_as::<E::Parameters>("parameters", &manifest.parameters)?)?;
        if let Some(e) = &manifest.expectations {
            read_as::<E::Expectations>("expectations", e)?;
        }
        Ok(())
    }

    fn schemas(&self) -> Vec<(String, Value)> {
        use crate::schema::schema_of;
        vec![
            (
                format!("{}-manifest.v1", E::NAME),
                schema_of::<crate::manifest::ExperimentManifest<E::Parameters, E::Expectations>>(),
            ),
            (format!("{}-artifact.v1", E::NAME), schema_of::<E::Artifact>()),
        ]
    }

    fn settings(&self, argv: &[String], manifest_parameters: Option<&Value>) -> Result<Settings, ExperimentError> {
        let args = <E::Args as clap::Parser>::try_parse_from(argv).map_err(|e| ExperimentError::Argv(e.kind()))?;
        if let Some(why) = args.writes_no_artifact() {
            return Err(ExperimentError::WritesNoArtifact(why));
        }
        let effective = match manifest_parameters {
            None => None,
            Some(base) => {
                let base: E::Parameters = read_as("parameters", base)?;
                Some(
                    serde_json::to_value(args.effective(&base))
                        .map_err(ExperimentError::read("effective parameters"))?,
                )
            }
        };
        Ok(Settings { requested: args.requested(), effective })
    }

    fn audit(&self, artifact: &Value, expectations: Option<&Value>, f: &mut Findings) {
        let artifact = match serde_json::from_value::<E::Artifact>(artifact.clone()) {
            Ok(a) => a,
            Err(e) => return f.wrong("schema", "", format!("does not read as a {} artifact: {e}", E::NAME)),
        };
        let expectations = match expectations.map(|e| read_as::<E::Expectations>("expectations", e)).transpose() {
            Ok(e) => e,
            Err(e) => return f.wrong("manifest", "expectations", e.to_string()),
        };
        Experiment::audit(self, &artifact, expectations.as_ref(), f)
    }

    fn recognises(&self, foreign: &Value) -> bool {
        Experiment::recognises(self, foreign)
    }

    fn audit_foreign(&self, foreign: &Value, findings: &mut Findings) {
        Experiment::audit_foreign(self, foreign, findings)
    }

    fn pin(&self, artifact: &Value, current: Option<&Value>) -> Result<Option<Value>, ExperimentError> {
        let artifact: E::Artifact = read_as("the artifact", artifact)?;
        let current: Option<E::Expectations> = current.map(|c| read_as("expectations", c)).transpose()?;
        match Experiment::pin(self, &artifact, current.as_ref())? {
            None => Ok(None),
            Some(pinned) => {
                serde_json::to_value(pinned).map(Some).map_err(ExperimentError::read("the pinned expectations"))
            }
        }
    }

    fn report(
        &self,
        title: &str,
        dir: &str,
        artifact: &Value,
        options: &ReportOptions,
    ) -> Result<Section, ExperimentError> {
        Experiment::report(self, title, dir, artifact, options)
    }

    fn compare(&self, a: &Value, b: &Value) -> Vec<CompareRow> {
        Experiment::compare(self, a, b)
    }

    fn rederive(&self, artifact: &mut Value) {
        let Ok(mut typed) = serde_json::from_value::<E::Artifact>(artifact.clone()) else { return };
        Experiment::rederive(self, &mut typed);
        if let Ok(value) = serde_json::to_value(&typed) {
            *artifact = value;
        }
    }

    fn claim_vocabulary(&self, parameters: &Value) -> Result<Vocabulary, ExperimentError> {
        Ok(Experiment::claim_vocabulary(self, &read_as::<E::Parameters>("parameters", parameters)?))
    }

    fn observations(&self, artifact: &Value) -> Vec<Observation> {
        Experiment::observations(self, artifact)
    }
}

/// The claims of a manifest, checked against the names the experiment gives for its
/// parameters; the error names the claim's field.
pub fn check_claims(experiment: &dyn AnyExperiment, manifest: &AnyManifest) -> Result<(), ExperimentError> {
    let names = experiment.claim_vocabulary(&manifest.parameters)?;
    crate::claim::check(&manifest.claims, &names)?;
    Ok(())
}

/// [`AnyExperiment::rederive`], then the stored claims judged again on the artifact's rounds:
/// every part of an artifact that follows from its recorded events, recomputed.
pub fn rederive(experiment: &dyn AnyExperiment, artifact: &mut Value) {
    experiment.rederive(artifact);
    let Some(stored) = artifact.get("claims").and_then(|c| serde_json::from_value::<Vec<ClaimResult>>(c.clone()).ok())
    else {
        return;
    };
    let mut claims: Vec<Claim> = Vec::new();
    for r in stored {
        if !claims.iter().any(|c| c.id == r.claim.id) {
            claims.push(r.claim);
        }
    }
    let judged = crate::evidence::judge(&claims, &experiment.observations(artifact));
    if let Ok(judged) = serde_json::to_value(judged) {
        artifact["claims"] = judged;
    }
}

/// The claims judged on an artifact. Ours carry theirs, judged when the run was made; a foreign
/// one (the predecessor's) is judged here on the claims its experiment's manifests state, those
/// of manifests pinning the artifact's model first, each claim id once.
pub fn claims_of(
    ws: &crate::workspace::Workspace,
    experiment: &dyn AnyExperiment,
    artifact: &Value,
) -> Vec<ClaimResult> {
    if artifact.get("provenance").is_some() {
        return artifact.get("claims").and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or_default();
    }
    let model = artifact.get("model_id").and_then(Value::as_str);
    let mut manifests: Vec<(bool, AnyManifest)> = ws
        .experiment_manifests()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, m)| m.experiment == experiment.name())
        .map(|(_, m)| (ws.model_pin(&m.model).is_ok_and(|pin| Some(pin.repo.as_str()) == model), m))
        .collect();
    manifests.sort_by_key(|(same_model, _)| !*same_model);
    let mut claims: Vec<Claim> = Vec::new();
    for claim in manifests.into_iter().flat_map(|(_, m)| m.claims) {
        if !claims.iter().any(|c| c.id == claim.id) {
            claims.push(claim);
        }
    }
    crate::evidence::judge(&claims, &experiment.observations(artifact))
}
