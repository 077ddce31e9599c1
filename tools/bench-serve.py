#!/usr/bin/env python3
"""bench-serve.py: N concurrent streaming clients against `varent serve` and llama-server on
the same BF16 weights, the same threads and the same OpenMP spin count, interleaved, with
medians over the repetitions (issue 35). Rows:

    streams S      S clients at once, each streaming --tokens tokens of its own prompt
                   (EOS banned by logit_bias on both, so every stream is full length):
                   aggregate tok/s (all tokens / wall time of the whole burst), time to
                   first token and inter-token latency percentiles over every stream
    prefix         a request whose --prefix-words long prefix (750 words: ~1,000 tokens) was served just before
                   (another suffix): its time to first token, against the same request
                   cold (varent: --no-prefix-cache; llama-server: "cache_prompt": false)

varent runs `varent serve --parallel S`, llama-server `-np S --cont-batching` with a
context of S x (prompt + tokens); both get --threads. llama-server is built from the
llama.cpp that the `llama-cpp-python` sdist vendors (tools/bench-llamacpp.py fetches it
into build/llamacpp-src; the first run builds llama-server into build/llamacpp-server,
minutes on 2 cores), the weights are tools/bench-llamacpp.py's BF16 GGUF (checked by
converting back). --engines varent runs varent alone (no llama.cpp needed).

Usage: tools/bench-serve.py [--model weights/SmolLM2-135M-Instruct]
           [--source-gguf weights/SmolLM2-135M-Instruct.Q4_1.gguf] [--streams 1,8] [--tokens 128]
           [--prefix-words 750] [--threads 2] [--reps 3] [--batch 64] [--engines varent,llama]
           [--out FILE.md]
"""
import argparse
import datetime
import http.client
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SERVER_BUILD = os.path.join(ROOT, "build", "llamacpp-server")
WORDS = ("the little cat saw a big red ball in the park and ran to play with it while her mom sat on a bench "
         "under a tall green tree near the pond where ducks swam in the sun").split()


def die(msg):
    print(f"bench-serve: {msg}", file=sys.stderr)
    sys.exit(1)


