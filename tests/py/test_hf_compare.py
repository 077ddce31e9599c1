"""varent vs Hugging Face transformers (HF's own Llama/Qwen2/Qwen3 code, through
tools/bench-hf.py) on the same random checkpoints: an independent reference.

For llama3-tiny, qwen2-tiny and qwen3-tiny, each written as f32 and as bf16 (the same
values rounded), HF's f32 forward on the CPU is the reference:
  - `varent logits` on the CPU, prompts of 1, 17 and 64 tokens:
    max|diff| / max|ref| <= 1e-3, and the same greedy next token;
  - `varent run --temp 0 -n 16` on the CPU: the greedy continuation of HF's
    past_key_values loop;
  - when `varent --version` reports a CUDA device, the same on `--device cuda` for the
    bf16 checkpoints (bf16 KV cache and prefill activations): ||diff||_2 / ||ref||_2 <= 1e-2.
A greedy mismatch passes only at a near tie: where HF's top-two gap is below the logit
error measured on that prompt (the sequences may then differ, so the rest is not compared).

The HF side runs in VARENT_HF_PYTHON (default: the first of python3 and this python that
imports torch and transformers: bench-hf.py exits 2 otherwise), one run for all six
directories; without such a python the comparison prints SKIP. bench-hf.py's
own error exits, `varent bench`'s report lines, and HF bench's JSON are checked too.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

import vtest
from vtest import check, skip
import gen_random_checkpoint as gen

BENCH_HF = os.path.join(vtest.ROOT, "tools", "bench-hf.py")
PRESETS = (("llama3-tiny", 31), ("qwen2-tiny", 32), ("qwen3-tiny", 33))
LENGTHS = (1, 17, 64)
GREEDY = 16
CPU_TOL = 1e-3   # max|diff| / max|ref|
CUDA_TOL = 1e-2  # ||diff||_2 / ||ref||_2


def hf(python, *args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([python, BENCH_HF, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e)


def hf_reference(dirs, prompts, device="cpu", dtype="f32", greedy=GREEDY):
    """HF on DEVICE in DTYPE (f32 on the CPU: the reference), one bench-hf.py run for every
    directory: {(dir, prompt index): {logits, argmax, greedy, gaps}}, with the python that
    ran it; or (None, None, why) when no candidate python imports torch and transformers
    (exit 2)."""
    want = os.environ.get("VARENT_HF_PYTHON")
    args = [a for d in dirs for a in ("-m", d)] + ["--device", device, "--dtype", dtype, "--greedy", greedy,
                                                   "--logits", ";".join(",".join(map(str, p)) for p in prompts)]
    tried = []
    for py in [want] if want else list(dict.fromkeys(["python3", sys.executable])):
        try:
            r = hf(py, *args)
        except OSError as e:
            tried.append(f"{py}: {e}")
            continue
        if r.returncode == 2:
            tried.append(f"{py} lacks them")
            continue
        if r.returncode != 0:
            return py, None, f"{py} bench-hf.py exit {r.returncode}: {r.stderr.strip()[-400:]}"
        res = json.loads(r.stdout)["results"]
        n = len(prompts)
        return py, {(x["model"], k % n): x for k, x in enumerate(res)}, ""
    return None, None, "no python with torch and transformers (" + "; ".join(tried) + "); set VARENT_HF_PYTHON"


def cuda_devices():
    r = vtest.varent("--version")
    for line in r.stdout.splitlines():
        if line.startswith("cuda devices:"):
            return int(line.split(":")[1])
    return 0


def test_bench_hf_errors(model_dir, tmp):
    """bench-hf.py's failures: checked before torch is imported, so they run everywhere."""
    py = sys.executable
    fake = os.path.join(tmp, "notorch", "torch")
    os.makedirs(fake, exist_ok=True)
    with open(os.path.join(fake, "__init__.py"), "w") as f:
        f.write("raise ImportError('No module named torch (simulated)')\n")
    r = hf(py, "-m", model_dir, "--logits", "1,2", env={"PYTHONPATH": os.path.dirname(fake)})
    check(r.returncode == 2 and "needs torch and transformers" in r.stderr and not r.stdout,
          "hf_bench_missing_torch_exit2", f"rc {r.returncode}: {r.stderr.strip()[-300:]}")
    cases = (("hf_bench_no_dir", ["-m", os.path.join(tmp, "nope")], "not a directory"),
             ("hf_bench_no_config", ["-m", tmp], "config.json"),
             ("hf_bench_bad_ids", ["-m", model_dir, "--logits", "1,x"], "--logits"),
             ("hf_bench_id_range", ["-m", model_dir, "--logits", "1,1000"], "outside the vocabulary"),
             ("hf_bench_bad_n", ["-m", model_dir, "-n", "0"], "-n 0"),
             ("hf_bench_greedy_alone", ["-m", model_dir, "--greedy", "3"], "--greedy needs --logits"),
             ("hf_bench_bad_device", ["-m", model_dir, "--device", "gpu"], "--device gpu"),
             ("hf_bench_unknown_option", ["-m", model_dir, "--bogus"], "--bogus"))
    for name, args, want in cases:
        r = hf(py, *args)
        check(r.returncode == 1 and want in r.stderr and not r.stdout, name, f"rc {r.returncode}: {r.stderr.strip()[-300:]}")


