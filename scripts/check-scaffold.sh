#!/usr/bin/env bash
# Proves that adding an experiment is one crate and one registry line: in a temporary copy of the
# workspace, `new-experiment demo` scaffolds the crate and registers it, touching nothing else;
# the crate runs on the tiny generated model and writes an artifact that the audit (which knows
# it only through the registry) passes. Reuses this checkout's target/ for speed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Times preserved: a copy that looks newer would rebuild build scripts here, into the shared
# target/, with this temporary path compiled into them (records' would then read no Cargo.lock).
cp -rp "$root/Cargo.toml" "$root/Cargo.lock" "$root/crates" "$root/experiments" "$root/tools" "$root/manifests" "$root/schemas" "$tmp/"
export CARGO_TARGET_DIR="$root/target" LAB_MODELS_DIR="$tmp/.models"
cd "$tmp"
git init -q && git add -A && git -c user.name=check -c user.email=check@localhost commit -qm before
# Names that cannot become a crate, a binary and a module are refused before anything is written.
for bad in clap tempfile build async std experiment; do
  if "$root/target/debug/new-experiment" "$bad" 2>/dev/null; then
    echo "check-scaffold: \`new-experiment $bad\` should be refused" >&2; exit 1
  fi
done
[ -z "$(git status --porcelain)" ] || { git status --porcelain >&2; echo "check-scaffold: a refused name wrote files" >&2; exit 1; }
"$root/target/debug/new-experiment" demo
if "$root/target/debug/new-experiment" demo 2>/dev/null; then
  echo "check-scaffold: scaffolding an existing name should fail" >&2; exit 1
fi
changed=$(git status --porcelain | awk '{print $2}' | sort | tr '\n' ' ')
expected="experiments/demo/ manifests/demo/ tools/Cargo.toml tools/src/registry.rs "
[ "$changed" = "$expected" ] || { echo "check-scaffold: new-experiment changed [$changed], expected [$expected]" >&2; exit 1; }
# One line in each registration, nothing else.
[ "$(git diff --numstat tools | awk '{a+=$1; d+=$2} END {print a, d}')" = "2 0" ] || { git diff tools >&2; echo "check-scaffold: the registration is not one added line per file" >&2; exit 1; }
out=$(cargo run -q -p demo -- --offline)
echo "$out"
artifact=$(sed -n 's/^artifact: //p' <<<"$out")
[ -f "$artifact" ] || { echo "check-scaffold: no artifact written" >&2; exit 1; }
UPDATE_SCHEMAS=1 cargo test -q -p tools --test schemas >/dev/null
cargo run -q -p tools --bin audit -- "$artifact"
cargo run -q -p tools --bin report -- "$artifact" --out "$tmp/report" >/dev/null
[ -s "$tmp/report/report.md" ] && grep -q "demo" "$tmp/report/report.md" || { echo "check-scaffold: no report section" >&2; exit 1; }
echo "check-scaffold: 1 passed, 0 failed"
