"""Tensor parallelism over MPI on the CPU (docs/distributed.md): `mpirun -np N varent ...`.

  - logits of N = 2 and 4 ranks vs the numpy reference forward (tests/reference) and the
    one-process logits, on every tiny preset (Llama 3, untied MHA with uneven head
    splits, Qwen2, Qwen3) and on stories260K, with prefill chunks that split the prompt;
  - greedy text and the entropix sampler's tokens and JSONL metrics equal the one-process
    run; the output appears once (rank 0 prints, the others are silent);
  - agents over ranks (replicas, lookahead, tensor-parallel groups): logs byte-identical
    to the one-process run, the done record's tok_per_s aside; one tensor-parallel group
    (the critic a second context on the shards) makes the one-process run's choices and
    verdicts, its floats within 1e-4;
  - serve under mpirun, with one slot and with --parallel 2 (the slots taking turns at
    the collectives): the one-process server's texts;
  - bad input: a degree that does not split the heads, --tp without mpirun, --tp that is
    not the launch's size, ranks holding different checkpoints, a rank killed mid-run
    and a rank that stops answering (--tp-timeout): a clear error and a non-zero exit,
    never a hang.
"""
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import ref_model
import slowmodel

MPIRUN = shutil.which("mpirun")
# Under make test-asan: Open MPI leaks by design at exit (its dlopen'ed components are
# unloaded by then, so no suppression can name them). The launched ranks run without
# leak detection; address and UB checks stay on, and tests/c/test_tp_shard.c covers the
# sharding's own memory with leak detection, its ranks as threads.
if "ASAN_OPTIONS" in os.environ:
    os.environ["ASAN_OPTIONS"] += ":detect_leaks=0"
PRESETS = ("llama3-tiny", "llama-mha-untied", "qwen2-tiny", "qwen3-tiny")


def mpirun(n, *args, timeout=180):
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n), vtest.VARENT, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def logits(tmp, name, d, ids, n=1, *extra):
    out = os.path.join(tmp, name + ".f32")
    args = ("logits", "-m", d, "--ids", ",".join(map(str, ids)), "-o", out, *extra)
    r = mpirun(n, *args) if n > 1 else vtest.varent(*args)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip()[-400:]}"
    return np.fromfile(out, dtype=np.float32), ""


def close(a, b, atol=2e-4, rtol=1e-4):
    return a is not None and b is not None and a.shape == b.shape and np.all(np.abs(a - b) <= atol + rtol * np.abs(b))


def diff(a, b):
    return "shape" if a is None or b is None or a.shape != b.shape else f"max |diff| {np.abs(a - b).max():.3g}"


def test_logits(tmp, models):
    for name, d in models:
        model = ref_model.Model(d)
        ids = np.random.default_rng(3).integers(3, model.cfg.vocab, 40).tolist()
        ref = ref_model.forward(model, ids)[-1].astype(np.float32)
        one, why = logits(tmp, f"{name}-1", d, ids)
        check(close(one, ref), f"logits_{name}_one_process_vs_numpy", why or diff(one, ref))
        for n in (2, 4):
            got, why = logits(tmp, f"{name}-{n}", d, ids, n, "-b", 16)
            check(close(got, ref), f"logits_{name}_np{n}_vs_numpy", why or diff(got, ref))
            check(close(got, one, 1e-4, 1e-5), f"logits_{name}_np{n}_vs_one_process", why or diff(got, one))


