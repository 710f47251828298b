//! Exports the versions of the inference crates, read from Cargo.lock, for the provenance block.
//! The manifest directory is read when the script runs, not compiled in: a script built in a
//! copy of the workspace (the scaffold check's) then still reads the lock of the one it runs for.
fn main() {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let lock_path = std::path::PathBuf::from(manifest_dir).join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock_path.display());
    let lock = std::fs::read_to_string(&lock_path).unwrap_or_default();
    for (krate, var) in [("candle-core", "CANDLE_VERSION"), ("tokenizers", "TOKENIZERS_VERSION")] {
        let needle = format!("name = \"{krate}\"\nversion = \"");
        let version = lock
            .find(&needle)
            .map(|at| &lock[at + needle.len()..])
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("unknown");
        println!("cargo:rustc-env={var}={version}");
    }
}
