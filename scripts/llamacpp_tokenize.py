#!/usr/bin/env python3
"""llama.cpp's token ids for a corpus of strings, the reference the engine's GGUF tokenizer is
held to (`crates/common/tests/tokenizer.rs`).

Run by hand with llama.cpp's Python binding (`.venv-llama`, which `just bench` builds):

    .venv-llama/bin/python scripts/llamacpp_tokenize.py MODEL.gguf NAME OUT.json

The corpus is drawn here, deterministically (a fixed seed), so the reference file holds each
string beside its ids: hand-written cases (contractions, digit runs, whitespace runs at piece
ends, code, scripts and emoji, the model's special tokens spelled alone, glued and cut short)
and random joins of fragments of every kind with every kind of separator. For each string it
records the ids with special tokens parsed (llama.cpp's `special=True`) and read as text
(`special=False`), both without a BOS.
"""

import hashlib
import json
import random
import sys

from llama_cpp import Llama

HAND = [
    "Explain cache invalidation in one sentence.",
    "Name one reason to bound a request queue.",
    "a  1", "a   b", "a 1", "a\t1", "x  ", "  x", " ", "  ", "\n", "\n\n\n", "\r\n", "\r\n\r\n x", " \n ",
    "\t\t\tindented", "trailing   ", "   leading", "mixed \t \n spaces", "a\u00a0b", "\u3000full width space",
    "I'm", "I'M", "don't", "DON'T", "they're", "THEY'RE", "we've", "you'll", "he'd", "it's", "IT'S", "'s", "''s",
    "rock 'n' roll", "O'Neil's", "l'amour",
    "1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "-42", "+7e10", "0x1F", "v2.0.1",
    "a1b2c3", "2024-12-07T09:56:48Z", "٣٤٥", "१२३", "①②③", "Ⅻ", "½",
    "def f(x):\n    return x * 2\n", "fn main() {\n\tprintln!(\"hi\");\n}\n", "if (a && b || !c) { x += 1; }",
    "<div class=\"a\">b</div>", "SELECT * FROM t WHERE id = 1;", "$ ls -la | grep '.rs'", "#include <stdio.h>",
    "naïve café résumé", "Ünïcödé", "straße", "İstanbul", "ǅemal", "ﬁne", "e\u0301", "👍", "👩‍💻", "🇫🇷",
    "日本語のテキスト", "中文文本，标点。", "한국어 텍스트", "Русский текст", "Ελληνικά", "العربية", "עברית", "हिन्दी",
    "ไทย", "ᚠᛇᚻ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u200b", "\ufeffbom", "\u00ad", "\x7f", "\x00", "tab\there",
    "!!!", "...", "?!", "—", "–", "“quoted”", "«guillemets»", "¿Qué?", "a.b.c", "@user #tag", "50%", "$5.99",
]

FRAGMENTS = {
    "word": ["the", "The", "THE", "cache", "invalidation", "request", "queue", "Hello", "world", "naïve",
             "über", "日本", "模型", "данные", "λόγος", "token", "tokens", "SmolLM", "Qwen", "llama"],
    "number": ["0", "7", "42", "123", "2024", "99999", "3.5", "1e9", "007", "12,345"],
    "punct": [".", ",", "!", "?", ";", ":", "'", "\"", "(", ")", "[", "]", "{", "}", "-", "_", "/", "\\", "*", "&",
              "#", "%", "=", "+", "<", ">", "|", "~", "`", "^", "@", "$", "...", "--", "->", "::", "==", "!="],
    "contraction": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D"],
    "emoji": ["😀", "🚀", "👍🏽", "❤️", "🤖", "✨"],
    "code": ["x = 1", "foo(bar)", "a[i] += b", "return None", "=> {", "});", "//", "/* */", "<<EOF", "0b1010"],
}
SEPARATORS = ["", " ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "\u00a0", " \t "]


def special_texts(llm):
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out = []
    for i in range(llm.n_vocab()):
        attr = llama_cpp.llama_vocab_get_attr(vocab, i)
        # LLAMA_TOKEN_ATTR_CONTROL = 1 << 3, LLAMA_TOKEN_ATTR_USER_DEFINED = 1 << 4
        if attr & ((1 << 3) | (1 << 4)):
            out.append(llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8"))
    return out


def corpus(special):
    rng = random.Random(20261207)
    strings = list(HAND)
    first = special[:3] or ["<|im_start|>"]
    for s in special[:12]:
        strings += [s, f"x{s}y", f" {s} ", f"{s}{s}", s[:-1], s[1:], f"{s}\n"]
    strings += [f"{first[0]}user\nHi{first[-1]}\n{first[0]}assistant\n", f"<{first[0]}>", f"{first[0]}{first[0][:-2]}"]
    kinds = list(FRAGMENTS)
    while len(strings) < 1200:
        parts = []
        for _ in range(rng.randint(1, 9)):
            kind = rng.choice(kinds + ["special"] if special else kinds)
            parts.append(rng.choice(special) if kind == "special" else rng.choice(FRAGMENTS[kind]))
            parts.append(rng.choice(SEPARATORS))
        strings.append("".join(parts[:-1] if rng.random() < 0.5 else parts))
    return strings


def main():
    path, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    special = special_texts(llm)
    cases = []
    for text in corpus(special):
        data = text.encode("utf-8")
        cases.append({
            "text": text,
            "ids": llm.tokenize(data, add_bos=False, special=True),
            "literal_ids": llm.tokenize(data, add_bos=False, special=False),
        })
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    import llama_cpp

    doc = {
        "model": name,
        "gguf_sha256": digest,
        "made_by": f"llama-cpp-python {llama_cpp.__version__}",
        "special_tokens": special,
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{out}: {len(cases)} strings, {len(special)} special tokens")


if __name__ == "__main__":
    main()
