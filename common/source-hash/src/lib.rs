//! The source hash of an experiment: SHA-256 over its own crate, the `common` crate and
//! `Cargo.lock`.
//!
//! One function serves both sides of the contract: an experiment's `build.rs` bakes the hash into
//! the binary (so an artifact says which code made it), and the audit recomputes it from the
//! working tree (so a reviewer learns whether the code changed since). Both must agree byte for
//! byte, which is why this is its own tiny crate usable as a build-dependency.
//!
//! The hash covers every regular file under the hashed directories except build outputs and
//! hidden files, identified by its path relative to the workspace root, so moving the checkout
//! does not change it.

use sha2::{Digest, Sha256};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The directories, relative to the workspace root, whose files make up an experiment's source.
/// `common` holds `source-hash` itself, so a change to the hashing rule changes every hash.
pub fn hashed_roots(experiment_dir: &str) -> Vec<String> {
    vec![experiment_dir.to_string(), "common".to_string(), "Cargo.lock".to_string()]
}

/// The result of hashing: the hex digest and the files it covered (relative paths, sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceHash {
    pub sha256: String,
    pub files: Vec<String>,
}

/// Hashes the given roots (files or directories relative to `workspace`).
///
/// The digest is SHA-256 over one line per file, `"<relative path>\0<sha256 of content>\n"`, in
/// sorted path order: independent of the walk order and of the checkout's location.
pub fn hash_sources(workspace: &Path, roots: &[String]) -> io::Result<SourceHash> {
    let mut files = Vec::new();
    for root in roots {
        collect(workspace, &workspace.join(root), &mut files)?;
    }
    files.sort();
    files.dedup();
    let mut outer = Sha256::new();
    for rel in &files {
        let bytes = fs::read(workspace.join(rel))?;
        let inner = Sha256::digest(&bytes);
        outer.update(rel.as_bytes());
        outer.update([0u8]);
        outer.update(hex(&inner).as_bytes());
        outer.update(b"\n");
    }
    Ok(SourceHash { sha256: hex(&outer.finalize()), files })
}

fn collect(workspace: &Path, path: &Path, out: &mut Vec<String>) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.is_file() {
        let rel = path
            .strip_prefix(workspace)
            .map_err(|_| io::Error::other(format!("{} is outside the workspace", path.display())))?;
        // Forward slashes so the hash is the same on every platform.
        let rel: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        out.push(rel.join("/"));
    } else if meta.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path)?.map(|e| e.map(|e| e.path())).collect::<io::Result<_>>()?;
        entries.sort();
        for entry in entries {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            collect(workspace, &entry, out)?;
        }
    }
    Ok(())
}

/// Lower-case hex of a byte slice.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// For an experiment's `build.rs`: hashes the experiment, `common` and `Cargo.lock`, tells cargo
/// to rerun when any hashed file (or the set of files) changes, and exports the build facts the
/// provenance block records (`SOURCE_SHA256`, `SOURCE_FILES`, `BUILD_RUSTC`, `BUILD_TARGET`,
/// `BUILD_PROFILE`, `BUILD_FEATURES`).
pub fn build_script() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from build.rs"));
    let workspace = find_workspace(&manifest_dir).expect("Cargo.lock above the crate");
    let crate_dir =
        manifest_dir.strip_prefix(&workspace).expect("crate inside workspace").to_string_lossy().replace('\\', "/");
    let roots = hashed_roots(&crate_dir);
    let hashed = hash_sources(&workspace, &roots).expect("hash sources");
    for root in &roots {
        // A directory entry makes cargo rerun when files are added or removed inside it.
        println!("cargo:rerun-if-changed={}", workspace.join(root).display());
    }
    for file in &hashed.files {
        println!("cargo:rerun-if-changed={}", workspace.join(file).display());
    }
    println!("cargo:rustc-env=SOURCE_SHA256={}", hashed.sha256);
    println!("cargo:rustc-env=SOURCE_FILES={}", hashed.files.len());
    println!("cargo:rustc-env=SOURCE_CRATE_DIR={crate_dir}");

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BUILD_RUSTC={version}");
    println!("cargo:rustc-env=BUILD_TARGET={}", std::env::var("TARGET").unwrap_or_default());
    println!("cargo:rustc-env=BUILD_PROFILE={}", std::env::var("PROFILE").unwrap_or_default());
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(|f| f.to_lowercase().replace('_', "-")))
        .collect();
    features.sort();
    println!("cargo:rustc-env=BUILD_FEATURES={}", features.join(","));
}

/// The nearest directory at or above `start` holding `Cargo.lock`.
pub fn find_workspace(start: &Path) -> Option<PathBuf> {
    start.ancestors().find(|d| d.join("Cargo.lock").is_file()).map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_content_and_path_not_location() {
        let a = tempdir("a");
        let b = tempdir("b");
        for root in [&a, &b] {
            fs::create_dir_all(root.join("exp/src")).unwrap();
            fs::write(root.join("exp/src/main.rs"), "fn main() {}").unwrap();
            fs::write(root.join("Cargo.lock"), "lock").unwrap();
            fs::create_dir_all(root.join("exp/target")).unwrap();
            fs::write(root.join("exp/target/junk"), "ignored").unwrap();
        }
        let roots = vec!["exp".to_string(), "Cargo.lock".to_string()];
        let ha = hash_sources(&a, &roots).unwrap();
        let hb = hash_sources(&b, &roots).unwrap();
        assert_eq!(ha, hb);
        assert_eq!(ha.files, vec!["Cargo.lock", "exp/src/main.rs"]);

        fs::write(b.join("exp/src/main.rs"), "fn main() { }").unwrap();
        assert_ne!(hash_sources(&b, &roots).unwrap().sha256, ha.sha256);
        fs::write(b.join("exp/src/main.rs"), "fn main() {}").unwrap();
        fs::rename(b.join("exp/src/main.rs"), b.join("exp/src/lib.rs")).unwrap();
        assert_ne!(hash_sources(&b, &roots).unwrap().sha256, ha.sha256);
        fs::remove_dir_all(&a).unwrap();
        fs::remove_dir_all(&b).unwrap();
    }

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("source-hash-test-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
    }
}
