"""varent's logits vs the independent numpy reference (tests/reference/ref_model.py) on
random tiny checkpoints of every supported architecture.

For each preset: `varent logits -m DIR --ids ... --out FILE [--chunk C]` must give the
last position's logits within max|diff| / max|ref| <= 1e-4, for prompts of 1, 2, 17, 64
and 130 tokens, fed all at once, token by token (C=1) and 7 at a time (C=7, so chunks
straddle the KV cache contents at odd offsets). One reference forward of the 130-token
prompt per preset gives every prefix's answer (the model is causal).
"""
import os
import shutil

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import ref_model

TOL = 1e-4
LENGTHS = (1, 2, 17, 64, 130)
CHUNKS = (None, 1, 7)
# preset, dtype, seed: llama-mha-untied is stored as f32 to cover F32 loading
PRESETS = (("llama3-tiny", "bf16", 11), ("llama-mha-untied", "f32", 12),
           ("qwen2-tiny", "bf16", 13), ("qwen3-tiny", "bf16", 14))


def engine_logits(model_dir, ids, chunk, out):
    args = ["logits", "-m", model_dir, "--ids", ",".join(map(str, ids)), "--out", out]
    if chunk:
        args += ["--chunk", chunk]
    if os.path.exists(out):
        os.remove(out)
    r = vtest.varent(*args, timeout=120)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"
    if not os.path.exists(out):
        return None, "no output file"
    return np.fromfile(out, dtype="<f4"), ""


def compare(name, model_dir, ids, want, chunk, out):
    got, why = engine_logits(model_dir, ids, chunk, out)
    if got is None:
        return check(False, name, why)
    if got.shape != want.shape:
        return check(False, name, f"{got.size} floats, want vocab_size {want.size}")
    if not np.isfinite(got).all():
        return check(False, name, "non-finite logits")
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    return check(err <= TOL, name, f"max|diff|/max|ref| = {err:.3g} (argmax {got.argmax()} vs {want.argmax()})")


def main():
    if not (os.path.isfile(vtest.VARENT) and os.access(vtest.VARENT, os.X_OK)):
        check(False, "logits_reference", f"varent binary not found at {vtest.VARENT}")
        return
    tmp = vtest.tmpdir("logits")
    out = os.path.join(tmp, "logits.f32")
    refs = {}
    for preset, dtype, seed in PRESETS:
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=seed, dtype=dtype)
        model = ref_model.Model(d)
        ids = np.random.default_rng(seed).integers(0, model.cfg.vocab, max(LENGTHS))
        ref = ref_model.forward(model, ids)
        refs[preset] = (ids, ref)
        for n in LENGTHS:
            for c in CHUNKS:
                compare(f"logits_{preset}_T{n}_chunk{c or 'all'}", d, ids[:n], ref[n - 1], c, out)
    # the same llama3-tiny weights in 3 shards behind model.safetensors.index.json
    d = os.path.join(tmp, "llama3-tiny-sharded")
    gen.generate("llama3-tiny", d, seed=11, shards=3)
    ids, ref = refs["llama3-tiny"]
    for n in (17, 130):
        for c in (None, 7):
            compare(f"logits_llama3-tiny-sharded_T{n}_chunk{c or 'all'}", d, ids[:n], ref[n - 1], c, out)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)


main()
vtest.done()
