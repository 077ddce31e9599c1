"""Bounds and messages (issue 22, rows 10 and 19; docs/robustness.md, "Bounds").

Row 19: a huge config.json field is rejected naming the field and its bound (not "out of
memory"); a tokenizer.json vocab id >= 2^24 names the id and the limit (not "invalid
JSON"); every write error names the path and the reason (/dev/full stands for a full
disk). Row 10: a normalizer that grows the text without bound (8 chained Replace of " "
by 1000 spaces) stops at the documented limit with a message naming the stage, quickly
and within a memory limit, instead of being killed by the kernel."""
import json
import os
import resource
import shutil
import subprocess
import time

from vtest import VARENT, check, done, skip, stories_dir, tmpdir, varent

work = tmpdir("limits")
base = stories_dir("f32")


def expect_fail(name, r, *needles, absent=()):
    msg = r.stderr.strip()
    ok = r.returncode == 1 and all(n in msg for n in needles) and not any(a in msg for a in absent)
    return check(ok, name, f"rc={r.returncode} stderr={msg[-600:]!r} (want {needles}, not {absent})")


def clone(name):
    d = os.path.join(work, name)
    shutil.copytree(base, d)
    return d


def edit_config(d, **fields):
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    c.update(fields)
    json.dump(c, open(p, "w"))


# --- row 19a: config.json fields beyond any model ------------------------------------
for field in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
              "max_position_embeddings", "head_dim", "num_key_value_heads"):
    d = clone("cfg-" + field)
    edit_config(d, **{field: 10**9})
    r = varent("logits", "-m", d, "--ids", "1,2", "--out", os.path.join(work, "l.bin"))
    expect_fail(f"config_{field}_huge", r, "config.json", field, "at most", absent=("out of memory",))

# --- row 19b: a tokenizer id >= 2^24 ---------------------------------------------------
for tid in (2**24, 2**31):
    d = os.path.join(work, f"tok-{tid}")
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump({"model": {"type": "BPE", "vocab": {"a": 0, "big": tid}, "merges": []}}, f)
    r = varent("tokenize", "-m", d, "ab")
    expect_fail(f"tokenizer_vocab_id_{tid}", r, "tokenizer.json", '"big"', str(tid), "16777216",
                absent=("invalid JSON",))

# --- row 19c: a full disk names the path and the reason --------------------------------
if os.path.exists("/dev/full"):
    prompts = os.path.join(work, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("Once upon a time\nThe cat\n")
    RUNB = ["run", "-m", base, "-n", "4", "--temp", "0", "--prompts", prompts, "-q"]
    expect_fail("run_batch_disk_full", varent(*RUNB, "-o", "/dev/full"), "-o /dev/full", "No space left on device")
    with open("/dev/full", "w") as full:
        p = subprocess.run([VARENT, *map(str, RUNB)], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    expect_fail("run_batch_stdout_disk_full", p, "stdout", "No space left on device")
    AG = ["agents", "-m", base, "-p", "Once upon a time", "-n", "8"]
    for opt in ("--log", "--log-text", "--dump-logits"):
        expect_fail(f"agents{opt.replace('-', '_')}_disk_full", varent(*AG, opt, "/dev/full"),
                    f"{opt} /dev/full", "No space left on device")
    expect_fail("logits_out_disk_full", varent("logits", "-m", base, "--ids", "1,2", "--out", "/dev/full"),
                "/dev/full", "No space left on device")
else:
    skip("run_batch_disk_full", "no /dev/full")

# --- row 10: a normalizer that grows the text exponentially ----------------------------
def limited():  # 4 GiB of address space: the old code died of it, or of the kernel
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


# AddressSanitizer reserves terabytes of shadow address space at start, so an ASan
# build (make test-asan) runs without the cap; the bound is what keeps it small.
if "ASAN_OPTIONS" in os.environ:
    limited = None  # noqa: F811


d = os.path.join(work, "tok-bomb")
os.makedirs(d)
tok = json.load(open(os.path.join(base, "tokenizer.json")))
bomb = [{"type": "Replace", "pattern": {"String": " "}, "content": " " * 1000} for _ in range(8)]
tok["normalizer"] = {"type": "Sequence", "normalizers": bomb}
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
t0 = time.time()
try:
    r = subprocess.run([VARENT, "tokenize", "-m", d, "Once upon a time"], capture_output=True, text=True,
                       timeout=60, preexec_fn=limited)
except subprocess.TimeoutExpired as e:
    r = subprocess.CompletedProcess(e.cmd, -9, "", "timed out after 60 s")
expect_fail("tokenizer_normalizer_bomb", r, "tokenizer", "normalizer", "Replace", "limit")
check(time.time() - t0 < 20, "tokenizer_normalizer_bomb_quick", f"{time.time() - t0:.1f} s")

# One Replace that grows a long text past the limit in a single step, through `run`.
d = clone("run-bomb")
tok["normalizer"] = {"type": "Replace", "pattern": {"String": "e"}, "content": "e" * 100}
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
r = varent("run", "-m", d, "-p", "see " * 50, "-n", "2")
expect_fail("run_normalizer_one_step_over_limit", r, "normalizer", "Replace", "limit")
# A normal normalizer within the bound is unaffected.
tok["normalizer"] = {"type": "Replace", "pattern": {"String": "e"}, "content": "eee"}
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
r = varent("tokenize", "-m", d, "see " * 50)
check(r.returncode == 0 and r.stdout.strip(), "tokenizer_normalizer_within_limit", r.stderr[-300:])
done()
