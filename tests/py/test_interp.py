"""Experiments on weights (docs/research.md) against the numpy reference model
(tests/reference/ref_model.py forward_hooked): activation capture (--dump-acts), per-head
attention statistics and probabilities (--attn-layers, --dump-attn), the logit lens,
control vectors (llama.cpp's GGUF format, written here with tests/reference/gguf_np.py),
head ablation and layer skipping, on random tiny Llama (GQA) and Qwen3 (q/k norm)
checkpoints; identity checks (a zero vector, a range that excludes it: logits bit-identical
to the base); bad files and flags (an error naming the file and key, nothing written);
`varent cvector` against a numpy mean/PCA of the reference's block outputs; and, where the
`gguf` PyPI package imports (build/gguf-venv or VARENT_GGUF_PYTHON), llama.cpp's own reader
and writer on the files varent writes and reads."""
import json
import math
import os
import shutil
import subprocess

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import gguf_np
import ref_model

TOL = 1e-4
POINTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
PRESETS = (("llama3-tiny", 21), ("qwen3-tiny", 22))


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


def logits(d, ids, out, *extra, chunk=None):
    args = ["logits", "-m", d, "--ids", ",".join(map(str, ids)), "--out", out, *extra]
    if chunk:
        args += ["--chunk", str(chunk)]
    if os.path.exists(out):
        os.remove(out)
    r = vtest.varent(*args, timeout=120)
    got = np.fromfile(out, dtype="<f4") if r.returncode == 0 and os.path.exists(out) else None
    return r, got


def read_tensors(path):
    h, data = vtest.read_st(path)
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype="<f4" if v["dtype"] == "F32" else "<i4").reshape(v["shape"])
    return out


def write_cvec(path, dim, dirs, arch="controlvector", layer_count=None, dtype=gguf_np.F32, drop=()):
    kv = {"general.architecture": arch, "controlvector.model_hint": "llama",
          "controlvector.layer_count": gguf_np.Val(gguf_np.I32, len(dirs) if layer_count is None else layer_count)}
    for k in drop:
        kv.pop(k)
    tensors = []
    for il, v in dirs.items():
        v = np.asarray(v, np.float32)
        raw = v.tobytes() if dtype == gguf_np.F32 else gguf_np.quantize(v, dtype)
        tensors.append((f"direction.{il}", dtype, list(v.shape[::-1]), raw))
    gguf_np.write_gguf(path, kv, tensors)


def check_acts(name, d, model, ids, tmp, chunk=None):
    path = os.path.join(tmp, "acts.safetensors")
    r, got = logits(d, ids, os.path.join(tmp, "l.f32"), "--dump-acts", path, "--dump-points", ",".join(POINTS),
                    "--force", chunk=chunk)  # the file of the previous model is replaced
    if not check(got is not None, name, r.stderr[-300:]):
        return
    _, acts, _ = ref_model.forward_hooked(model, ids)
    t = read_tensors(path)
    worst = max(rel(t[f"layers.{l}.{p}"], acts[(l, p)]) for l in range(model.cfg.n_layers) for p in POINTS)
    ok = all(t[f"layers.{l}.{p}"].shape == (len(ids), model.cfg.dim) for l in range(model.cfg.n_layers) for p in POINTS)
    check(ok and worst <= TOL and list(t["ids"]) == list(ids), name, f"shapes ok={ok} worst rel {worst:.3g}")


def head_stats(scores):
    """Per-head entropy and varentropy (bits) of softmax(scores [H, K])."""
    p = ref_model.softmax(scores)
    lp = np.log2(np.maximum(p, 1e-300))
    h = -(p * lp).sum(-1)
    return h, (p * (lp + h[:, None]) ** 2).sum(-1), p


