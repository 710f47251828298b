# Reproducible LLM-inference experiments. `just` lists the recipes.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list

# Build, generate or fetch the pinned models, run every experiment on every manifest, print a summary.
reproduce *FLAGS:
    cargo build --release --workspace --bins
    ./target/release/reproduce {{FLAGS}}

# Like `reproduce`, but a manifest skipped for want of its model counts as a failure.
reproduce-strict *FLAGS:
    just reproduce --strict {{FLAGS}}

# Every test: unit, integration (offline, on generated checkpoints) and the scaffold check.
test:
    cargo test --workspace
    scripts/check-scaffold.sh

# Audit artifacts against their manifests (default: all of artifacts/); `--external FILE` reads a seed.
audit *ARGS:
    cargo run --release -q -p common --bin audit -- {{ARGS}}

# Rewrite a manifest's expectations from a fresh artifact, showing the change: `just pin ARTIFACT`.
pin ARTIFACT:
    cargo run --release -q -p common --bin audit -- --update {{ARTIFACT}}

# Render artifacts into SVG/PNG charts and a Markdown page (default: newest per manifest, into artifacts/reports/).
report *ARGS:
    cargo run --release -q -p report -- {{ARGS}}

# Pinned models and their state; `just models generate|verify|fetch|pin ...` (see `--help`).
models *ARGS:
    cargo run --release -q -p common --bin models -- {{ARGS}}

# Scaffold a new experiment crate under experiments/ and its manifest.
new-experiment NAME:
    cargo run --release -q -p common --bin new-experiment -- {{NAME}}

# Benchmarks: checkpoint verification vs plain reading, scheduler overhead and engine vs bare candle.
bench:
    cargo bench -p common --bench verify --bench engine
    cargo bench -p serving-bench --bench client
