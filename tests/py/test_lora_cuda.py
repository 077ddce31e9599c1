"""LoRA adapters on the CUDA device (issue 24; docs/cuda.md), run on the emulated device
(build/emu/varent) against the CPU backend, which tests/py/test_lora.py checks against the
numpy reference with the adapters folded into the weights:

  - every tiny preset (Llama 3, untied MHA, Qwen2 with biases, Qwen3 with q/k norms), all
    seven projections adapted: `logits --device cuda --lora` equals `--device cpu --lora`
    within the bf16 KV cache's tolerance (test_emu_cli.py's 3e-2), in prefill and in
    one-token decode steps (the captured graph); the adapter must matter: the adapted
    logits are far from the base model's on the CPU, and the device's adapted logits are
    far from the device's base logits (a dropped delta fails);
  - a subset of projections and layers in bf16, rsLoRA, `--lora-scaled`, two adapters
    stacked; `--lora-scaled DIR 0` gives logits bit for bit equal to the device's base
    model, prefill and decode;
  - greedy text under `run --device cuda --lora` equals the CPU's (stories260K);
  - the server's --lora-modules on the device: requests alternating between the adapter
    and the base model on one slot (the decode graph must be captured again at each
    switch) give the CPU server's greedy texts and echo logprobs;
  - tensor parallelism on two emulated GPUs, `--devices 0,1 --tp 2` in one process and
    `mpirun -np 2 ... --device cuda --tp 2`, every preset, prefill and decode, two
    adapters stacked with one scaled: equal to one device within test_emu_tp.py's 1e-2
    (the ranks' partial sums add in another order), and the two launch forms equal bit
    for bit.
"""
import json
import os
import shutil

import numpy as np

import servertest
import vtest
from vtest import check, stories_dir
import gen_random_checkpoint as gen
import test_lora

EMU = os.path.join(os.environ.get("EMU_BUILD", os.path.join(vtest.ROOT, "build", "emu")), "varent")
TOL = 3e-2  # max|diff| / max|ref|: the device keeps K and V in bf16 (test_emu_cli.py)
PRESETS = (("llama3-tiny", "bf16", 11), ("llama-mha-untied", "f32", 12), ("qwen2-tiny", "bf16", 13),
           ("qwen3-tiny", "bf16", 14))
ERRS = []  # (device-vs-CPU error, check) for the summary line
ERRS_TP = []  # two ranks against one device
IDS = [1, 17, 200, 35, 99, 4, 123, 250, 7, 64, 300, 12, 5]


def run(binary, *args, timeout=600):
    import subprocess
    env = dict(os.environ)
    if binary == "mpirun" and "ASAN_OPTIONS" in env:  # make test-asan: Open MPI leaks by design at exit
        env["ASAN_OPTIONS"] += ":detect_leaks=0"   # (test_tp_mpi.py); address and UB checks stay on
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=timeout,
                          env=env)


def logits(binary, d, out, *extra):
    if os.path.exists(out):
        os.remove(out)
    r = run(binary, "logits", "-m", d, "--ids", ",".join(map(str, IDS)), "--out", out, "-t", 1, *extra)
    return (np.fromfile(out, dtype="<f4"), "") if r.returncode == 0 else (None, r.stderr.strip()[-400:])


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def compare(tmp, name, d, args, extra=()):
    """Device against CPU with the same adapter arguments; returns the device's logits."""
    want, why = logits(vtest.VARENT, d, os.path.join(tmp, "cpu.f32"), *args, *extra)
    got, why2 = logits(EMU, d, os.path.join(tmp, "dev.f32"), "--device", "cuda", *args, *extra)
    if want is None or got is None:
        check(False, name, why or why2)
        return None
    e = rel(got, want)
    ERRS.append((e, name))
    check(np.isfinite(got).all() and e <= TOL, name, f"max|diff|/max|ref| = {e:.3g}")
    return got


def active_presets():
    """make test-asan: llama3-tiny and qwen2-tiny (biases) only; the host code is the same
    for every preset and make test runs all four (CI's time)."""
    return (PRESETS[0], PRESETS[2]) if vtest.UNDER_ASAN else PRESETS