def check_attn_and_lens(name, d, model, ids, tmp):
    path = os.path.join(tmp, "attn.safetensors")
    r, got = logits(d, ids, os.path.join(tmp, "l.f32"), "--attn-layers", "all", "--dump-attn", path, "--logit-lens",
                    "--force")
    if not check(got is not None, name + "_run", r.stderr[-300:]):
        return
    ref, acts, scores = ref_model.forward_hooked(model, ids)
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    t = read_tensors(path)
    worst_h, worst_p = 0.0, 0.0
    for layer in rec["attn_layers"]:
        h, v, p = head_stats(scores[layer["layer"]])
        worst_h = max(worst_h, float(np.max(np.abs(np.array(layer["entropy"]) - h))),
                      float(np.max(np.abs(np.array(layer["varentropy"]) - v))))
        worst_p = max(worst_p, float(np.max(np.abs(t[f"layers.{layer['layer']}.attn"][0] - p))))
    check(len(rec["attn_layers"]) == model.cfg.n_layers and worst_h < 1e-3 and worst_p < 1e-5 and
          list(t["positions"]) == [len(ids) - 1], name + "_attn", f"stats {worst_h:.3g} probs {worst_p:.3g}")
    ok, why = True, ""
    for lens in rec["logit_lens"]:
        lg = ref_model.logit_lens(model, acts[(lens["layer"], "resid_post")][-1])
        p = ref_model.softmax(lg)
        want_h = float(-(p * np.log2(p)).sum())
        top = [x["id"] for x in lens["top"]]
        want_top = list(np.argsort(-lg, kind="stable")[:5])
        if abs(lens["entropy"] - want_h) > 1e-3 or top[0] != want_top[0] or len(top) != 5:
            ok, why = False, f"layer {lens['layer']}: H {lens['entropy']} vs {want_h}, top {top} vs {want_top}"
    last = rec["logit_lens"][-1]
    ok = ok and last["top"][0]["id"] == int(np.argmax(got))  # the last layer's lens is the model's logits
    check(ok and len(rec["logit_lens"]) == model.cfg.n_layers, name + "_lens", why)


def check_interventions(name, d, model, ids, tmp):
    out = os.path.join(tmp, "l.f32")
    D, L = model.cfg.dim, model.cfg.n_layers
    _, base = logits(d, ids, out)
    rng = np.random.default_rng(5)
    v1 = rng.standard_normal(D).astype(np.float32)
    cv, cz = os.path.join(tmp, "cv.gguf"), os.path.join(tmp, "zero.gguf")
    write_cvec(cv, D, {1: v1})
    write_cvec(cz, D, {il: np.zeros(D, np.float32) for il in range(1, L)})
    r, got = logits(d, ids, out, "--control-vector", cz)
    check(got is not None and np.array_equal(got, base), name + "_cvec_zero_identity", r.stderr[-300:])
    r, got = logits(d, ids, out, "--control-vector-scaled", cv, "0.5", "--control-vector", cv)
    want = ref_model.forward_hooked(model, ids, cvec={1: 1.5 * v1.astype(np.float64)})[0][-1]
    check(got is not None and rel(got, want) <= TOL, name + "_cvec_sum",
          r.stderr[-300:] if got is None else f"{rel(got, want):.3g}")
    r, got = logits(d, ids, out, "--control-vector", cv, "--control-vector-layer-range", "0", "0")
    check(got is not None and np.array_equal(got, base), name + "_cvec_range_excludes", r.stderr[-300:])
    r, got = logits(d, ids, out, "--ablate-head", "0:1", "--ablate-head", f"{L - 1}:3")
    want = ref_model.forward_hooked(model, ids, ablate={(0, 1), (L - 1, 3)})[0][-1]
    check(got is not None and rel(got, want) <= TOL and not np.array_equal(got, base), name + "_ablate",
          r.stderr[-300:] if got is None else f"{rel(got, want):.3g}")
    for chunk in (None, 3):
        r, got = logits(d, ids, out, "--skip-layer", "0", chunk=chunk)
        want = ref_model.forward_hooked(model, ids, skip={0})[0][-1]
        check(got is not None and rel(got, want) <= TOL, f"{name}_skip_chunk{chunk or 'all'}",
              r.stderr[-300:] if got is None else f"{rel(got, want):.3g}")


def check_ppl_steered(d, model, tmp):
    """Interventions reach every command that loads a model: ppl through a zero vector is
    the base's, through a real one it moves."""
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("Once upon a time there was a little girl who loved the sea and the sun. " * 3)
    cz, cv = os.path.join(tmp, "ppl_zero.gguf"), os.path.join(tmp, "ppl_cv.gguf")
    D, L = model.cfg.dim, model.cfg.n_layers
    write_cvec(cz, D, {il: np.zeros(D) for il in range(1, L)})
    write_cvec(cv, D, {2: np.random.default_rng(7).standard_normal(D)})
    res = {}
    for name, extra in (("base", []), ("zero", ["--control-vector", cz]), ("steered", ["--control-vector-scaled", cv, "3"]),
                        ("skip", ["--skip-layer", "1"])):
        r = vtest.varent("ppl", "-m", d, "-f", text, "--json", "-q", *extra, timeout=120)
        res[name] = json.loads(r.stdout)["ppl"] if r.returncode == 0 else None
    ok = None not in res.values() and res["zero"] == res["base"] and res["steered"] != res["base"] != res["skip"]
    check(ok, "interp_ppl_interventions", str(res))


