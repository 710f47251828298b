//! Helpers shared by the integration tests: the workspace and a freshly generated tiny model.
#![allow(dead_code)] // each test file uses its own subset

use common::generate;
use common::manifest::read_model_pin;
use common::workspace::Workspace;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub fn workspace() -> Workspace {
    Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).expect("tests run inside the workspace")
}

/// The `tiny` checkpoint, generated under cargo's scratch folder for integration tests and
/// reused while it still matches its pin (a folder per process would pile up in the system's
/// temporary folder: a static is never dropped). A file lock keeps test processes that run side
/// by side from replacing it under each other.
pub fn tiny_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(scratch).unwrap();
        let lock = std::fs::File::create(scratch.join("tiny.lock")).unwrap();
        lock.lock().unwrap();
        let dir = scratch.join("tiny");
        let pin = read_model_pin(&workspace().manifests_dir().join("models/tiny.json")).unwrap();
        if pin.verify(&dir).is_err() {
            generate::generate_into(&generate::shape("tiny").unwrap(), &dir, true).unwrap();
        }
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