def test_interventions(tmp, stories):
    """Head ablation (global head numbers on a rank holding other heads), layer skipping, and
    the captures that gather over ranks: --attn-layers all and --logit-lens."""
    ids = list(range(5, 30))
    one, why = logits(tmp, "abl-1", stories, ids, 1, "--ablate-head", "0:5", "--ablate-head", "4:7", "--skip-layer", 2)
    base, _ = logits(tmp, "abl-base", stories, ids)
    for n in (2, 4):
        got, why = logits(tmp, f"abl-{n}", stories, ids, n, "--ablate-head", "0:5", "--ablate-head", "4:7",
                          "--skip-layer", 2)
        check(close(got, one, 1e-4, 1e-5) and not close(one, base, 1e-3, 0), f"ablate_skip_np{n}_vs_one_process",
              why or diff(got, one))
    recs = {}
    for n in (1, 2):
        path = os.path.join(tmp, f"lens{n}.jsonl")
        rc, out, err = run_text(n, "-m", stories, "-p", "Once upon a time", "-n", 6, "--temp", 0, "--logit-lens",
                                "--attn-layers", "all", "--metrics-out", path)
        recs[n] = [json.loads(x) for x in open(path)] if rc == 0 else []
    worst = "" if recs[1] and len(recs[1]) == len(recs[2]) else f"{len(recs[1])} vs {len(recs[2])} records"
    for x, y in zip(recs[1], recs[2]):
        for lx, ly in zip(x["logit_lens"], y["logit_lens"]):
            if [t["id"] for t in lx["top"]] != [t["id"] for t in ly["top"]] or abs(lx["entropy"] - ly["entropy"]) > 1e-4:
                worst = worst or f"pos {x['pos']} layer {lx['layer']} lens {ly} vs {lx}"
        for ax, ay in zip(x["attn_layers"], y["attn_layers"]):
            if not np.allclose(ax["entropy"], ay["entropy"], atol=1e-4) or len(ax["entropy"]) != len(ay["entropy"]):
                worst = worst or f"pos {x['pos']} layer {ax['layer']} attention entropies differ"
    check(not worst, "logit_lens_and_attn_layers_np2_vs_one_process", worst)


def run_text(n, *args):
    r = mpirun(n, "run", *args) if n > 1 else vtest.varent("run", *args)
    return r.returncode, r.stdout, r.stderr


def test_generation(tmp, stories):
    base = ("-m", stories, "-p", "Once upon a time", "-n", 60)
    rc1, out1, err1 = run_text(1, *base, "--temp", 0)
    for n in (2, 4):
        rc, out, err = run_text(n, *base, "--temp", 0)
        check(rc == 0 and out == out1 and out1.strip(), f"greedy_text_np{n}", f"rc={rc} {err[-300:]!r}\n{out!r}\nvs\n{out1!r}")
    metrics = {}
    for n in (1, 2):
        path = os.path.join(tmp, f"metrics{n}.jsonl")
        rc, out, err = run_text(n, *base, "--sampler", "entropix", "-s", 11, "--attn-layer", 2, "--metrics-out", path)
        metrics[n] = [json.loads(x) for x in open(path)] if rc == 0 else None
        if n == 2:
            check(rc == 0 and out == out_e1, "entropix_text_np2", f"rc={rc} {err[-300:]!r}")
        out_e1 = out
    a, b = metrics[1], metrics[2]
    ok = a and b and len(a) == len(b) and all(x["token"] == y["token"] for x, y in zip(a, b))
    worst = ""
    for x, y in zip(a or [], b or []):
        for k in ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength"):
            if abs(x[k] - y[k]) > 1e-4 + 1e-4 * abs(x[k]):
                worst = worst or f"pos {x['pos']} {k}: {y[k]} vs {x[k]}"
    check(ok and not worst, "entropix_metrics_np2_vs_one_process", worst or f"{len(a or [])} vs {len(b or [])} lines")


def test_stdin(stories):
    """Under mpirun stdin reaches rank 0 alone: the prompt and the chat's lines are shared."""
    def both(cmd, text):
        outs = []
        for n in (1, 2):
            pre = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2"] if n > 1 else []
            r = subprocess.run(pre + [vtest.VARENT, *map(str, cmd)], input=text, capture_output=True, text=True,
                               timeout=120)
            outs.append((r.returncode, r.stdout, r.stderr[-300:]))
        return outs
    a, b = both(("run", "-m", stories, "-n", 24, "--temp", 0), "Once upon a time\n")
    check(a[0] == 0 and a[:2] == b[:2] and a[1].strip(), "stdin_prompt_np2", f"{b} vs {a}")
    a, b = both(("chat", "-m", stories, "-n", 12, "--temp", 0, "--chat-template", "chatml"), "Once upon a time\nThe cat\n")
    check(a[0] == 0 and a[:2] == b[:2] and a[1].strip(), "chat_lines_np2", f"{b} vs {a}")


