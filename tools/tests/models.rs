//! `models generate` is atomic: a generation killed half-way leaves no checkpoint where a complete
//! one belongs (the next run would otherwise load it).

use common::workspace::Workspace;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_killed_generation_leaves_no_checkpoint_behind() {
    let ws = Workspace::discover_from(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    let models = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_models"))
        .args(["generate", "qwen2.5-0.5b"])
        .current_dir(&ws.root)
        .env("LAB_MODELS_DIR", models.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let generated = models.path().join("generated");
    // Wait until the generator is writing into its temporary folder, then kill it.
    let start = Instant::now();
    loop {
        let partial = std::fs::read_dir(&generated)
            .map(|rd| rd.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().contains(".partial-")))
            .unwrap_or(false);
        if partial {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "generation never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!generated.join("qwen2.5-0.5b").exists(), "a killed run left a checkpoint where a complete one belongs");
}
