#!/usr/bin/env bash
# Proves that `new-experiment` scaffolds a crate that builds and runs as is: scaffolds `demo`
# in a temporary copy of the workspace, runs it on the tiny generated model, and checks that
# it wrote an artifact with a provenance block. Reuses this checkout's target/ for speed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Every workspace member but the experiments (the copy must start without any).
cp -r "$root/Cargo.toml" "$root/Cargo.lock" "$root/common" "$root/report" "$tmp/"
mkdir -p "$tmp/experiments" "$tmp/manifests/models"
cp "$root/manifests/models/tiny.json" "$tmp/manifests/models/"
export CARGO_TARGET_DIR="$root/target" LAB_MODELS_DIR="$tmp/.models"
cd "$tmp"
# The copy has no experiment yet (cargo would reject its `experiments/*` member glob), so use
# the new-experiment binary `cargo test` just built.
"$root/target/debug/new-experiment" demo
if "$root/target/debug/new-experiment" demo 2>/dev/null; then
  echo "check-scaffold: scaffolding an existing name should fail" >&2; exit 1
fi
out=$(cargo run -q -p demo -- --offline)
echo "$out"
artifact=$(sed -n 's/^artifact: //p' <<<"$out")
[ -f "$artifact" ] || { echo "check-scaffold: no artifact written" >&2; exit 1; }
grep -q '"source"' "$artifact" && grep -q '"manifest"' "$artifact" || { echo "check-scaffold: artifact lacks provenance" >&2; exit 1; }
echo "check-scaffold: 1 passed, 0 failed"
