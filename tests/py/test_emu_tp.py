"""Tensor parallelism on the emulated CUDA devices (docs/distributed.md), against the
one-device run of the same emulated build (never against its own output):
  - logits of `--devices 0,1 --tp 2` (one process, a thread per GPU) and of `mpirun -np 2
    ... --device cuda --tp 2` (a process per GPU, NCCL bootstrapped over MPI) equal
    `--device cuda` within TOL on the four tiny presets and stories260K, prefill and decode
    (--chunk 1: graph-captured steps with the NCCL collectives in the graph); the two
    launch forms compute the same thing, so their logits are bit-identical; --tp 4 on four
    emulated GPUs (KV heads repeated over ranks, uneven head splits) too; eager launches
    (VARENT_CUDA_GRAPHS=0) equal the graph replays bit for bit;
  - greedy stories260K prints the one-device text in both forms;
  - the entropix metrics (run --metrics-out: logit entropy and varentropy over the whole
    vocabulary, attention entropy, varentropy, agreement and interaction strength over all
    heads, computed on the device after the gathers) match the one-device run, with the
    same tokens and quadrants; LEHV branches (batched rows, KV tails, commits on every
    rank) give the one-device text;
  - second contexts on the shards: the agents' critic (--check-every) makes the one-device
    run's choices and verdicts in both forms (the two forms' logs identical); serve
    --parallel 2 (both forms; under MPI the slots take turns) streams two requests at once
    with the one-device server's texts; interventions (head ablation, a skipped layer, a
    control vector) and captures (logit lens, per-layer attention statistics, activations)
    equal one device's;
  - bad input gives clear errors: --tp larger than the GPUs, a degree that does not divide
    the heads (one process and MPI), a GPU listed twice, --devices without --tp, agents
    on more GPUs than --tp (one group holds one replica); an MPI rank stopped mid-run makes rank 0 fail with a
    message naming the rank that did not arrive, and the launch ends instead of hanging.
TOL: the ranks' partial sums add in another order (fp32), which the bf16 rounding of
prefill activations and of the KV cache can turn into one bf16 step of an element; the
device-against-CPU bound of test_emu_cli.py is 3e-2.
"""
import json
import os
import shutil
import signal
import subprocess

import numpy as np

import vtest
from vtest import check, skip, stories_dir
import gen_random_checkpoint as gen

MODEL = []  # stories260K, set by main
EMU = os.path.join(os.environ.get("EMU_BUILD", os.path.join(vtest.ROOT, "build", "emu")), "varent")
TOL = 1e-2
PRESETS = (("llama3-tiny", "bf16", 11), ("llama-mha-untied", "f32", 12),
           ("qwen2-tiny", "bf16", 13), ("qwen3-tiny", "bf16", 14))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np"]


def run(cmd, env=None, timeout=300):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=timeout, env=e)


def mpi_ok(model, tmp):
    """mpirun present and the emulated build made with MPI."""
    if not shutil.which("mpirun"):
        return False, "no mpirun"
    r = run(MPIRUN + [1, EMU, "logits", "-m", model, "--ids", "1", "--out", os.path.join(tmp, "probe.f32")])
    return r.returncode == 0, r.stderr.strip()[-200:]


def logits(cmd, out, env=None):
    if os.path.exists(out):
        os.remove(out)
    r = run(cmd + ["--out", out], env)
    ok = r.returncode == 0 and os.path.exists(out)
    return (np.fromfile(out, dtype="<f4"), "") if ok else (None, f"rc {r.returncode}: {r.stderr.strip()[-300:]}")


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def compare_logits(name, d, ids, tmp, mpi, extra=()):
    base = ["logits", "-m", d, "--ids", ",".join(map(str, ids)), *extra]
    one, why = logits([EMU, *base, "--device", "cuda"], os.path.join(tmp, "one.f32"))
    loc, why2 = logits([EMU, *base, "--devices", "0,1", "--tp", 2], os.path.join(tmp, "loc.f32"))
    if one is None or loc is None:
        check(False, f"emu_tp_logits_{name}", why or why2)
        return
    e = rel(loc, one)
    check(np.isfinite(loc).all() and e <= TOL, f"emu_tp_logits_{name}_devices_0_1", f"max|diff|/max|ref| = {e:.3g}")
    if mpi:
        got, why = logits(MPIRUN + [2, EMU, *base, "--device", "cuda", "--tp", 2], os.path.join(tmp, "mpi.f32"))
        check(got is not None and rel(got, one) <= TOL and np.array_equal(got, loc), f"emu_tp_logits_{name}_mpirun",
              why or f"vs one device {rel(got, one):.3g}; vs --devices 0,1: max|diff| {np.max(np.abs(got - loc)):.3g}")