def test_bench_report(model_dir, n_cuda):
    """`varent bench` names its device and yardstick: memcpy on the CPU, the device copy on CUDA."""
    runs = [("cpu", "memcpy")] + ([("cuda", "device copy")] if n_cuda else [])
    for dev, copy in runs:
        r = vtest.varent("bench", "-m", model_dir, "-n", 4, "--prompt-len", 8, "--runs", 1, "--sampler", "none",
                         "--device", dev)
        lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.strip()}
        ok = (r.returncode == 0 and lines.get("device", "device -").split()[1].startswith(dev)
              and f"; {copy} " in lines.get("bandwidth", "") and "ratio" in lines.get("bandwidth", "")
              and all(k in lines for k in ("model", "prefill", "decode")))
        check(ok, f"bench_report_{dev}", (r.stdout + r.stderr)[-400:])


def test_hf_bench_json(py, model_dir):
    r = hf(py, "-m", model_dir, "-n", 4, "--prompt-len", 8, "--runs", 1, "--device", "cpu", "--json")
    try:
        res = json.loads(r.stdout)
        ok = (r.returncode == 0 and res["decode_tok_s"] > 0 and res["prefill_tok_s"] > 0 and res["attn"] == "eager"
              and res["n"] == 4 and res["prompt_len"] == 8 and len(res["decode_s"]) == 1)
    except (ValueError, KeyError, TypeError):
        ok = False
    check(ok, "hf_bench_json", f"rc {r.returncode}: {(r.stdout + r.stderr)[-400:]}")


def varent_logits(model_dir, ids, device, out):
    if os.path.exists(out):
        os.remove(out)
    r = vtest.varent("logits", "-m", model_dir, "--ids", ",".join(map(str, ids)), "--out", out, "--device", device,
                     timeout=120)
    if r.returncode != 0 or not os.path.exists(out):
        return None, f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"
    return np.fromfile(out, dtype="<f4"), ""


def varent_greedy(model_dir, ids, device):
    r = vtest.varent("run", "-m", model_dir, "--ids", ",".join(map(str, ids)), "-n", GREEDY, "--temp", 0,
                     "--device", device, timeout=120)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"
    try:
        return [int(t) for t in r.stdout.split()], ""
    except ValueError:
        return None, f"not token ids: {r.stdout[:200]!r}"


