"""vtest: helpers for the Python test programs (PASS/FAIL/SKIP protocol of tests/run.sh)."""
import os
import subprocess
import sys
import tempfile

ROOT = os.environ.get("ROOT", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VARENT = os.environ.get("VARENT", os.path.join(ROOT, "varent"))
TESTDATA = os.environ.get("TESTDATA", os.path.join(ROOT, "tests", "data"))
TESTTMP = os.environ.get("TESTTMP", os.path.join(ROOT, "tests", "tmp"))
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


def skip(name, why):
    print(f"SKIP {name}: {why}", flush=True)


def varent(*args, stdin=None, timeout=300, env=None):
    """Run the varent binary; returns CompletedProcess with text stdout/stderr."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([VARENT, *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=e)


def tmpdir(prefix):
    os.makedirs(TESTTMP, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix + "-", dir=TESTTMP)


def done():
    sys.exit(1 if failures else 0)


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
