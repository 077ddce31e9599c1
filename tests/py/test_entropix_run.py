"""The entropix sampler end to end (`varent run --metrics-out`), against the numpy
reference (tests/reference/ref_metrics.py) and the formulas of docs/entropix.md.

  - every logged token's six metrics equal ref_metrics.metrics_for(prompt + generated
    ids before it) within 1e-3 relative, on stories260K and random tiny checkpoints,
    under the standard and the entropix sampler, at the last layer and --attn-layer 0;
  - under forced LEHV branching (--branch), the committed branch tokens' metrics still
    match the reference (so the tails and the commit hold the right keys and values);
  - each line's temperature/top-k/top-p/min-p equal the quadrant's formula recomputed here;
  - the clarifier is never inserted twice in a row; same seed gives the same tokens;
  - an unwritable --metrics-out fails before generating with exit status 1.
"""
import json
import math
import os

import vtest
from vtest import check
import gen_random_checkpoint as gen
import ref_model
import ref_metrics

RTOL, ATOL = 1e-3, 1e-5
KEYS = ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength")
T0, P0, K0, M0 = 0.666, 0.90, 27, 0.03


def run(model_dir, ids, n, out, *extra):
    if os.path.exists(out):
        os.remove(out)
    r = vtest.varent("run", "-m", model_dir, "--ids", ",".join(map(str, ids)), "-n", n, "--metrics-out", out,
                     *extra, timeout=120)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip()[-300:]}"
    with open(out) as f:
        return [json.loads(line) for line in f], ""


def close(got, ref):
    return abs(got - ref) <= ATOL + RTOL * abs(ref)


def check_metrics(name, model, prompt, lines, layer=None):
    """Each line vs the reference on the ids before its position."""
    if not lines:
        return check(False, name, "no metrics lines")
    ids = list(prompt) + [ln["token"] for ln in lines]
    worst = ""
    for ln in lines:
        if ln["pos"] > len(ids) - 1:
            return check(False, name, f"pos {ln['pos']} beyond the sequence")
        ref = ref_metrics.metrics_for(model, ids[:ln["pos"]], layer)
        for k in KEYS:
            if not close(ln[k], ref[k]):
                worst = worst or f"pos {ln['pos']} {k}: {ln[k]:.9g} vs reference {ref[k]:.9g}"
    return check(not worst, name, worst)


def expected_params(ln):
    """(temperature, top_k, top_p, min_p) of the seed profile's quadrant, from the logged metrics."""
    H, V, ae, av = ln["entropy"], ln["varentropy"], ln["attn_entropy"], ln["attn_varentropy"]
    ag, ist, q = ln["agreement"], ln["interaction_strength"], ln["quadrant"]
    if q == "LELV":
        return 0, 1, 1, 0
    if q == "LEHV":
        return min(1.5, T0 * (1.2 + 0.3 * ist)), max(5, math.floor(K0 * (1 + 0.5 * (1 - ag)))), P0, M0
    if q == "HEHV":
        return max(2.0, T0 * (2.0 + 0.5 * av)), K0, max(0.5, P0 - 0.2 * ae), M0
    if q == "HELV":
        return None  # clarifier or the HELV draw, checked separately
    t = T0 * (1 + 0.3 * (H + V) + 0.2 * (ae + av) - 0.2 * ag)
    top_p = min(max(P0 * (1 + 0.1 * av), 0.1), 1.0)
    top_k = int(min(max(round(K0 * (1 + 0.3 * ist - 0.2 * ag)), 1), 100))
    min_p = min(max(M0 * (1 - 0.5 * (H + V)), 0.01), 0.5)
    return t, top_k, top_p, min_p


def seed_quadrant(ln):
    H, V = ln["entropy"], ln["varentropy"]
    for q, ok in (("LELV", H < 0.1 and V < 0.1), ("LEHV", H < 5 and V > 5), ("HELV", H > 3 and V < 0.1),
                  ("HEHV", H > 5 and V > 5)):
        if ok:
            return q
    return "ADAPTIVE"


def check_params(name, lines):
    bad = ""
    for ln in lines:
        if seed_quadrant(ln) != ln["quadrant"]:
            bad = bad or f"pos {ln['pos']}: quadrant {ln['quadrant']}, want {seed_quadrant(ln)}"
        want = expected_params(ln)
        if want is None:
            continue
        got = (ln["temperature"], ln["top_k"], ln["top_p"], ln["min_p"])
        if got[1] != want[1] or not all(abs(g - w) <= 1e-6 * max(1, abs(w)) for g, w in zip(got, want)):
            bad = bad or f"pos {ln['pos']} {ln['quadrant']}: params {got}, want {want}"
    return check(not bad, name, bad)