def test_logits(tmp, model, mpi):
    for preset, dtype, seed in PRESETS:
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=seed, dtype=dtype)
        ids = list(np.random.default_rng(seed).integers(0, 200, 17))
        compare_logits(f"{preset}_prefill", d, ids, tmp, mpi)
        compare_logits(f"{preset}_decode", d, ids, tmp, mpi, ("--chunk", 1))
    compare_logits("stories260K_prefill", model, [1, 403, 407, 261, 12, 9, 77], tmp, mpi)
    compare_logits("stories260K_decode", model, [1, 403, 407, 261, 9, 77], tmp, mpi, ("--chunk", 1))
    # four GPUs: llama3-tiny's 2 KV heads each on two ranks; the untied model's 6 heads as 2, 1, 2, 1
    for preset in ("llama3-tiny", "llama-mha-untied"):
        d, env = os.path.join(tmp, preset), {"VARENT_EMU_DEVICES": "4"}
        base = ["logits", "-m", d, "--ids", "3,1,4,1,5,9,2,6"]
        one, why = logits([EMU, *base, "--device", "cuda"], os.path.join(tmp, "one.f32"), env)
        four, why2 = logits([EMU, *base, "--devices", "0,1,2,3", "--tp", 4], os.path.join(tmp, "four.f32"), env)
        ok = one is not None and four is not None and rel(four, one) <= TOL
        check(ok, f"emu_tp4_logits_{preset}", why or why2 or f"max|diff|/max|ref| = {rel(four, one):.3g}")
    # graphs against eager launches: the same kernels and collectives, the same bits
    d = os.path.join(tmp, "qwen3-tiny")
    base = [EMU, "logits", "-m", d, "--ids", "5,6,7,8,9", "--chunk", 1, "--devices", "0,1", "--tp", 2]
    g, why = logits(base, os.path.join(tmp, "graph.f32"))
    e, why2 = logits(base, os.path.join(tmp, "eager.f32"), {"VARENT_CUDA_GRAPHS": "0"})
    check(g is not None and e is not None and np.array_equal(g, e), "emu_tp_graph_equals_eager", why or why2)


def text(cmd):
    r = run(cmd)
    return (r.stdout, "") if r.returncode == 0 else (None, f"rc {r.returncode}: {r.stderr.strip()[-300:]}")


def test_greedy(model, mpi):
    base = ["run", "-m", model, "--temp", "0", "-n", 32, "-p", "Once upon a time"]
    one, why = text([EMU, *base, "--device", "cuda"])
    loc, why2 = text([EMU, *base, "--devices", "0,1", "--tp", 2])
    check(one is not None and loc == one, "emu_tp_greedy_stories260K_devices_0_1", why or why2 or f"{loc[:80]!r}")
    if mpi:
        got, why = text(MPIRUN + [2, EMU, *base, "--device", "cuda", "--tp", 2])
        check(one is not None and got == one, "emu_tp_greedy_stories260K_mpirun", why or f"{str(got)[:80]!r}")


KEYS = ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength")


def metrics(cmd, path):
    if os.path.exists(path):
        os.remove(path)
    r = run(cmd + ["--metrics-out", path, "--force"])
    if r.returncode != 0:
        return None, None, f"rc {r.returncode}: {r.stderr.strip()[-300:]}"
    return r.stdout, [json.loads(x) for x in open(path)], ""


def same_metrics(a, b):
    """Same tokens and quadrants, every metric within 1e-3 relative (+1e-4)."""
    if len(a) != len(b):
        return f"{len(a)} records against {len(b)}"
    for x, y in zip(a, b):
        if (x.get("token"), x.get("quadrant")) != (y.get("token"), y.get("quadrant")):
            return f"position {x.get('pos')}: token/quadrant {x.get('token')}/{x.get('quadrant')} against " \
                   f"{y.get('token')}/{y.get('quadrant')}"
        for k in KEYS:
            if abs(x[k] - y[k]) > 1e-4 + 1e-3 * abs(y[k]):
                return f"position {x.get('pos')}: {k} {x[k]} against {y[k]}"
    return ""


