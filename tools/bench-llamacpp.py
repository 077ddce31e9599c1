#!/usr/bin/env python3
"""bench-llamacpp.py: varent against llama.cpp on the same BF16 weights, the same threads and
the same OpenMP spin count (varent's default GOMP_SPINCOUNT, 30 us of pause rounds on this
CPU as `varent version` prints it, unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set), interleaved, with medians and ratios (issue 19):

    pp512                     prefill of 512 tokens
    tg128 @ depth 0/512/4096  128 single-token decode steps after a prefill of that many
                              tokens (depth 0 is a 1-token prefill on both)
    run --temp 1.0            128 decode steps with sampling (16-token prompt): varent's
    run --temp 0.7 --top-p .9 generate() loop (`varent bench --sampler standard`), and
                              llama.cpp's sampler chain in the same order (temperature,
                              then top-p, then the draw) around llama_decode

and checks that `varent ppl --protocol llamacpp` and llama-perplexity's protocol computed
on llama.cpp's logits agree within 1% on the same text (--ppl-text, default Debian's
GPL-3 text) and weights.

llama.cpp comes from the `llama-cpp-python` sdist on PyPI (it vendors llama.cpp), built
natively into the git-ignored venv build/llamacpp-venv with the `gguf` package; the first
run builds it (tens of minutes on 2 cores). The weights: the model directory's BF16
safetensors written as a BF16 GGUF with its source GGUF's metadata and tokenizer
(tools/llamacpp_gguf.py), checked by converting it back with `varent convert gguf`.
The llama.cpp side is timed in-process through the low-level bindings (ctypes overhead
per call is microseconds against milliseconds per token); varent's side through
`varent bench`, which times itself after loading. Each repetition runs every row on both
engines, alternating which goes first.

Usage: tools/bench-llamacpp.py [--model weights/SmolLM2-135M-Instruct]
           [--source-gguf weights/SmolLM2-135M-Instruct.Q4_1.gguf] [--threads 2] [--reps 3]
           [--rows pp512,tg0,tg512,tg4096,run1,run07] [--ppl-chunks 4] [--out FILE.md]
           [--varent-args '--kv-type bf16']
Exit status 1 when the perplexities differ by more than 1% or a step fails.
"""
import argparse
import ctypes
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
VENV = os.path.join(ROOT, "build", "llamacpp-venv")
SRC = os.path.join(ROOT, "build", "llamacpp-src")
WORK = os.path.join(ROOT, "build", "bench-llamacpp")
LLAMA_CPP_PYTHON = "0.3.36"
CMAKE_ARGS = "-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DCMAKE_BUILD_TYPE=Release"
ROWS = {"pp512": "pp512", "tg0": "tg128 @ d0", "tg512": "tg128 @ d512", "tg4096": "tg128 @ d4096",
        "run1": "run --temp 1.0", "run07": "run --temp 0.7 --top-p 0.9"}


def die(msg):
    print(f"bench-llamacpp: {msg}", file=sys.stderr)
    sys.exit(1)


# ---- the venv -------------------------------------------------------------------------

def venv_python():
    return os.path.join(VENV, "bin", "python")


