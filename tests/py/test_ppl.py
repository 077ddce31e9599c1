"""`varent ppl` against the numpy reference (tests/reference/ref_ppl.py, the Hugging Face
strided-window loop over ref_model's float64 forward):

  - stories260K and a random llama3-tiny checkpoint (given the stories tokenizer), one
    window and several --ctx/--stride settings: PPL, its standard error, the mean NLL
    and the scored-token and window counts agree;
  - bad inputs (missing file, a text under 3 tokens, --stride >= --ctx, --ctx 1, --ctx
    beyond the model) fail with a clear message and exit status 1;
  - progress: a bar with carriage returns on a terminal, plain lines otherwise;
  - when weights/SmolLM2-135M-Instruct is present, PPL of an English paragraph is sane.
"""
import json
import os
import pty
import shutil
import subprocess

import vtest
from vtest import ROOT, check, skip, stories_dir, tmpdir, varent
import gen_random_checkpoint as gen
import ref_model
import ref_ppl

RTOL = 1e-4
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
        "One day, she saw a big dog.")

work = tmpdir("ppl")
text_path = os.path.join(work, "text.txt")
with open(text_path, "w") as f:
    f.write(TEXT)


def ids_of(model_dir, text):
    r = varent("tokenize", "-m", model_dir, text)
    assert r.returncode == 0, r.stderr
    return [1] + json.loads(r.stdout)  # both tokenizers here add BOS = 1


def close(a, b):
    return abs(a - b) <= RTOL * abs(b) + 1e-9


def check_ppl(name, model_dir, model, ids, ctx, stride):
    args = ["ppl", "-m", model_dir, "-f", text_path, "--json", "-q"]
    if ctx:
        args += ["--ctx", ctx, "--stride", stride]
    r = varent(*args, timeout=120)
    if not check(r.returncode == 0, name + "_runs", r.stderr[-300:]):
        return
    got = json.loads(r.stdout)
    ref = ref_ppl.perplexity(model, ids, got["ctx"], got["stride"])
    bad = [k for k in ("ppl", "ppl_se", "nll_mean", "nll_se") if not close(got[k], ref[k])]
    bad += [k for k in ("scored", "windows") if got[k] != ref[k]]
    if got["tokens"] != len(ids):
        bad.append(f"tokens {got['tokens']} vs {len(ids)}")
    check(not bad, name, f"{bad}: {got} vs {ref}")


stories = stories_dir("f32")
ids = ids_of(stories, TEXT)
m = ref_model.Model(stories)
check_ppl("ppl_stories_one_window", stories, m, ids, None, None)
for ctx, stride in ((16, 5), (16, 15), (24, 12), (2, 1)):
    check_ppl(f"ppl_stories_ctx{ctx}_stride{stride}", stories, m, ids, ctx, stride)

# The reference's window scheme itself: every token but the first scored once.
r = ref_ppl.perplexity(m, ids, 16, 5)
check(r["indices"] == list(range(1, len(ids))), "ref_scores_each_token_once", str(r["indices"]))

rnd = os.path.join(work, "rnd")
gen.generate("llama3-tiny", rnd, seed=3, dtype="f32")
for fn in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(stories, fn), rnd)
mr = ref_model.Model(rnd)
check_ppl("ppl_random_one_window", rnd, mr, ids, None, None)
check_ppl("ppl_random_ctx16_stride7", rnd, mr, ids, 16, 7)


def bad(name, args, want, rc=1):
    r = varent("ppl", *args)
    check(r.returncode == rc and want in r.stderr and not r.stdout, name, f"rc {r.returncode} {r.stderr!r}")


short = os.path.join(work, "short.txt")
with open(short, "w") as f:
    f.write("a")
bad("ppl_missing_file", ["-m", stories, "-f", os.path.join(work, "nope.txt")], "nope.txt")
bad("ppl_text_too_short", ["-m", stories, "-f", short], "at least 3")
bad("ppl_stride_not_below_ctx", ["-m", stories, "-f", text_path, "--ctx", "16", "--stride", "16"], "--stride 16")
bad("ppl_ctx_one", ["-m", stories, "-f", text_path, "--ctx", "1"], "--ctx 1")
bad("ppl_ctx_beyond_model", ["-m", stories, "-f", text_path, "--ctx", "100000"], "--ctx 100000")
bad("ppl_missing_f", ["-m", stories], "missing -f FILE", rc=2)  # a usage error

# Progress: plain lines when stderr is not a terminal, a bar on a terminal.
r = varent("ppl", "-m", stories, "-f", text_path, "--ctx", "16", "--stride", "8")
lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ppl: ")]
check(r.returncode == 0 and len(lines) >= 3 and "\r" not in r.stderr, "ppl_progress_lines", repr(r.stderr))
master, slave = pty.openpty()
p = subprocess.Popen([vtest.VARENT, "ppl", "-m", stories, "-f", text_path, "--ctx", "16", "--stride", "8"],
                     stdout=subprocess.PIPE, stderr=slave)
os.close(slave)
tty_err = b""
while True:
    try:
        chunk = os.read(master, 4096)
    except OSError:
        break
    if not chunk:
        break
    tty_err += chunk
out, _ = p.communicate(timeout=60)
os.close(master)
check(p.returncode == 0 and b"\r" in tty_err and b"[###" in tty_err and b"PPL" in out, "ppl_progress_bar_on_tty",
      repr(tty_err[-300:]))

# The real model (git-ignored download; issue 8 asks for a sane perplexity).
smol = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct")
PARAGRAPH = ("The city council met on Tuesday evening to discuss the new budget for the public library. "
             "Several residents spoke in favor of extending the opening hours on weekends, arguing that "
             "students and working parents need more time to use the computers and borrow books. The mayor "
             "said that the proposal would be reviewed next month, after the finance committee has estimated "
             "the cost of hiring additional staff.")
if os.path.exists(os.path.join(smol, "model.safetensors")):
    para = os.path.join(work, "paragraph.txt")
    with open(para, "w") as f:
        f.write(PARAGRAPH)
    r = varent("ppl", "-m", smol, "-f", para, "--json", "-q", timeout=300)
    got = json.loads(r.stdout) if r.returncode == 0 else {}
    check(r.returncode == 0 and 2 < got.get("ppl", 0) < 60, "ppl_smollm2_english_sane", f"{got} {r.stderr[-300:]}")
    print(f"# SmolLM2-135M-Instruct ppl {got.get('ppl')} +/- {got.get('ppl_se')} over {got.get('scored')} tokens")
else:
    skip("ppl_smollm2_english_sane", "weights/SmolLM2-135M-Instruct not downloaded")

vtest.done()