def test_metrics(model, tmp, mpi):
    base = ["run", "-m", model, "-n", 24, "--seed", 3, "--sampler", "entropix", "-p", "Once upon a time"]
    t1, m1, why = metrics([EMU, *base, "--device", "cuda"], os.path.join(tmp, "m1.jsonl"))
    t2, m2, why2 = metrics([EMU, *base, "--devices", "0,1", "--tp", 2], os.path.join(tmp, "m2.jsonl"))
    if m1 is None or m2 is None:
        check(False, "emu_tp_entropix_metrics", why or why2)
        return
    attn = any(r["agreement"] > 0 for r in m1)  # the capture layer was on: attention metrics to compare
    diff = same_metrics(m2, m1) or ("" if attn else "no attention metrics in the one-device run")
    check(t2 == t1 and not diff, "emu_tp_entropix_metrics_devices_0_1", diff or "the texts differ")
    if mpi:
        t3, m3, why = metrics(MPIRUN + [2, EMU, *base, "--device", "cuda", "--tp", 2], os.path.join(tmp, "m3.jsonl"))
        check(m3 is not None and t3 == t1 and m3 == m2, "emu_tp_entropix_metrics_mpirun",
              why or same_metrics(m3, m2) or "the text differs")


def test_branches(model, tmp):
    base = ["run", "-m", model, "-p", "Once upon a time", "-n", 24, "--seed", 5, "--sampler", "entropix", "--branch",
            "3:8", "--set", "order=LEHV", "--set", "LEHV.entropy.max=inf", "--set", "LEHV.varentropy.min=-1"]
    t1, m1, why = metrics([EMU, *base, "--device", "cuda"], os.path.join(tmp, "b1.jsonl"))
    t2, m2, why2 = metrics([EMU, *base, "--devices", "0,1", "--tp", 2], os.path.join(tmp, "b2.jsonl"))
    quads = [r.get("quadrant") for r in m2] if m2 else []
    check(t1 is not None and t2 == t1 and "BRANCH" in quads, "emu_tp_lehv_branches_devices_0_1",
          why or why2 or f"texts equal {t1 == t2}; quadrants {sorted(set(map(str, quads)))}")


def st_arrays(path):
    """{name: float32 array} of a safetensors file of F32 tensors."""
    h, data = vtest.read_st(path)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype="<f4").reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}


def captures(tmp, tag, launch, devices):
    """(metrics records, activations) of a greedy run with every capture on, or an error."""
    m, a = os.path.join(tmp, f"cap-{tag}.jsonl"), os.path.join(tmp, f"cap-{tag}.safetensors")
    r = run(launch + [EMU, "run", "-m", MODEL[0], "-p", "Once upon a time", "-n", 6, "--temp", 0, "--logit-lens",
                      "--attn-layers", "all", "--metrics-out", m, "--force", "--dump-acts", a, "--dump-points",
                      "resid_pre,attn_out,resid_mid,mlp_out,resid_post", "--dump-layers", "all"] + devices)
    if r.returncode != 0:
        return f"rc {r.returncode}: {r.stderr.strip()[-300:]}"
    return [json.loads(x) for x in open(m)], st_arrays(a)


def captures_differ(got, one):
    """'' when two captures() agree: the logit lens' top tokens, its entropies and the
    per-layer attention statistics within 1e-3 relative (+1e-4), the activations within TOL."""
    if isinstance(got, str) or isinstance(one, str):
        return got if isinstance(got, str) else one
    (mg, ag), (mo, ao) = got, one
    if len(mg) != len(mo) or sorted(ag) != sorted(ao) or not ao:
        return f"{len(mg)} records against {len(mo)}; tensors {sorted(ag)[:3]} against {sorted(ao)[:3]}"
    for x, y in zip(mg, mo):
        for lx, ly in zip(x["logit_lens"], y["logit_lens"]):
            if [t["id"] for t in lx["top"]] != [t["id"] for t in ly["top"]] or \
                    abs(lx["entropy"] - ly["entropy"]) > 1e-4 + 1e-3 * abs(ly["entropy"]):
                return f"pos {x['pos']} layer {lx['layer']}: lens {lx} against {ly}"
        for ax, ay in zip(x["attn_layers"], y["attn_layers"]):
            for k in ("entropy", "varentropy"):
                u, v = (np.array([np.nan if e is None else e for e in z[k]], dtype=float) for z in (ax, ay))
                if u.shape != v.shape or not np.allclose(u, v, rtol=1e-3, atol=1e-4):
                    return f"pos {x['pos']} layer {ax['layer']}: attention {k} {u} against {v}"
        if len(x["attn_layers"]) != len(y["attn_layers"]) or not y["attn_layers"] or not y["logit_lens"]:
            return f"pos {x['pos']}: {len(x['attn_layers'])} attention layers against {len(y['attn_layers'])}"
    worst = max((rel(ag[k], ao[k]), k) for k in ao)
    return "" if worst[0] <= TOL else f"{worst[1]}: max|diff|/max|ref| = {worst[0]:.3g}"


