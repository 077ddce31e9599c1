"""The CPU forward's weights copied into huge pages (model/place.c) against the weights
read from the file mapping (--mmap): logits bit for bit on every architecture, tied and
untied, bf16 and f32, in prefill and one token at a time; both within the numpy
reference's tolerance (the copy could be exact and still wrong: a short copy reads zeros).
Under an MPI launch each rank copies only its share: a 2-rank run writes the same text
with and without --mmap."""
import os
import shutil
import subprocess

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import ref_model


def logits(tmp, d, ids, *extra):
    out = os.path.join(tmp, "l.f32")
    r = vtest.varent("logits", "-m", d, "--ids", ",".join(map(str, ids)), "-o", out, *extra)
    return (np.fromfile(out, dtype=np.float32), "") if r.returncode == 0 else (None, r.stderr[-300:])


def same_logits(tmp):
    for preset, dtype in (("llama3-tiny", "bf16"), ("llama-mha-untied", "bf16"), ("qwen2-tiny", "f32"),
                          ("qwen3-tiny", "bf16")):
        d = os.path.join(tmp, f"{preset}-{dtype}")
        gen.generate(preset, d, seed=11, dtype=dtype)
        model = ref_model.Model(d)
        ids = np.random.default_rng(3).integers(3, model.cfg.vocab, 30).tolist()
        want = ref_model.forward(model, ids)[-1]
        scale = float(np.max(np.abs(want)))
        for tag, batch in (("prefill", "64"), ("one_by_one", "1")):
            placed, e1 = logits(tmp, d, ids, "-b", batch)
            mapped, e2 = logits(tmp, d, ids, "-b", batch, "--mmap")
            ok = placed is not None and mapped is not None
            err = float(np.max(np.abs(placed - want)) / scale) if ok else 1.0
            check(ok and np.array_equal(placed, mapped) and err < 1e-4, f"place_{preset}_{dtype}_{tag}",
                  e1 or e2 or f"bit-identical {ok and np.array_equal(placed, mapped)}, {err:.3g} from numpy")


def same_text_tp(tmp):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        vtest.skip("place_tp_np2", "mpirun is not installed")
        return
    d = os.path.join(tmp, "qwen3-tiny-bf16")
    texts = []
    for extra in ((), ("--mmap",)):
        cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", vtest.VARENT, "run", "-m", d, "--ids",
               "5,6,7,8", "-n", "24", "--temp", "0", "--ignore-eos", *extra]
        env = dict(os.environ)
        if "ASAN_OPTIONS" in env:  # make test-asan: Open MPI leaks by design at exit (test_tp_mpi.py)
            env["ASAN_OPTIONS"] += ":detect_leaks=0"
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        texts.append((r.returncode, r.stdout, r.stderr[-300:]))
    ok = texts[0][0] == 0 and texts[1][0] == 0 and texts[0][1] == texts[1][1] and texts[0][1]
    check(bool(ok), "place_tp_np2_same_text", f"{texts}")


def bench_line(tmp):
    """varent bench says where the weights are read from, and how much is in huge pages."""
    d = os.path.join(tmp, "llama3-tiny-bf16")
    for extra, want in (((), "copied into memory, "), (("--mmap",), "read from the file mapping (--mmap)")):
        r = vtest.varent("bench", "-m", d, "-n", 2, "--prompt-len", 2, "--runs", 1, "--sampler", "none", *extra)
        line = next((l for l in r.stdout.splitlines() if l.startswith("weights ")), "")
        check(r.returncode == 0 and want in line, f"bench_weights_line{'_mmap' if extra else ''}",
              f"{line!r} {r.stderr[-200:]}")


def main():
    tmp = vtest.tmpdir("place")
    same_logits(tmp)
    bench_line(tmp)
    same_text_tp(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