def models():
    out = [("stories260K", vtest.stories_dir("f32"), [1, 403, 407, 261, 378])]
    for preset, dtype, seed in (("llama3-tiny", "bf16", 21), ("qwen3-tiny", "bf16", 22), ("llama-mha-untied", "f32", 23)):
        d = os.path.join(vtest.tmpdir("entropix-" + preset), "model")
        gen.generate(preset, d, seed=seed, dtype=dtype)
        out.append((preset, d, [1, 17, 45, 300, 9, 77]))
    return out


def test_model(name, d, prompt, tmp):
    model = ref_model.Model(d)
    out = os.path.join(tmp, name + ".jsonl")
    lines, why = run(d, prompt, 8, out, "--temp", "0")
    if not check(lines is not None, f"{name}_standard_runs", why):
        return
    check(all(ln["sampler"] == "standard" for ln in lines), f"{name}_standard_field")
    check_metrics(f"{name}_standard_metrics", model, prompt, lines)
    lines, why = run(d, prompt, 10, out, "--sampler", "entropix", "--seed", 5, "--attn-layer", 0)
    if check(lines is not None, f"{name}_entropix_runs", why):
        check_metrics(f"{name}_entropix_metrics_layer0", model, prompt, lines, layer=0)
        check_params(f"{name}_entropix_params", lines)
    # Every step LEHV: branching; 3 branches of 3 steps.
    force = ("--set", "order=LEHV", "--set", "LEHV.entropy.max=inf", "--set", "LEHV.varentropy.min=-1")
    lines, why = run(d, prompt, 9, out, "--sampler", "entropix", "--seed", 9, "--branch", "3:3", *force)
    if check(lines is not None, f"{name}_branch_runs", why):
        # two committed branches of 1 + 3 tokens; the last token has no room to branch
        qs = [ln["quadrant"] for ln in lines]
        check(qs == ["BRANCH"] * 8 + ["LEHV"], f"{name}_branch_quadrants", f"{qs}")
        check_metrics(f"{name}_branch_metrics", model, prompt, lines)
        again, _ = run(d, prompt, 9, out, "--sampler", "entropix", "--seed", 9, "--branch", "3:3", *force)
        check(again and [ln["token"] for ln in again] == [ln["token"] for ln in lines], f"{name}_branch_same_seed")


def test_clarifier(d, tmp):
    out = os.path.join(tmp, "clar.jsonl")
    force = ("--set", "order=HELV", "--set", "HELV.entropy.min=-1", "--set", "HELV.varentropy.max=inf")
    prompt = [1, 403, 407]
    lines, why = run(d, prompt, 12, out, "--sampler", "entropix", "--seed", 3, "--clarifier-token", 13, *force)
    if not check(lines is not None, "clarifier_runs", why):
        return
    toks = [prompt[-1]] + [ln["token"] for ln in lines]
    pairs = list(zip(toks, toks[1:]))
    check(all(not (a == 13 and b == 13) for a, b in pairs), "clarifier_not_back_to_back", f"{toks}")
    check(all(b == 13 for a, b in pairs if a != 13), "clarifier_inserted_after_others", f"{toks}")
    # default clarifier: " ..." through the tokenizer
    lines, why = run(d, prompt, 4, out, "--sampler", "entropix", "--seed", 3, *force)
    check(lines is not None and lines[0]["text"].strip(" ") in ("...", "."), "clarifier_from_tokenizer",
          why or f"first token {lines[0] if lines else None}")