def test_hooks(tmp, mpi):
    """Interventions and captures on the shards against one device: head ablation (heads
    of both ranks), a skipped layer and a control vector, in prefill and in decode; the
    logit lens, every layer's attention statistics (each layer's heads gathered) and the
    five activation points of every layer."""
    d = MODEL[0]
    cv, pos, neg = (os.path.join(tmp, x) for x in ("cv.gguf", "pos.txt", "neg.txt"))
    open(pos, "w").write("The girl was happy and laughed.\nWhat a sunny day!\n")
    open(neg, "w").write("The girl was sad and cried.\nWhat a gloomy day.\n")
    if os.path.exists(cv):
        os.remove(cv)
    r = vtest.varent("cvector", "-m", d, "--positive", pos, "--negative", neg, "-o", cv)  # the CPU build
    hooks = ["--ablate-head", "0:5", "--ablate-head", "4:2", "--skip-layer", 2]
    if r.returncode == 0:
        hooks += ["--control-vector-scaled", cv, 2]
    else:
        check(False, "emu_tp_hooks_control_vector", r.stderr[-300:])
    ids = ["--ids", "5,6,7,8,9,10,11,12,13"]
    for mode, extra in (("prefill", []), ("decode", ["--chunk", 1])):
        base, _ = logits([EMU, "logits", "-m", d, *ids, *extra, "--device", "cuda"], os.path.join(tmp, "h0.f32"))
        one, why = logits([EMU, "logits", "-m", d, *ids, *extra, *hooks, "--device", "cuda"], os.path.join(tmp, "h1.f32"))
        loc, why2 = logits([EMU, "logits", "-m", d, *ids, *extra, *hooks, "--devices", "0,1", "--tp", 2],
                           os.path.join(tmp, "h2.f32"))
        ok = one is not None and loc is not None and base is not None and rel(loc, one) <= TOL and rel(one, base) > 1e-2
        check(ok, f"emu_tp_hooks_interventions_{mode}_devices_0_1",
              why or why2 or f"vs one device {rel(loc, one):.3g}; the hooks changed the logits by {rel(one, base):.3g}")
        if mpi:
            got, why = logits(MPIRUN + [2, EMU, "logits", "-m", d, *ids, *extra, *hooks, "--device", "cuda", "--tp", 2],
                              os.path.join(tmp, "h3.f32"))
            check(ok and got is not None and rel(got, one) <= TOL and np.array_equal(got, loc),
                  f"emu_tp_hooks_interventions_{mode}_mpirun", why or "differs from one device or --devices 0,1")
    one = captures(tmp, "one", [], ["--device", "cuda"])
    why = captures_differ(captures(tmp, "loc", [], ["--devices", "0,1", "--tp", 2]), one)
    check(not why, "emu_tp_captures_devices_0_1", why)
    if mpi:
        why = captures_differ(captures(tmp, "mpi", MPIRUN + [2], ["--device", "cuda", "--tp", 2]), one)
        check(not why, "emu_tp_captures_mpirun", why)


def agents_log(tmp, name, launch, devices):
    path = os.path.join(tmp, name + ".jsonl")
    r = run(launch + [EMU, "agents", "-m", MODEL[0], "-p", "Once upon a time", "-n", 12, "-s", 9, "--check-every", 3,
                      "--rollback", 1, "--log", path, "--force"] + devices)
    if r.returncode != 0 or not os.path.exists(path):
        return None, f"rc {r.returncode}: {r.stderr.strip()[-300:]}"
    return [x for x in open(path).read().splitlines() if '"tok_per_s"' not in x], r.stdout


