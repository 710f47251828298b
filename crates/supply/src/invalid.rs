//! The one error of a value out of its range, named by its field: what manifests, claims and
//! flags are checked into.

/// A manifest parameter out of its range, found before anything runs: `field` is its path in the
/// manifest (`parameters.rounds`, `jobs[2].id`), `problem` what is wrong and what would be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct Invalid {
    pub field: String,
    pub problem: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Invalid { field: field.into(), problem: problem.into() }
    }
}
