#!/usr/bin/env python3
"""Times llama.cpp (the llama-cpp-python binding) on a GGUF file, one command at a time, so that
`just bench` (experiments/engine-bench) can alternate rounds of llama.cpp with rounds of our engine
on the same weights and prompt: on a machine shared with other work, timings drift by tens of
percent within a minute, and only measurements taken side by side compare fairly.

Loads the model, prints {"ready": true}, then answers each line on stdin with one JSON line:
  prefill      clears the context, evaluates the prompt ids: {"s": seconds, "token": greedy next}
  decode N     N greedy steps from the last token: {"s": seconds, "ids": [the N tokens]}
End of input ends the process."""

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


def reply(value: dict) -> None:
    print(json.dumps(value), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--prompt-ids", required=True, help="JSON file holding a list of token ids")
    parser.add_argument("--max-decode", type=int, default=64, help="context room for decode steps")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    ids = json.load(open(args.prompt_ids))
    llm = Llama(
        model_path=args.gguf,
        n_ctx=len(ids) + args.max_decode + 8,
        n_batch=max(512, len(ids)),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=False,
    )
    reply({"ready": True, "version": llama_cpp.__version__})
    token = None
    for line in sys.stdin:
        command = line.split()
        if command == ["prefill"]:
            llm.reset()
            start = time.perf_counter()
            llm.eval(ids)
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
        else:
            reply({"error": f"unknown command or no prefill yet: {line.strip()!r}"})


if __name__ == "__main__":
    main()
