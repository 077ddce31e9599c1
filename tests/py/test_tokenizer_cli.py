"""varent tokenize/detokenize CLI: --jsonl against the published Qwen3 vectors
(transformers.js ids), plain text, --no-special, detokenize and its errors."""
import json
import lzma
import os
import shutil

from vtest import TESTDATA, VARENT, check, done, skip, tmpdir, varent


def unpack(name):
    d = tmpdir("tokcli-" + name)
    src = os.path.join(TESTDATA, "tokenizers", name)
    with lzma.open(os.path.join(src, "tokenizer.json.xz")) as f, open(os.path.join(d, "tokenizer.json"), "wb") as o:
        o.write(f.read())
    shutil.copy(os.path.join(src, "tokenizer_config.json"), d)
    return d


def main():
    if not os.access(VARENT, os.X_OK):
        skip("tokenizer_cli", f"{VARENT} not built")
        return
    d = unpack("qwen3")
    with lzma.open(os.path.join(TESTDATA, "tokenizers", "vectors", "qwen3.jsonl.xz"), "rt") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    stdin = "".join(json.dumps({"text": c["text"]}) + "\n" for c in cases)
    r = varent("tokenize", "-m", d, "--jsonl", stdin=stdin)
    got = [json.loads(line) for line in r.stdout.splitlines()]
    bad = [c["id"] for c, g in zip(cases, got) if g != c["ids"]]
    check(r.returncode == 0 and len(got) == len(cases) and not bad, "cli_jsonl_qwen3_vectors",
          f"rc={r.returncode} lines={len(got)}/{len(cases)} mismatched ids {bad[:5]} {r.stderr[-300:]}")

    r = varent("tokenize", "-m", os.path.join(d, "tokenizer.json"), "Hello world<|im_end|>")
    check(r.stdout.strip() == "[9707,1879,151645]", "cli_tokenize_text_special", r.stdout + r.stderr)
    r = varent("tokenize", "-m", d, "--no-special", "<|im_end|>")
    ids = json.loads(r.stdout or "[]")
    check(r.returncode == 0 and 151645 not in ids and len(ids) > 1, "cli_tokenize_no_special", r.stdout + r.stderr)
    r = varent("tokenize", "-m", d, "")
    check(r.returncode == 0 and r.stdout.strip() == "[]", "cli_tokenize_empty", r.stdout + r.stderr)

    r = varent("detokenize", "-m", d, "9707,1879,151645")
    check(r.returncode == 0 and r.stdout == "Hello world<|im_end|>\n", "cli_detokenize", repr(r.stdout) + r.stderr)
    r = varent("detokenize", "-m", d, "9707,999999")
    check(r.returncode == 1 and "out of range" in r.stderr, "cli_detokenize_out_of_range", r.stderr)
    r = varent("tokenize", "-m", os.path.join(d, "missing.json"), "x")
    check(r.returncode == 1 and "missing.json" in r.stderr, "cli_tokenize_missing_file", r.stderr)


main()
done()
