"""--parallel: batch runs, compare and eval on the scheduler (host/decode/sched.h), on stories260K.

Each command's records (JSONL, timing fields dropped) must be byte-identical, in input
order, whether the sequences run one by one (--parallel 1) or together (the default, and
3 rows), with the prefix cache off, and with a KV pool so small that sequences queue
for blocks and idle prefixes are evicted. The prompts share whole --batch chunks and
repeat, so both reuses (equal prompts, whole chunks) happen, and --stats says so.
Eval mixes scheduled arms with a branch arm, which runs one by one at its turn.
Bad input: the scheduler's options on a single run (usage error), a pool smaller than one
sequence (names the prompt), both pool sizes at once.
"""
import json
import os
import re

import vtest
from vtest import check, expect_fail, stories_dir, tmpdir, varent

work = tmpdir("parallel")
model = stories_dir("f32")

HEAD = "Once upon a time, there was a little girl named Lily. She liked to play with her toys in the park every day."
prompts = [
    HEAD + " One day",
    "Tom had a red ball",
    HEAD + " She saw a big dog",
    "The sun was hot",
    HEAD + " One day",  # equal to the first
    "Tom had a red ball",
    HEAD,
    "A cat",
    HEAD + " Her mom said",
    "Once upon a time",
]
path = os.path.join(work, "prompts.txt")
with open(path, "w") as f:
    f.write("\n".join(prompts) + "\n")

COMMON = ("-m", model, "--batch", "16", "--seed", "7", "-q")


def records(r, drop):
    if r.returncode != 0:
        return None
    out = []
    for ln in r.stdout.splitlines():
        x = json.loads(ln)
        for k in drop:
            x.pop(k, None)
        out.append(x)
    return out


def reused(r):
    """The prompt positions --stats says were reused."""
    m = re.search(r"(\d+) of \d+ prompt positions reused", r.stderr)
    return int(m.group(1)) if m else -1


# ---- run --prompts ------------------------------------------------------------------
for sampler in ("standard", "entropix"):
    base = varent("run", *COMMON, "--prompts", path, "-n", "24", "--sampler", sampler, "--parallel", "1")
    want = records(base, ("tok_per_s",))
    check(want is not None and len(want) == len(prompts), f"run_{sampler}_one_by_one", base.stderr[-300:])
    for name, extra in (("default", ()), ("3_rows", ("--parallel", "3")), ("no_prefix_cache", ("--no-prefix-cache",)),
                        ("tiny_pool", ("--kv-pool-tokens", "112"))):
        r = varent("run", *COMMON, "--prompts", path, "-n", "24", "--sampler", sampler, "--stats", *extra)
        got = records(r, ("tok_per_s",))
        check(got is not None and got == want, f"run_{sampler}_{name}_same_records",
              r.stderr[-300:] if got is None else next((f"record {i}: {a} vs {b}" for i, (a, b) in
                                                       enumerate(zip(got, want)) if a != b), f"{len(got)} records"))
        if name == "default":
            # the repeated prompt (all of it) and the shared head's whole 16-token chunks
            check(reused(r) >= 30, f"run_{sampler}_reuses_prompts", r.stderr[-300:])
        if name == "no_prefix_cache":
            check(reused(r) == 0, f"run_{sampler}_no_reuse", r.stderr[-300:])

# ---- compare --------------------------------------------------------------------------
cmp = ("compare", *COMMON, "--prompts", path, "-n", "16", "--samplers", "standard,greedy,entropix", "--format", "jsonl")
want = records(varent(*cmp, "--parallel", "1"), ("tok_per_s",))
r = varent(*cmp)
got = records(r, ("tok_per_s",))
check(want is not None and len(want) == 3 * len(prompts) and got == want, "compare_same_rows",
      r.stderr[-300:] if got is None else "rows differ")

# ---- eval -----------------------------------------------------------------------------
ev = ("eval", "-m", model, "--batch", "16", "--tasks", "add2,count-letters", "--items", "5", "--repeats", "2",
      "--samplers", "greedy,standard,entropix,branch", "-n", "10", "-q")
outs = []
for extra in (("--parallel", "1"), ()):
    out = os.path.join(work, f"eval{len(outs)}.jsonl")
    r = varent(*ev, "-o", out, "--summary", out + ".json", *extra)
    check(r.returncode == 0, f"eval_runs_{len(outs)}", r.stderr[-300:])
    recs = []
    if r.returncode == 0:
        for ln in open(out):
            x = json.loads(ln)
            x.pop("wall_s", None)
            recs.append(x)
    outs.append(recs)
check(len(outs[0]) == 2 * 5 * 2 * 4 and outs[0] == outs[1], "eval_same_trial_records",
      f"{len(outs[0])} and {len(outs[1])} records")

# ---- bad input ---------------------------------------------------------------------------
expect_fail("single_run_refuses_parallel", varent("run", "-m", model, "-p", "Hi", "--parallel", "2"), "batch runs", rc=2)
expect_fail("pool_smaller_than_a_sequence",
            varent("run", *COMMON, "--prompts", path, "-n", "200", "--kv-pool-tokens", "64"), "line 1", "KV pool holds")
# refused as a usage error before the model loads, by every command that takes them
both = ("--kv-pool-mb", "8", "--kv-pool-tokens", "512")
for cmd, args in (("run", ("run", *COMMON, "--prompts", path)), ("compare", ("compare", *COMMON, "--prompts", path)),
                  ("eval", ("eval", "-m", model, "--tasks", "add2"))):
    r = varent(*args, *both)
    check(r.returncode == 2 and "not both" in r.stderr and "load:" not in r.stderr, f"both_pool_sizes_{cmd}",
          f"rc {r.returncode}: {r.stderr.strip()[-200:]!r}")

vtest.done()
