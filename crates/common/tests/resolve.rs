//! Model resolution: a Python-filled Hugging Face cache works offline, a corrupt copy stops the
//! run naming the file, and a missing model says what was tried and what to do.

mod support;

use common::pin::{ModelPin, ModelSource};
use common::resolve::{resolve, Origin, ResolveOptions};
use std::path::Path;

/// The tiny checkpoint's pin, presented as if it were a Hub model.
fn hub_pin() -> ModelPin {
    let ws = support::workspace();
    let mut pin = ws.model_pin("tiny").unwrap();
    pin.name = "hub-tiny".into();
    pin.repo = "test-org/tiny-model".into();
    pin.source = ModelSource::Hub;
    pin
}

/// Lays out a cache the way huggingface_hub does: content in blobs/, named by digest, and the
/// snapshot folder of the commit holding relative symlinks to them.
fn python_style_cache(cache: &Path, pin: &ModelPin) {
    let repo = cache.join("models--test-org--tiny-model");
    let snapshot = repo.join("snapshots").join(&pin.revision);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), &pin.revision).unwrap();
    for f in &pin.files {
        std::fs::copy(support::tiny_dir().join(&f.path), repo.join("blobs").join(&f.digest)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{}", f.digest), snapshot.join(&f.path)).unwrap();
    }
}

#[test]
fn a_python_filled_cache_resolves_offline() {
    let ws = support::workspace();
    let pin = hub_pin();
    let cache = tempfile::tempdir().unwrap();
    python_style_cache(cache.path(), &pin);
    let opts = ResolveOptions { offline: true, hub_cache: Some(cache.path().into()), ..Default::default() };
    let model = resolve(&ws, &pin, &opts).unwrap();
    assert_eq!(model.origin, Origin::HfCache);
    assert_eq!(model.files, pin.files);
    common::load::LoadedModel::load(&model.dir).unwrap();
}

#[test]
fn a_corrupt_cached_file_stops_the_run_naming_file_and_digests() {
    let ws = support::workspace();
    let pin = hub_pin();
    let cache = tempfile::tempdir().unwrap();
    python_style_cache(cache.path(), &pin);
    let cfg = pin.file("config.json").unwrap();
    let blob = cache.path().join("models--test-org--tiny-model/blobs").join(&cfg.digest);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&blob, &bytes).unwrap();
    let opts = ResolveOptions { offline: true, hub_cache: Some(cache.path().into()), ..Default::default() };
    let err = resolve(&ws, &pin, &opts).unwrap_err().to_string();
    let actual = common::digest::bytes_digest(&bytes, common::digest::Algorithm::GitSha1);
    assert!(err.contains("config.json: git-sha1 mismatch"), "{err}");
    assert!(err.contains(&cfg.digest) && err.contains(&actual), "{err}");
}

#[test]
fn a_missing_model_says_what_was_tried_and_what_to_do() {
    let ws = support::workspace();
    let pin = hub_pin();
    let empty = tempfile::tempdir().unwrap();
    let opts = ResolveOptions { offline: true, hub_cache: Some(empty.path().into()), ..Default::default() };
    let err = resolve(&ws, &pin, &opts).unwrap_err().to_string();
    for part in [
        "hub-tiny",
        "test-org/tiny-model",
        pin.revision.as_str(),
        "Hugging Face cache",
        "offline",
        "--model-dir",
        "generated checkpoint",
    ] {
        assert!(err.contains(part), "`{part}` missing from: {err}");
    }
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn model_dir_is_verified_against_the_pin() {
    let ws = support::workspace();
    let pin = ws.model_pin("tiny").unwrap();
    let good = ResolveOptions { model_dir: Some(support::tiny_dir()), ..Default::default() };
    assert_eq!(resolve(&ws, &pin, &good).unwrap().origin, Origin::ModelDir);

    let copy = support::tiny_copy();
    std::fs::remove_file(copy.path().join("tokenizer.json")).unwrap();
    let bad = ResolveOptions { model_dir: Some(copy.path().into()), ..Default::default() };
    let err = resolve(&ws, &pin, &bad).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json: missing"), "{err}");

    let nowhere = ResolveOptions { model_dir: Some(copy.path().join("nope")), ..Default::default() };
    assert!(resolve(&ws, &pin, &nowhere)
        .unwrap_err()
        .to_string()
        .contains("neither a checkpoint folder nor a model file"));
    // A file where a pinned model's folder is expected names the folder to pass instead.
    let file = ResolveOptions { model_dir: Some(copy.path().join("config.json")), ..Default::default() };
    let err = resolve(&ws, &pin, &file).unwrap_err().to_string();
    assert!(err.contains("model `tiny` is pinned") && err.contains("pass the folder that holds"), "{err}");
}
