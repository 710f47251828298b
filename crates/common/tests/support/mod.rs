//! Helpers shared by the integration tests: the workspace and a freshly generated tiny model.
#![allow(dead_code)] // each test file uses its own subset

use common::generate;
use common::workspace::Workspace;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub fn workspace() -> Workspace {
    Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).expect("tests run inside the workspace")
}

/// The `tiny` checkpoint, generated once per test process into its own temporary folder.
pub fn tiny_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap().keep();
        let dir = tmp.join("tiny");
        generate::generate_into(&generate::shape("tiny").unwrap(), &dir, false).unwrap();
        dir
    })
    .clone()
}

/// A copy of the tiny checkpoint that a test may damage.
pub fn tiny_copy() -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }
    copy
}
