"""--kv-type bf16 (a bf16 KV cache on the CPU; docs/benchmarks.md): logits against the
numpy reference forward whose keys (after RoPE) and values are rounded to bfloat16,
on every tiny preset and stories260K, in prefill chunks and one token at a time; they
must sit far closer to that reference than to the unrounded one (the rounding is the one
predicted, not noise). Agents' lookahead branches (batched rows, tails, commits) run on
the bf16 cache, and a bad --kv-type is a usage error."""
import json
import os
import shutil

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import ref_model


def logits(tmp, d, ids, *extra):
    out = os.path.join(tmp, "l.f32")
    r = vtest.varent("logits", "-m", d, "--ids", ",".join(map(str, ids)), "-o", out, "--kv-type", "bf16", *extra)
    return (np.fromfile(out, dtype=np.float32), "") if r.returncode == 0 else (None, r.stderr[-300:])


def main():
    tmp = vtest.tmpdir("kvbf16")
    models = []
    for p in ("llama3-tiny", "llama-mha-untied", "qwen2-tiny", "qwen3-tiny"):
        d = os.path.join(tmp, p)
        gen.generate(p, d, seed=5, dtype="f32")
        models.append((p, d))
    stories = vtest.stories_dir()
    models.append(("stories260K", stories))
    for name, d in models:
        model = ref_model.Model(d)
        ids = np.random.default_rng(8).integers(3, model.cfg.vocab, 45).tolist()
        rounded = ref_model.forward(model, ids, kv_bf16=True)[-1]
        exact = ref_model.forward(model, ids)[-1]
        scale = np.max(np.abs(rounded))
        for tag, extra in (("chunks", ("-b", 16)), ("one_by_one", ("-b", 1))):
            got, why = logits(tmp, d, ids, *extra)
            e_r = float(np.max(np.abs(got - rounded)) / scale) if got is not None else 1
            e_x = float(np.max(np.abs(got - exact)) / scale) if got is not None else 0
            # 1e-3, not the fp32 tests' 1e-4: a key or value whose fp32 (varent) and float64
            # (numpy) values fall on either side of a bf16 rounding boundary rounds one bf16
            # step (2^-8) apart, and which ones do depends on the compiler's arithmetic
            # (-O1 under make test-asan measured 4.0e-4; -O3 under 1e-4).
            check(got is not None and e_r <= 1e-3 and e_r * 5 < e_x, f"kv_bf16_{name}_{tag}_vs_rounded_reference",
                  why or f"max rel err {e_r:.3g} vs rounded reference, {e_x:.3g} vs unrounded")
    log = os.path.join(tmp, "agents.jsonl")
    dump = os.path.join(tmp, "agents.f32")
    r = vtest.varent("agents", "-m", stories, "-p", "Once upon a time", "-n", 16, "-s", 2, "--lookahead", 3,
                     "--check-every", 4, "--kv-type", "bf16", "--log", log, "--dump-logits", dump)
    ids = [1] + json.loads(vtest.varent("tokenize", "-m", stories, "--no-special", "Once upon a time").stdout)
    # agents feed the prompt but its last token in one pass, then that token (host/agents/
    # loop.c); logits is given the same chunks, as the CPU attention sums a tile's rows in
    # another order once they fill a vector (8 rows with AVX2, 16 with AVX-512), so the
    # bits of a prefill depend on its chunks (an AVX2 machine: 2.4e-6 apart at -b 2 and 4)
    first, why = logits(tmp, stories, ids, "-b", len(ids) - 1)
    rows = np.fromfile(dump, dtype=np.float32).reshape(-1, 512) if r.returncode == 0 else None
    check(r.returncode == 0 and rows is not None and first is not None and np.array_equal(rows[0], first),
          "kv_bf16_agents_lookahead", r.stderr[-300:] or why)
    r = vtest.varent("run", "-m", stories, "-p", "x", "--kv-type", "f16")
    vtest.expect_fail("kv_type_bad_value", r, "--kv-type f16: f32 or bf16", rc=2)
    gemm_inputs(tmp)


def has_avx512_bf16():
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512_bf16" in f.read()
    except OSError:
        return False


def gemm_inputs(tmp):
    """--gemm-inputs bf16: bf16 weights, a prompt fed as one batch (the CPU GEMM), the
    projections' inputs rounded to bf16 as the numpy reference predicts; the default f32
    stays with the unrounded reference."""
    if not has_avx512_bf16():
        vtest.skip("gemm_inputs_bf16", "this CPU lacks AVX512_BF16 (the flag then changes nothing)")
        return
    for p in ("llama3-tiny", "qwen2-tiny", "qwen3-tiny"):
        d = os.path.join(tmp, p + "-bf16")
        gen.generate(p, d, seed=6, dtype="bf16")
        model = ref_model.Model(d)
        ids = np.random.default_rng(9).integers(3, model.cfg.vocab, 40).tolist()
        rounded = ref_model.forward(model, ids, gemm_bf16=True)[-1]
        exact = ref_model.forward(model, ids)[-1]
        scale = np.max(np.abs(exact))
        out = os.path.join(tmp, "g.f32")
        for mode, want, other in (("bf16", rounded, exact), ("f32", exact, rounded)):
            r = vtest.varent("logits", "-m", d, "--ids", ",".join(map(str, ids)), "-o", out, "-b", 64,
                             "--gemm-inputs", mode)
            got = np.fromfile(out, dtype=np.float32) if r.returncode == 0 else None
            e_w = float(np.max(np.abs(got - want)) / scale) if got is not None else 1
            e_o = float(np.max(np.abs(got - other)) / scale) if got is not None else 0
            check(got is not None and e_w <= 2e-3 and e_w * 3 < e_o, f"gemm_inputs_{mode}_{p}",
                  r.stderr[-300:] or f"max rel err {e_w:.3g} vs the predicted reference, {e_o:.3g} vs the other")
            print(f"# gemm_inputs {mode} {p}: {e_w:.3g} vs predicted, {e_o:.3g} vs the other")
    r = vtest.varent("run", "-m", vtest.stories_dir(), "-p", "x", "--gemm-inputs", "f16")
    vtest.expect_fail("gemm_inputs_bad_value", r, "--gemm-inputs f16: f32 or bf16", rc=2)
    shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