def agents_log(tmp, name, n, stories, *extra):
    path = os.path.join(tmp, name + ".jsonl")
    args = ("agents", "-m", stories, "-p", "Once upon a time", "-n", 24, "-s", 9, "--check-every", 4, "--log", path,
            *extra)
    r = mpirun(n, *args) if n > 1 else vtest.varent(*args)
    if r.returncode != 0:
        return None, r
    lines = open(path).read().splitlines()
    return [ln for ln in lines if '"tok_per_s"' not in ln], r  # the done record holds timings


def test_agents(tmp, stories):
    for tag, extra in (("plain", ()), ("lookahead", ("--lookahead", 3, "--max-parallel", 2))):
        one, r1 = agents_log(tmp, f"agents-{tag}-1", 1, stories, *extra)
        for n in (2, 3):
            got, r = agents_log(tmp, f"agents-{tag}-{n}", n, stories, *extra)
            check(got is not None and got == one and r.stdout == r1.stdout, f"agents_{tag}_np{n}_byte_identical",
                  f"rc={r.returncode} {r.stderr[-300:]!r}")
        tp2, r2 = agents_log(tmp, f"agents-{tag}-tp2", 2, stories, *extra, "--tp", 2)
        tp4, r4 = agents_log(tmp, f"agents-{tag}-2x2", 4, stories, *extra, "--tp", 2)
        check(tp2 is not None and tp2 == tp4 and len(tp2) > 10, f"agents_{tag}_two_tp_groups_equal_one",
              f"rc={r4.returncode} {r4.stderr[-300:]!r}")
        # the sharded model (and its critic, a second context on the shard) against one process
        why = vtest.same_decisions(tp2, one, 1e-4) if tp2 and one else f"rc={r2.returncode} {r2.stderr[-300:]!r}"
        check(not why and r2.stdout == r1.stdout, f"agents_{tag}_tp2_critic_equals_one_process", why or "stdout")


def test_bad_input(tmp, models, stories):
    d = dict(models)["llama3-tiny"]
    r = mpirun(3, "logits", "-m", d, "--ids", "1,2", "-o", os.path.join(tmp, "x.f32"))
    check(r.returncode == 1 and "cannot be split over 3 ranks" in r.stderr and "Degrees that work: 1, 2, 4" in r.stderr,
          "bad_degree_refused", f"rc={r.returncode} {r.stderr[-400:]!r}")
    r = vtest.varent("run", "-m", d, "--ids", "1,2", "-n", 2, "--tp", 2)
    vtest.expect_fail("tp_without_mpirun", r, "mpirun -np 2")
    r = mpirun(4, "run", "-m", d, "--ids", "1,2", "-n", 2, "--tp", 2)
    check(r.returncode == 2 and "one tensor-parallel group of every rank" in r.stderr, "tp_not_the_launch_size",
          f"rc={r.returncode} {r.stderr[-400:]!r}")
    r = mpirun(2, "agents", "-m", stories, "-p", "Hi", "--devices", "cpu,cpu", "--tp", 2)
    check(r.returncode == 2 and "a tensor-parallel group holds one replica" in r.stderr, "agents_devices_with_tp_refused",
          f"rc={r.returncode} {r.stderr[-300:]!r}")
    other = dict(models)["qwen3-tiny"]
    out = os.path.join(tmp, "mix.f32")
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "1", vtest.VARENT, "logits", "-m", d, "--ids", "1,2",
           "-o", out, ":", "-np", "1", vtest.VARENT, "logits", "-m", other, "--ids", "1,2", "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    check(r.returncode == 1 and "rank 1 loaded a different checkpoint from rank 0" in r.stderr and not os.path.exists(out),
          "mismatched_checkpoints_refused", f"rc={r.returncode} {r.stderr[-400:]!r}")