def bench_llamacpp():
    """tools/bench-llamacpp.py as a module: its venv, sdist and GGUF helpers."""
    spec = importlib.util.spec_from_file_location("bench_llamacpp", os.path.join(ROOT, "tools", "bench-llamacpp.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def llama_server(bl):
    """The llama-server binary, built once from the sdist's vendored llama.cpp."""
    exe = os.path.join(SERVER_BUILD, "bin", "llama-server")
    if os.path.exists(exe):
        return exe
    bl.ensure_venv()  # downloads and unpacks the sdist
    src = os.path.join(bl.SRC, f"llama_cpp_python-{bl.LLAMA_CPP_PYTHON}", "vendor", "llama.cpp")
    if not os.path.isdir(src):
        die(f"{src} is missing: the llama-cpp-python sdist did not unpack there")
    print(f"bench-serve: building llama-server from {src} into {SERVER_BUILD}", file=sys.stderr)
    subprocess.run(["cmake", "-S", src, "-B", SERVER_BUILD, "-DGGML_NATIVE=ON", "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True)
    subprocess.run(["cmake", "--build", SERVER_BUILD, "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                   check=True)
    return exe


# ---- servers ---------------------------------------------------------------------------

class Server:
    def __init__(self, cmd, port_re, name):
        self.log = open(os.path.join(WORK, f"{name}.log"), "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 300
        while time.time() < deadline and self.proc.poll() is None:
            self.log.seek(0)
            m = re.search(port_re, self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.1)
        if self.port is None:
            self.stop()
            self.log.seek(0)
            die(f"{name} did not start: {self.log.read()[-800:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_varent(args, streams, no_cache=False):
    cmd = [args.varent, "serve", "-m", args.model, "--port", "0", "--parallel", str(streams), "-t", str(args.threads),
           "--batch", str(args.batch), "--ctx", str(args.ctx)]
    if no_cache:
        cmd.append("--no-prefix-cache")
    return Server(cmd, r"listening on http://127\.0\.0\.1:(\d+)/", f"varent-{streams}")


def start_llama(args, streams):
    port = free_port()
    cmd = [args.llama_server, "-m", args.gguf, "--port", str(port), "--host", "127.0.0.1", "-np", str(streams),
           "-t", str(args.threads), "-tb", str(args.threads), "-c", str(args.ctx * streams), "-b", str(args.batch),
           "--cont-batching", "--no-webui"]
    srv = Server(cmd, rf"(?:listening|server is listening).*?:({port})\b", f"llama-{streams}")
    deadline = time.time() + 300  # the model loads after the socket opens
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    return srv


# ---- clients ----------------------------------------------------------------------------

def stream(port, body, out):
    """One streamed completion: out gets (start, [arrival time of each token event], tokens)."""
    t0 = time.perf_counter()
    times, tokens = [], None
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out.append((t0, [], 0, f"status {r.status}: {r.read()[:200]!r}"))
        return
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if not line.startswith(b"data: ") or line[6:] == b"[DONE]":
                    continue
                d = json.loads(line[6:])
                if d.get("usage"):
                    tokens = d["usage"].get("completion_tokens", tokens)
                for ch in d.get("choices", []):
                    if ch.get("text"):
                        times.append(time.perf_counter())
    c.close()
    out.append((t0, times, tokens if tokens is not None else len(times), None))


def burst(port, bodies):
    """Every body streamed at once; (wall seconds, [(start, times, tokens, error)])."""
    out = []
    threads = [threading.Thread(target=stream, args=(port, b, out)) for b in bodies]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def prompt_text(i, words):
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words))


def streams_row(args, port, streams, extra):
    bodies = [dict({"prompt": prompt_text(i, 24), "max_tokens": args.tokens, "temperature": 0.8, "seed": i,
                    "logit_bias": {str(args.eos): -100}}, **extra) for i in range(streams)]
    wall, res = burst(port, bodies)
    errs = [e for _, _, _, e in res if e]
    if errs:
        die(f"a stream failed: {errs[0]}")
    ttft = [times[0] - t0 for t0, times, _, _ in res if times]
    itl = [b - a for _, times, _, _ in res for a, b in zip(times, times[1:])]
    toks = sum(n for _, _, n, _ in res)
    return dict(tok_s=toks / wall, ttft50=pct(ttft, 50), ttft90=pct(ttft, 90), itl50=pct(itl, 50), itl90=pct(itl, 90),
                itl99=pct(itl, 99), tokens=toks)


def prefix_ttft(args, port, extra, rep):
    """TTFT of prefix + suffix B after prefix + suffix A was served."""
    prefix = prompt_text(1000 + rep, args.prefix_words)
    first = dict({"prompt": prefix + " and then", "max_tokens": 4, "seed": 1}, **extra)
    burst(port, [first])
    second = dict({"prompt": prefix + " but later", "max_tokens": 4, "seed": 2}, **extra)
    _, res = burst(port, [second])
    t0, times, _, err = res[0]
    if err or not times:
        die(f"the prefix request failed: {err}")
    return times[0] - t0


# ---- the run ------------------------------------------------------------------------------

def measure(args, engine, streams, rep):
    if engine == "varent":
        srv = start_varent(args, streams)
        extra = {}
    else:
        srv = start_llama(args, streams)
        extra = {"cache_prompt": True}
    try:
        streams_row(args, srv.port, 1, extra)  # warm-up
        return streams_row(args, srv.port, streams, extra)
    finally:
        srv.stop()


def measure_prefix(args, engine, rep):
    out = {}
    for cached in (True, False):
        if engine == "varent":
            srv = start_varent(args, 1, no_cache=not cached)
            extra = {}
        else:
            srv = start_llama(args, 1)
            extra = {"cache_prompt": cached}
        try:
            streams_row(args, srv.port, 1, extra)
            out["hot" if cached else "cold"] = prefix_ttft(args, srv.port, extra, rep)
        finally:
            srv.stop()
    return out


def machine():
    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def report(args, res, pre, load_before):
    names = {"varent": "varent serve", "llama": "llama-server"}
    lines = [f"Date {datetime.date.today()}; machine: {machine()}; {args.threads} threads per server; model "
             f"{os.path.basename(os.path.normpath(args.model))}; {args.tokens} tokens per stream, --batch {args.batch}; OpenMP: "
             f"{bench_llamacpp().omp_env()}.",
             f"Command: `{' '.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])}`; {args.reps} interleaved "
             f"repetitions, medians; load average {load_before} before, {os.getloadavg()[0]:.1f} after.", "",
             "| engine | streams | aggregate tok/s | x one stream | TTFT p50 / p90 (ms) | ITL p50 / p90 / p99 (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    for e in args.engines:
        one = statistics.median(r["tok_s"] for r in res[e][min(args.streams)])
        for s in args.streams:
            rows = res[e][s]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            lines.append(f"| {names[e]} | {s} | {med['tok_s']:,.1f} | {med['tok_s'] / one:.2f}x | "
                         f"{1e3 * med['ttft50']:.0f} / {1e3 * med['ttft90']:.0f} | {1e3 * med['itl50']:.1f} / "
                         f"{1e3 * med['itl90']:.1f} / {1e3 * med['itl99']:.1f} |")
    if len(args.engines) == 2:
        for s in args.streams:
            v = statistics.median(r["tok_s"] for r in res["varent"][s])
            ll = statistics.median(r["tok_s"] for r in res["llama"][s])
            lines.append(f"\n{s} streams: varent / llama-server aggregate = {v / ll:.2f}x.")
    if pre:
        lines += ["", f"| engine | TTFT after a {args.prefix_words}-word prefix was served (ms) | cold (ms) | speed-up |",
                  "|---|---:|---:|---:|"]
        for e in args.engines:
            hot = statistics.median(p["hot"] for p in pre[e])
            cold = statistics.median(p["cold"] for p in pre[e])
            lines.append(f"| {names[e]} | {1e3 * hot:.0f} | {1e3 * cold:.0f} | {cold / hot:.1f}x |")
    return "\n".join(lines) + "\n"


def eos_id(model):
    with open(os.path.join(model, "config.json")) as f:
        e = json.load(f).get("eos_token_id")
    return e[0] if isinstance(e, list) else e


def main():
    global WORK
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct"))
    ap.add_argument("--source-gguf", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prefix-words", type=int, default=750, help="the prefix row's words (~1,000 tokens); 0: no row")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="prefill chunk of both (varent's prefix reuse is per chunk)")
    ap.add_argument("--ctx", type=int, default=2048, help="context per stream")
    ap.add_argument("--engines", default="varent,llama")
    ap.add_argument("--varent", default=os.path.join(ROOT, "varent"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-serve"))
    ap.add_argument("--out", help="also write the report (markdown) here")
    args = ap.parse_args()
    args.streams = sorted({int(s) for s in args.streams.split(",") if s})
    args.engines = [e for e in args.engines.split(",") if e]
    if not args.streams or min(args.streams) < 1 or any(e not in ("varent", "llama") for e in args.engines):
        die("--streams takes counts >= 1, --engines varent and/or llama")
    for path, what in ((args.model, "--model"), (args.varent, "--varent")):
        if not os.path.exists(path):
            die(f"{what} {path} does not exist (make run fetches SmolLM2 into weights/; make builds varent)")
    WORK = args.work
    os.makedirs(WORK, exist_ok=True)
    args.eos = eos_id(args.model)
    bench_llamacpp().default_spin(args.varent)  # varent's default spin, for llama.cpp's libgomp too
    if "llama" in args.engines:
        try:
            import gguf  # noqa: F401  (the GGUF writer: inside tools/bench-llamacpp.py's venv)
        except ImportError:
            py = bench_llamacpp().ensure_venv()
            os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])
        bl = bench_llamacpp()
        if not os.path.exists(args.source_gguf):
            die(f"--source-gguf {args.source_gguf} does not exist (its metadata and tokenizer go into the BF16 GGUF)")
        args.llama_server = llama_server(bl)
        bl.WORK = WORK
        args.gguf = os.path.join(WORK, os.path.basename(os.path.normpath(args.model)) + ".bf16.gguf")
        bl.check_weights(argparse.Namespace(model=args.model, source_gguf=args.source_gguf, varent=args.varent),
                         args.gguf)
    load_before = f"{os.getloadavg()[0]:.1f}"
    res = {e: {s: [] for s in args.streams} for e in args.engines}
    pre = {e: [] for e in args.engines} if args.prefix_words > 0 else None
    for rep in range(args.reps):
        order = args.engines if rep % 2 == 0 else args.engines[::-1]
        for s in args.streams:
            for e in order:
                r = measure(args, e, s, rep)
                res[e][s].append(r)
                print(f"# rep {rep + 1}, {s} streams, {e}: {r['tok_s']:.1f} tok/s, TTFT p50 {1e3 * r['ttft50']:.0f} ms",
                      file=sys.stderr, flush=True)
        for e in order if pre is not None else ():
            pre[e].append(measure_prefix(args, e, rep))
            print(f"# rep {rep + 1}, prefix, {e}: {pre[e][-1]}", file=sys.stderr, flush=True)
    text = report(args, res, pre, load_before)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
