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
    cargo run --release -q -p tools --bin audit -- {{ARGS}}

# Rewrite a manifest's expectations from a fresh artifact, showing the change: `just pin ARTIFACT`.
pin ARTIFACT:
    cargo run --release -q -p tools --bin audit -- --update {{ARTIFACT}}

# Render artifacts into SVG/PNG charts and a Markdown page (default: newest per manifest, into artifacts/reports/).
report *ARGS:
    cargo run --release -q -p tools --bin report -- {{ARGS}}

# Pinned models and their state; `just models generate|verify|fetch|pin ...` (see `--help`).
models *ARGS:
    cargo run --release -q -p tools --bin models -- {{ARGS}}

# Scaffold a new experiment crate under experiments/ and its manifest.
new-experiment NAME:
    cargo run --release -q -p tools --bin new-experiment -- {{NAME}}

# The embedded server alone, until Ctrl-C (`just serve --help` lists its flags; default: the tiny model on 127.0.0.1:8000).
serve *ARGS:
    cargo run --release -q -p serve -- {{ARGS}}

# Context and batch scaling and scheduler overhead go into the artifact too (the audit recomputes
# its ratios); then checkpoint verification against plain reading and the serving client's cost
# (printed), and the micro-benchmarks under criterion (kernels, digests, stream parsers; history in
# target/criterion/). llama.cpp's Python binding is built from source into .venv-llama once (about
# 8 minutes); without a compiler or registry access that comparison is skipped (the artifact says so).
# (`just --list` shows each recipe's last comment line: keep it a summary.)
# Benchmarks: the engine against the stock candle loop and llama.cpp, into artifacts/bench/.
bench:
    test -x .venv-llama/bin/python || (python3 -m venv .venv-llama && .venv-llama/bin/pip install -q llama-cpp-python==0.3.36 numpy) || (rm -rf .venv-llama; echo "llama.cpp binding unavailable: its comparison is skipped")
    cargo build --release -p engine-bench
    ./target/release/engine-bench --manifest manifests/engine-bench/qwen2.5-0.5b.json --out artifacts/bench/engine-$(date -u +%Y%m%dT%H%M%SZ).json
    cargo bench -p common --bench verify
    cargo bench -p serving-bench --bench client
    cargo bench -p engine --bench kernels -p supply --bench digest -p loadgen --bench parsers

# llama-server is built from source into .llama-server once (about 10 minutes); without a
# compiler or registry access that side is skipped and the embedded server is still measured.
# The embedded server against llama.cpp's own server on the same weights, side by side, into artifacts/bench/.
bench-serving:
    scripts/bench-serving.sh

# What it covers: the server's request validation (crate serve), the client's stream parsers, every
# experiment's command lines and manifests; then every kind of sealed forgery of every field of
# every committed artifact (docs/audit.md lists the ones that pass).
# Property tests at 100,000 cases, and every forgery of every committed artifact.
fuzz:
    PROPTEST_CASES=100000 cargo test --release -p serve --test fuzz -p serving-bench --test fuzz
    PROPTEST_CASES=100000 cargo test --release -p tools --test inputs_fuzz
    FORGERY_KINDS=all cargo test --release -p tools --test forgeries -- --nocapture
