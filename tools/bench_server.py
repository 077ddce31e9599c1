#!/usr/bin/env python3
"""bench_server: the server's per-token overhead over `varent run` (docs/benchmarks.md).

  bench_server.py MODEL_DIR [--tokens N] [--reps R] [--threads T] [--prompt TEXT] [--varent PATH]

Same model, prompt, seed and sampling on both sides; R repetitions, medians reported:
  run      `varent run --stats` (metrics computed, as the server does): decode tok/s
           from its stats line, and prefill + decode seconds;
  server   `varent serve` on loopback, one request at a time:
           decode    the server's own decode tok/s (timings.decode_tokens_per_s): the
                     generation loop with the server's per-token work (text, stop
                     strings, metrics JSON, SSE framing);
           e2e       the client's wall time for the whole request (HTTP, JSON parse,
                     tokenize, queue, prefill, decode, response) per generated token,
                     against run's (prefill + decode) per token.
           cpu       marginal CPU time per generated token: (CPU for N tokens - CPU
                     for N/4 tokens) / (N - N/4), summed over the repetitions; the
                     server process (every thread, /proc/PID/task/*/schedstat, one
                     keep-alive connection) against `varent run` (getrusage). Load, prefill and per-request costs cancel, and
                     CPU time is less sensitive than wall time to other load.
           callbacks the share of the server's decode time spent in its per-token
                     callbacks (timings.server_token_s / decode_s), measured inside.
Both sides use the same thread count. Overheads are (server - run) / run.
"""
import argparse
import http.client
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid):
    """CPU seconds of a live process's live threads, in ns precision (schedstat). The
    bench keeps one keep-alive connection, so no thread of interest ends in between."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total / 1e9


def run_once(varent, model, prompt, n, seed, threads):
    c0 = child_cpu()
    r = subprocess.run([varent, "run", "-m", model, "-p", prompt, "-n", str(n), "--seed", str(seed), "--temp", "1",
                        "-t", str(threads), "--stats"], capture_output=True, text=True, errors="replace",
                       check=True)
    m = re.search(r"prefill (\d+) tokens ([\d.]+) tok/s \| decode (\d+) tokens ([\d.]+) tok/s", r.stderr)
    n_prompt, pre_tps, n_gen, dec_tps = int(m.group(1)), float(m.group(2)), int(m.group(3)), float(m.group(4))
    return {"n_gen": n_gen, "decode_tps": dec_tps, "cpu_s": child_cpu() - c0,
            "total_s": n_prompt / pre_tps + (n_gen - 1) / dec_tps}


_conn = {}


def post(port, body):
    """POST on one keep-alive connection (reopened if the server closed it)."""
    for attempt in range(2):
        c = _conn.get(port) or http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        _conn[port] = c
        try:
            t0 = time.perf_counter()
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            return time.perf_counter() - t0, data
        except (http.client.HTTPException, ConnectionError):
            c.close()
            _conn.pop(port, None)
            if attempt:
                raise


def server_once(pid, port, prompt, n, seed, stream):
    body = {"prompt": prompt, "max_tokens": n, "seed": seed, "temperature": 1, "stream": stream,
            "stream_options": {"include_usage": True}}
    c0 = proc_cpu(pid)
    wall, data = post(port, body)
    cpu = proc_cpu(pid) - c0
    if stream:
        events = [json.loads(line[6:]) for line in data.decode().split("\n")
                  if line.startswith("data: {")]
        last = [e for e in events if "usage" in e][-1]
    else:
        last = json.loads(data)
    return {"n_gen": last["usage"]["completion_tokens"], "decode_tps": last["timings"]["decode_tokens_per_s"],
            "wall_s": wall, "cpu_s": cpu,
            "callback_frac": last["timings"]["server_token_s"] / max(last["timings"]["decode_s"], 1e-12)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", default="Once upon a time, there was a little girl")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--varent", default=os.environ.get("VARENT", os.path.join(ROOT, "varent")))
    a = ap.parse_args()
    srv = subprocess.Popen([a.varent, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads),
                            "--max-tokens-limit", str(max(a.tokens, 16))], stderr=subprocess.PIPE, text=True)
    line = srv.stderr.readline()
    port = int(re.search(r":(\d+)/", line).group(1))
    n1 = max(1, a.tokens // 4)
    sides = {"run": lambda n: run_once(a.varent, a.model, a.prompt, n, a.seed, a.threads),
             "plain": lambda n: server_once(srv.pid, port, a.prompt, n, a.seed, False),
             "stream": lambda n: server_once(srv.pid, port, a.prompt, n, a.seed, True)}
    res = {k: {n1: [], a.tokens: []} for k in sides}
    try:
        sides["plain"](8), sides["run"](8)  # warm-up: the slot's first forward, the page cache
        for _ in range(a.reps):  # interleaved, so load changes hit every side alike
            for k, f in sides.items():
                for n in (n1, a.tokens):
                    res[k][n].append(f(n))
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(30)
    n = res["run"][a.tokens][0]["n_gen"]
    m1 = res["run"][n1][0]["n_gen"]
    if any(x["n_gen"] != (n if k == a.tokens else m1) for v in res.values() for k, xs in v.items() for x in xs):
        sys.exit("token counts differ between run and server: not the same generation")
    med = statistics.median
    # marginal CPU per token: (CPU at n tokens - CPU at n1 tokens) / (n - n1), summed over reps;
    # load, prefill and per-request costs cancel
    marg = {k: 1000 * (sum(x["cpu_s"] for x in v[a.tokens]) - sum(x["cpu_s"] for x in v[n1])) / (a.reps * (n - m1))
            for k, v in res.items()}
    runs = res["run"][a.tokens]
    run_dec, run_tot = med(x["decode_tps"] for x in runs), med(x["total_s"] for x in runs)
    out = {"model": os.path.basename(os.path.normpath(a.model)), "tokens": n, "reps": a.reps, "threads": a.threads,
           "run_decode_tps": round(run_dec, 1), "run_ms_per_token": round(1000 * run_tot / n, 4),
           "run_cpu_ms_per_token": round(marg["run"], 4)}
    for name in ("plain", "stream"):
        xs = res[name][a.tokens]
        dec, wall = med(x["decode_tps"] for x in xs), med(x["wall_s"] for x in xs)
        out[f"{name}_decode_tps"] = round(dec, 1)
        out[f"{name}_decode_overhead_pct"] = round(100 * (run_dec / dec - 1), 2)
        out[f"{name}_e2e_ms_per_token"] = round(1000 * wall / n, 4)
        out[f"{name}_e2e_overhead_pct"] = round(100 * (wall / run_tot - 1), 2)
        out[f"{name}_cpu_ms_per_token"] = round(marg[name], 4)
        out[f"{name}_cpu_overhead_pct"] = round(100 * (marg[name] / marg["run"] - 1), 2)
        out[f"{name}_callbacks_pct_of_decode"] = round(100 * med(x["callback_frac"] for x in xs), 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