def near_tie_ok(got, want, gaps, eos, margin):
    """got (varent, may stop at eos) against want (HF, GREEDY tokens, no eos stop)."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return gaps[i] < margin, f"step {i}: {g} vs HF {w}, HF top-2 gap {gaps[i]:.3g} (margin {margin:.3g})"
    if len(got) < len(want) and not (got and got[-1] == eos):
        return False, f"{len(got)} tokens, stopped without eos"
    return len(got) <= len(want), f"{len(got)} tokens, identical"


def rel_l2(a, ref):
    a, ref = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def cuda_tol(hf_bf16, ref):
    """The CUDA yardstick: HF's own bf16 forward on the GPU, measured against the same f32
    reference. varent may be at most twice as far from f32 as HF in bf16 is, and never
    has to beat CUDA_TOL (the first H200 run put varent at 0.002-0.011, growing with the
    prompt: bf16 KV cache and prefill activations)."""
    if hf_bf16 is None:
        return CUDA_TOL, ""
    e = rel_l2(hf_bf16["logits"], ref["logits"])
    return max(CUDA_TOL, 2 * e), f" (HF bf16 on cuda: {e:.3g})"


def compare(name, model_dir, prompt, ref, device, tol, eos, out, note=""):
    want = np.asarray(ref["logits"], dtype=np.float64)
    got, why = varent_logits(model_dir, prompt, device, out)
    if got is None or got.shape != want.shape or not np.isfinite(got).all():
        check(False, f"{name}_logits", why or f"{got.size} floats, want {want.size}, all finite")
        return
    diff = got - want
    if device == "cpu":
        err = float(np.max(np.abs(diff)) / np.max(np.abs(want)))
        metric = "max|diff|/max|ref|"
    else:
        err = float(np.linalg.norm(diff) / np.linalg.norm(want))
        metric = "||diff||/||ref||"
    check(err <= tol, f"{name}_logits", f"{metric} = {err:.3g} > {tol:.3g}{note}")
    margin = max(2 * float(np.max(np.abs(diff))), 1e-6 * float(np.max(np.abs(want))))
    g = int(np.argmax(got))
    gap = float(want[ref["argmax"]] - want[g])  # 0 when they agree
    check(g == ref["argmax"] or gap < margin, f"{name}_next_token",
          f"varent {g} vs HF {ref['argmax']} (HF logit gap {gap:.3g}, margin {margin:.3g})")
    toks, why = varent_greedy(model_dir, prompt, device)
    if toks is None:
        check(False, f"{name}_greedy{GREEDY}", why)
        return
    ok, why = near_tie_ok(toks, ref["greedy"], ref["gaps"], eos, margin)
    check(ok, f"{name}_greedy{GREEDY}", why)
    print(f"  {name}: {metric} {err:.3g}{note}, greedy {why}", flush=True)


def main():
    if not (os.path.isfile(vtest.VARENT) and os.access(vtest.VARENT, os.X_OK)):
        check(False, "hf_compare", f"varent binary not found at {vtest.VARENT}")
        return
    tmp = vtest.tmpdir("hfcmp")
    out = os.path.join(tmp, "logits.f32")
    dirs = {}
    for preset, seed in PRESETS:
        for dtype in ("f32", "bf16"):
            d = os.path.join(tmp, f"{preset}-{dtype}")
            dirs[preset, dtype] = (gen.generate(preset, d, seed=seed, dtype=dtype), d)
    first = dirs[PRESETS[0][0], "f32"][1]
    n_cuda = cuda_devices()
    test_bench_hf_errors(first, tmp)
    test_bench_report(first, n_cuda)
    rng = np.random.default_rng(30)
    prompts = [rng.integers(0, 1000, n).tolist() for n in LENGTHS]  # every preset's vocab is >= 1000
    py, refs, why = hf_reference([d for _, d in dirs.values()], prompts)
    if not py:
        skip("hf_compare", why)
    elif refs is None:
        check(False, "hf_reference", why)
    else:
        test_hf_bench_json(py, first)
        hf_bf16 = {}
        if n_cuda:  # HF's own bf16 error on the GPU sets the CUDA yardstick (cuda_tol)
            bf16_dirs = [d for (_, dtype), (_, d) in dirs.items() if dtype == "bf16"]
            _, got, why = hf_reference(bf16_dirs, prompts, device="cuda", dtype="bf16", greedy=0)
            check(got is not None, "hf_reference_bf16_cuda", why)
            hf_bf16 = got or {}
        for (preset, dtype), (cfg, d) in dirs.items():
            devices = ["cpu"] + (["cuda"] if n_cuda and dtype == "bf16" else [])
            for k, p in enumerate(prompts):
                for dev in devices:
                    tol, note = (CPU_TOL, "") if dev == "cpu" else cuda_tol(hf_bf16.get((d, k)), refs[d, k])
                    compare(f"hf_{preset}_{dtype}_T{len(p)}_{dev}", d, p, refs[d, k], dev, tol, cfg["eos_token_id"],
                            out, note)
        if not n_cuda:
            skip("hf_compare_cuda", "no CUDA device (varent --version)")
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)


main()
vtest.done()
