"""test_gguf_path: `-m FILE.gguf` (issue 23 item 3). The fixture tests/data/gguf-tiny holds
one tiny Llama twice: hf/ (a Hugging Face directory) and tiny.gguf, written by the `gguf`
package from PyPI (llama.cpp's writer, independent of varent's reader and converter);
make_fixture.py wrote both. The GGUF must give the same text as the directory, its
tokenizer and chat template coming from its metadata; it is converted once into a cache
keyed by its SHA-256 (checked with hashlib), atomically; a -m that is neither says what
it is."""
import glob
import hashlib
import os
import shutil
import subprocess
import sys

from vtest import ROOT, TESTDATA, VARENT, check, done, expect_fail, skip, tmpdir

FIX = os.path.join(TESTDATA, "gguf-tiny")
HF, GGUF = os.path.join(FIX, "hf"), os.path.join(FIX, "tiny.gguf")
work = tmpdir("gguf-path")
cache = os.path.join(work, "cache")
ENV = {"XDG_CACHE_HOME": cache}


def run(*args, stdin=None, env=ENV):
    """varent with stdout as bytes (a random model writes any bytes) and stderr as text."""
    e = {**os.environ, **env}
    r = subprocess.run([VARENT, *map(str, args)], input=stdin.encode() if stdin else None, capture_output=True,
                       timeout=300, env=e)
    r.stderr = r.stderr.decode(errors="replace")
    return r


def gguf_python():
    """A python that imports the gguf package (build/venv-gguf, else the system's)."""
    for py in (os.path.join(ROOT, "build", "venv-gguf", "bin", "python"), sys.executable):
        if os.path.exists(py) and subprocess.run([py, "-c", "import gguf"], capture_output=True).returncode == 0:
            return py
    return None


# The committed fixture is what make_fixture.py writes (so tiny.gguf came from the gguf package).
py = gguf_python()
if py:
    regen = os.path.join(work, "regen")
    r = subprocess.run([py, os.path.join(FIX, "make_fixture.py"), regen], capture_output=True, text=True)
    same = r.returncode == 0 and all(
        open(os.path.join(regen, rel), "rb").read() == open(os.path.join(FIX, rel), "rb").read()
        for rel in ["tiny.gguf"] + [os.path.join("hf", f) for f in os.listdir(HF)])
    check(same, "fixture_is_what_make_fixture_writes", r.stderr[-400:])
else:
    skip("fixture_is_what_make_fixture_writes", "the gguf package is not installed (python3 -m venv build/venv-gguf "
         "&& build/venv-gguf/bin/pip install gguf)")

# Same text as the directory form: greedy, sampled, and through the chat template.
sha = hashlib.sha256(open(GGUF, "rb").read()).hexdigest()
for name, extra in (("greedy", ["--temp", "0"]), ("sampled", ["--temp", "0.9", "--top-k", "40", "--seed", "7"])):
    a = run("run", "-m", HF, "-p", "the cat sat on", "-n", 24, *extra)
    b = run("run", "-m", GGUF, "-p", "the cat sat on", "-n", 24, *extra)
    check(a.returncode == 0 and b.returncode == 0 and len(a.stdout) > 10 and a.stdout == b.stdout,
          f"gguf_same_text_as_dir_{name}", f"{a.stdout!r} vs {b.stdout!r} {b.stderr[-400:]}")
cdir = os.path.join(cache, "varent", "gguf", sha)
check(os.path.isfile(os.path.join(cdir, "config.json")) and os.path.isfile(os.path.join(cdir, "tokenizer.json")),
      "gguf_cache_keyed_by_sha256", f"{os.listdir(os.path.dirname(cdir)) if os.path.isdir(os.path.dirname(cdir)) else 'no cache'}")
check(not glob.glob(os.path.join(cache, "varent", "gguf", "*.tmp.*")), "gguf_cache_no_temporaries")

r = run("run", "-m", GGUF, "-p", "the dog", "-n", 4, "--temp", "0")
check(r.returncode == 0 and "convert" not in r.stderr and "hashing" not in r.stderr, "gguf_converted_once", r.stderr)