def ensure_venv():
    """Builds build/llamacpp-venv with llama-cpp-python (native CPU) and gguf when missing."""
    py = venv_python()
    if os.path.exists(py) and subprocess.run([py, "-c", "import llama_cpp, gguf"], capture_output=True).returncode == 0:
        return py
    print(f"bench-llamacpp: building llama-cpp-python {LLAMA_CPP_PYTHON} into {VENV} (CMAKE_ARGS={CMAKE_ARGS}); "
          "this compiles llama.cpp and takes a long time on few cores", file=sys.stderr)
    sysp = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([sysp, "-m", "venv", VENV], check=True)
    os.makedirs(SRC, exist_ok=True)
    sdist = os.path.join(SRC, f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz")
    if not os.path.exists(sdist):
        subprocess.run([py, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "-d", SRC,
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
    subprocess.run(["tar", "xzf", sdist, "-C", SRC], check=True)
    env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    subprocess.run([py, "-m", "pip", "install", sdist, "gguf"], check=True, env=env)
    return py


def llamacpp_commit():
    """The llama.cpp commit vendored by the sdist (its git metadata), or 'unknown'."""
    head = os.path.join(SRC, f"llama_cpp_python-{LLAMA_CPP_PYTHON}", ".git", "modules", "vendor", "llama.cpp", "HEAD")
    try:
        with open(head) as f:
            return f.read().strip()[:12]
    except OSError:
        return "unknown"


# ---- llama.cpp through the low-level bindings -------------------------------------------

class LlamaCpp:
    def __init__(self, gguf_path, threads):
        import llama_cpp as L
        self.L, self.threads = L, threads
        self._quiet = L.llama_log_callback(lambda level, text, ud: None)  # kept alive: llama.cpp calls it
        L.llama_log_set(self._quiet, ctypes.c_void_p(0))
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(gguf_path.encode(), L.llama_model_default_params())
        if not self.model:
            die(f"llama.cpp could not load {gguf_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def context(self, n_ctx, n_batch=512):
        L = self.L
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_ctx, n_batch, n_batch
        p.n_threads, p.n_threads_batch = self.threads, self.threads
        ctx = L.llama_init_from_model(self.model, p)
        if not ctx:
            die(f"llama.cpp could not make a {n_ctx}-token context")
        return ctx

    def decode(self, ctx, ids, pos0, want_logits=None):
        """Decodes ids at positions pos0.. in batches of 512; want_logits(i) marks outputs."""
        L = self.L
        for a in range(0, len(ids), 512):
            chunk = ids[a:a + 512]
            b = L.llama_batch_init(len(chunk), 0, 1)
            for i, t in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + a + i, 1
                b.seq_id[i][0] = 0
                b.logits[i] = bool(want_logits(a + i)) if want_logits else (a + i == len(ids) - 1)
            b.n_tokens = len(chunk)
            rc = L.llama_decode(ctx, b)
            L.llama_batch_free(b)
            if rc != 0:
                die(f"llama_decode failed ({rc})")
        L.llama_synchronize(ctx)

    def decode_one(self, ctx, tok, pos):
        L = self.L
        arr = (L.llama_token * 1)(tok)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, 1)) != 0:
            die("llama_decode failed")
        L.llama_synchronize(ctx)

    def tokenize(self, text, add_special=True):
        L = self.L
        data = text.encode()
        buf = (L.llama_token * (len(data) + 16))()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, False)
        if n < 0:
            die("llama_tokenize failed")
        return list(buf[:n])

    def free(self, ctx):
        self.L.llama_free(ctx)


def random_ids(n, vocab, seed=12345):
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1) % (1 << 64)
        out.append((x >> 33) % vocab)
    return out


def lc_prefill(lc, n):
    """tok/s of one n-token prefill into a fresh context (after a warm-up one)."""
    ids = random_ids(n, lc.n_vocab)
    ctx = lc.context(n + 8)
    lc.decode(ctx, ids, 0)
    lc.L.llama_memory_clear(lc.L.llama_get_memory(ctx), True)
    t0 = time.perf_counter()
    lc.decode(ctx, ids, 0)
    dt = time.perf_counter() - t0
    lc.free(ctx)
    return n / dt


def lc_decode(lc, depth, n, chain=None):
    """tok/s of n single-token decode steps after a prefill of max(depth, 1) tokens; with
    chain (a llama_sampler), each step samples the next token from the last logits."""
    L = lc.L
    d = max(depth, 1)
    ids = random_ids(d + n + 1, lc.n_vocab)
    ctx = lc.context(d + n + 8)
    lc.decode(ctx, ids[:d], 0)
    tok = ids[d]
    t0 = time.perf_counter()
    for i in range(n):
        lc.decode_one(ctx, tok, d + i)
        tok = L.llama_sampler_sample(chain, ctx, -1) if chain else ids[d + i + 1]
    dt = time.perf_counter() - t0
    lc.free(ctx)
    return n / dt


def lc_chain(lc, temp, top_p, seed=42):
    L = lc.L
    ch = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(ch, L.llama_sampler_init_temp(temp))
    if top_p < 1:
        L.llama_sampler_chain_add(ch, L.llama_sampler_init_top_p(top_p, 1))
    L.llama_sampler_chain_add(ch, L.llama_sampler_init_dist(seed))
    return ch


def lc_perplexity(lc, text, ctx_len, chunks):
    """llama-perplexity's protocol on llama.cpp's logits: dict(ppl, scored, chunks, ids)."""
    import numpy as np
    L = lc.L
    ids = lc.tokenize(text, True)
    if len(ids) < 2 * ctx_len:
        die(f"the perplexity text is {len(ids)} tokens; it needs {2 * ctx_len}")
    n_chunk = min(len(ids) // ctx_len, chunks) if chunks > 0 else len(ids) // ctx_len
    first, nll, count = ctx_len // 2, [], 0
    add_bos = L.llama_vocab_get_add_bos(lc.vocab)
    ctx = lc.context(ctx_len, ctx_len)
    for c in range(n_chunk):
        win = ids[c * ctx_len:(c + 1) * ctx_len]
        if add_bos:
            win[0] = L.llama_vocab_bos(lc.vocab)
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        lc.decode(ctx, win, 0, want_logits=lambda i: i >= first)
        for j in range(first, ctx_len - 1):
            lg = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, j), shape=(lc.n_vocab,)).astype(np.float64)
            m = lg.max()
            nll.append(m + np.log(np.exp(lg - m).sum()) - lg[win[j + 1]])
            count += 1
    lc.free(ctx)
    return dict(ppl=float(np.exp(np.mean(nll))), scored=count, chunks=n_chunk, ids=ids, add_bos=bool(add_bos))


