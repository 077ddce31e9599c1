"""Experiments on weights on the emulated CUDA device (build/emu/varent, docs/cuda.md
"Forward hooks"): the interventions and captures of docs/research.md with --device cuda,
against the CPU binary (itself checked against the numpy reference by test_interp.py)
and, for the captures, the numpy reference directly. Random tiny bf16 checkpoints (the
device's weights are the CPU's bits; only its bf16 KV cache and prefill GEMM inputs
differ), prefill (all ids in one forward) and decode (--chunk 1: graph-captured steps):
  - control vectors (two files summed), --skip-layer, --ablate-head: logits within the
    CUDA-vs-CPU tolerance of test_emu_cli.py, where the intervention moves them far more;
  - identity: a zero vector, and a vector whose blocks the layer range excludes, give
    logits bit-identical to the device's plain pass;
  - --dump-acts (every point), --attn-layers, --dump-attn and --logit-lens: same tensors,
    shapes and positions as the CPU, values within tolerance; with --skip-layer too;
  - a generated run: the dump covers prompt and generated positions, the JSONL carries
    the attention statistics;
  - `bench --device cuda` step counts with interventions: a skipped layer launches
    nothing, a control vector rides on the down projection (no launch), an ablated
    head is one memset node; one host sync per token throughout;
  - agents' captures: the replayed accepted sequence against the CPU's logits captures;
  - ppl's captures: the windows' rows and each scored token's members against the CPU;
  - agents (batched decode rows, cuda_forward_batch) with a control vector and a skipped
    layer decide as the CPU does;
  - varent cvector --device cuda (block outputs through the capture hooks) writes the
    CPU's vectors (mean: within tolerance; pca: cosine >= 0.99).
SKIPs cleanly without build/emu/varent (make emu)."""
import json
import os
import re
import shutil
import subprocess

import numpy as np

import vtest
from vtest import check, skip
import gen_random_checkpoint as gen
import gguf_np
import ref_model
from test_interp import write_cvec, read_tensors, POINTS

