"""`varent compare` on stories260K: every prompt under every sampler, same seed.

  - JSONL: one row per (prompt, sampler) in order, with the documented fields; the
    Markdown table has a section per prompt, a row per sampler and a summary;
  - each row's text equals a single `varent run` with that sampler and the seed (greedy:
    --temp 0), and its mean entropy and quadrant counts equal that run's --metrics-out;
  - distinct-n recomputed here from the ids; the mean log-probability recomputed with
    the numpy reference forward (ref_model) on prompt + generated ids;
  - bad inputs (unknown sampler or profile, missing or empty prompts file, unwritable -o)
    fail with exit status 1 and leave no output file.
"""
import json
import math
import os

import numpy as np

import vtest
from vtest import check, stories_dir, tmpdir, varent
import ref_model

N, SEED = 12, 11
SAMPLERS = ["standard", "greedy", "entropix:seed", "entropix:jax"]
RUN_ARGS = {"standard": [], "greedy": ["--temp", "0"], "entropix:seed": ["--sampler", "entropix", "--profile", "seed"],
            "entropix:jax": ["--sampler", "entropix", "--profile", "jax"]}
PROMPTS = ["Once upon a time", "Lily saw a big dog"]

work = tmpdir("compare")
model = stories_dir("f32")
prompts = os.path.join(work, "prompts.txt")
with open(prompts, "w") as f:
    f.write("\n".join(PROMPTS) + "\n")
out = os.path.join(work, "out.jsonl")
r = varent("compare", "-m", model, "--prompts", prompts, "--samplers", ",".join(SAMPLERS), "-n", N, "--seed", SEED,
           "-o", out, timeout=120)
check(r.returncode == 0, "compare_runs", r.stderr[-400:])
rows = [json.loads(ln) for ln in open(out)] if os.path.exists(out) else []
order = [(row["prompt_index"], row["sampler"]) for row in rows]
check(order == [(i, s) for i in range(len(PROMPTS)) for s in SAMPLERS], "compare_jsonl_rows_in_order", str(order))
FIELDS = {"prompt_index", "line", "prompt", "sampler", "profile", "seed", "text", "ids", "tokens", "prompt_tokens", "stop",
          "tok_per_s", "mean_logprob", "distinct", "mean", "quadrants"}
missing = [sorted(FIELDS - set(row)) for row in rows if FIELDS - set(row)]
check(rows and not missing, "compare_jsonl_fields", str(missing))
check(all(row["seed"] == SEED and row["prompt"] == PROMPTS[row["prompt_index"]] for row in rows), "compare_same_seed_and_prompt")
check(all(row["tok_per_s"] is not None and row["tok_per_s"] > 0 for row in rows), "compare_tok_per_s_positive")

md = r.stdout
sections = [ln for ln in md.splitlines() if ln.startswith("### Prompt ")]
table_rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| sampler")]
check(len(sections) == len(PROMPTS) and len(table_rows) == len(PROMPTS) * len(SAMPLERS) + len(SAMPLERS),
      "compare_markdown_layout", md[:500])
check(all(ln.count(" | ") == 13 for ln in table_rows[:len(SAMPLERS)]), "compare_markdown_columns", table_rows[0] if table_rows else "")


def single_run(prompt, sampler, metrics):
    rr = varent("run", "-m", model, "-p", prompt, "-n", N, "--seed", SEED, "--metrics-out", metrics, "--force",
                *RUN_ARGS[sampler])
    assert rr.returncode == 0, rr.stderr
    return rr.stdout[:-1] if rr.stdout.endswith("\n") else rr.stdout, [json.loads(ln) for ln in open(metrics)]


