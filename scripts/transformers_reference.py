#!/usr/bin/env python3
"""Writes Hugging Face transformers' greedy output ids for the seed workload on a checkpoint.

Run by hand (not in CI): it needs torch and transformers from PyPI. The Rust tests compare our
engine's ids with the JSON this writes, for every policy and chunk size.

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers
    just models generate tiny
    /tmp/ref/bin/python scripts/transformers_reference.py \
        --model-dir .models/generated/tiny --manifest manifests/scheduler/tiny.json \
        --out crates/common/tests/data/transformers-reference-tiny.json

With `--gguf FILE` the model is that GGUF file instead (transformers dequantizes it to F32, as our
engine does), and the reference records the file's SHA-256:

    /tmp/ref/bin/pip install gguf
    /tmp/ref/bin/python scripts/transformers_reference.py \
        --gguf .models/package/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
        --manifest manifests/scheduler/smollm2-135m-instruct.json \
        --out crates/common/tests/data/transformers-reference-smollm2.json

With `--long 1024 4096 8192`, it writes instead the greedy ids after long prompts: the seed's
prompts joined as one user message, repeated until the chat reaches the longest length, and cut
to each length's first ids (the same prompts `engine-bench` prefills).

    /tmp/ref/bin/python scripts/transformers_reference.py \
        --model-dir .models/generated/tiny --manifest manifests/scheduler/tiny.json \
        --long 1024 4096 8192 --new-tokens 8 \
        --out crates/common/tests/data/transformers-reference-tiny-long.json
"""

import argparse
import hashlib
import json
import pathlib

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=pathlib.Path)
    parser.add_argument("--gguf", type=pathlib.Path, help="a GGUF file to run instead of a checkpoint folder")
    parser.add_argument("--manifest", required=True, type=pathlib.Path, help="scheduler manifest with the jobs")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--long", type=int, nargs="+", help="long prompts of these token lengths instead of the jobs")
    parser.add_argument("--new-tokens", type=int, default=8, help="greedy ids after each long prompt")
    args = parser.parse_args()

    manifest = json.loads(args.manifest.read_text())
    pin = json.loads((args.manifest.parent.parent / "models" / f"{manifest['model']}.json").read_text())
    torch.manual_seed(0)
    if args.gguf:
        where = {"pretrained_model_name_or_path": args.gguf.parent, "gguf_file": args.gguf.name}
    elif args.model_dir:
        where = {"pretrained_model_name_or_path": args.model_dir}
    else:
        parser.error("give --model-dir or --gguf")
    tokenizer = AutoTokenizer.from_pretrained(**where)
    model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    model.eval()

    jobs = []
    if args.long:
        text = "\n\n".join(job["prompt"] for job in manifest["parameters"]["jobs"])
        while True:
            messages = [{"role": "user", "content": text}]
            chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
            if len(ids) >= max(args.long):
                break
            text = text + "\n\n" + text
        for length in args.long:
            prompt_ids = ids[:length]
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([prompt_ids]),
                    attention_mask=torch.ones(1, length, dtype=torch.long),
                    max_new_tokens=args.new_tokens,
                    do_sample=False,
                )
            jobs.append({"id": f"long-{length}", "prompt_ids": prompt_ids, "output_ids": out[0, length:].tolist()})
    for job in [] if args.long else manifest["parameters"]["jobs"]:
        messages = [{"role": "user", "content": job["prompt"]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=job["max_new_tokens"],
                do_sample=False,
            )
        jobs.append({"id": job["id"], "prompt_ids": prompt_ids, "output_ids": out[0, len(prompt_ids):].tolist()})

    result = {
        "model": pin["name"],
        "repo": pin["repo"],
        "revision": pin["revision"],
        "engine": f"transformers {transformers.__version__}, torch {torch.__version__}, cpu, float32, greedy",
        "jobs": jobs,
    }
    if args.gguf:
        result["gguf_sha256"] = hashlib.sha256(args.gguf.read_bytes()).hexdigest()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
