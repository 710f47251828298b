#!/usr/bin/env bash
# `just bench-serving`: the embedded server against llama.cpp's own server on the same weights,
# measured by serving-bench in one run (same prompts, same max_tokens, greedy, the two servers
# taking turns round by round), written as an artifact under artifacts/bench/.
#
# llama-server is built once from the llama.cpp sources that PyPI's llama-cpp-python sdist
# vendors (scripts/build-llama-server.sh, into .llama-server/) and serves the F32 GGUF export of
# the generated qwen2.5-0.5b checkpoint with 4 parallel slots (continuous batching). Without a
# compiler or registry access that side is skipped, with the reason, and the embedded server is
# still measured.
set -euo pipefail
cd "$(dirname "$0")/.."

manifest=manifests/serving-bench/qwen2.5-0.5b.json
cargo build --release -p serving-bench -p tools --bins
./target/release/models generate qwen2.5-0.5b

targets=(--target openai=embedded)
server_pid=
# A server stopped by its signal exits non-zero; that is no failure of the benchmark.
cleanup() { if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
if scripts/build-llama-server.sh; then
  gguf=target/bench/qwen2.5-0.5b-f32.gguf
  if [ ! -f "$gguf" ]; then
    mkdir -p target/bench
    ./target/release/models export-gguf qwen2.5-0.5b --type f32 --out "$gguf"
  fi
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # 4 slots of 1024 positions each (the prompts and answers need about 110), loopback only.
  LD_LIBRARY_PATH=.llama-server/bin .llama-server/bin/llama-server -m "$gguf" --host 127.0.0.1 --port "$port" \
    --parallel 4 --ctx-size 4096 --threads "$(nproc)" --no-cache-prompt --cache-ram 0 >target/bench/llama-server.log 2>&1 &
  server_pid=$!
  if python3 - "$port" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/health"
for _ in range(600):
    try:
        if urllib.request.urlopen(url, timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit(1)
PY
  then
    # llama-server first: every other target's ratios are taken against it.
    targets=(--target "openai=http://127.0.0.1:$port" --target openai=embedded)
  else
    echo "llama-server did not come up (see target/bench/llama-server.log); measuring the embedded server alone" >&2
    cleanup
    server_pid=
  fi
else
  echo "llama-server unavailable (see above): measuring the embedded server alone" >&2
fi

mkdir -p artifacts/bench
./target/release/serving-bench --manifest "$manifest" "${targets[@]}" \
  --out "artifacts/bench/serving-$(date -u +%Y%m%dT%H%M%SZ).json"

# The same two servers under open-loop load: Poisson arrivals at each rate in turn, the servers
# taking turns per rate, latency against achieved throughput in one artifact.
./target/release/serving-bench --manifest "$manifest" "${targets[@]}" \
  --request-rate 0.25,0.5,1,2 --num-requests 16 --warmup-requests 2 --max-tokens 64 --slo ttft_ms=2000 \
  --out "artifacts/bench/serving-sweep-$(date -u +%Y%m%dT%H%M%SZ).json"

# The client holding its schedule: 500 requests/s (Poisson) against the embedded server on the
# tiny checkpoint, in its own process with room for 256 streams; the artifact's
# send_lateness_s_p99 is the client's lateness at that rate. The prompts are vLLM's random kind:
# 16 tokens of text each on /v1/completions, counted with tiny's tokenizer. The seed's prompts
# through the chat template are about 89 tokens each, over 40,000 prefill tokens a second at
# this rate, more than the server sustains on the two cores it shares with the client: its 256
# slots then fill, requests wait for one, and send lateness measures the server's backlog rather
# than the client (the client prints a note when that happens; client_lateness_s keeps its own part).
cleanup
server_pid=
./target/release/models generate tiny
./target/release/serving-bench serve --manifest manifests/serving-bench/tiny.json --port 0 \
  --max-active 256 --queue 1024 >target/bench/embedded-serve.log 2>&1 &
server_pid=$!
for _ in $(seq 100); do grep -q 'http://' target/bench/embedded-serve.log && break; sleep 0.2; done
url=$(grep -o 'http://[0-9.:]*' target/bench/embedded-serve.log | head -1)
./target/release/serving-bench --target "openai=$url" --request-rate 500 --max-concurrency 256 \
  --num-requests 3000 --warmup-requests 100 --max-tokens 8 \
  --endpoint completions --input-tokens fixed:16 --tokenizer "${LAB_MODELS_DIR:-.models}/generated/tiny" \
  --out "artifacts/bench/client-schedule-$(date -u +%Y%m%dT%H%M%SZ).json"