EMU = os.path.join(os.environ.get("EMU_BUILD", os.path.join(vtest.ROOT, "build", "emu")), "varent")
TOL = 3e-2  # max|diff| / max|ref| between the device and the CPU (test_emu_cli.py)
PRESETS = (("llama3-tiny", 41), ("qwen3-tiny", 42))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if b.size == 0:
        return 0.0
    if not np.isfinite(a).all():  # NaN would slip through max() and <=
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def logits(binary, d, ids, tmp, *extra):
    out = os.path.join(tmp, "l.f32")
    if os.path.exists(out):
        os.remove(out)
    args = [binary, "logits", "-m", d, "--ids", ",".join(map(str, ids)), "--out", out, *map(str, extra)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    got = np.fromfile(out, dtype="<f4") if r.returncode == 0 and os.path.exists(out) else None
    return r, got


def cpu_dev(d, ids, tmp, *extra):
    rc, c = logits(vtest.VARENT, d, ids, tmp, *extra)
    rd, g = logits(EMU, d, ids, tmp, "--device", "cuda", *extra)
    return c, g, (rc.stderr + rd.stderr).strip()[-300:]


def check_interventions(name, d, ids, tmp):
    D, L = (json.load(open(os.path.join(d, "config.json")))[k] for k in ("hidden_size", "num_hidden_layers"))
    rng = np.random.default_rng(3)
    cv, cz = os.path.join(tmp, "cv.gguf"), os.path.join(tmp, "zero.gguf")
    write_cvec(cv, D, {1: rng.standard_normal(D).astype(np.float32)})
    write_cvec(cz, D, {il: np.zeros(D, np.float32) for il in range(1, L)})
    cases = (("cvec_sum", ("--control-vector", cv, "--control-vector-scaled", cv, "0.5")),
             ("skip0", ("--skip-layer", "0")), (f"skip{L - 1}", ("--skip-layer", str(L - 1))),
             ("ablate", ("--ablate-head", "0:1", "--ablate-head", f"{L - 1}:3")),
             ("all_three", ("--control-vector", cv, "--skip-layer", "0", "--ablate-head", f"{L - 1}:0")))
    for label, chunk in (("prefill", ()), ("decode", ("--chunk", "1"))):
        base_c, base_g, why = cpu_dev(d, ids, tmp, *chunk)
        if not check(base_c is not None and base_g is not None, f"{name}_{label}_base", why):
            continue
        for case, flags in cases:
            c, g, why = cpu_dev(d, ids, tmp, *flags, *chunk)
            if not check(c is not None and g is not None, f"{name}_{label}_{case}", why):
                continue
            err, moved = rel(g, c), rel(base_c, c)
            check(np.isfinite(g).all() and err <= TOL and moved > 5 * err, f"{name}_{label}_{case}",
                  f"cuda vs cpu {err:.3g}, the intervention moves the cpu logits by {moved:.3g}")
        for case, flags in (("zero_vector", ("--control-vector", cz)),
                            ("range_excludes", ("--control-vector", cv, "--control-vector-layer-range", "0", "0"))):
            r, g = logits(EMU, d, ids, tmp, "--device", "cuda", *flags, *chunk)
            check(g is not None and np.array_equal(g, base_g), f"{name}_{label}_{case}_identity",
                  r.stderr.strip()[-300:] if g is None else f"max|diff| {np.max(np.abs(g - base_g)):.3g}")


def captures(binary, d, ids, tmp, tag, *extra):
    acts, attn = os.path.join(tmp, f"acts_{tag}.st"), os.path.join(tmp, f"attn_{tag}.st")
    for p in (acts, attn):
        if os.path.exists(p):
            os.remove(p)
    r, got = logits(binary, d, ids, tmp, "--dump-acts", acts, "--dump-points", ",".join(POINTS), "--attn-layers", "all",
                    "--dump-attn", attn, "--logit-lens", *extra)
    if got is None:
        return None, r.stderr.strip()[-300:]
    return (read_tensors(acts), read_tensors(attn), json.loads(r.stdout.strip().splitlines()[-1])), ""


def compare_captures(name, c, g):
    acts_c, attn_c, rec_c = c
    acts_g, attn_g, rec_g = g
    same_keys = sorted(acts_c) == sorted(acts_g) and sorted(attn_c) == sorted(attn_g)
    worst = max((rel(acts_g[k], acts_c[k]) for k in acts_c if k != "ids" and np.any(acts_c[k])), default=0.0)
    zeros = all(not np.any(acts_g[k]) for k in acts_c if k != "ids" and not np.any(acts_c[k]))
    ok_ids = list(acts_g["ids"]) == list(acts_c["ids"])
    check(same_keys and ok_ids and zeros and worst <= TOL, name + "_dump_acts",
          f"keys equal {same_keys}, ids {ok_ids}, zero tensors zero {zeros}, worst rel {worst:.3g}")
    shapes = all(attn_g[k].shape == attn_c[k].shape for k in attn_c)
    probs = max((float(np.max(np.abs(attn_g[k] - attn_c[k]))) if shapes and np.isfinite(attn_g[k]).all() else np.inf
                 for k in attn_c if k != "positions" and attn_c[k].size), default=0.0)
    check(shapes and list(attn_g["positions"]) == list(attn_c["positions"]) and probs <= 2e-2, name + "_dump_attn",
          f"shapes equal {shapes}, positions {list(attn_g['positions'])} vs {list(attn_c['positions'])}, "
          f"max |dp| {probs:.3g}")
    bad = []
    for a, b in zip(rec_c["attn_layers"], rec_g["attn_layers"]):
        for k in ("entropy", "varentropy"):
            if (a[k] is None) != (b[k] is None) or (a[k] is not None and
                                                    np.max(np.abs(np.subtract(a[k], b[k]))) > 0.05 + 0.05 * np.max(a[k])):
                bad.append((a["layer"], k, a[k], b[k]))
    check(len(rec_c["attn_layers"]) == len(rec_g["attn_layers"]) and not bad, name + "_attn_layers", str(bad[:2]))
    bad = [(a["layer"], a["entropy"], b["entropy"], a["top"][0]["id"], [t["id"] for t in b["top"]])
           for a, b in zip(rec_c["logit_lens"], rec_g["logit_lens"])
           if b["entropy"] is None or abs(a["entropy"] - b["entropy"]) > 0.1 or
           a["top"][0]["id"] not in [t["id"] for t in b["top"]]]
    check(len(rec_c["logit_lens"]) == len(rec_g["logit_lens"]) and not bad, name + "_logit_lens", str(bad[:2]))


def check_captures(name, d, ids, tmp):
    model = ref_model.Model(d)
    for label, extra in (("prefill", ()), ("decode", ("--chunk", "1")), ("chunk4", ("--chunk", "4")),
                         ("skip0", ("--skip-layer", "0", "--chunk", "4"))):
        c, why = captures(vtest.VARENT, d, ids, tmp, "cpu", *extra)
        g, why2 = captures(EMU, d, ids, tmp, "dev", "--device", "cuda", *extra)
        if not check(c is not None and g is not None, f"{name}_{label}_captures", why or why2):
            continue
        compare_captures(f"{name}_{label}", c, g)
        if label == "decode":  # and the numpy reference itself, every layer and point
            _, acts, _ = ref_model.forward_hooked(model, ids)
            worst = max(rel(g[0][f"layers.{l}.{p}"], acts[(l, p)]) for l in range(model.cfg.n_layers) for p in POINTS)
            check(worst <= TOL, f"{name}_{label}_dump_acts_vs_numpy", f"worst rel {worst:.3g}")


def check_run(d, tmp):
    acts, log = os.path.join(tmp, "run_acts.st"), os.path.join(tmp, "run.jsonl")
    for p in (acts, log):
        if os.path.exists(p):
            os.remove(p)
    prompt = [1, 17, 42, 99, 5]
    r = subprocess.run([EMU, "run", "-m", d, "--ids", ",".join(map(str, prompt)), "-n", "4", "--temp", "0", "--device",
                        "cuda", "--dump-acts", acts, "--dump-layers", "0-1", "--attn-layers", "all", "--metrics-out",
                        log, "--force"], capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, "interp_cuda_run_capture", r.stderr.strip()[-300:]):
        return
    t = read_tensors(acts)
    ids = [int(x) for x in t["ids"]]
    gen_ids = [int(x) for x in r.stdout.split()]
    c, why = captures(vtest.VARENT, d, ids, tmp, "cpu_run")
    worst = max(rel(t[f"layers.{l}.resid_post"], c[0][f"layers.{l}.resid_post"]) for l in (0, 1)) if c else None
    check(ids == prompt + gen_ids and t["layers.0.resid_post"].shape[0] == len(ids) and worst is not None and worst <= TOL,
          "interp_cuda_run_dump_covers_every_position", f"ids {ids} vs {prompt}+{gen_ids}, worst {worst} {why}")
    recs = [json.loads(x) for x in open(log)]
    ok = len(recs) == len(gen_ids) and all(len(x.get("attn_layers", [])) == 2 for x in recs)
    check(ok, "interp_cuda_run_jsonl_attn_layers", f"{len(recs)} records for {len(gen_ids)} tokens")


def step_line(d, *flags):
    r = subprocess.run([EMU, "bench", "-m", d, "--device", "cuda", "-n", "4", "--prompt-len", "5", "--runs", "1",
                        "--sampler", "none", *flags], capture_output=True, text=True, timeout=300)
    for line in r.stdout.splitlines():
        m = re.match(r"decode step (\d+) kernel launches .*, (\d+) graph nodes, ([\d.]+) host syncs per token", line)
        if m:
            return int(m.group(1)), int(m.group(2)), float(m.group(3)), line
    return None, None, None, (r.stdout + r.stderr).strip()[-300:]


def check_step_counts(d, tmp):
    L = json.load(open(os.path.join(d, "config.json")))["num_hidden_layers"]
    D = json.load(open(os.path.join(d, "config.json")))["hidden_size"]
    cv = os.path.join(tmp, "steps_cv.gguf")
    write_cvec(cv, D, {il: np.ones(D, np.float32) for il in range(1, L)})
    plain = 2 + 5 * L  # test_emu_cli.py's count
    for name, flags, launches, extra_nodes in (
            ("skip", ("--skip-layer", "0"), plain - 5, 0),
            ("cvec", ("--control-vector", cv), plain, 0),
            ("ablate", ("--ablate-head", "0:1", "--ablate-head", f"{L - 1}:2"), plain, 2),
            ("cvec_on_skipped", ("--control-vector", cv, "--skip-layer", "1"), plain - 5 + 1, 0)):
        # bench arms each greedy step (test_emu_cli.py): one finishing launch more, and the
        # graph has the step block's copy and the draw's copy back
        n, nodes, syncs, line = step_line(d, *flags)
        launches += 1
        check(n == launches and nodes == launches + 2 + extra_nodes and syncs == 1.0, f"interp_cuda_bench_step_{name}",
              f"{line!r}: want {launches} launches, {launches + 2 + extra_nodes} graph nodes, 1.00 host syncs")


def check_agents(tmp):
    """Batched decode rows (cuda_forward_batch) with interventions decide as the CPU; a
    short run, as a hot agent's draw can flip on the bf16 KV cache's last bits (test_emu_cli.py)."""
    model = vtest.stories_dir("f32")
    D, L = (json.load(open(os.path.join(model, "config.json")))[k] for k in ("hidden_size", "num_hidden_layers"))
    cv = os.path.join(tmp, "agents_cv.gguf")
    write_cvec(cv, D, {2: np.random.default_rng(9).standard_normal(D).astype(np.float32) * 0.5})
    steer = ("--control-vector", cv, "--skip-layer", str(L - 1))
    recs = {}
    for who, binary, devices, flags in (("cpu", vtest.VARENT, "cpu", steer), ("dev", EMU, "0", steer),
                                        ("cpu_plain", vtest.VARENT, "cpu", ())):
        log = os.path.join(tmp, f"agents_{who}.jsonl")
        r = subprocess.run([binary, "agents", "-m", model, "-p", "Once upon a time", "-n", "4", "--seed", "5",
                            "--devices", devices, "--check-every", "4", "--log", log, "--force", *flags],
                           capture_output=True, text=True, timeout=600)
        recs[who] = [(x["event"], x.get("chosen_agent"), x.get("token")) for x in map(json.loads, open(log))] \
            if r.returncode == 0 else r.stderr.strip()[-300:]
    ok = all(isinstance(v, list) for v in recs.values())
    check(ok and recs["cpu"] == recs["dev"] and recs["cpu"] != recs["cpu_plain"],
          "interp_cuda_agents_interventions_match_cpu",
          str(recs)[:300] if not ok else f"equal to the cpu {recs['cpu'] == recs['dev']}, "
          f"moved by the interventions {recs['cpu'] != recs['cpu_plain']}")


def check_agents_captures(tmp):
    """agents' captures on the device (docs/research.md): the replayed accepted sequence
    equals the CPU's `logits --dump-acts` of the ids the file holds; each step record of
    the log carries every layer's attention statistics."""
    model = vtest.stories_dir("f32")
    acts, log = os.path.join(tmp, "agents_cap.st"), os.path.join(tmp, "agents_cap.jsonl")
    r = subprocess.run([EMU, "agents", "-m", model, "-p", "Once upon a time", "-n", "4", "--seed", "5", "--devices", "0",
                        "--lookahead", "2", "--check-every", "0", "--log", log, "--force", "--dump-acts", acts,
                        "--dump-points", ",".join(POINTS), "--attn-layers", "all"],
                       capture_output=True, text=True, timeout=600)
    if not check(r.returncode == 0, "interp_cuda_agents_captures", r.stderr.strip()[-300:]):
        return
    g = read_tensors(acts)
    ids = [int(x) for x in g["ids"]]
    c, why = captures(vtest.VARENT, model, ids, tmp, "cpu_agents")
    keys = [k for k in g if k.startswith("layers.")]
    worst = max(rel(g[k], c[0][k]) for k in keys) if c else None
    check(c is not None and list(g["positions"]) == list(range(len(ids))) and worst is not None and worst <= TOL,
          "interp_cuda_agents_dump_acts_match_cpu", f"worst rel {worst} {why}")
    L = json.load(open(os.path.join(model, "config.json")))["num_hidden_layers"]
    steps = [x for x in map(json.loads, open(log)) if x["event"] == "step"]
    check(steps and all(len(x.get("attn_layers", [])) == L for x in steps), "interp_cuda_agents_step_attn_layers",
          f"{len(steps)} steps")


def check_cvector(tmp):
    """varent cvector on the device: its block outputs come through the capture hooks."""
    model = vtest.stories_dir("f32")
    pos, neg = os.path.join(tmp, "pos.txt"), os.path.join(tmp, "neg.txt")
    with open(pos, "w") as f:
        f.write("Lily was very happy and smiled.\nThe sun was bright and warm.\n\nTim laughed with joy.\n")
    with open(neg, "w") as f:
        f.write("Lily was very sad and cried.\nThe rain was cold and dark.\n\nTim was angry.\n")
    for method in ("mean", "pca"):
        files = {}
        for who, binary, dev in (("cpu", vtest.VARENT, "cpu"), ("dev", EMU, "cuda")):
            out = os.path.join(tmp, f"cv_{method}_{who}.gguf")
            if os.path.exists(out):
                os.remove(out)
            r = subprocess.run([binary, "cvector", "-m", model, "--positive", pos, "--negative", neg, "--method", method,
                                "-o", out, "--device", dev], capture_output=True, text=True, timeout=300)
            files[who] = gguf_np.read_gguf(out)[2] if r.returncode == 0 else r.stderr.strip()[-300:]
        if not check(all(isinstance(v, dict) for v in files.values()), f"interp_cuda_cvector_{method}", str(files)):
            continue
        a, b = ({k: np.frombuffer(v[2], "<f4").astype(np.float64) for k, v in f.items()} for f in files.values())
        # mean: the same vectors within tolerance; pca: the same direction (a top eigenvector
        # of a few differences moves more with the bf16 KV cache's rounding)
        worst = max(rel(b[k], a[k]) for k in a) if sorted(a) == sorted(b) else float("inf")
        cos = min(float(a[k] @ b[k] / np.linalg.norm(a[k]) / np.linalg.norm(b[k])) for k in a) if sorted(a) == sorted(b) \
            else -1.0
        check(worst <= TOL if method == "mean" else cos >= 0.99, f"interp_cuda_cvector_{method}_matches_cpu",
              f"tensors {sorted(b)} vs {sorted(a)}, worst rel {worst:.3g}, min cosine {cos:.4f}")


def check_ppl_captures(tmp):
    """ppl's captures on the device (docs/research.md): the same windows' rows (ids,
    positions, text_pos) as the CPU, values within the bf16 KV cache's tolerance, and
    each scored token's --per-token members."""
    model, text = vtest.stories_dir("f32"), os.path.join(tmp, "ppl.txt")
    with open(text, "w") as f:
        f.write("Once upon a time, there was a little girl named Lily. She loved to play outside.\n")
    got = {}
    for who, binary, dev in (("cpu", vtest.VARENT, "cpu"), ("dev", EMU, "cuda")):
        out = [os.path.join(tmp, f"ppl_{who}{x}") for x in (".acts.st", ".attn.st", ".jsonl")]
        r = subprocess.run([binary, "ppl", "-m", model, "-f", text, "--ctx", "12", "--stride", "5", "-q", "--device", dev,
                            "--per-token", out[2], "--dump-acts", out[0], "--dump-attn", out[1], "--attn-layers", "all",
                            "--logit-lens"], capture_output=True, text=True, timeout=600)
        got[who] = (read_tensors(out[0]), read_tensors(out[1]), [json.loads(x) for x in open(out[2])]) \
            if r.returncode == 0 else None
        check(r.returncode == 0, f"interp_cuda_ppl_captures_{who}", r.stderr.strip()[-300:])
    if not got["cpu"] or not got["dev"]:
        return
    (ac, tc, rc), (ag, tg, rg) = got["cpu"], got["dev"]
    rows = all(list(ac[k]) == list(ag[k]) and list(tc[k]) == list(tg[k]) for k in ("ids", "positions", "text_pos"))
    worst = max(rel(ag[k], ac[k]) for k in ac if k.startswith("layers."))
    probs = max(float(np.max(np.abs(tg[k] - tc[k]))) for k in tc if k.startswith("layers."))
    check(rows and worst <= TOL and probs <= 0.1, "interp_cuda_ppl_files_match_cpu",
          f"rows equal {rows}, acts worst rel {worst:.3g}, attn max |dp| {probs:.3g}")
    bad = [(x["pos"], lx["layer"]) for x, y in zip(rc, rg) for lx, ly in zip(x.get("logit_lens", []), y.get("logit_lens", []))
           if abs(lx["entropy"] - ly["entropy"]) > 0.15 or lx["top"][0]["id"] not in [t["id"] for t in ly["top"]]]
    scored = [x["pos"] for x in rc if x["logprob"] is not None]
    same = scored == [y["pos"] for y in rg if "logit_lens" in y and "attn_layers" in y]
    check(same and not bad, "interp_cuda_ppl_per_token_members", f"scored equal {same}, lens off {bad[:3]}")


def main():
    if not os.access(EMU, os.X_OK):
        skip("interp_cuda", f"no emulated build at {EMU} (make emu)")
        vtest.done()
    tmp = vtest.tmpdir("interp-cuda")
    for preset, seed in PRESETS:
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=seed, dtype="bf16")
        ids = list(np.random.default_rng(seed).integers(3, 900, 9))
        check_interventions(f"interp_cuda_{preset}", d, ids, tmp)
        check_captures(f"interp_cuda_{preset}", d, ids, tmp)
        if preset == "llama3-tiny":
            check_run(d, tmp)
            check_step_counts(d, tmp)
    check_agents(tmp)
    check_agents_captures(tmp)
    check_ppl_captures(tmp)
    check_cvector(tmp)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
