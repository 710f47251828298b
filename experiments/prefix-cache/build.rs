// Bakes the source hash and build facts into the binary for the provenance block.
fn main() {
    source_hash::build_script();
}
