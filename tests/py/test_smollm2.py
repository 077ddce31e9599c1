"""The real SmolLM2-135M-Instruct, when `make run` (weights/fetch-smollm2.sh) has fetched it.

- Token ids of the converted tokenizer.json equal those of an independent byte-level BPE
  (tests/reference/gpt2_bpe.py) fed straight from the GGUF file's vocabulary and merges.
- A greedy chat answer to a factual question is coherent: it names the right answer.
- `varent ppl` on a paragraph of ordinary English lands in a sane range.
Everything SKIPs on a fresh clone, where the weights are not downloaded.
"""
import json
import lzma
import os
import re

from vtest import ROOT, TESTDATA, check, done, skip, varent

MODEL = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct")
GGUF = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")

SAMPLES = [
    "Hello world 123", "It's a dog's life, isn't it? We'll see.", "  leading spaces\n\n\ttabs  and   runs   ",
    "naïve café résumé Ω≈ç√", "日本語のテキスト 中文", "emoji 🤖🚀 done", "x=3.14159; y = 2**10 // 7",
    "<|im_start|>user\nhi<|im_end|>\n", "'s 'S 'LL don't", "trailing space ", "",
    "def f(x):\n    return x * 2  # doubled\n", "Ünïcödé ＦＵＬＬＷＩＤＴＨ ½ ⅷ ²³", "$1,234.56 vs €7.89 (12%)",
]


def extra_samples():
    """Texts of the shared tokenizer vectors: a wide spread of scripts, digits and spacing."""
    texts = []
    with lzma.open(os.path.join(TESTDATA, "tokenizers", "vectors", "llama3.jsonl.xz"), "rt") as f:
        texts += [json.loads(line)["text"] for line in f if line.strip()]
    inp = os.path.join(TESTDATA, "tokenizers", "vectors", "ggml-vocab-llama-bpe.gguf.inp")
    if os.path.exists(inp):
        texts += open(inp, encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    return texts


def test_tokenizer_vs_gguf_vocab():
    import gguf_np
    import gpt2_bpe
    _, kv, _ = gguf_np.read_gguf(GGUF)
    bpe = gpt2_bpe.ByteLevelBPE.from_gguf_kv(kv)
    texts = SAMPLES + extra_samples()
    r = varent("tokenize", "-m", MODEL, "--jsonl", stdin="".join(json.dumps({"text": t}) + "\n" for t in texts))
    if not check(r.returncode == 0, "smollm2 tokenize --jsonl runs", r.stderr[-300:]):
        return
    got = [json.loads(line) for line in r.stdout.splitlines()]
    texts = [t for t in texts if t.strip(" \t\r")] if len(got) != len(texts) else texts  # blank lines are skipped
    bad = [(t, g, bpe.encode(t)) for t, g in zip(texts, got) if g != bpe.encode(t)]
    check(len(got) == len(texts) and not bad, f"smollm2 ids equal the GGUF-vocab reference ({len(texts)} texts)",
          f"{len(got)} results for {len(texts)} texts; first mismatch: {bad[:1]}")


def test_chat_answer():
    r = varent("run", "-m", MODEL, "--chat", "-p", "What is the capital of France? Answer in one sentence.",
               "--temp", "0", "-n", "40")
    check(r.returncode == 0 and re.search(r"\bParis\b", r.stdout), "smollm2 greedy chat answer names Paris",
          f"rc={r.returncode} out={r.stdout!r} err={r.stderr[-300:]!r}")


def test_make_run_demo_and_batch():
    """`make run`'s question (tools/run-default.sh, its sampler and seed) and the README's
    batch example: with the chat template applied by default (issue 33 row 4) the answer
    names Paris, and no record of examples/prompts.txt is empty."""
    r = varent("run", "-m", MODEL, "-p", "What is the capital of France? Answer in one sentence.", "--sampler",
               "entropix", "-n", "128", "--seed", "1")
    check(r.returncode == 0 and re.search(r"\bParis\b", r.stdout) and "chat template" in r.stderr,
          "smollm2 make run demo answers Paris", f"rc={r.returncode} out={r.stdout!r} err={r.stderr[-300:]!r}")
    r = varent("run", "-m", MODEL, "--prompts", os.path.join(ROOT, "examples", "prompts.txt"), "-n", "48", "-s", "1",
               "-q")
    recs = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
    check(len(recs) == 5 and all(x["chat"] and x["text"].strip() for x in recs), "smollm2 batch example no empty record",
          f"rc={r.returncode} {[x.get('text') for x in recs]} {r.stderr[-300:]}")


PARAGRAPH = ("The history of the city goes back more than two thousand years. It began as a small settlement on "
             "the banks of a river, where farmers traded grain and cattle at a weekly market. Over the centuries "
             "it grew into a busy town with a cathedral, a university and a harbour full of ships. Today it is "
             "known for its museums, its parks and the old bridges that cross the river in the centre.")


def test_ppl():
    r = varent("ppl", "-h")
    if "unknown command" in r.stderr:
        skip("smollm2 ppl", "varent ppl is not built")
        return
    path = os.path.join(ROOT, "tests", "tmp", "smollm2-paragraph.txt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(PARAGRAPH)
    r = varent("ppl", "-m", MODEL, "-f", path)
    m = re.search(r"(?i)ppl(?:\w*)\s*[=:]\s*([0-9.]+)", r.stdout + r.stderr)
    ppl = float(m.group(1)) if m else float("nan")
    print(f"# smollm2 perplexity on the paragraph: {ppl}")
    check(r.returncode == 0 and 1.5 < ppl < 60, "smollm2 ppl of ordinary English is in a sane range (1.5..60)",
          f"rc={r.returncode} ppl={ppl} out={r.stdout[-300:]!r} err={r.stderr[-300:]!r}")


if not (os.path.exists(os.path.join(MODEL, "model.safetensors")) and os.path.exists(GGUF)):
    skip("smollm2", "weights/SmolLM2-135M-Instruct is not fetched (make run fetches it)")
else:
    test_tokenizer_vs_gguf_vocab()
    test_chat_answer()
    test_make_run_demo_and_batch()
    test_ppl()
done()
