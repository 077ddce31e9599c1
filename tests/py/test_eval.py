"""`varent eval` and `varent calibrate` against independent references:

  - the statistics of the summary (accuracy, Wilson interval, the paired counts, the
    accuracy difference with Newcombe's interval, McNemar's exact p-value, the entropy
    means split by right and wrong) on a fixed set of trial records (`--from`), written
    here from their formulas with exact binomial sums (math.comb);
  - the built-in generators: the same seed gives the same items, item i does not depend
    on the count, and every answer is recomputed here from the prompt;
  - bad task files: each names the file and line, and --write leaves no file;
  - on stories260K: log-likelihood choices equal the sum of the numpy reference model's
    token log-probabilities; every arm sees the same prompt and seed; the greedy arm's
    output is `varent run --temp 0`'s; each trial's verdict equals this file's own
    implementation of the match rules; the plot of the records draws one mark per arm;
  - calibrate: the measured metrics equal the reference's, the thresholds are numpy's
    quantiles of them, the stock thresholds' ranks and the quadrant shares are right,
    and `--profile FILE` drives `varent run` with those thresholds.
"""
import json
import math
import os
import random
import re
from fractions import Fraction

import numpy as np

import vtest
from vtest import check, expect_fail, stories_dir, tmpdir, varent
import ref_metrics
import ref_model

work = tmpdir("eval")
Z = 1.959963984540054


def path(name):
    return os.path.join(work, name)


# ---- references ----

def wilson(k, n):
    if n == 0:
        return 0.0, 1.0
    p = k / n
    c = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    h = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return max(0.0, c - h), min(1.0, c + h)


def mcnemar(b, c):
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(Fraction(math.comb(n, i), 2 ** n) for i in range(min(b, c) + 1))
    return float(min(Fraction(1), 2 * tail))


def newcombe(a, b, c, d):
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n)
    l2, u2 = wilson(a + c, n)
    den = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(den) if den else 0.0
    lo = p1 - p2 - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = p1 - p2 + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, lo), min(1.0, hi)