text_bad, metric_bad = [], []
for row in rows:
    text, lines = single_run(row["prompt"], row["sampler"], os.path.join(work, "m.jsonl"))
    if text != row["text"]:
        text_bad.append(f"{row['sampler']}: {row['text']!r} vs run {text!r}")
    mean_h = sum(ln["entropy"] for ln in lines) / len(lines)
    counts = {q: sum(ln["quadrant"] == q for ln in lines) for q in row["quadrants"]}
    if [ln["token"] for ln in lines] != row["ids"] or abs(mean_h - row["mean"]["entropy"]) > 1e-9 * max(1, mean_h) \
            or counts != row["quadrants"]:
        metric_bad.append(f"{row['sampler']} prompt {row['prompt_index']}")
check(rows and not text_bad, "compare_text_equals_single_run", "; ".join(text_bad))
check(rows and not metric_bad, "compare_metrics_equal_metrics_out", "; ".join(metric_bad))
greedy = [row for row in rows if row["sampler"] == "greedy"]
plain = [varent("run", "-m", model, "-p", p, "-n", N, "--temp", "0").stdout.rstrip("\n") for p in PROMPTS]
check([g["text"] for g in greedy] == plain, "compare_greedy_equals_run_temp0")


def distinct(ids, n):
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


bad = [(row["sampler"], k) for row in rows for k in ("1", "2", "3")
       if (row["distinct"][k] is None) != (distinct(row["ids"], int(k)) is None)
       or (row["distinct"][k] is not None and abs(row["distinct"][k] - distinct(row["ids"], int(k))) > 1e-12)]
check(rows and not bad, "compare_distinct_n_recomputed", str(bad))

# Mean log p of the generated ids under the numpy reference forward.
m = ref_model.Model(model)
worst = 0.0
for row in rows:
    ptoks = [1] + json.loads(varent("tokenize", "-m", model, row["prompt"]).stdout)
    ids = ptoks + row["ids"]
    lg = ref_model.forward(m, ids)
    lp = lg - lg.max(axis=1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(axis=1, keepdims=True))
    ref = float(np.mean([lp[i - 1, ids[i]] for i in range(len(ptoks), len(ids))]))
    worst = max(worst, abs(ref - row["mean_logprob"]))
check(rows and worst < 1e-4, "compare_mean_logprob_vs_reference", f"max abs diff {worst}")

# --format jsonl prints the rows to stdout.
r = varent("compare", "-m", model, "--prompts", prompts, "--samplers", "greedy", "-n", 4, "--seed", 1, "--format", "jsonl", "-q")
lines = r.stdout.splitlines()
check(r.returncode == 0 and len(lines) == 2 and json.loads(lines[1])["sampler"] == "greedy" and not r.stderr,
      "compare_format_jsonl_stdout", r.stdout[:200] + r.stderr)


def bad_input(name, args, want, rc=1):
    """rc: 1 for a bad file, 2 for a bad option value (a usage error)."""
    dest = os.path.join(work, f"bad-{name}.jsonl")
    rr = varent("compare", "-m", model, "-o", dest, *args)
    check(rr.returncode == rc and want in rr.stderr and not os.path.exists(dest)
          and not [f for f in os.listdir(work) if f.startswith(f"bad-{name}")], name, f"rc {rr.returncode} {rr.stderr!r}")


empty = os.path.join(work, "empty.txt")
open(empty, "w").close()
bad_input("compare_unknown_sampler", ["--prompts", prompts, "--samplers", "greedy,nucleus"], "unknown sampler 'nucleus'", rc=2)
bad_input("compare_unknown_profile", ["--prompts", prompts, "--samplers", "entropix:nope"], "unknown profile 'nope'", rc=2)
bad_input("compare_missing_prompts", ["--prompts", os.path.join(work, "none.txt")], "none.txt")
bad_input("compare_empty_prompts", ["--prompts", empty], "no prompts")
rr = varent("compare", "-m", model, "--prompts", prompts, "-o", os.path.join(work, "no", "such", "dir", "x.jsonl"))
check(rr.returncode == 1 and "cannot create" in rr.stderr and not rr.stdout, "compare_unwritable_out", rr.stderr)

vtest.done()
