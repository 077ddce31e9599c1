"""Byte-level BPE pre-tokenization against an independent scanner, on random text.

A small tokenizer.json (256 byte tokens plus a few merges) is written with the GPT-2
ByteLevel pre-tokenizer, with and without HF's Digits(individual_digits) in front, and
varent's ids for random strings over a mixed alphabet (letters of several scripts,
Unicode numbers such as ½ and ², spaces, tabs, newlines, apostrophes, emoji) are
compared with tests/reference/gpt2_bpe.py, which splits without a regex engine.
"""
import json
import os
import random

from vtest import check, done, tmpdir, varent
import gpt2_bpe

ALPHABET = list("abcdeXYZ  \t\n'.,!-_01239") + ["'s", "'ll", "'t", "é", "ß", "Ω", "日", "本", "½", "²", "ⅷ", "٣",
                                                "🤖", "\u00a0", "  ", "\r\n", "’"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "a b", "ab c", "Ġ Ġ", "1 2", "' s"]


def write_tokenizer(path, digits):
    b2u = gpt2_bpe.byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    for m in MERGES:
        a, b = m.split(" ")
        if a + b not in tokens:
            tokens.append(a + b)
    bytelevel = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    pre = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, bytelevel]} \
        if digits else bytelevel
    tj = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": pre,
          "post_processor": None, "decoder": {"type": "ByteLevel"},
          "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}, "merges": MERGES}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    return tokens


def run(digits, texts):
    d = tmpdir("bytelevel-digits" if digits else "bytelevel")
    tokens = write_tokenizer(os.path.join(d, "tokenizer.json"), digits)
    ref = gpt2_bpe.ByteLevelBPE(tokens, MERGES, individual_digits=digits)
    r = varent("tokenize", "-m", d, "--jsonl", stdin="".join(json.dumps({"text": t}) + "\n" for t in texts))
    name = "bytelevel" + ("+digits" if digits else "")
    if not check(r.returncode == 0, f"{name} tokenize runs", r.stderr[-300:]):
        return
    got = [json.loads(line) for line in r.stdout.splitlines()]
    bad = [(t, g, ref.encode(t)) for t, g in zip(texts, got) if g != ref.encode(t)]
    check(len(got) == len(texts) and not bad, f"{name}: {len(texts)} random texts match the reference split",
          f"{len(got)} results; first mismatch: {bad[:1]}")


rng = random.Random(1234)
texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 40))) for _ in range(400)]
texts = [t for t in texts if t.strip(" \t\r")]  # --jsonl skips blank lines
texts += ["½ ⅷ ²³ x²", "a 12 b  345", "it's 'S 'LL", "   \n  x", "٣٤ ١"]
run(False, texts)
run(True, texts)
done()
