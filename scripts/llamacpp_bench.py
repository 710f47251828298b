#!/usr/bin/env python3
"""Times llama.cpp (the llama-cpp-python binding) on a GGUF file, one command at a time, so that
`just bench` (experiments/engine-bench) can alternate rounds of llama.cpp with rounds of our engine
on the same weights and prompt: on a machine shared with other work, timings drift by tens of
percent within a minute, and only measurements taken side by side compare fairly.

Loads the model, prints {"ready": true, "version": ..., "settings": {...}}, then answers each line
on stdin with one JSON line:
  prefill N    clears the context, evaluates the first N prompt ids: {"s": seconds, "token": greedy next}
  decode N     N greedy steps from the last token: {"s": seconds, "ids": [the N tokens]}
  memory       the process's peak resident memory so far (Linux's VmHWM): {"peak": bytes}
End of input ends the process.

The context is the binding's defaults but for its size (the whole prompt and the decode steps),
the threads, and flash attention, which follows llama.cpp's own default (`auto`: on for the CPU)
as `llama-server` and `llama-cli` run it; the binding alone would turn it off. `--flash-attn off`
measures the binding's default."""

import argparse
import json
import sys
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama


def greedy(llm: Llama) -> int:
    """The argmax of the last evaluated position's logits (read from the context itself: the
    binding's `scores` array is not filled when `logits_all` is off)."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def peak_resident():
    """VmHWM of /proc/self/status in bytes, or None where there is none."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reply(value: dict) -> None:
    print(json.dumps(value), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--prompt-ids", required=True, help="JSON file holding a list of token ids")
    parser.add_argument("--max-decode", type=int, default=64, help="context room for decode steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--flash-attn", choices=["on", "off"], default="on")
    args = parser.parse_args()

    ids = json.load(open(args.prompt_ids))
    llm = Llama(
        model_path=args.gguf,
        n_ctx=len(ids) + args.max_decode + 8,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=args.flash_attn == "on",
        logits_all=False,
        verbose=False,
    )
    params = llm.context_params
    settings = {
        "n_ctx": params.n_ctx,
        "n_batch": params.n_batch,
        "n_ubatch": params.n_ubatch,
        "n_threads": params.n_threads,
        "flash_attn": args.flash_attn,
        "type_k": int(params.type_k),
        "type_v": int(params.type_v),
        # Repacking quantized weights into the CPU's interleaved layouts (llama-server's
        # `--no-repack` turns it off); the binding keeps llama.cpp's default, on.
        "use_extra_bufts": bool(llm.model_params.use_extra_bufts),
    }
    reply({"ready": True, "version": llama_cpp.__version__, "settings": settings})
    token = None
    for line in sys.stdin:
        command = line.split()
        if len(command) == 2 and command[0] == "prefill" and command[1].isdigit() and 0 < int(command[1]) <= len(ids):
            llm.reset()
            start = time.perf_counter()
            llm.eval(ids[: int(command[1])])
            seconds = time.perf_counter() - start
            token = greedy(llm)
            reply({"s": seconds, "token": token})
        elif len(command) == 2 and command[0] == "decode" and token is not None:
            out = []
            start = time.perf_counter()
            for _ in range(int(command[1])):
                llm.eval([token])
                token = greedy(llm)
                out.append(token)
            reply({"s": time.perf_counter() - start, "ids": out})
        elif command == ["memory"]:
            reply({"peak": peak_resident()})
        else:
            reply({"error": f"unknown command or no prefill yet: {line.strip()!r}"})


if __name__ == "__main__":
    main()