# ---- varent -------------------------------------------------------------------------------

def run_varent(args, *cmd, timeout=1800):
    r = subprocess.run([args.varent, *cmd], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        die(f"varent {' '.join(cmd)} failed: {r.stderr[-400:]}")
    return r.stdout


def grab(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        die(f"no {what} in varent's output:\n{text[-600:]}")
    return float(m.group(1))


def vr_bench(args, plen, n, extra=()):
    return run_varent(args, "bench", "-m", args.model, "--threads", str(args.threads), "--prompt-len", str(plen),
                      "-n", str(n), "--runs", "1", *args.varent_args.split(), *extra)


def vr_row(args, row):
    if row == "pp512":
        return grab(r"prefill\s+512 tokens: ([\d.]+) tok/s", vr_bench(args, 512, 1, ("--sampler", "none")), "prefill")
    if row.startswith("tg"):
        out = vr_bench(args, max(int(row[2:]), 1), 128, ("--sampler", "none"))
        return grab(r"decode\s+128 tokens: ([\d.]+) tok/s", out, "decode")
    temp, top_p = ("1.0", "1") if row == "run1" else ("0.7", "0.9")
    out = vr_bench(args, 16, 128, ("--sampler", "standard", "--temp", temp, "--top-p", top_p))
    return 1e3 / grab(r"sampler\s+standard\s+([\d.]+) ms/token", out, "sampler standard")


def lc_row(lc, row):
    if row == "pp512":
        return lc_prefill(lc, 512)
    if row.startswith("tg"):
        return lc_decode(lc, int(row[2:]), 128)
    ch = lc_chain(lc, 1.0, 1.0) if row == "run1" else lc_chain(lc, 0.7, 0.9)
    try:
        return lc_decode(lc, 16, 128, ch)
    finally:
        lc.L.llama_sampler_free(ch)


# ---- the report -----------------------------------------------------------------------------

def machine():
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def default_spin(varent):
    """Sets GOMP_SPINCOUNT to the spin varent picks on this CPU (host/cli/main.c: 30 us of
    pause rounds; `varent version` prints it), unless the caller chose a policy for both."""
    if os.environ.get("OMP_WAIT_POLICY") or os.environ.get("GOMP_SPINCOUNT"):
        return
    out = subprocess.run([varent, "version"], capture_output=True, text=True).stdout
    m = re.search(r"^openmp: GOMP_SPINCOUNT=(\d+)$", out, re.M)
    if not m:
        die(f"{varent} version printed no GOMP_SPINCOUNT line:\n{out}")
    os.environ["GOMP_SPINCOUNT"] = m.group(1)


def omp_env():
    return ", ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if os.environ.get(k))


def report(args, results, ppl, versions):
    lines = [f"Date {datetime.date.today()}; machine: {machine()}; {args.threads} threads on both sides.",
             f"llama.cpp {versions['commit']} via llama-cpp-python {versions['python']} (built with {CMAKE_ARGS}); "
             f"system info: {versions['system']}",
             f"OpenMP: both engines with {omp_env()} (varent's default; libgomp's own 300000 spin rounds collapse "
             "under contention).",
             f"Command: `{' '.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])}`; {args.reps} interleaved "
             f"repetitions, medians; load average {args.load_before} before, {os.getloadavg()[0]:.1f} after "
             f"(the machine is shared: other jobs ran during the measurement).", "",
             "| row | llama.cpp tok/s | varent tok/s | varent / llama.cpp |", "|---|---|---|---|"]
    for row in args.rows:
        lc, vr = statistics.median(results[row]["lc"]), statistics.median(results[row]["vr"])
        lines.append(f"| {ROWS[row]} | {lc:,.1f} | {vr:,.1f} | {vr / lc:.2f}x |")
    if ppl:
        lines += ["", f"Perplexity, llama.cpp's protocol (ctx {args.ppl_ctx}, {ppl['chunks']} chunks, "
                  f"{ppl['scored']} tokens, {os.path.basename(args.ppl_text)}): llama.cpp {ppl['lc']:.4f}, "
                  f"varent {ppl['vr']:.4f} ({100 * (ppl['vr'] / ppl['lc'] - 1):+.3f}%); "
                  f"tokenisations {'identical' if ppl['same_ids'] else 'DIFFER'}."]
    return "\n".join(lines) + "\n"


def check_weights(args, gguf_path):
    """Writes the BF16 GGUF (once) and checks varent reads back the same tensors from it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llamacpp_gguf
    if not os.path.exists(gguf_path):
        llamacpp_gguf.make_bf16_gguf(args.model, args.source_gguf, gguf_path)
    back = os.path.join(WORK, "roundtrip")
    subprocess.run(["rm", "-rf", back], check=True)
    run_varent(args, "convert", "gguf", gguf_path, back, "--dtype", "bf16")
    diffs = llamacpp_gguf.same_tensors(args.model, back)
    if diffs:
        die(f"{gguf_path} does not hold {args.model}'s weights: {diffs[:5]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct"))
    ap.add_argument("--source-gguf", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--ppl-text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--ppl-ctx", type=int, default=512)
    ap.add_argument("--ppl-chunks", type=int, default=4, help="0: every chunk")
    ap.add_argument("--varent", default=os.path.join(ROOT, "varent"))
    ap.add_argument("--varent-args", default="", help="extra options for varent bench, e.g. '--kv-type bf16'")
    ap.add_argument("--out", help="also write the report (markdown) here")
    args = ap.parse_args()
    args.rows = [r for r in args.rows.split(",") if r]
    bad = [r for r in args.rows if r not in ROWS]
    if bad:
        die(f"--rows: unknown {bad} (use {','.join(ROWS)})")
    for path, what in ((args.model, "--model"), (args.source_gguf, "--source-gguf"), (args.varent, "--varent")):
        if not os.path.exists(path):
            die(f"{what} {path} does not exist (make run fetches SmolLM2 into weights/; make builds varent)")
    # Both engines use libgomp: give llama.cpp the spin count varent runs with by default.
    default_spin(args.varent)
    try:
        import llama_cpp  # noqa: F401  (inside the venv)
    except ImportError:
        py = ensure_venv()
        os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])
    import llama_cpp
    os.makedirs(WORK, exist_ok=True)
    gguf_path = os.path.join(WORK, os.path.basename(os.path.normpath(args.model)) + ".bf16.gguf")
    check_weights(args, gguf_path)
    lc = LlamaCpp(gguf_path, args.threads)
    versions = dict(python=llama_cpp.__version__, commit=llamacpp_commit(),
                    system=llama_cpp.llama_print_system_info().decode().strip())
    results = {r: {"lc": [], "vr": []} for r in args.rows}
    args.load_before = f"{os.getloadavg()[0]:.1f}"
    for rep in range(args.reps):
        for row in args.rows:
            order = ("lc", "vr") if rep % 2 == 0 else ("vr", "lc")
            for who in order:
                v = lc_row(lc, row) if who == "lc" else vr_row(args, row)
                results[row][who].append(v)
            print(f"# rep {rep + 1} {ROWS[row]}: llama.cpp {results[row]['lc'][-1]:.1f} tok/s, "
                  f"varent {results[row]['vr'][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    ppl = None
    if args.ppl_chunks >= 0 and args.ppl_text:
        with open(args.ppl_text, encoding="utf-8") as f:
            text = f.read()
        got = lc_perplexity(lc, text, args.ppl_ctx, args.ppl_chunks)
        out = run_varent(args, "ppl", "-m", args.model, "-f", args.ppl_text, "--protocol", "llamacpp", "--ctx",
                         str(args.ppl_ctx), "--chunks", str(args.ppl_chunks or 1 << 30), "--json", "-q",
                         "--threads", str(args.threads))
        vr = float(re.search(r'"ppl":([\d.eE+-]+)', out).group(1))
        vids = [int(t) for t in re.findall(r"-?\d+", run_varent(args, "tokenize", "-m", args.model, text))]
        same = vids == (got["ids"][1:] if got["add_bos"] else got["ids"])
        ppl = dict(lc=got["ppl"], vr=vr, scored=got["scored"], chunks=got["chunks"], same_ids=same)
    text = report(args, results, ppl, versions)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if ppl and not abs(ppl["vr"] / ppl["lc"] - 1) <= 0.01:
        die(f"perplexities differ by more than 1%: llama.cpp {ppl['lc']:.4f}, varent {ppl['vr']:.4f}")
    print(f"PASS perplexity within 1% ({100 * (ppl['vr'] / ppl['lc'] - 1):+.3f}%)" if ppl else "", file=sys.stderr)


if __name__ == "__main__":
    main()