def close(a, b, tol=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol * max(1.0, abs(b))


def judge(rec):
    """This file's own reading of the match rules (host/eval/match.h)."""
    out, ans, rule = rec["output"], rec["answer"], rec["match"]
    if rule == "exact":
        return out.strip() == ans.strip()
    if rule == "contains":
        return ans in out
    if rule == "regex":
        return re.search(ans, out, re.I if rec.get("nocase") else 0) is not None
    nums = [m.group(0) for m in re.finditer(r"(?<![A-Za-z0-9.])-?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?", out)]
    if not nums:
        return False
    x = float(nums[-1 if rec["pick"] == "last" else 0].replace(",", ""))
    return abs(x - float(ans)) <= 1e-9 * max(1, abs(float(ans)))


# ---- 1. statistics on fixed predictions ----

rng = random.Random(5)
arms = ["alpha", "beta", "gamma"]
recs = []
for task, n_items, p in (("t1", 37, (0.7, 0.5, 0.45)), ("t2", 23, (0.3, 0.35, 0.6))):
    for i in range(n_items):
        for rep in range(2):
            for a, arm in enumerate(arms):
                ok = rng.random() < p[a]
                recs.append({"task": task, "item": i, "repeat": rep, "arm": arm, "correct": ok,
                             "tokens": rng.randint(1, 30), "compute": rng.randint(30, 90), "wall_s": rng.random(),
                             "entropy": rng.random() * 3, "varentropy": rng.random() * 9})
with open(path("recs.jsonl"), "w") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
r = varent("eval", "--from", path("recs.jsonl"), "--summary", path("sum.json"))
check(r.returncode == 0, "from_runs", r.stderr)
summary = json.load(open(path("sum.json"))) if r.returncode == 0 else {"tasks": []}
check([t["task"] for t in summary["tasks"]] == ["t1", "t2", "all"], "from_tasks", str(summary)[:300])
bad = []
for t in summary["tasks"]:
    sel = [x for x in recs if t["task"] in ("all", x["task"])]
    for s in t["arms"]:
        mine = [x for x in sel if x["arm"] == s["arm"]]
        k, n = sum(x["correct"] for x in mine), len(mine)
        lo, hi = wilson(k, n)
        if (s["n"], s["correct"]) != (n, k) or not close(s["accuracy"], k / n) or not close(s["ci"][0], lo) \
                or not close(s["ci"][1], hi):
            bad.append(("acc", t["task"], s["arm"], s, k, n, lo, hi))
        for key, field in (("tokens", "tokens"), ("compute", "compute"), ("wall_s", "wall_s")):
            if not close(s[key], sum(x[field] for x in mine) / n):
                bad.append((key, t["task"], s["arm"]))
        for right in (True, False):
            grp = [x for x in mine if x["correct"] == right]
            want_h = sum(x["entropy"] for x in grp) / len(grp) if grp else None
            want_v = sum(x["varentropy"] for x in grp) / len(grp) if grp else None
            side = "right" if right else "wrong"
            if not close(s["entropy"][side], want_h) or not close(s["varentropy"][side], want_v):
                bad.append(("hv", t["task"], s["arm"], side))
    for pr in t["pairs"]:
        key = lambda x: (x["task"], x["item"], x["repeat"])
        A = {key(x): x["correct"] for x in sel if x["arm"] == pr["a"]}
        B = {key(x): x["correct"] for x in sel if x["arm"] == pr["b"]}
        a = sum(A[q] and B[q] for q in A)
        b = sum(A[q] and not B[q] for q in A)
        c = sum(B[q] and not A[q] for q in A)
        d = sum(not A[q] and not B[q] for q in A)
        lo, hi = newcombe(a, b, c, d)
        got = (pr["both_right"], pr["a_only"], pr["b_only"], pr["both_wrong"])
        if got != (a, b, c, d) or not close(pr["diff"], (b - c) / (a + b + c + d)) or not close(pr["ci"][0], lo) \
                or not close(pr["ci"][1], hi) or not close(pr["mcnemar_p"], mcnemar(b, c), 1e-10):
            bad.append(("pair", t["task"], pr, (a, b, c, d), lo, hi, mcnemar(b, c)))
check(not bad and summary["tasks"], "stats_match_python_reference", str(bad)[:800])
# exact McNemar values at the edges: no discordant pairs, all one way, large n
check(close(mcnemar(0, 0), 1.0) and close(mcnemar(0, 10), 2 / 1024), "mcnemar_reference_selfcheck")

r = varent("eval", "--from", path("recs.jsonl"))
check(r.returncode == 0 and "| alpha | beta |" in r.stdout and "### all tasks" in r.stdout, "from_markdown", r.stdout[:300])
with open(path("dup.jsonl"), "w") as f:
    f.write(json.dumps(recs[0]) + "\n" + json.dumps(recs[0]) + "\n")
expect_fail("from_duplicate_trial", varent("eval", "--from", path("dup.jsonl")), "recorded twice")
with open(path("badrec.jsonl"), "w") as f:
    f.write(json.dumps(recs[0]) + "\n{\"task\":\"t1\"}\n")
expect_fail("from_bad_record", varent("eval", "--from", path("badrec.jsonl")), "badrec.jsonl:2:", "\"correct\"")

# ---- 2. built-in generators ----

def write(name, *args):
    r = varent("eval", "--tasks", "all,decimal-choice", "--write", path(name), *args)
    check(r.returncode == 0, "write_" + name, r.stderr)
    return [json.loads(line) for line in open(path(name))] if r.returncode == 0 else []


a1, a2, b1 = write("s1a.jsonl", "--seed", "1", "--items", "40"), write("s1b.jsonl", "--seed", "1", "--items", "40"), \
    write("s2.jsonl", "--seed", "2", "--items", "40")
few = write("s1few.jsonl", "--seed", "1", "--items", "5")
check(a1 == a2 and len(a1) == 7 * 40, "generators_deterministic", f"{len(a1)} items")
check(a1 != b1, "generators_seed_matters")
check(all(x in a1 for x in few), "generators_item_independent_of_count")


def recompute(x):
    p = x["prompt"]
    t = x["task"]
    if t in ("add2", "add3"):
        u, v = map(int, re.match(r"What is (\d+) \+ (\d+)\?", p).groups())
        lo = 10 if t == "add2" else 100
        return str(u + v) == x["answer"] and lo <= u < lo * 10 and lo <= v < lo * 10 and x["pick"] == "last"
    if t in ("decimal", "decimal-choice"):
        u, v = re.match(r"Which number is larger: ([\d.]+) or ([\d.]+)\?", p).groups()
        big = u if Fraction(u) > Fraction(v) else v
        if t == "decimal-choice":
            return x["choices"] == [" " + u, " " + v] and x["choices"][x["gold"]] == " " + big
        return x["answer"] == big and x["pick"] == "first" and Fraction(u) != Fraction(v)
    if t == "count-letters":
        c, w = re.match(r'How many times does the letter "(.)" appear in the word "(\w+)"', p).groups()
        return x["answer"] == str(w.count(c))
    if t == "count-items":
        items = re.match(r"How many items are in this list: (.*)\? Reply", p).group(1).split(", ")
        return x["answer"] == str(len(items)) and len(set(items)) == len(items)
    if t == "recall":
        m = re.match(r"Here is a list: (.*)\. What is the (\w+) item", p)
        items = m.group(1).split(", ")
        k = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"].index(m.group(2))
        want = items[k]
        other = items[(k + 1) % len(items)]
        flags = re.I if x.get("nocase") else 0
        return (re.search(x["answer"], f"The answer is {want.upper()}.", flags) is not None
                and re.search(x["answer"], f"{other}, then {want}", flags) is None
                and re.search(x["answer"], f"{want}s", flags) is None)
    return False


wrong = [x for x in a1 if not recompute(x)]
check(not wrong and a1, "generator_answers_recomputed", str(wrong[:2]))
tasks = {x["task"] for x in a1}
check(tasks == {"add2", "add3", "decimal", "count-letters", "count-items", "recall", "decimal-choice"}, "generator_tasks",
      str(tasks))
dec = [x for x in a1 if x["task"] == "decimal"]
traps = sum(len(x["answer"].split(".")[1]) == 1 for x in dec)
check(0 < traps < len(dec), "decimal_both_directions", f"{traps} of {len(dec)} answers have one decimal")

# ---- 3. bad task files ----

def bad_file(name, lines, *needles):
    p = path(name + ".jsonl")
    with open(p, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = path(name + "-out.jsonl")
    r = varent("eval", "--tasks", p, "--write", out)
    expect_fail("taskfile_" + name, r, *needles)
    check(not os.path.exists(out), "taskfile_" + name + "_no_output")


ok = '{"prompt":"p","answer":"1"}'
bad_file("bad_json", [ok, "", '{"prompt": "p", '], name_line := f"bad_json.jsonl:3:", "not valid JSON")
bad_file("missing_answer", [ok, '{"prompt":"p"}'], "missing_answer.jsonl:2:", "missing \"answer\"")
bad_file("missing_prompt", ['{"answer":"1"}'], "missing_prompt.jsonl:1:", "missing \"prompt\"")
bad_file("unknown_rule", [ok, ok, '{"prompt":"p","answer":"1","match":"fuzzy"}'], "unknown_rule.jsonl:3:", "'fuzzy'")
bad_file("empty_choices", ['{"prompt":"p","choices":[],"gold":0}'], "empty_choices.jsonl:1:", "choices: is empty")
bad_file("gold_range", ['{"prompt":"p","choices":["a"],"gold":1}'], "gold_range.jsonl:1:", "gold")
bad_file("empty", [""], "empty.jsonl", "no items")
expect_fail("taskfile_missing", varent("eval", "--tasks", path("nope.jsonl"), "--write", path("x.jsonl")), "nope.jsonl")
expect_fail("unknown_builtin", varent("eval", "--tasks", "add4", "--write", path("x.jsonl")), "unknown task 'add4'")

# ---- 4. a real model: stories260K ----

stories = stories_dir("f32")
model = ref_model.Model(stories)


def ids_of(text, bos=True):
    r = varent("tokenize", "-m", stories, text)
    assert r.returncode == 0, r.stderr
    return ([1] if bos else []) + json.loads(r.stdout)


choice_items = [
    {"prompt": "Once upon a time", "choices": [" there was", " the dog", " a big red ball"], "gold": 0},
    {"prompt": "Lily saw a", "choices": [" cat", " dog"], "gold": 1, "id": "c2"},
]
gen_items = [
    {"prompt": "Once upon a time", "answer": "there", "match": "contains"},
    {"prompt": "One day, a girl", "answer": "(?i)\\bshe\\b", "match": "regex"},
    {"prompt": "Tom had 3 apples and", "answer": "2", "match": "number", "pick": "first"},
    {"prompt": "The cat", "answer": "The cat", "match": "exact"},
]
with open(path("tiny.jsonl"), "w") as f:
    for x in choice_items + gen_items:
        f.write(json.dumps(x) + "\n")
ARMS = "greedy,standard,entropix,entropix:jax,branch,agents"
r = varent("eval", "-m", stories, "--tasks", path("tiny.jsonl"), "--samplers", ARMS, "-n", "12", "--seed", "3",
           "--repeats", "2", "--agents", "0.5:5,1.0:20", "--check-every", "3", "-o", path("tiny-out.jsonl"),
           "--summary", path("tiny-sum.json"), "-t", "1", timeout=600)
check(r.returncode == 0, "tiny_eval_runs", r.stderr[-500:])
out = [json.loads(line) for line in open(path("tiny-out.jsonl"))] if r.returncode == 0 else []
n_arms = len(ARMS.split(","))
check(len(out) == (len(choice_items) + len(gen_items)) * 2 * n_arms, "tiny_record_count", str(len(out)))

bad = []
for rec in out:
    if "choices" not in rec:
        continue
    it = choice_items[rec["item"]]
    p = ids_of(it["prompt"])
    for c, text in enumerate(it["choices"]):
        cont = ids_of(text, bos=False)
        lp = ref_model.forward(model, p + cont)
        lsm = lp - np.log(np.sum(np.exp(lp - lp.max(axis=1, keepdims=True)), axis=1, keepdims=True)) - lp.max(axis=1, keepdims=True)
        want = sum(float(lsm[len(p) - 1 + j, t]) for j, t in enumerate(cont))
        if abs(rec["loglik"][c] - want) > 1e-4 * max(1, abs(want)) or rec["choice_tokens"][c] != len(cont):
            bad.append((rec["item"], c, rec["loglik"][c], want))
    if rec["chosen"] != int(np.argmax(rec["loglik"])) or rec["correct"] != (rec["chosen"] == it["gold"]):
        bad.append(("chosen", rec))
check(out and not bad, "choice_loglik_matches_reference", str(bad[:3]))

by_trial = {}
for rec in out:
    by_trial.setdefault((rec["item"], rec["repeat"]), []).append(rec)
same = all(len({(x["seed"], x["prompt_tokens"]) for x in v}) == 1 and len(v) == n_arms for v in by_trial.values())
check(out and same, "arms_share_prompts_and_seeds")
check(len({v[0]["seed"] for v in by_trial.values()}) == len(by_trial), "trials_have_distinct_seeds")
gens = [x for x in out if "output" in x]
wrong = [x for x in gens if x["correct"] != judge(x)]
check(gens and not wrong, "verdicts_match_python_rules", str(wrong[:2]))
agents_compute = [x["compute"] >= x["tokens"] for x in gens if x["arm"] == "agents"]
check(agents_compute and all(agents_compute), "agents_compute_counts_tokens")
branch = [x for x in gens if x["arm"] == "branch"]
check(branch and all(x["compute"] >= x["tokens"] for x in branch), "branch_compute_counts_tokens")
for k, it in enumerate(gen_items):
    rr = varent("run", "-m", stories, "-p", it["prompt"], "-n", "12", "--temp", "0", "-t", "1")
    g = [x for x in gens if x["arm"] == "greedy" and x["item"] == len(choice_items) + k]
    check(rr.returncode == 0 and g and all(x["output"] == rr.stdout.rstrip("\n") for x in g), f"greedy_arm_is_run_temp0_{k}",
          f"{rr.stdout!r} vs {[x['output'] for x in g]}")
# -l reaches every arm's draws: the greedy arm with a bias is `run --temp 0` with the same bias
it = gen_items[0]
r = varent("eval", "-m", stories, "--tasks", path("tiny.jsonl"), "--samplers", "greedy", "-n", "12", "-l", "400+6",
           "-l", "432-inf", "-o", path("tiny-bias.jsonl"), "-t", "1", "-q")
biased = [json.loads(line) for line in open(path("tiny-bias.jsonl"))] if r.returncode == 0 else []
rr = varent("run", "-m", stories, "-p", it["prompt"], "-n", "12", "--temp", "0", "-t", "1", "-l", "400+6", "-l", "432-inf")
g = [x for x in biased if x["item"] == len(choice_items) and "output" in x]
plain = [x for x in gens if x["arm"] == "greedy" and x["item"] == len(choice_items)]
check(g and rr.returncode == 0 and g[0]["output"] == rr.stdout.rstrip("\n") and g[0]["output"] != plain[0]["output"],
      "logit_bias_reaches_the_arms", f"{r.stderr[-200:]} {[x.get('output') for x in g]} vs {rr.stdout!r}")
# --lora reaches the arms: the greedy arm with an adapter is `run --temp 0` with it
import test_lora
adapter = test_lora.write_adapter(path("adapter"), stories, r=4, alpha=16, seed=3)
r = varent("eval", "-m", stories, "--tasks", path("tiny.jsonl"), "--samplers", "greedy", "-n", "12", "--lora", adapter,
           "-o", path("tiny-lora.jsonl"), "-t", "1", "-q")
adapted = [json.loads(line) for line in open(path("tiny-lora.jsonl"))] if r.returncode == 0 else []
rr = varent("run", "-m", stories, "-p", it["prompt"], "-n", "12", "--temp", "0", "-t", "1", "--lora", adapter)
g = [x for x in adapted if x["item"] == len(choice_items) and "output" in x]
check(g and rr.returncode == 0 and g[0]["output"] == rr.stdout.rstrip("\n") and g[0]["output"] != plain[0]["output"],
      "lora_reaches_the_arms", f"{r.stderr[-200:]} {[x.get('output') for x in g]} vs {rr.stdout!r}")
r = varent("eval", "-m", stories, "--tasks", path("tiny.jsonl"), "-l", "99999+1", "-o", path("tiny-bad.jsonl"), "-q")
check(r.returncode == 1 and "99999" in r.stderr and not os.path.exists(path("tiny-bad.jsonl")), "logit_bias_bad_id",
      r.stderr[-300:])
r = varent("eval", "-m", stories, "--tasks", path("tiny.jsonl"), "-l", "12~3")
check(r.returncode == 2 and "12~3" in r.stderr, "logit_bias_malformed_is_usage_error", r.stderr[-300:])
r = varent("eval", "-m", stories, "--tasks", path("tiny.jsonl"), "--samplers", "greedy,standard", "-n", "12", "--seed", "3",
           "--repeats", "2", "--skip", "3", "-o", path("tiny-skip.jsonl"), "-t", "1", "-q")
skipped = [json.loads(line) for line in open(path("tiny-skip.jsonl"))] if r.returncode == 0 else []
full = {(x["item"], x["repeat"], x["arm"]): x for x in out if x["arm"] in ("greedy", "standard")}
same = all(full[(x["item"], x["repeat"], x["arm"])].get("output") == x.get("output") and
           full[(x["item"], x["repeat"], x["arm"])]["seed"] == x["seed"] for x in skipped)
check(skipped and min(x["item"] for x in skipped) == 3 and len(skipped) == (6 - 3) * 2 * 2 and same,
      "skip_keeps_indices_and_seeds", r.stderr[-300:])
summ = json.load(open(path("tiny-sum.json"))) if r.returncode == 0 else {"tasks": [{"arms": []}]}
check([a["arm"] for a in summ["tasks"][0]["arms"]] == ARMS.split(","), "summary_arm_order")

r = varent("plot", path("tiny-out.jsonl"), "-o", path("acc.svg"))
svg = open(path("acc.svg")).read() if r.returncode == 0 else ""
check(r.returncode == 0 and svg.count('class="arm"') == n_arms and 'id="task-marks"' in svg, "plot_accuracy_vs_compute",
      r.stderr)

expect_fail("unknown_arm", varent("eval", "-m", stories, "--tasks", "add2", "--samplers", "greedy,best"), "unknown arm 'best'")
expect_fail("bad_branch", varent("eval", "-m", stories, "--tasks", "add2", "--branch", "3x"), "--branch")
expect_fail("missing_profile_file", varent("eval", "-m", stories, "--tasks", "add2", "--samplers", "entropix:" + path("no.json")),
            "no.json")
expect_fail("from_with_model", varent("eval", "--from", path("recs.jsonl"), "-m", stories), "--from", rc=2)

# ---- 5. calibrate ----

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
        "One day, she saw a big dog. The dog was brown and it wanted to play with a red ball.")
with open(path("corpus.txt"), "w") as f:
    f.write(TEXT)
r = varent("calibrate", "-m", stories, "-f", path("corpus.txt"), "-o", path("prof.json"), "--dump", path("dump.jsonl"),
           "--max-tokens", "30", "--low", "0.2", "--high", "0.8", "-t", "1")
check(r.returncode == 0 and "Share of tokens per quadrant" in r.stdout, "calibrate_corpus_runs", r.stderr[-400:])
dump = [json.loads(line) for line in open(path("dump.jsonl"))] if r.returncode == 0 else []
ids = ids_of(TEXT)
check(len(dump) == 30, "calibrate_max_tokens", str(len(dump)))
bad = []
for k in (0, 7, 29):
    if k >= len(dump):
        break
    ref = ref_metrics.metrics_for(model, ids[:k + 2])
    for key, v in ref.items():
        if abs(dump[k][key] - v) > 1e-4 * max(1.0, abs(v)):
            bad.append((k, key, dump[k][key], v))
check(dump and not bad, "calibrate_metrics_match_reference", str(bad[:4]))
prof = json.load(open(path("prof.json"))) if r.returncode == 0 else {}
H = np.array([d["entropy"] for d in dump] or [0.0])
V = np.array([d["varentropy"] for d in dump] or [0.0])
hl, hh, vl, vh = np.percentile(H, 20), np.percentile(H, 80), np.percentile(V, 20), np.percentile(V, 80)
want = {"LELV.entropy.max": hl, "LELV.varentropy.max": vl, "HELV.entropy.min": hh, "HELV.varentropy.max": vl,
        "LEHV.entropy.max": hl, "LEHV.varentropy.min": vh, "HEHV.entropy.min": hh, "HEHV.varentropy.min": vh}
badq = [(k, prof.get(k), v) for k, v in want.items() if not isinstance(prof.get(k), float) or abs(prof[k] - v) > 1e-6 * max(1, abs(v))]
check(prof and not badq, "calibrate_thresholds_are_quantiles", str(badq))
cal = prof.get("calibration", {})
ranks = [(s["key"], s["below"]) for s in cal.get("stock_thresholds", [])
         if s["key"].split(".")[1] in ("entropy", "varentropy")
         and abs(s["below"] - float(np.mean((H if s["key"].split(".")[1] == "entropy" else V) < s["value"]))) > 1e-6]
check(cal.get("stock_thresholds") and not ranks, "calibrate_stock_ranks", str(ranks[:3]))


def classify(p, m):
    for q in p["order"].split(","):
        inside = True
        for metric in ("entropy", "varentropy"):
            lo, hi = float(p[f"{q}.{metric}.min"]), float(p[f"{q}.{metric}.max"])
            inside = inside and lo < m[metric] < hi
        if inside:
            return q
    return "ADAPTIVE"


share = {q: sum(classify(prof, d) == q for d in dump) / len(dump) for q in ("LELV", "HELV", "LEHV", "HEHV", "ADAPTIVE")} if dump else {}
got = cal.get("quadrant_share", {}).get("calibrated", {})
check(got and all(abs(got[q] - share[q]) < 1e-6 for q in share), "calibrate_quadrant_shares", f"{got} vs {share}")

r = varent("run", "-m", stories, "-p", "Once upon a time", "-n", "16", "--seed", "4", "--sampler", "entropix", "--profile",
           path("prof.json"), "--metrics-out", path("m.jsonl"), "--force", "-t", "1")
ms = [json.loads(line) for line in open(path("m.jsonl"))] if r.returncode == 0 else []
mism = [(m["quadrant"], classify(prof, m)) for m in ms if m["quadrant"] not in ("BRANCH",) and m["quadrant"] != classify(prof, m)]
check(ms and not mism, "profile_file_drives_run", str(mism[:3]) + r.stderr[-300:])
r = varent("calibrate", "-m", stories, "-n", "3", "-o", path("gen.json"), "-t", "1", "-q")
g = json.load(open(path("gen.json"))) if r.returncode == 0 else {}
check(r.returncode == 0 and g.get("calibration", {}).get("tokens", 0) > 0, "calibrate_generated_runs", r.stderr[-300:])
expect_fail("calibrate_bad_quantiles", varent("calibrate", "-m", stories, "--low", "0.8", "--high", "0.2"), "--low", rc=2)
expect_fail("calibrate_missing_corpus", varent("calibrate", "-m", stories, "-f", path("none.txt")), "none.txt")
with open(path("badprof.json"), "w") as f:
    f.write('{"LELV.entropy.max": "x"}')
expect_fail("profile_file_bad_value", varent("run", "-m", stories, "-p", "a", "--profile", path("badprof.json")),
            "badprof.json", "LELV.entropy.max", rc=2)
for cmd in ("eval", "calibrate"):
    r = varent(cmd, "--help")
    check(r.returncode == 0 and r.stdout.startswith(f"usage: varent {cmd}"), f"{cmd}_help", r.stderr)
expect_fail("eval_missing_tasks", varent("eval", "-m", stories), "missing --tasks", rc=2)
expect_fail("calibrate_missing_model", varent("calibrate"), "missing -m", rc=2)
vtest.done()