def test_presets(tmp):
    for p in PRESETS:
        if p not in active_presets():
            vtest.skip(f"lora_cuda_{p[0]}", "under ASan (make test runs it)")
    for preset, dtype, seed in active_presets():
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=seed, dtype=dtype)
        ad = test_lora.write_adapter(os.path.join(tmp, f"ad-{preset}"), d, seed=seed + 20)
        cpu_base, _ = logits(vtest.VARENT, d, os.path.join(tmp, "cb.f32"))
        cpu_lora, _ = logits(vtest.VARENT, d, os.path.join(tmp, "cl.f32"), "--lora", ad)
        dev_base, why = logits(EMU, d, os.path.join(tmp, "db.f32"), "--device", "cuda")
        far = cpu_base is not None and cpu_lora is not None and rel(cpu_lora, cpu_base) > 10 * TOL
        check(far, f"lora_cuda_{preset}_adapter_matters", f"{rel(cpu_lora, cpu_base):.3g}" if far else "")
        for label, extra in (("prefill", ()), ("decode", ("--chunk", 1))):
            got = compare(tmp, f"lora_cuda_{preset}_{label}_vs_cpu", d, ("--lora", ad), extra)
            # planted: the device's delta is there (its adapted logits are not its base logits)
            check(got is not None and dev_base is not None and rel(got, dev_base) > 10 * TOL,
                  f"lora_cuda_{preset}_{label}_delta_applied", why)
    return os.path.join(tmp, "llama3-tiny")


def test_variants(tmp, d):
    sub = test_lora.write_adapter(os.path.join(tmp, "ad-sub"), d, targets=["q_proj", "v_proj", "down_proj"],
                                  layers=[1], r=3, alpha=5, seed=7, dtype="BF16")
    rs = test_lora.write_adapter(os.path.join(tmp, "ad-rs"), d, r=8, alpha=4, rslora=True, seed=8)
    gu = test_lora.write_adapter(os.path.join(tmp, "ad-gu"), d, targets=["gate_proj", "o_proj"], r=16, seed=9)
    for name, args in (("subset_bf16", ["--lora", sub]), ("rslora", ["--lora", rs]),
                       ("scaled", ["--lora-scaled", rs, 0.35]), ("gate_o_rank16", ["--lora", gu]),
                       ("two_stacked", ["--lora", sub, "--lora-scaled", rs, -1.5])):
        for label, extra in (("prefill", ()), ("decode", ("--chunk", 1))):
            compare(tmp, f"lora_cuda_{name}_{label}_vs_cpu", d, args, extra)
    for label, extra in (("prefill", ()), ("decode", ("--chunk", 1))):
        b, why = logits(EMU, d, os.path.join(tmp, "b.f32"), "--device", "cuda", *extra)
        z, why2 = logits(EMU, d, os.path.join(tmp, "z.f32"), "--device", "cuda", "--lora-scaled", rs, 0, *extra)
        check(b is not None and z is not None and b.tobytes() == z.tobytes(), f"lora_cuda_scale_0_bit_identical_{label}",
              why or why2)


def test_greedy(tmp):
    stories = stories_dir("f32")
    # gentle enough that the text stays a story (no near ties to tip the bf16 KV cache's way), strong enough
    # that it is another story than the base model's
    gentle = lambda t: t.update({k: v * 0.15 for k, v in t.items() if "lora_B" in k})  # noqa: E731
    ad = test_lora.write_adapter(os.path.join(tmp, "ad-stories"), stories, seed=21, edit=gentle)
    args = ("run", "-m", stories, "-p", "Once upon a time", "-n", 40, "--temp", 0, "--lora", ad)
    cpu, dev, base = run(vtest.VARENT, *args), run(EMU, *args, "--device", "cuda"), run(EMU, *args[:-2], "--device", "cuda")
    check(cpu.returncode == 0 and dev.returncode == 0 and dev.stdout == cpu.stdout and dev.stdout != base.stdout,
          "lora_cuda_greedy_text_equals_cpu", f"rc {dev.returncode} {dev.stderr[-300:]!r}: {dev.stdout!r} vs "
          f"{cpu.stdout!r} (base {base.stdout!r})")
    return stories, ad


