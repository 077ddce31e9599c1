"""vtest: helpers for the Python test programs (PASS/FAIL/SKIP protocol of tests/run.sh)."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.environ.get("ROOT", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VARENT = os.environ.get("VARENT", os.path.join(ROOT, "varent"))
TESTDATA = os.environ.get("TESTDATA", os.path.join(ROOT, "tests", "data"))
TESTTMP = os.environ.get("TESTTMP", os.path.join(ROOT, "tests", "tmp"))
# make test-asan sets ASAN_OPTIONS: the emulated-device tests leave out there what make
# test runs without ASan (the emulated device is several times slower under it)
UNDER_ASAN = bool(os.environ.get("ASAN_OPTIONS"))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tools"))

failures = 0


def check(cond, name, why=""):
    global failures
    if cond:
        print(f"PASS {name}", flush=True)
    else:
        failures += 1
        print(f"FAIL {name}: {why}", flush=True)
    return cond


def expect_fail(name, r, *needles, rc=1):
    """PASS when the CompletedProcess r exited rc and its stderr holds every needle."""
    msg = r.stderr.strip()
    ok = r.returncode == rc and all(n in msg for n in needles)
    return check(ok, name, f"rc={r.returncode} (want {rc}) stderr={msg[-600:]!r} (want {needles})")


def read_st(path):
    """(header dict, data bytes) of a safetensors file."""
    import json
    import struct
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def write_st(path, header, data, mod4=None):
    """A safetensors file; with mod4, the JSON header is padded with spaces (valid JSON)
    to a length that is mod4 modulo 4."""
    import json
    import struct
    h = json.dumps(header, separators=(",", ":")).encode()
    if mod4 is not None:
        h += b" " * ((mod4 - len(h)) % 4)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def poison_tensor(model_dir, tensor, value):
    """Sets every f32 of one tensor of model_dir/model.safetensors to value, in place."""
    import struct
    path = os.path.join(model_dir, "model.safetensors")
    header, data = read_st(path)
    lo, hi = header[tensor]["data_offsets"]
    write_st(path, header, data[:lo] + struct.pack("<f", value) * ((hi - lo) // 4) + data[hi:])


def make_endless(d):
    """Edits the model directory d (a copy of stories260K) so that a run never stops by
    itself: a long context and no EOS, so it is still generating when a signal comes."""
    import json
    for f, edit in (("config.json", {"max_position_embeddings": 65536, "eos_token_id": []}),
                    ("generation_config.json", {"eos_token_id": []})):
        c = json.load(open(os.path.join(d, f)))
        c.update(edit)
        json.dump(c, open(os.path.join(d, f), "w"))
    c = json.load(open(os.path.join(d, "tokenizer_config.json")))
    c.pop("eos_token", None)
    json.dump(c, open(os.path.join(d, "tokenizer_config.json"), "w"))


def skip(name, why):
    print(f"SKIP {name}: {why}", flush=True)


def varent(*args, stdin=None, timeout=300, env=None):
    """Run the varent binary; returns CompletedProcess with text stdout/stderr."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([VARENT, *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=e)


def with_chat_template(src, out, template="meta-llama-Llama-2-chat.jinja"):
    """A copy of model dir src at out whose tokenizer_config.json has tests/data's template."""
    import shutil
    shutil.copytree(src, out)
    cfg_path = os.path.join(out, "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    cfg["chat_template"] = open(os.path.join(TESTDATA, "chat-templates", template)).read()
    json.dump(cfg, open(cfg_path, "w"))
    return out


def tmpdir(prefix):
    os.makedirs(TESTTMP, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix + "-", dir=TESTTMP)


def done():
    sys.exit(1 if failures else 0)


def same_decisions(a, b, tol):
    """'' when agents logs a and b (JSONL lines) make the same choices: every record's fields
    equal but the floats (entropies, the critic's log-probabilities), which agree within
    tol relative (the ranks' partial sums add in another order); else the first difference."""
    if len(a) != len(b):
        return f"{len(a)} records against {len(b)}"

    def walk(x, y, where):
        if isinstance(x, float) or isinstance(y, float):
            ok = isinstance(x, (int, float)) and isinstance(y, (int, float)) and abs(x - y) <= tol * (1 + abs(y))
            return "" if ok else f"{where}: {x} against {y}"
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return f"{where}: keys {sorted(x)} against {sorted(y)}"
            return next((w for k in x for w in [walk(x[k], y[k], f"{where}.{k}")] if w), "")
        if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            return next((w for i, (u, v) in enumerate(zip(x, y)) for w in [walk(u, v, f"{where}[{i}]")] if w), "")
        return "" if x == y else f"{where}: {x!r} against {y!r}"
    for i, (x, y) in enumerate(zip(a, b)):
        why = walk(json.loads(x), json.loads(y), f"record {i}")
        if why:
            return why
    return ""


def stream_completion(port, body, out, i):
    """One streamed completion: out[i] = (text, time of the first token, time of the end)."""
    import http.client
    import time
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
        r, text, first = c.getresponse(), "", None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            piece = json.loads(line[6:])["choices"][0].get("text", "")
            if piece and first is None:
                first = time.time()
            text += piece
        out[i] = (text, first, time.time())
    except Exception as e:
        out[i] = (repr(e), None, None)
    finally:
        c.close()


def stories_dir(dtype="f32"):
    """stories260K converted to a HF dir with `varent convert llama2c` (cached per test run)."""
    import lzma
    import shutil
    out = os.path.join(TESTTMP, f"stories260K-{dtype}")
    if os.path.exists(os.path.join(out, "tokenizer.json")):
        return out
    src = os.path.join(TESTDATA, "stories260K")
    ckpt = os.path.join(TESTTMP, "stories260K.bin")
    if not os.path.exists(ckpt):
        with lzma.open(os.path.join(src, "stories260K.bin.xz")) as f, open(ckpt + ".tmp", "wb") as g:
            shutil.copyfileobj(f, g)
        os.replace(ckpt + ".tmp", ckpt)
    shutil.rmtree(out, ignore_errors=True)
    r = varent("convert", "llama2c", ckpt, os.path.join(src, "tok512.bin"), out, "--dtype", dtype)
    if r.returncode != 0:
        raise RuntimeError(f"convert llama2c failed: {r.stderr}")
    return out