def free_port():
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def post(port, path, body, timeout=60):
    import urllib.request
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def start_server(cmd, port):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, encoding="utf-8", errors="replace")
    for _ in range(300):
        try:
            import urllib.request
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return p
        except Exception:
            if p.poll() is not None:
                return p
            time.sleep(0.1)
    return p


def texts(reply):
    return [c.get("text", c.get("message", {}).get("content")) for c in json.loads(reply)["choices"]]


def test_serve(tmp, stories):
    """serve under mpirun: rank 0 answers, the other ranks follow every request."""
    ports = free_port(), free_port()
    one = start_server([vtest.VARENT, "serve", "-m", stories, "--port", str(ports[0])], ports[0])
    two = start_server([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", vtest.VARENT, "serve", "-m",
                        stories, "--port", str(ports[1])], ports[1])
    try:
        reqs = (("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.8, "seed": 5, "n": 2}),
                ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": ["park"]}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "seed": 3}),
                ("/v1/completions", {"prompt": "The cat", "max_tokens": 5, "echo": True, "logprobs": 2, "seed": 1}))
        for i, (path, body) in enumerate(reqs):
            try:
                a, b = texts(post(ports[0], path, body)), texts(post(ports[1], path, body))
                check(a == b and all(a), f"serve_np2_request{i}_same_text", f"{b!r} vs {a!r}")
            except Exception as e:
                check(False, f"serve_np2_request{i}_same_text", repr(e))
        # a client that goes away mid-stream: the ranks stop together and the next request still works
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", ports[1], timeout=30)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "Once", "max_tokens": 400, "stream": True,
                                                         "seed": 2}), {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read(200)
        c.close()
        time.sleep(0.5)
        body = reqs[0][1]
        try:
            b = texts(post(ports[1], reqs[0][0], body))
            check(b == texts(post(ports[0], reqs[0][0], body)), "serve_np2_after_cancelled_stream", repr(b))
        except Exception as e:
            check(False, "serve_np2_after_cancelled_stream", repr(e))
    finally:
        for p in (one, two):
            p.send_signal(signal.SIGTERM)
        for p in (one, two):
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    check(two.returncode is not None, "serve_np2_stops_on_sigterm", "still running")


def serve_parallel(cmd, port, reqs):
    """Every request at once on a server started with cmd (--parallel 2); the texts, two
    streams' (text, first token, end), or an error."""
    import threading
    p = start_server(cmd, port)
    try:
        out, streams = [None] * len(reqs), [None, None]

        def one(i):
            try:
                out[i] = texts(post(port, *reqs[i]))
            except Exception as e:
                out[i] = repr(e)
        bodies = ({"prompt": "Once upon a time", "max_tokens": 60, "seed": 7}, {"prompt": "The dog", "max_tokens": 60,
                                                                                   "temperature": 0})
        for th in ([threading.Thread(target=one, args=(i,)) for i in range(len(reqs))],
                   [threading.Thread(target=vtest.stream_completion, args=(port, b, streams, i))
                    for i, b in enumerate(bodies)]):  # the requests, then the two streams alone
            [t.start() for t in th]
            [t.join() for t in th]
        return out, streams
    except Exception as e:
        return repr(e), None
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


def test_serve_parallel(tmp, stories):
    """serve --parallel 2 under mpirun: the slots take turns at the collectives; four
    requests at once (two choices with a seed, greedy with a stop string, a chat
    completion, echo with logprobs), then two streams at once, give the one-process
    server's texts, and the two streams are under way at once."""
    reqs = (("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0.8, "seed": 5, "n": 2}),
            ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": ["park"]}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "seed": 3}),
            ("/v1/completions", {"prompt": "The cat", "max_tokens": 5, "echo": True, "logprobs": 2, "seed": 1}))
    ports = free_port(), free_port()
    opts = ["--parallel", "2", "--token-delay-ms", "5"]  # the streams last long enough to meet
    a, sa = serve_parallel([vtest.VARENT, "serve", "-m", stories, "--port", str(ports[0]), *opts], ports[0], reqs)
    b, sb = serve_parallel([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", vtest.VARENT, "serve", "-m",
                            stories, "--port", str(ports[1]), *opts], ports[1], reqs)
    ok = isinstance(a, list) and a == b and all(isinstance(x, list) and all(x) for x in a)
    same = sa and sb and [x[0] for x in sa] == [x[0] for x in sb] and all(x[1] for x in sb)
    check(ok and same, "serve_np2_parallel_2_same_texts", f"{b!r} vs {a!r}; streams {sb!r} vs {sa!r}")
    check(same and max(x[1] for x in sb) < min(x[2] for x in sb), "serve_np2_parallel_2_streams_at_once", repr(sb))


def rank_pid(mpi, rank):
    """The pid of the given MPI rank among mpirun's children."""
    for _ in range(200):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if ppid == mpi.pid and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
                return int(pid)
        time.sleep(0.05)
    return None


def first_output(proc, timeout):
    """Waits until proc has written to stdout (at most timeout seconds)."""
    import select
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return bool(ready)


def test_rank_failures(tmp, stories):
    slow = os.path.join(tmp, "slow")
    slowmodel.write_slow_model(slow, stories)
    # (what, signal, options, the message, seconds after rank 0's text begins; 0: as soon
    # as rank 1 starts, inside MPI's start-up, where only the watchdog armed before
    # MPI_Init helps).
    for what, sig, extra, needle, delay in (
            ("killed", signal.SIGKILL, (), "rank 1", 0.1),
            ("stopped", signal.SIGSTOP, ("--tp-timeout", 3), "waited more than 3 s", 0.1),
            ("stopped_at_start", signal.SIGSTOP, ("--tp-timeout", 3), "waited more than 3 s", 0)):
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", vtest.VARENT, "run", "-m", slow, "-p",
               "Once upon a time", "-n", "1500", "--ctx", "2048", "--temp", "0", *map(str, extra)]
        mpi = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8", errors="replace")
        pid = rank_pid(mpi, 1)
        if delay:  # mid run: once rank 0's text has begun (a fixed delay could land after the end)
            first_output(mpi, 60)
            time.sleep(delay)
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pid = None  # rank 1 already gone: the check below says so
        t0 = time.time()
        try:
            out, err = mpi.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            mpi.kill()
            out, err = mpi.communicate()
            err = "HUNG for 60 s\n" + err
        if pid and sig == signal.SIGSTOP:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        took = time.time() - t0
        name = f"rank_{what}_stops_all" if delay == 0 else f"rank_{what}_mid_run_stops_all"
        check(pid is not None and mpi.returncode != 0 and needle in err and took < 60, name,
              f"pid={pid} rc={mpi.returncode} after {took:.1f} s, stderr {err[-500:]!r}")


def main():
    if not MPIRUN:
        vtest.skip("tp_mpi", "mpirun is not installed (tools/install-deps.sh installs openmpi-bin)")
        return vtest.done()
    if " mpi" not in vtest.varent("--version").stdout:
        vtest.skip("tp_mpi", "varent was built without MPI")
        return vtest.done()
    tmp = vtest.tmpdir("tp")
    models = []
    for p in PRESETS:
        d = os.path.join(tmp, p)
        gen.generate(p, d, seed=4)
        models.append((p, d))
    stories = vtest.stories_dir()
    test_logits(tmp, models + [("stories260K", stories)])
    test_generation(tmp, stories)
    test_interventions(tmp, stories)
    test_stdin(stories)
    test_agents(tmp, stories)
    test_serve(tmp, stories)
    test_serve_parallel(tmp, stories)
    test_bad_input(tmp, models, stories)
    test_rank_failures(tmp, stories)
    shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