def check_bad(d, D, L, tmp):
    out = os.path.join(tmp, "bad.f32")
    cases = []
    p = os.path.join(tmp, "wide.gguf")
    write_cvec(p, D + 8, {1: np.ones(D + 8)})
    cases.append(("width", p, ("wide.gguf", "direction.1", f"hidden_size is {D}")))
    p = os.path.join(tmp, "nocount.gguf")
    write_cvec(p, D, {1: np.ones(D)}, drop=("controlvector.layer_count",))
    cases.append(("missing_layer_count", p, ("nocount.gguf", "controlvector.layer_count")))
    p = os.path.join(tmp, "noarch.gguf")
    write_cvec(p, D, {1: np.ones(D)}, drop=("general.architecture",))
    cases.append(("missing_arch", p, ("noarch.gguf", "general.architecture")))
    p = os.path.join(tmp, "layer0.gguf")
    write_cvec(p, D, {0: np.ones(D)})
    cases.append(("layer0", p, ("layer0.gguf", "direction.0")))
    p = os.path.join(tmp, "deep.gguf")
    write_cvec(p, D, {L: np.ones(D)})
    cases.append(("too_deep", p, ("deep.gguf", f"direction.{L}")))
    p = os.path.join(tmp, "f16.gguf")
    write_cvec(p, D, {1: np.ones(D)}, dtype=gguf_np.F16)
    cases.append(("not_f32", p, ("f16.gguf", "direction.1", "F32")))
    p = os.path.join(tmp, "count.gguf")
    write_cvec(p, D, {1: np.ones(D)}, layer_count=5)
    cases.append(("layer_count_mismatch", p, ("count.gguf", "controlvector.layer_count")))
    p = os.path.join(tmp, "junk.gguf")
    with open(p, "wb") as f:
        f.write(b"not a gguf file at all")
    cases.append(("not_gguf", p, ("junk.gguf",)))
    for what, path, needles in cases:
        r, got = logits(d, [1, 2, 3], out, "--control-vector", path)
        vtest.expect_fail(f"interp_bad_cvec_{what}", r, *needles)
        check(not os.path.exists(out), f"interp_bad_cvec_{what}_nothing_written", "output file was written")
    for flag, val, needle in (("--ablate-head", f"{L}:0", "--ablate-head"), ("--ablate-head", "0:99", "heads 0.."),
                              ("--ablate-head", "x", "LAYER:HEAD"), ("--skip-layer", str(L), "--skip-layer"),
                              ("--attn-layers", "0,9", "--attn-layers"), ("--dump-points", "nope", "--dump-points")):
        extra = [flag, val] + (["--dump-acts", os.path.join(tmp, "a.st")] if flag == "--dump-points" else [])
        r, got = logits(d, [1, 2, 3], out, *extra)
        vtest.expect_fail(f"interp_bad_flag{flag}_{val}", r, needle, rc=2 if val == "x" else 1)  # x: a usage error
        check(not os.path.exists(out) and not os.path.exists(os.path.join(tmp, "a.st")),
              f"interp_bad_flag{flag}_{val}_nothing_written", "an output file was written")


