"""LoRA adapters with tensor parallelism over MPI on the CPU (issue 24; docs/distributed.md):
`mpirun -np N varent ... --tp N --lora DIR` against the one-process run, which
tests/py/test_lora.py checks against the numpy reference with the adapters folded in.

  - every tiny preset (Llama 3, untied MHA with uneven head splits at N = 4, Qwen2 with
    biases, Qwen3 with q/k norms), all seven projections adapted: logits of N = 2 (and
    N = 4 where the heads split) equal one process within fp32 tolerance, in prefill
    chunks and in one-token decode steps; the adapter must matter (the adapted logits
    are far from the base model's, so a rank dropping its delta fails);
  - `--lora-scaled`, two adapters stacked, a subset of projections and layers in bf16;
    scale 0 equals the base model's tensor-parallel logits bit for bit;
  - greedy text under `run --tp 2 --lora` equals one process;
  - the server's --lora-modules under mpirun: a request selecting the adapter gets the
    one-process server's logprobs.
"""
import os
import shutil

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import test_lora
import test_tp_mpi as tpm

IDS = [1, 17, 200, 35, 99, 4, 123, 250, 7, 64, 300, 12, 5]
DIFFS = []  # max |tp - one process| of every comparison, for the summary line
SPLITS = {"llama3-tiny": (2, 4), "llama-mha-untied": (2, 4), "qwen2-tiny": (2,), "qwen3-tiny": (2, 4)}


def logits(tmp, name, d, n, *extra):
    out = os.path.join(tmp, name + ".f32")
    if os.path.exists(out):
        os.remove(out)
    args = ("logits", "-m", d, "--ids", ",".join(map(str, IDS)), "-o", out, "-t", 1, *extra)
    r = tpm.mpirun(n, *args, "--tp", n) if n > 1 else vtest.varent(*args)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip()[-400:]}"
    return np.fromfile(out, dtype=np.float32), ""


def same(name, got, one, why):
    if got is not None and one is not None and got.shape == one.shape:
        DIFFS.append(float(np.abs(got - one).max() / np.abs(one).max()))
    check(tpm.close(got, one, 1e-4, 1e-5), name, why or tpm.diff(got, one))


def far(a, b):
    """The adapter changes the logits by much more than the tolerance (a dropped delta shows)."""
    return a is not None and b is not None and np.abs(a - b).max() > 100 * (2e-4 + 1e-4 * np.abs(b).max())


def test_presets(tmp):
    for preset, splits in SPLITS.items():
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=5, dtype="f32")
        ad = test_lora.write_adapter(os.path.join(tmp, f"ad-{preset}"), d, seed=31)
        base, _ = logits(tmp, f"{preset}-base", d, 1)
        one, why = logits(tmp, f"{preset}-one", d, 1, "--lora", ad)
        check(far(one, base), f"lora_tp_{preset}_adapter_matters", why or tpm.diff(one, base))
        for n in splits:
            got, why = logits(tmp, f"{preset}-np{n}", d, n, "--lora", ad, "-b", 5)
            same(f"lora_tp_{preset}_np{n}_vs_one_process", got, one, why)
        got, why = logits(tmp, f"{preset}-np2-steps", d, 2, "--lora", ad, "--chunk", 1)
        same(f"lora_tp_{preset}_np2_decode_steps", got, one, why)
    return os.path.join(tmp, "llama3-tiny")


def test_variants(tmp, d):
    sub = test_lora.write_adapter(os.path.join(tmp, "ad-sub"), d, targets=["q_proj", "v_proj", "down_proj"],
                                  layers=[1], r=3, alpha=5, seed=7, dtype="BF16")
    rs = test_lora.write_adapter(os.path.join(tmp, "ad-rs"), d, r=8, alpha=4, rslora=True, seed=8)
    for name, args in (("subset_bf16", ["--lora", sub]), ("scaled", ["--lora-scaled", rs, 0.35]),
                       ("two_stacked", ["--lora", sub, "--lora-scaled", rs, -1.5])):
        one, why = logits(tmp, f"{name}-one", d, 1, *args)
        got, why2 = logits(tmp, f"{name}-np2", d, 2, *args)
        same(f"lora_tp_{name}_np2_vs_one_process", got, one, why or why2)
    b2, _ = logits(tmp, "base-np2", d, 2)
    z2, why = logits(tmp, "zero-np2", d, 2, "--lora-scaled", rs, 0)
    check(b2 is not None and z2 is not None and b2.tobytes() == z2.tobytes(), "lora_tp_scale_0_bit_identical", why)
    args = ("run", "-m", d, "--ids", ",".join(map(str, IDS[:4])), "-n", 8, "--temp", 0, "--lora", rs, "-t", 1)
    r1, r2 = vtest.varent(*args), tpm.mpirun(2, *args, "--tp", 2)
    check(r1.returncode == 0 and r2.returncode == 0 and r1.stdout == r2.stdout and r1.stdout.strip(),
          "lora_tp_greedy_text_np2", f"rc {r2.returncode} {r2.stderr[-300:]!r}: {r2.stdout!r} vs {r1.stdout!r}")


def test_serve(tmp):
    stories = vtest.stories_dir("f32")
    ad = test_lora.write_adapter(os.path.join(tmp, "ad-stories"), stories, seed=21)
    ports = tpm.free_port(), tpm.free_port()
    mods = ("--lora-modules", f"story-lora={ad}")
    one = tpm.start_server([vtest.VARENT, "serve", "-m", stories, "--port", str(ports[0]), *mods], ports[0])
    two = tpm.start_server([tpm.MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", vtest.VARENT, "serve",
                            "-m", stories, "--port", str(ports[1]), "--tp", "2", *mods], ports[1])
    import json
    try:
        lps = {}
        for model in ("story-lora", "stories260K-f32"):
            body = {"model": model, "prompt": [1, 403, 407, 261, 500], "max_tokens": 0, "echo": True, "logprobs": 1}
            got = [json.loads(tpm.post(p, "/v1/completions", body))["choices"][0]["logprobs"]["token_logprobs"][1:]
                   for p in ports]
            lps[model] = got
            check(np.allclose(got[0], got[1], atol=1e-4), f"lora_tp_serve_{model}_np2_vs_one_process",
                  f"{got[1]} vs {got[0]}")
        check(not np.allclose(lps["story-lora"][0], lps["stories260K-f32"][0], atol=1e-2), "lora_tp_serve_adapter_matters",
              str(lps))
    except Exception as e:  # a server that died or answered an error
        check(False, "lora_tp_serve", f"{e!r} {two.poll()}")
    finally:
        for p in (one, two):
            p.terminate()
            try:
                p.wait(timeout=30)
            except Exception:
                p.kill()


def main():
    if not tpm.MPIRUN:
        vtest.skip("lora_tp", "mpirun is not installed (tools/install-deps.sh installs openmpi-bin)")
        return vtest.done()
    if " mpi" not in vtest.varent("--version").stdout:
        vtest.skip("lora_tp", "varent was built without MPI")
        return vtest.done()
    tmp = vtest.tmpdir("lora_tp")
    d = test_presets(tmp)
    test_variants(tmp, d)
    test_serve(tmp)
    if DIFFS:
        print(f"tp vs one process max|diff|/max|ref|: worst {max(DIFFS):.3g} over {len(DIFFS)} comparisons")
    shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