def test_config_and_errors(d, tmp):
    cfg = os.path.join(tmp, "hehv.json")
    with open(cfg, "w") as f:
        json.dump({"order": "HEHV", "HEHV.entropy.min": -1, "HEHV.varentropy.min": -1, "temperature": 2.0,
                   "profile": "jax"}, f)
    out = os.path.join(tmp, "cfg.jsonl")
    lines, why = run(d, [1, 403], 5, out, "--sampler", "entropix", "--seed", 1, "--sampler-config", cfg)
    ok = lines is not None and all(
        ln["quadrant"] == "HEHV" and abs(ln["temperature"] - max(2.0, 2.0 * (2 + 0.5 * ln["attn_varentropy"]))) < 1e-5
        and abs(ln["top_p"] - max(0.5, P0 - 0.2 * ln["attn_entropy"])) < 1e-6 for ln in lines)
    check(ok, "sampler_config_json", why or f"{lines[:1]}")
    r = vtest.varent("run", "-m", d, "--ids", "1,2", "-n", 3, "--metrics-out", "/nonexistent-dir/m.jsonl")
    check(r.returncode == 1 and "/nonexistent-dir/m.jsonl" in r.stderr and not r.stdout.strip(),
          "metrics_out_unwritable", f"rc {r.returncode}, stderr {r.stderr.strip()!r}, stdout {r.stdout[:80]!r}")
    r = vtest.varent("run", "-m", d, "--ids", "1,2", "-n", 3, "--sampler", "entropix", "--set", "bogus.key=1")
    check(r.returncode == 2 and "bogus.key" in r.stderr, "unknown_constant_named", r.stderr.strip())  # usage
    r = vtest.varent("run", "-m", d, "--ids", "1,2", "-n", 3, "--profile", "nope")
    check(r.returncode == 2 and "nope" in r.stderr, "unknown_profile_named", r.stderr.strip())
    r = vtest.varent("run", "-m", d, "--ids", "1,2", "-n", 3, "--sampler", "entropix", "--attn-layer", 9)
    check(r.returncode == 1 and "attn-layer" in r.stderr, "attn_layer_range", r.stderr.strip())
    # same seed, same tokens (entropix, no branching); stats line
    a = vtest.varent("run", "-m", d, "--ids", "1,403", "-n", 24, "--sampler", "entropix", "--seed", 42, "--stats")
    b = vtest.varent("run", "-m", d, "--ids", "1,403", "-n", 24, "--sampler", "entropix", "--seed", 42)
    check(a.returncode == 0 and a.stdout == b.stdout, "entropix_same_seed", a.stderr[-200:])
    check("ADAPTIVE" in a.stderr and "mean entropy" in a.stderr, "stats_quadrants", a.stderr[-300:])


def test_branch_penalties(d, tmp):
    """Branch steps obey --no-repeat-ngram too: with N=1 no id may appear twice, prompt included."""
    out = os.path.join(tmp, "branch-ngram.jsonl")
    prompt = [1, 403, 407]
    r = vtest.varent("run", "-m", d, "--ids", ",".join(map(str, prompt)), "-n", 40, "--sampler", "entropix",
                     "--set", "order=LEHV", "--set", "LEHV.entropy.max=inf", "--set", "LEHV.varentropy.min=-1",
                     "--branch", "3:4", "--no-repeat-ngram", 1, "--seed", 3, "--metrics-out", out)
    recs = [json.loads(ln) for ln in open(out)] if r.returncode == 0 else []
    toks = [x["token"] for x in recs]
    branched = sum(x["quadrant"] == "BRANCH" for x in recs)
    check(r.returncode == 0 and branched > 20 and len(set(toks + prompt)) == len(toks) + len(prompt),
          "branch_no_repeat_ngram", f"rc {r.returncode}, {branched} branch tokens, ids {toks}")


def test_bench_samplers(d):
    """varent bench runs the decode loop under each sampler and reports them side by side."""
    r = vtest.varent("bench", "-m", d, "-n", 8, "--prompt-len", 8, "--runs", 1, "--sampler", "standard,entropix")
    lines = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("sampler")]
    check(r.returncode == 0 and [ln[1] for ln in lines] == ["standard", "entropix"]
          and all(float(ln[2]) > 0 for ln in lines), "bench_sampler_side_by_side", r.stdout + r.stderr[-200:])
    r = vtest.varent("bench", "-m", d, "-n", 4, "--prompt-len", 4, "--runs", 1, "--sampler", "standard,bogus")
    check(r.returncode == 1 and "bogus" in r.stderr, "bench_unknown_sampler", r.stderr.strip())


def main():
    if not (os.path.isfile(vtest.VARENT) and os.access(vtest.VARENT, os.X_OK)):
        check(False, "entropix", f"varent binary not found at {vtest.VARENT}")
        return
    tmp = vtest.tmpdir("entropix")
    ms = models()
    for name, d, prompt in ms:
        test_model(name, d, prompt, tmp)
    test_clarifier(ms[0][1], tmp)
    test_config_and_errors(ms[0][1], tmp)
    test_bench_samplers(ms[0][1])
    test_branch_penalties(ms[0][1], tmp)


if __name__ == "__main__":
    main()
    vtest.done()
