//! The hash covers what an experiment's binary links, on this workspace's real dependency graph:
//! editing the audit, the report, another experiment or a test leaves an artifact fresh; editing
//! the engine, the experiment itself or the lock entry of a package it links makes it stale.

use source_hash::{find_workspace, hash_crate, linked_crates, linked_lock};
use std::path::Path;
use std::process::Command;

fn real() -> std::path::PathBuf {
    find_workspace(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn an_experiment_links_the_layers_below_it_and_nothing_beside_or_above() {
    let mut crates = linked_crates(&real(), "experiments/scheduler").unwrap();
    assert_eq!(crates[0], "experiments/scheduler");
    crates.sort();
    assert_eq!(
        crates,
        [
            "crates/common",
            "crates/engine",
            "crates/records",
            "crates/source-hash",
            "crates/supply",
            "experiments/scheduler"
        ]
    );
}

#[test]
fn editing_what_it_does_not_link_leaves_the_hash_and_editing_what_it_links_changes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir_all(root.join("experiments")).unwrap();
    for item in ["Cargo.toml", "Cargo.lock", "crates", "experiments/scheduler", "experiments/serving-bench"] {
        let status = Command::new("cp").arg("-r").arg(real().join(item)).arg(root.join(item)).status().unwrap();
        assert!(status.success(), "copying {item}");
    }
    let hash = || hash_crate(root, "experiments/scheduler").unwrap().sha256;
    let before = hash();
    let append = |file: &str| {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str("\n// edited\n");
        std::fs::write(&path, text).unwrap();
    };
    for unlinked in [
        "crates/audit/src/lib.rs",
        "crates/report/src/lib.rs",
        "crates/tools/src/registry.rs",
        "experiments/serving-bench/src/lib.rs",
        "crates/engine/tests/new_test.rs",
        "crates/common/benches/verify.rs",
    ] {
        append(unlinked);
        assert_eq!(hash(), before, "editing {unlinked} changed the scheduler's source hash");
    }
    for linked in ["crates/engine/src/qwen.rs", "experiments/scheduler/src/lib.rs"] {
        let was = hash();
        append(linked);
        assert_ne!(hash(), was, "editing {linked} left the scheduler's source hash unchanged");
    }

    // Cargo.lock: a package only the report links (plotters), or only the serving benchmark
    // (axum), or only a dev-dependency (criterion), is not the scheduler's; candle-core is.
    let lock = format!("\n{}", linked_lock(root, "experiments/scheduler").unwrap());
    assert!(lock.contains("\ncandle-core ") && lock.contains("\nserde "), "{lock}");
    for other in ["plotters", "axum", "criterion", "proptest"] {
        assert!(!lock.contains(&format!("\n{other} ")), "the scheduler's lock entries include {other}");
    }
    let edit_entry = |name: &str| {
        let path = root.join("Cargo.lock");
        let text = std::fs::read_to_string(&path).unwrap();
        let entry = format!("[[package]]\nname = \"{name}\"\nversion = \"");
        assert!(text.contains(&entry), "no lock entry for {name}");
        std::fs::write(&path, text.replacen(&entry, &format!("{entry}0.0.0-edited+"), 1)).unwrap();
    };
    for unlinked in ["plotters", "axum", "criterion"] {
        let was = hash();
        edit_entry(unlinked);
        assert_eq!(hash(), was, "editing {unlinked}'s lock entry changed the scheduler's source hash");
    }
    let was = hash();
    edit_entry("candle-core");
    assert_ne!(hash(), was, "editing candle-core's lock entry left the scheduler's source hash unchanged");
}

/// The layering rule of ARCHITECTURE.md, from the manifests: each crate links only the layers
/// below it; no library below the tools links an experiment, and no experiment links another,
/// the audit, the report or the tools.
#[test]
fn every_crate_links_only_the_layers_below_it() {
    let root = real();
    let below: [(&str, &[&str]); 7] = [
        ("crates/source-hash", &[]),
        ("crates/supply", &["crates/source-hash"]),
        ("crates/engine", &["crates/supply", "crates/source-hash"]),
        ("crates/records", &["crates/supply", "crates/source-hash"]),
        ("crates/common", &["crates/engine", "crates/records", "crates/supply", "crates/source-hash"]),
        ("crates/audit", &["crates/common", "crates/engine", "crates/records", "crates/supply", "crates/source-hash"]),
        ("crates/report", &["crates/common", "crates/engine", "crates/records", "crates/supply", "crates/source-hash"]),
    ];
    for (krate, allowed) in below {
        let linked = linked_crates(&root, krate).unwrap();
        let extra: Vec<&String> = linked[1..].iter().filter(|c| !allowed.contains(&c.as_str())).collect();
        assert!(extra.is_empty(), "{krate} links {extra:?}, above or beside its layer");
    }
    let experiments: Vec<String> = std::fs::read_dir(root.join("experiments"))
        .unwrap()
        .map(|e| format!("experiments/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert!(experiments.len() >= 3);
    let common = linked_crates(&root, "crates/common").unwrap();
    for experiment in &experiments {
        let linked = linked_crates(&root, experiment).unwrap();
        let extra: Vec<&String> = linked[1..].iter().filter(|c| !common.contains(c)).collect();
        assert!(
            extra.is_empty(),
            "{experiment} links {extra:?}: an experiment links `common` and the layers under it only"
        );
    }
}