def check_run_capture(d, model, tmp):
    """A generated run: the dump covers prompt and generated positions, the JSONL records
    carry the attention statistics of the forward they were drawn from."""
    acts, attn, log = (os.path.join(tmp, x) for x in ("run_acts.st", "run_attn.st", "run.jsonl"))
    for p in (acts, attn, log):
        if os.path.exists(p):
            os.remove(p)
    prompt = [1, 17, 42, 99, 5]
    r = vtest.varent("run", "-m", d, "--ids", ",".join(map(str, prompt)), "-n", "6", "--temp", "0", "--seed", "1", "--dump-acts", acts, "--dump-layers", "0-1", "--dump-attn", attn,
                     "--attn-layers", "all", "--metrics-out", log, timeout=120)
    if not check(r.returncode == 0, "interp_run_capture", r.stderr[-300:]):
        return
    t = read_tensors(acts)
    ids = [int(x) for x in t["ids"]]
    gen_ids = [int(x) for x in r.stdout.split()]
    ref, ra, scores = ref_model.forward_hooked(model, ids)
    worst = max(rel(t[f"layers.{l}.resid_post"], ra[(l, "resid_post")]) for l in (0, 1))
    check(ids == prompt + gen_ids and t["layers.0.resid_post"].shape[0] == len(ids) and worst <= TOL,
          "interp_run_dump_covers_every_position", f"ids {ids} vs {prompt}+{gen_ids}, worst {worst:.3g}")
    a = read_tensors(attn)
    pos = list(a["positions"])
    ok = pos == list(range(len(prompt) - 1, len(ids)))
    for s, q in enumerate(pos):  # row s: the query at position q over keys 0..q
        _, _, sc = ref_model.forward_hooked(model, ids[:q + 1])
        for l in range(model.cfg.n_layers):
            p = ref_model.softmax(sc[l])
            ok = ok and np.max(np.abs(a[f"layers.{l}.attn"][s][:, :q + 1] - p)) < 1e-5
            ok = ok and not np.any(a[f"layers.{l}.attn"][s][:, q + 1:])
    check(ok, "interp_run_dump_attn_rows", f"positions {pos}")
    recs = [json.loads(x) for x in open(log)]
    worst = 0.0
    for rec in recs:  # the token at pos was drawn from the forward whose last query is pos - 1
        _, _, sc = ref_model.forward_hooked(model, ids[:rec["pos"]])
        for layer in rec["attn_layers"]:
            h, _, _ = head_stats(sc[layer["layer"]])
            worst = max(worst, float(np.max(np.abs(np.array(layer["entropy"]) - h))))
    check(len(recs) == len(gen_ids) and worst < 1e-3, "interp_run_jsonl_attn_layers", f"worst {worst:.3g}")


def numpy_cvector(model, pairs, pca):
    """llama.cpp's method on the reference's block outputs: direction.(l+1) of block l."""
    L, out = model.cfg.n_layers, {}
    rows = {l: [] for l in range(L - 1)}
    for a, b in pairs:
        _, pa, _ = ref_model.forward_hooked(model, a)
        _, pb, _ = ref_model.forward_hooked(model, b)
        for l in range(L - 1):
            diff = pa[(l, "resid_post")] - pb[(l, "resid_post")]
            rows[l] += [x for x in diff if np.any(np.abs(x) > 1e-6)]
    for l in range(L - 1):
        x = np.array(rows[l])
        mean = x.sum(0) / np.linalg.norm(x.sum(0))
        if pca:
            w, v = np.linalg.eigh(x.T @ x)
            top = v[:, -1]
            mean = top if top @ mean > 0 else -top
        out[l + 1] = mean
    return out


def check_cvector_cmd(tmp):
    d = vtest.stories_dir()
    model = ref_model.Model(d)
    pos, neg = os.path.join(tmp, "pos.txt"), os.path.join(tmp, "neg.txt")
    with open(pos, "w") as f:
        f.write("Lily was very happy and smiled.\nThe sun was bright and warm.\n\nTim laughed with joy.\n")
    with open(neg, "w") as f:
        f.write("Lily was very sad and cried.\nThe rain was cold and dark.\n\nTim was angry.\n")
    pairs = []
    for a, b in zip(open(pos).read().split("\n"), open(neg).read().split("\n")):
        if not a.strip():
            continue
        ia = [int(x) for x in vtest.varent("tokenize", "-m", d, a).stdout.strip().strip("[]").split(",")]
        ib = [int(x) for x in vtest.varent("tokenize", "-m", d, b).stdout.strip().strip("[]").split(",")]
        sp = [int(x) for x in vtest.varent("tokenize", "-m", d, " ").stdout.strip().strip("[]").split(",")][-1]
        bos = [model.cfg.raw.get("bos_token_id", 1)]
        ia, ib = bos + ia, bos + ib
        n = max(len(ia), len(ib))
        pairs.append((ia + [sp] * (n - len(ia)), ib + [sp] * (n - len(ib))))
    for method in ("mean", "pca"):
        out = os.path.join(tmp, f"cv_{method}.gguf")
        r = vtest.varent("cvector", "-m", d, "--positive", pos, "--negative", neg, "--method", method, "-o", out)
        if not check(r.returncode == 0, f"interp_cvector_{method}", r.stderr[-300:]):
            continue
        _, kv, t = gguf_np.read_gguf(out)
        want = numpy_cvector(model, pairs, method == "pca")
        worst = max(float(np.max(np.abs(np.frombuffer(t[f"direction.{il}"][2], "<f4") - v))) for il, v in want.items())
        check(kv.get("general.architecture") == "controlvector" and kv.get("controlvector.layer_count") == len(want)
              and set(t) == {f"direction.{il}" for il in want} and worst < 2e-3,
              f"interp_cvector_{method}_matches_numpy", f"kv {kv} tensors {sorted(t)} worst {worst:.3g}")
    r = vtest.varent("cvector", "-m", d, "--positive", pos, "--negative", os.path.join(tmp, "missing.txt"),
                     "-o", os.path.join(tmp, "never.gguf"))
    vtest.expect_fail("interp_cvector_missing_file", r, "missing.txt")
    check(not os.path.exists(os.path.join(tmp, "never.gguf")), "interp_cvector_missing_file_nothing_written")
    return d, model


