//! JSON Schemas of what we write, generated from the Rust types and committed under `schemas/`,
//! so that readers in other languages (and the audit) can validate artifacts without our code.
//! A test in each crate calls [`check_committed`]; it fails when a type changed and its committed
//! schema did not. `UPDATE_SCHEMAS=1 cargo test` rewrites them.

use std::path::Path;

/// Why a committed schema does not match its type.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("schemas/{0}.json differs from the Rust types; review the change and run `UPDATE_SCHEMAS=1 cargo test` to rewrite it")]
    Stale(String),
    #[error("schemas/{name}.json: cannot write: {cause}")]
    Write { name: String, cause: std::io::Error },
}

/// Compares the schema of `T` with `schemas/<name>.json` under `workspace`, or rewrites the file
/// when `UPDATE_SCHEMAS=1`.
pub fn check_committed<T: schemars::JsonSchema>(workspace: &Path, name: &str) -> Result<(), SchemaError> {
    check_committed_value(workspace, name, &schema_of::<T>())
}

/// The JSON Schema of `T`, as committed.
pub fn schema_of<T: schemars::JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default()
}

/// [`check_committed`] for a schema already made (an experiment's, through its trait).
pub fn check_committed_value(workspace: &Path, name: &str, schema: &serde_json::Value) -> Result<(), SchemaError> {
    // A `Value` always prints.
    let mut text = format!("{schema:#}");
    text.push('\n');
    let dir = workspace.join("schemas");
    let path = dir.join(format!("{name}.json"));
    if std::env::var("UPDATE_SCHEMAS").as_deref() == Ok("1") {
        let write = |cause| SchemaError::Write { name: name.to_string(), cause };
        std::fs::create_dir_all(&dir).map_err(write)?;
        std::fs::write(&path, &text).map_err(write)?;
        return Ok(());
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == text {
        Ok(())
    } else {
        Err(SchemaError::Stale(name.to_string()))
    }
}
