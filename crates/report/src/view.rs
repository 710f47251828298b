//! Reading artifacts for rendering: ours (any experiment, any version) and foreign ones (the
//! Python predecessor's seeds) alike; the experiment is the one the artifact names, or the one
//! that recognises a foreign file.

use common::experiment::Experiment;
use serde_json::Value;
use std::path::Path;

pub struct Artifact<'a> {
    /// File stem, used to name the rendered files.
    pub name: String,
    pub kind: &'a dyn Experiment,
    pub value: Value,
}

pub fn load<'a>(path: &Path, experiments: &[&'a dyn Experiment]) -> Result<Artifact<'a>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut value: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    if let Some(map) = value.as_object_mut() {
        map.remove(common::artifact::SEAL_KEY);
    }
    let kind = match value.pointer("/provenance/experiment").and_then(Value::as_str) {
        Some(name) => experiments.iter().copied().find(|e| e.name() == name),
        None => experiments.iter().copied().find(|e| e.recognises(&value)),
    };
    let names: Vec<&str> = experiments.iter().map(|e| e.name()).collect();
    let kind = kind.ok_or_else(|| {
        format!("{}: not an artifact of a registered experiment ({})", path.display(), names.join(", "))
    })?;
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "artifact".into());
    Ok(Artifact { name, kind, value })
}
