fn main() {
    source_hash::build_script();
}
