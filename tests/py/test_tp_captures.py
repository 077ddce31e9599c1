"""The captures (--dump-acts, --dump-attn, --attn-layers, --logit-lens; docs/research.md)
under tensor parallelism over MPI on the CPU (`mpirun -np N varent ... --tp 2`): agents
(one tensor-parallel group, and two groups of 2 with lookahead), serve (rank 0 answers,
rank 1 follows; a file per choice) and ppl against the same commands in one process.
Only rank 0 writes the files; the gathered rows are the same on every rank."""
import json
import os
import shutil
import signal
import subprocess

import numpy as np

import vtest
from vtest import check
from test_interp import read_tensors
from test_tp_mpi import MPIRUN, free_port, mpirun, post, start_server

CAPTURES = ("--dump-points", "resid_post,attn_out", "--attn-layers", "all", "--logit-lens")


def same_files(name, a, b, tol=1e-4):
    """Two capture files: the same tensors, ids and positions equal, values within tol."""
    if not check(os.path.exists(a) and os.path.exists(b), name + "_written", f"{a} {b}"):
        return
    x, y = read_tensors(a), read_tensors(b)
    worst, ok = 0.0, sorted(x) == sorted(y)
    for k in x if ok else ():
        ok = ok and x[k].shape == y[k].shape
        if ok and k in ("ids", "positions"):
            ok = list(x[k]) == list(y[k])
        elif ok:
            worst = max(worst, float(np.max(np.abs(np.asarray(x[k], float) - np.asarray(y[k], float)), initial=0)))
    check(ok and worst < tol, name + "_same_as_one_process", f"tensors {sorted(x)[:4]}.. worst {worst:.3g}")


def same_members(name, xs, ys):
    """attn_layers and logit_lens of matching records: equal top ids, entropies within 1e-4."""
    worst = "" if xs and len(xs) == len(ys) else f"{len(xs)} vs {len(ys)} records"
    for x, y in zip(xs, ys):
        if "logit_lens" not in y or "attn_layers" not in y:
            worst = worst or "members missing"
            break
        for lx, ly in zip(x["logit_lens"], y["logit_lens"]):
            if [t["id"] for t in lx["top"]] != [t["id"] for t in ly["top"]] or abs(lx["entropy"] - ly["entropy"]) > 1e-4:
                worst = worst or f"layer {lx['layer']} lens differs"
        for ax, ay in zip(x["attn_layers"], y["attn_layers"]):
            if len(ax["entropy"]) != len(ay["entropy"]) or not np.allclose(ax["entropy"], ay["entropy"], atol=1e-4):
                worst = worst or f"layer {ax['layer']} attention entropies differ"
    check(not worst, name + "_records_same_as_one_process", worst)


def files(tmp, tag):
    return os.path.join(tmp, tag + ".acts.st"), os.path.join(tmp, tag + ".attn.st"), os.path.join(tmp, tag + ".jsonl")


def run(n, *args):
    return mpirun(n, *args, "--tp", 2) if n > 1 else vtest.varent(*args)


def test_agents(tmp, stories):
    for tag, n, extra in (("agents", 2, ()), ("agents-lookahead", 4, ("--lookahead", 3))):
        got = {}
        for k in (1, n):
            acts, attn, log = files(tmp, f"{tag}-{k}")
            r = run(k, "agents", "-m", stories, "-p", "Once upon a time", "-n", 10, "-s", 9, "--check-every", 4,
                    "--log", log, "--dump-acts", acts, "--dump-attn", attn, *CAPTURES, *extra)
            got[k] = (r, acts, attn, log)
        (r1, a1, t1, l1), (rn, an, tn, ln) = got[1], got[n]
        if not check(r1.returncode == 0 and rn.returncode == 0 and rn.stdout == r1.stdout, f"{tag}_np{n}_tp2_runs",
                     f"rc={rn.returncode} {rn.stderr[-400:]!r}"):
            continue
        same_files(f"{tag}_np{n}_acts", a1, an)
        same_files(f"{tag}_np{n}_attn", t1, tn)
        steps = [[json.loads(x) for x in open(p) if '"event":"step"' in x] for p in (l1, ln)]
        same_members(f"{tag}_np{n}", steps[0], steps[1])


def test_ppl(tmp, stories):
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.\n")
    got = {}
    for k in (1, 2):
        acts, attn, log = files(tmp, f"ppl-{k}")
        got[k] = (run(k, "ppl", "-m", stories, "-f", text, "--ctx", 12, "--stride", 5, "-q", "--per-token", log,
                      "--dump-acts", acts, "--dump-attn", attn, *CAPTURES), acts, attn, log)
    (r1, a1, t1, l1), (r2, a2, t2, l2) = got[1], got[2]
    if check(r1.returncode == 0 and r2.returncode == 0 and r1.stdout == r2.stdout, "ppl_np2_tp2_runs",
             f"rc={r2.returncode} {r2.stderr[-400:]!r}"):
        same_files("ppl_np2_acts", a1, a2)
        same_files("ppl_np2_attn", t1, t2)
        recs = [[json.loads(x) for x in open(p) if '"logit_lens"' in x] for p in (l1, l2)]
        same_members("ppl_np2", recs[0], recs[1])


def test_serve(tmp, stories):
    dirs = {k: (os.path.join(tmp, f"serve{k}-acts"), os.path.join(tmp, f"serve{k}-attn")) for k in (1, 2)}
    for d in dirs.values():
        for x in d:
            os.makedirs(x, exist_ok=True)
    ports = free_port(), free_port()
    common = ("serve", "-m", stories, *CAPTURES)
    one = start_server([vtest.VARENT, *common, "--port", str(ports[0]), "--dump-acts", dirs[1][0], "--dump-attn",
                        dirs[1][1]], ports[0])
    two = start_server([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", vtest.VARENT, *common, "--port",
                        str(ports[1]), "--tp", "2", "--dump-acts", dirs[2][0], "--dump-attn", dirs[2][1]], ports[1])
    try:
        body = {"prompt": [1, 403, 407, 261], "max_tokens": 5, "temperature": 0, "metrics": True}
        try:
            a, b = json.loads(post(ports[0], "/v1/completions", body)), json.loads(post(ports[1], "/v1/completions", body))
        except Exception as e:
            a = b = None
            check(False, "serve_np2_tp2_captures_answer", repr(e))
        if a and b:
            ca, cb = a["choices"][0], b["choices"][0]
            check(ca["text"] == cb["text"] and "capture" in cb, "serve_np2_tp2_captures_answer", str(cb)[:300])
            same_members("serve_np2", ca["metrics"], cb["metrics"])
            for k, what in enumerate(("acts", "attn")):
                same_files(f"serve_np2_{what}", os.path.join(dirs[1][k], ca["capture"][what]),
                           os.path.join(dirs[2][k], cb["capture"][what]))
    finally:
        for p in (one, two):
            p.send_signal(signal.SIGTERM)
        for p in (one, two):
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    left = [f for d in dirs[2] for f in os.listdir(d)]
    check(len(left) == 2 and all(f.endswith(".safetensors") for f in left), "serve_np2_rank0_writes_once", str(left))


def main():
    if not MPIRUN:
        vtest.skip("tp_captures", "mpirun is not installed (tools/install-deps.sh installs openmpi-bin)")
        return vtest.done()
    if " mpi" not in vtest.varent("--version").stdout:
        vtest.skip("tp_captures", "varent was built without MPI")
        return vtest.done()
    tmp = vtest.tmpdir("tp-captures")
    stories = vtest.stories_dir()
    test_agents(tmp, stories)
    test_ppl(tmp, stories)
    test_serve(tmp, stories)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