def test_agents_critic(tmp, mpi):
    """The agents with their critic, a second context on the sharded model: the one-device
    run's choices, verdicts and rollbacks; entropies and the critic's log-probabilities
    within TOL (its prompt is a bf16 prefill, the ranks' sums reordered: measured 8e-3
    absolute on log-probabilities near -40); the two launch forms' logs identical."""
    one, t1 = agents_log(tmp, "ag1", [], ["--devices", "cuda"])
    loc, t2 = agents_log(tmp, "ag2", [], ["--devices", "0,1", "--tp", 2])
    if one is None or loc is None:
        check(False, "emu_tp_agents_critic", t1 if one is None else t2)
        return
    critic = sum('"event":"critic"' in x for x in one)
    why = vtest.same_decisions(loc, one, TOL) or ("" if critic >= 3 else f"{critic} critic records")
    check(not why and t2 == t1, "emu_tp_agents_critic_devices_0_1", why or f"text {t2!r} against {t1!r}")
    if mpi:
        got, t3 = agents_log(tmp, "ag3", MPIRUN + [2], ["--devices", "cuda", "--tp", 2])
        check(got is not None and got == loc and t3 == t1, "emu_tp_agents_critic_mpirun",
              t3 if got is None else vtest.same_decisions(got, loc, 0) or "the text differs")