msgs = "Tell me about the cat.\nAnd the dog?\n"
a = run("chat", "-m", HF, "--temp", "0", "-n", 16, stdin=msgs)
b = run("chat", "-m", GGUF, "--temp", "0", "-n", 16, stdin=msgs)
check(a.returncode == 0 and b.returncode == 0 and a.stdout.count(b"\n") >= 2 and a.stdout == b.stdout,
      "gguf_chat_template_from_metadata", f"{a.stdout!r} vs {b.stdout!r} {b.stderr[-300:]}")
a = run("run", "-m", HF, "--chat", "--system", "Be brief.", "-p", "hi", "--temp", "0", "-n", 12)
b = run("run", "-m", GGUF, "--chat", "--system", "Be brief.", "-p", "hi", "--temp", "0", "-n", 12)
check(a.returncode == 0 and a.stdout == b.stdout, "gguf_run_chat_same_as_dir", f"{a.stdout!r} vs {b.stdout!r}")
r = run("info", "-m", GGUF)
check(r.returncode == 0 and b"layers:         2" in r.stdout and sha.encode() in r.stdout, "gguf_info", f"{r.stdout!r} {r.stderr}")

# A conversion killed half-way leaves <sha>.tmp.<pid>/ only: the next run removes it and
# converts; the cache never holds a half directory under its final name.
cache2 = os.path.join(work, "cache2")
root2 = os.path.join(cache2, "varent", "gguf")
os.makedirs(os.path.join(root2, sha + ".tmp.999999999"))
open(os.path.join(root2, sha + ".tmp.999999999", "config.json.tmp.1"), "w").write("{")
r = run("run", "-m", GGUF, "-p", "the", "-n", 4, "--temp", "0", env={"XDG_CACHE_HOME": cache2})
check(r.returncode == 0 and os.listdir(root2) and sorted(os.listdir(root2)) == sorted([sha, "index"]),
      "gguf_stale_conversion_removed", f"{os.listdir(root2)} {r.stderr[-300:]}")
# A killed converter: SIGKILL at once, then the cache has no final directory or a whole one.
cache3 = os.path.join(work, "cache3")
p = subprocess.Popen([VARENT, "info", "-m", GGUF],
                     env={**os.environ, "XDG_CACHE_HOME": cache3}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
p.kill()
p.wait()
final = os.path.join(cache3, "varent", "gguf", sha)
whole = not os.path.exists(final) or all(os.path.isfile(os.path.join(final, f)) for f in
                                         ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"))
check(whole, "gguf_killed_conversion_no_half_cache", str(os.listdir(final)) if os.path.exists(final) else "")

# A -m that is neither a model directory nor a GGUF says what it is and what -m takes.
txt = os.path.join(work, "notes.txt")
open(txt, "w").write("hello\n")
expect_fail("m_text_file", run("run", "-m", txt, "-p", "hi"), txt, "neither a model directory nor a GGUF",
            "-m takes")
expect_fail("m_safetensors_file", run("run", "-m", os.path.join(HF, "model.safetensors"), "-p", "hi"),
            "a safetensors file", "directory that holds it")
holder = os.path.join(work, "holder")
os.makedirs(holder)
shutil.copy(GGUF, holder)
expect_fail("m_dir_with_gguf_names_it", run("run", "-m", holder, "-p", "hi"), "without config.json",
            os.path.join(holder, "tiny.gguf"))
expect_fail("m_missing", run("run", "-m", os.path.join(work, "nope.gguf"), "-p", "hi"), "nope.gguf",
            "does not exist", "-m takes")
bad = os.path.join(work, "trunc.gguf")
open(bad, "wb").write(open(GGUF, "rb").read()[:5000])
cache4 = os.path.join(work, "cache4")
r = run("run", "-m", bad, "-p", "hi", env={"XDG_CACHE_HOME": cache4})
expect_fail("m_truncated_gguf", r, "trunc.gguf")
left = [d for d in os.listdir(os.path.join(cache4, "varent", "gguf")) if d != "index"] \
    if os.path.isdir(os.path.join(cache4, "varent", "gguf")) else []
check(not left, "m_truncated_gguf_leaves_no_cache", str(left))
r = run("run", "-m", GGUF, "-p", "hi", env={"XDG_CACHE_HOME": "", "HOME": ""})
expect_fail("m_gguf_no_cache_dir", r, "XDG_CACHE_HOME")
done()
