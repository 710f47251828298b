//! Exports the versions of the inference crates, read from Cargo.lock, for the provenance block.
fn main() {
    let lock_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
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