def serve_two(cmd, launch=()):
    """Two requests at once on a server started with cmd; [(text, first, end)] or an error."""
    import socket
    import threading
    import time
    import urllib.request
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    p = subprocess.Popen(list(map(str, [*launch, EMU, "serve", "-m", MODEL[0], "--port", port, "--parallel", 2] + cmd)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except Exception:
                if p.poll() is not None:
                    return f"rc {p.returncode}: {p.stderr.read()[-300:]}"
                time.sleep(0.1)
        bodies = ({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.8, "seed": 5},
                  {"prompt": "The cat", "max_tokens": 24, "temperature": 0})
        out = [None, None]
        th = [threading.Thread(target=vtest.stream_completion, args=(port, b, out, i)) for i, b in enumerate(bodies)]
        [t.start() for t in th]
        [t.join() for t in th]
        return out
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


def test_serve_parallel(mpi):
    """serve --parallel 2 on --devices 0,1 --tp 2 and on mpirun -np 2 --device cuda --tp 2:
    two requests at once, each on its slot (the second a second context on the shards),
    stream the one-device server's texts, and both are under way at once (each sent a
    token before either ended; under MPI the slots take turns at the collectives)."""
    one = serve_two(["--device", "cuda"])
    forms = [("devices_0_1", serve_two(["--devices", "0,1", "--tp", 2]))]
    if mpi:
        forms.append(("mpirun", serve_two(["--device", "cuda", "--tp", 2], MPIRUN + [2])))
    for name, two in forms:
        if isinstance(one, str) or isinstance(two, str):
            check(False, f"emu_tp_serve_parallel_2_{name}", one if isinstance(one, str) else two)
            continue
        same = [a[0] for a in one] == [b[0] for b in two] and all(a[0] for a in one)
        overlap = all(b[1] for b in two) and max(b[1] for b in two) < min(b[2] for b in two)
        check(same and overlap, f"emu_tp_serve_parallel_2_{name}_same_texts_at_once",
              f"texts {[b[0] for b in two]!r} against {[a[0] for a in one]!r}; at once {overlap}")


def test_bad_input(tmp, model, mpi):
    d = os.path.join(tmp, "llama3-tiny")  # 4 query heads, 2 KV heads
    base = [EMU, "logits", "-m", d, "--ids", "1,2,3", "--out", os.path.join(tmp, "bad.f32")]
    cases = (
        ("tp_over_devices", ["--device", "cuda", "--tp", 4], {}, "--tp 4 needs 4 GPUs, 2 CUDA devices found"),
        ("tp_over_list", ["--devices", "0,1", "--tp", 4], {}, "--tp 4 needs 4 GPUs, --devices 0,1 lists 2"),
        ("degree_not_dividing", ["--devices", "0,1,2", "--tp", 3], {"VARENT_EMU_DEVICES": "4"},
         "cannot be split over 3 ranks"),
        ("gpu_twice", ["--devices", "0,0", "--tp", 2], {}, "cuda:0 twice"),
        ("devices_without_tp", ["--devices", "0,1"], {}, "give --tp N"),
    )
    for name, extra, env, want in cases:
        r = run(base + extra, env)
        check(r.returncode != 0 and want in r.stderr, f"emu_tp_refuses_{name}", f"rc {r.returncode}: {r.stderr[-300:]}")
    # one group holds one replica: more GPUs than --tp for the agents is refused
    r = run([EMU, "agents", "-m", model, "-p", "Hi", "-n", 2, "--devices", "0,1,2", "--tp", 2],
            {"VARENT_EMU_DEVICES": "4"})
    check(r.returncode == 2 and "a tensor-parallel group holds one replica" in r.stderr,
          "emu_tp_refuses_agents_more_gpus_than_tp", f"rc {r.returncode}: {r.stderr[-300:]}")
    if mpi:
        r = run(MPIRUN + [3] + base + ["--device", "cuda"], {"VARENT_EMU_DEVICES": "3"})
        check(r.returncode != 0 and "cannot be split over 3 ranks" in r.stderr, "emu_tp_refuses_mpirun_degree",
              f"rc {r.returncode}: {r.stderr[-300:]}")


def rank_pids(parent):
    """{MPI rank: pid} of mpirun's children."""
    out = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) != parent:
                continue
            for e in open(f"/proc/{p}/environ", "rb").read().split(b"\0"):
                if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                    out[int(e.split(b"=")[1])] = int(p)
        except (OSError, ValueError, IndexError):
            pass
    return out


def test_stuck_rank(model):
    """A rank that stops answering mid-run (SIGSTOP): rank 0 gives up with a clear error and
    the launch ends, instead of hanging (the emulated NCCL's 3 s timeout here; on GPUs the
    stream wait's --tp-timeout)."""
    import signal
    import time
    cmd = MPIRUN + [2, "-x", "VARENT_EMU_NCCL_TIMEOUT", EMU, "run", "-m", model, "--temp", 0, "-n", 400, "-p",
                    "Once upon a time", "--device", "cuda", "--tp", 2, "--tp-timeout", 30]
    import select
    p = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, VARENT_EMU_NCCL_TIMEOUT="3"))
    select.select([p.stdout], [], [], 60)  # rank 0 prints once the session (and its NCCL group) is up
    time.sleep(0.5)
    pids = rank_pids(p.pid)
    if 1 in pids:
        os.kill(pids[1], signal.SIGSTOP)
    t0 = time.time()
    try:
        _, err = p.communicate(timeout=90)
        hung = False
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        hung = True
    for pid in pids.values():  # whatever mpirun left behind
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    took = time.time() - t0
    ok = 1 in pids and not hung and p.returncode != 0 and "tensor parallelism (rank 0 of 2" in err and \
        "rank 1 did not arrive" in err
    check(ok, "emu_tp_stuck_rank_is_an_error_not_a_hang",
          f"ranks {pids}, hung {hung}, rc {p.returncode} after {took:.0f} s: {err.strip()[-400:]}")


def main():
    if not os.access(EMU, os.X_OK):
        check(False, "emu_tp", f"no emulated build at {EMU} (make emu)")
        vtest.done()
    tmp = vtest.tmpdir("emu-tp")
    model = stories_dir("f32")
    MODEL.append(model)
    mpi, why = mpi_ok(model, tmp)
    if not mpi:
        skip("emu_tp_mpirun", f"the MPI launch form: {why}")
    test_logits(tmp, model, mpi)
    if vtest.UNDER_ASAN:
        # make test-asan: the metrics runs take the same TP decode path as the greedy text,
        # and the branches the batch forward test_cuda_forward_batch runs; make test runs
        # both (about 40 s of CI's time under ASan)
        skip("emu_tp_greedy", "under ASan (make test runs it)")
        skip("emu_tp_lehv_branches", "under ASan (make test runs it)")
    else:
        test_greedy(model, mpi)
        test_branches(model, tmp)
    test_metrics(model, tmp, mpi)
    test_hooks(tmp, mpi)
    test_agents_critic(tmp, mpi)
    test_serve_parallel(mpi)
    test_bad_input(tmp, model, mpi)
    if mpi:
        test_stuck_rank(model)
    vtest.done()


if __name__ == "__main__":
    main()
