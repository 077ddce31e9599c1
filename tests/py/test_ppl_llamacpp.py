"""`varent ppl --protocol llamacpp` (llama-perplexity's chunks) against the numpy reference
(tests/reference/ref_ppl_llamacpp.py, written from the protocol's description over
ref_model's float64 forward):

  - stories260K (its tokenizer adds BOS, so every chunk starts with BOS) and a random
    llama3-tiny checkpoint given the same tokenizer with add_bos_token false (chunks
    start mid-text): PPL, its standard error, the mean NLL and the token, scored and
    chunk counts agree at several --ctx, with and without --chunks;
  - the reference's own scheme: each chunk scores exactly its second half;
  - bad inputs fail with a clear message: a text under 2 x --ctx and --ctx 2 exit 1; the
    usage errors (--stride with the protocol, --chunks without it, an unknown protocol,
    --chunks 0) exit 2;
  - --per-token gives the scored tokens' logprobs (as the reference) and null elsewhere.
"""
import json
import os
import shutil

import vtest
from vtest import check, stories_dir, tmpdir, varent
import gen_random_checkpoint as gen
import ref_model
import ref_ppl_llamacpp as ref

RTOL = 1e-4
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
        "One day, she saw a big dog. The dog was brown and had a red ball. Lily wanted to play with "
        "the dog, so she asked her mom. Her mom said yes, and Lily ran to the dog. They played all day "
        "until the sun went down. Lily was happy and tired. She went home and slept.")

work = tmpdir("ppl_llamacpp")
text_path = os.path.join(work, "text.txt")
with open(text_path, "w") as f:
    f.write(TEXT)


def ids_of(model_dir, text, bos):
    r = varent("tokenize", "-m", model_dir, text)
    assert r.returncode == 0, r.stderr
    return ([bos] if bos is not None else []) + json.loads(r.stdout)


def close(a, b):
    return abs(a - b) <= RTOL * abs(b) + 1e-9


def check_ppl(name, model_dir, model, ids, ctx, bos, chunks=0):
    args = ["ppl", "-m", model_dir, "-f", text_path, "--json", "-q", "--protocol", "llamacpp", "--ctx", str(ctx)]
    if chunks:
        args += ["--chunks", str(chunks)]
    r = varent(*args, timeout=120)
    if not check(r.returncode == 0, name + "_runs", r.stderr[-300:]):
        return
    got = json.loads(r.stdout)
    want = ref.perplexity(model, ids, ctx, bos, chunks)
    bad = [k for k in ("ppl", "ppl_se", "nll_mean", "nll_se") if not close(got[k], want[k])]
    bad += [k for k in ("scored", "chunks") if got[k] != want[k]]
    if got["tokens"] != len(ids) or got["protocol"] != "llamacpp" or got["ctx"] != ctx:
        bad.append(f"tokens/protocol/ctx {got['tokens']} {got['protocol']} {got['ctx']} vs {len(ids)}")
    check(not bad, name, f"{bad}: {got} vs { {k: v for k, v in want.items() if k != 'indices'} }")


stories = stories_dir("f32")
ids = ids_of(stories, TEXT, 1)
m = ref_model.Model(stories)
for ctx, chunks in ((16, 0), (17, 0), (24, 2), (3, 0), (40, 0)):
    check_ppl(f"ppl_llamacpp_stories_ctx{ctx}_chunks{chunks}", stories, m, ids, ctx, 1, chunks)

# The reference's scheme: chunk c scores its tokens ctx/2+1 .. ctx-1, nothing else.
r = ref.perplexity(m, ids, 16, 1)
want_idx = [c * 16 + j for c in range(len(ids) // 16) for j in range(9, 16)]
check(r["indices"] == want_idx, "ref_llamacpp_scores_second_halves", str(r["indices"][:20]))

# No BOS: a random checkpoint whose tokenizer does not add one.
rnd = os.path.join(work, "rnd")
gen.generate("llama3-tiny", rnd, seed=5, dtype="f32")
shutil.copy(os.path.join(stories, "tokenizer.json"), rnd)
with open(os.path.join(stories, "tokenizer_config.json")) as f:
    tcfg = json.load(f)
tcfg["add_bos_token"] = False
with open(os.path.join(rnd, "tokenizer_config.json"), "w") as f:
    json.dump(tcfg, f)
ids_nb = ids_of(rnd, TEXT, None)
mr = ref_model.Model(rnd)
check_ppl("ppl_llamacpp_random_no_bos_ctx16", rnd, mr, ids_nb, 16, None)
check_ppl("ppl_llamacpp_random_no_bos_ctx21_chunks3", rnd, mr, ids_nb, 21, None, 3)


def bad(name, args, want, rc=1):
    r = varent("ppl", "-m", stories, "-f", text_path, *args)
    check(r.returncode == rc and want in r.stderr and not r.stdout, name, f"rc {r.returncode} {r.stderr!r}")


half = len(ids) // 2 + 1
bad("ppl_llamacpp_text_under_two_chunks", ["--protocol", "llamacpp", "--ctx", str(half)], f"2 x --ctx = {2 * half}")
bad("ppl_llamacpp_ctx_two", ["--protocol", "llamacpp", "--ctx", "2"], "--ctx 2")
# usage errors (exit 2)
bad("ppl_llamacpp_no_stride", ["--protocol", "llamacpp", "--ctx", "16", "--stride", "8"], "--stride", rc=2)
bad("ppl_chunks_needs_llamacpp", ["--ctx", "16", "--chunks", "2"], "--chunks", rc=2)
bad("ppl_unknown_protocol", ["--protocol", "hf"], "--protocol", rc=2)
bad("ppl_llamacpp_chunks_zero", ["--protocol", "llamacpp", "--ctx", "16", "--chunks", "0"], "--chunks", rc=2)

# --per-token: the scored second halves get their logprob, every other token null.
pt = os.path.join(work, "per_token.jsonl")
r = varent("ppl", "-m", stories, "-f", text_path, "--protocol", "llamacpp", "--ctx", "16", "--chunks", "2", "-q",
           "--json", "--per-token", pt)
rows = [json.loads(ln) for ln in open(pt)] if r.returncode == 0 else []
scored = [x["pos"] for x in rows if x["logprob"] is not None]
want_lp = {i: -v for i, v in ref.token_nll(m, ids, 16, 1, 2)}
ok = r.returncode == 0 and len(rows) == len(ids) and scored == sorted(want_lp) and \
    all(abs(x["logprob"] - want_lp[x["pos"]]) <= 1e-4 * abs(want_lp[x["pos"]]) + 1e-6 for x in rows if x["pos"] in want_lp)
check(ok, "ppl_llamacpp_per_token", f"rc {r.returncode} {r.stderr[-200:]} scored {scored[:10]}")

vtest.done()