def server_answers(binary, stories, ad, *extra):
    saved = vtest.VARENT
    vtest.VARENT = binary  # servertest starts vtest.VARENT
    try:
        srv = servertest.Server(stories, "-t", 1, "--lora-modules", f"story-lora={ad}", *extra, name="lora-cuda")
    finally:
        vtest.VARENT = saved
    out = []
    try:
        for model in ("story-lora", "stories260K-f32", "story-lora", "stories260K-f32"):
            st, r = srv.post("/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": 40,
                                                 "temperature": 0}, timeout=300)
            out.append(r["choices"][0]["text"] if st == 200 else f"status {st}: {r}")
        st, r = srv.post("/v1/completions", {"model": "story-lora", "prompt": [1, 403, 407, 261, 500], "max_tokens": 0,
                                             "echo": True, "logprobs": 1}, timeout=300)
        out.append(r["choices"][0]["logprobs"]["token_logprobs"][1:] if st == 200 else f"status {st}: {r}")
    finally:
        srv.stop()
    return out


def test_server(stories, ad):
    cpu = server_answers(vtest.VARENT, stories, ad)
    dev = server_answers(EMU, stories, ad, "--device", "cuda")
    check(dev[:4] == cpu[:4] and cpu[0] != cpu[1], "lora_cuda_server_modules_per_request",
          f"{json.dumps(dev[:4])} vs {json.dumps(cpu[:4])}")
    ok = isinstance(dev[4], list) and isinstance(cpu[4], list) and all(
        abs(a - b) <= TOL * max(1.0, abs(b)) for a, b in zip(dev[4], cpu[4]))
    check(ok, "lora_cuda_server_echo_logprobs", f"{dev[4]} vs {cpu[4]}")


def test_tp(tmp):
    mpi = shutil.which("mpirun") is not None
    for preset, _, seed in active_presets():
        d = os.path.join(tmp, preset)
        ad = os.path.join(tmp, f"ad-{preset}")
        sub = test_lora.write_adapter(os.path.join(tmp, f"ad-sub-{preset}"), d, targets=["k_proj", "o_proj", "up_proj"],
                                      r=5, seed=seed + 40, dtype="BF16")
        args = ("--lora", ad, "--lora-scaled", sub, -0.7)
        for label, extra in (("prefill", ()), ("decode", ("--chunk", 1))):
            one, why = logits(EMU, d, os.path.join(tmp, "one.f32"), "--device", "cuda", *args, *extra)
            loc, why2 = logits(EMU, d, os.path.join(tmp, "loc.f32"), "--devices", "0,1", "--tp", 2, *args, *extra)
            name = f"lora_cuda_tp_{preset}_{label}"
            if one is None or loc is None:
                check(False, name, why or why2)
                continue
            ERRS_TP.append(rel(loc, one))
            check(rel(loc, one) <= 1e-2, f"{name}_devices_0_1", f"max|diff|/max|ref| = {rel(loc, one):.3g}")
            if mpi:
                out = os.path.join(tmp, "mpi.f32")
                if os.path.exists(out):
                    os.remove(out)
                r = run("mpirun", "--allow-run-as-root", "--oversubscribe", "-np", 2, EMU, "logits", "-m", d, "--ids",
                        ",".join(map(str, IDS)), "--out", out, "-t", 1, "--device", "cuda", "--tp", 2, *args, *extra)
                got = np.fromfile(out, dtype="<f4") if r.returncode == 0 else None
                check(got is not None and np.array_equal(got, loc), f"{name}_mpirun_equals_one_process",
                      r.stderr.strip()[-300:])


def main():
    if not os.access(EMU, os.X_OK):
        check(False, "lora_cuda", f"no emulated build at {EMU} (make emu)")
        vtest.done()
    tmp = vtest.tmpdir("lora-cuda")
    d = test_presets(tmp)
    test_variants(tmp, d)
    stories, ad = test_greedy(tmp)
    test_server(stories, ad)
    test_tp(tmp)
    if ERRS_TP:
        print(f"TP (2 emulated GPUs) vs one device max|diff|/max|ref|: worst {max(ERRS_TP):.3g}")
    if ERRS:
        print(f"device vs CPU max|diff|/max|ref|: worst {max(ERRS)[0]:.3g} ({max(ERRS)[1]}), median "
              f"{sorted(ERRS)[len(ERRS) // 2][0]:.3g} over {len(ERRS)} comparisons")
    vtest.done()


if __name__ == "__main__":
    main()