def gguf_python():
    want = os.environ.get("VARENT_GGUF_PYTHON")
    cands = [want] if want else [os.path.join(vtest.ROOT, "build", "gguf-venv", "bin", "python"), "python3"]
    for py in cands:
        try:
            if subprocess.run([py, "-c", "import gguf"], capture_output=True, timeout=60).returncode == 0:
                return py
        except OSError:
            pass
    return None


def check_llamacpp_gguf(d, model, tmp):
    """The gguf package (llama.cpp's gguf-py) reads what varent writes and writes what it reads."""
    py = gguf_python()
    if not py:
        vtest.skip("interp_gguf_pypi", "the gguf package does not import (python3 -m venv build/gguf-venv && "
                   "build/gguf-venv/bin/pip install gguf, or set VARENT_GGUF_PYTHON)")
        return
    mine = os.path.join(tmp, "cv_mean.gguf")
    script = ("import sys, json, gguf\nr = gguf.GGUFReader(sys.argv[1])\n"
              "f = r.fields\nprint(json.dumps({'arch': bytes(f['general.architecture'].parts[-1]).decode(),"
              "'count': int(f['controlvector.layer_count'].parts[-1][0]),"
              "'t': {t.name: [float(x) for x in t.data] for t in r.tensors}}))\n")
    r = subprocess.run([py, "-c", script, mine], capture_output=True, text=True, timeout=120)
    ok = r.returncode == 0
    if ok:
        j = json.loads(r.stdout)
        _, _, t = gguf_np.read_gguf(mine)
        ok = j["arch"] == "controlvector" and j["count"] == len(t) and all(
            np.allclose(j["t"][k], np.frombuffer(v[2], "<f4")) for k, v in t.items())
    check(ok, "interp_gguf_pypi_reads_varent_cvector", r.stderr[-300:])
    theirs = os.path.join(tmp, "pypi.gguf")
    D = model.cfg.dim
    script = ("import sys, numpy as np, gguf\nw = gguf.GGUFWriter(sys.argv[1], 'controlvector')\n"
              "w.add_string('controlvector.model_hint', 'llama')\nw.add_uint32('controlvector.layer_count', 1)\n"
              f"w.add_tensor('direction.2', np.full({D}, 0.25, dtype=np.float32))\n"
              "w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()\n")
    r = subprocess.run([py, "-c", script, theirs], capture_output=True, text=True, timeout=120)
    ids = [1, 40, 41, 42]
    r2, got = logits(d, ids, os.path.join(tmp, "l.f32"), "--control-vector-scaled", theirs, "2")
    want = ref_model.forward_hooked(model, ids, cvec={2: np.full(D, 0.5)})[0][-1]
    check(r.returncode == 0 and got is not None and rel(got, want) <= TOL, "interp_gguf_pypi_written_cvec_applies",
          (r.stderr + r2.stderr)[-300:])


def main():
    tmp = vtest.tmpdir("interp")
    for preset, seed in PRESETS:
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=seed, dtype="f32")
        model = ref_model.Model(d)
        ids = list(np.random.default_rng(seed).integers(3, model.cfg.vocab, 11))
        check_acts(f"interp_{preset}_dump_acts", d, model, ids, tmp)
        check_acts(f"interp_{preset}_dump_acts_chunk4", d, model, ids, tmp, chunk=4)
        check_attn_and_lens(f"interp_{preset}", d, model, ids, tmp)
        check_interventions(f"interp_{preset}", d, model, ids, tmp)
        if preset == "llama3-tiny":
            check_bad(d, model.cfg.dim, model.cfg.n_layers, tmp)
            check_ppl_steered(vtest.stories_dir(), ref_model.Model(vtest.stories_dir()), tmp)
            check_run_capture(d, model, tmp)
    d, model = check_cvector_cmd(tmp)
    check_llamacpp_gguf(d, model, tmp)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
