#!/usr/bin/env python3
"""Times llama.cpp (the llama-cpp-python binding) on a GGUF file: one prefill of the given prompt
ids, then greedy decode steps, one token each. Prints one JSON line. Called by `just bench`
(common/benches/engine.rs) with the same weights and prompt our engine is timed on."""

import argparse
import json
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama


def greedy(llm: Llama) -> int:
    """The argmax of the last evaluated position's logits (read from the context itself: the
    binding's `scores` array is not filled when `logits_all` is off)."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--prompt-ids", required=True, help="JSON file holding a list of token ids")
    parser.add_argument("--decode", type=int, default=31)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    ids = json.load(open(args.prompt_ids))
    llm = Llama(
        model_path=args.gguf,
        n_ctx=len(ids) + args.decode + 8,
        n_batch=max(512, len(ids)),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=False,
    )
    start = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - start
    token = greedy(llm)
    out = [token]
    start = time.perf_counter()
    for _ in range(args.decode):
        llm.eval([token])
        token = greedy(llm)
        out.append(token)
    decode_s = time.perf_counter() - start
    print(json.dumps({"prefill_s": prefill_s, "decode_tps": args.decode / decode_s, "ids": out}))


if __name__ == "__main__":
    main()
