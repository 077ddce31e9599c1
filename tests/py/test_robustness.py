"""Bad-input rows of docs/robustness.md not covered by test_bad_input.py, test_gguf.py or
the tokenizer tests: broken tokenizer.json files through the CLI, corrupt GGUF metadata,
--metrics-out to an unwritable path or a full disk, stdout on a full disk, and Ctrl-C
during generation. Each: a clear message, a non-zero exit (130 for Ctrl-C) and no
partial output file."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

from vtest import VARENT, check, done, make_endless, skip, stories_dir, tmpdir, varent, expect_fail

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import gguf_np as G  # noqa: E402

work = tmpdir("robust")
base = stories_dir("f32")



# --- tokenizer.json ----------------------------------------------------------------
GOOD = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}


def tok_dir(name, doc):
    d = os.path.join(work, "tok-" + name)
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
    return d


def tok_case(name, doc, *needles):
    d = tok_dir(name, doc)
    expect_fail("tokenizer_" + name, varent("tokenize", "-m", d, "ab"), "tokenizer.json", *needles)


tok_case("missing_model", {"added_tokens": []}, 'missing "model"')
tok_case("missing_vocab", {"model": {"type": "BPE", "merges": []}}, "model.vocab is missing")
tok_case("added_token_missing_content", dict(GOOD, added_tokens=[{"id": 3, "special": True}]),
         "added_tokens[0]", '"content"')
tok_case("added_token_missing_id", dict(GOOD, added_tokens=[{"content": "<s>"}]), "added_tokens[0]", '"id"')
tok_case("split_missing_pattern", dict(GOOD, pre_tokenizer={"type": "Split", "behavior": "Isolated"}),
         'Split needs a "pattern"')
tok_case("normalizer_missing_type", dict(GOOD, normalizer={"prepend": "x"}), 'normalizer without a "type"')
tok_case("merges_unknown_token", {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a zz"]}},
         "model.merges[0]", "missing from the vocab")
tok_case("merges_unknown_result", {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}},
         "model.merges[0]", "missing from the vocab")
tok_case("regex_does_not_compile",
         dict(GOOD, pre_tokenizer={"type": "Split", "pattern": {"Regex": "(?<name"}, "behavior": "Isolated"}),
         "regex rejected", "(?<name")
tok_case("truncated_json", json.dumps(GOOD)[:40], "invalid JSON at byte offset")
# Ids far beyond any vocab (fuzz findings: the per-id tables would take gigabytes).
tok_case("huge_vocab_id", {"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}}, "not a token id")
tok_case("huge_added_token_id", dict(GOOD, added_tokens=[{"id": 2000000000, "content": "x"}]), "added_tokens id 2000000000")

# The same through `varent run`: the model dir's tokenizer.json is named.
d = os.path.join(work, "run-badtok")
shutil.copytree(base, d)
with open(os.path.join(d, "tokenizer.json"), "w") as f:
    json.dump({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a q"]}}, f)
expect_fail("run_tokenizer_merges_unknown_token", varent("run", "-m", d, "-p", "hi", "-n", "4"),
            "tokenizer.json", "merges[0]")

# --- GGUF metadata (magic, counts, string length, value type: test_gguf.py) ---------
HDR = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)


def gguf_case(name, data, *needles):
    path = os.path.join(work, name + ".gguf")
    with open(path, "wb") as f:
        f.write(data)
    out = os.path.join(work, name + "-out")
    r = varent("convert", "gguf", path, out)
    expect_fail("gguf_" + name, r, path, *needles)
    check(not os.path.exists(out), f"gguf_{name}_no_output", str(os.path.exists(out)))


gguf_case("array_element_type", HDR + G._enc_str("x.arr") + struct.pack("<IIQ", G.ARR, 77, 1) + b"\0" * 16,
          "unknown array element type 77", "x.arr")
nested = G._enc_str("x.n") + struct.pack("<I", G.ARR)
for _ in range(12):
    nested += struct.pack("<IQ", G.ARR, 1)
nested += struct.pack("<IQ", G.U8, 1) + b"\0"
gguf_case("arrays_nested_too_deep", HDR + nested, "nested deeper")
gguf_case("string_array_past_end", HDR + G._enc_str("x.s") + struct.pack("<IIQ", G.ARR, G.STR, 2) + G._enc_str("ok")
          + struct.pack("<Q", 1 << 40), "past the end")
gguf_case("empty_file", b"", "too small")

# --- safetensors offsets beyond any file (a fuzz finding) -------------------------
d = os.path.join(work, "st-huge")
shutil.copytree(base, d)
p = os.path.join(d, "model.safetensors")
raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
hdr["model.norm.weight"]["data_offsets"] = [0, 1e30]
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(p, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
expect_fail("safetensors_offsets_beyond_u64", varent("logits", "-m", d, "--ids", "1", "--out", os.path.join(work, "l.bin")),
            "model.norm.weight", "data_offsets")
check(not os.path.exists(os.path.join(work, "l.bin")), "safetensors_offsets_beyond_u64_no_output")

# --- --metrics-out -----------------------------------------------------------------
RUN = ["run", "-m", base, "-n", "8", "--temp", "0"]
r = varent(*RUN, "--metrics-out", os.path.join(work, "no-such-dir", "m.jsonl"))
expect_fail("metrics_out_missing_dir", r, "--metrics-out", "no-such-dir", "cannot create")
check(r.stdout == "", "metrics_out_missing_dir_before_generation", f"stdout {r.stdout!r}")
r = varent(*RUN, "--metrics-out", work)
expect_fail("metrics_out_is_a_directory", r, "--metrics-out", "cannot create")
check(r.stdout == "", "metrics_out_is_a_directory_before_generation", f"stdout {r.stdout!r}")
log = os.path.join(work, "m.jsonl")
r = varent("run", "-m", os.path.join(work, "no-such-model"), "--metrics-out", log)
expect_fail("metrics_out_failed_run", r, "no-such-model")
check(not os.path.exists(log), "metrics_out_failed_run_leaves_no_log", "the empty log was left behind")

if os.path.exists("/dev/full"):
    r = varent(*RUN, "--metrics-out", "/dev/full")
    expect_fail("metrics_out_disk_full", r, "--metrics-out /dev/full", "write failed", "No space left")
    with open("/dev/full", "w") as full:
        p = subprocess.run([VARENT, *RUN], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    expect_fail("stdout_disk_full", p, "stdout")
else:
    skip("metrics_out_disk_full", "no /dev/full")

# --- Ctrl-C during generation --------------------------------------------------------
# stories260K with a long context and no stop token, so it is still generating when
# the signal comes.
d = os.path.join(work, "endless")
shutil.copytree(base, d)
make_endless(d)
log = os.path.join(work, "sigint.jsonl")
p = subprocess.Popen([VARENT, "run", "-m", d, "--ctx", "65536", "-n", "60000", "--seed", "3", "--metrics-out", log],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
first = p.stdout.read(64)  # generation is under way
t0 = time.time()
p.send_signal(signal.SIGINT)
try:
    out, err = p.communicate(timeout=60)
except subprocess.TimeoutExpired:
    p.kill()
    out, err = p.communicate()
took = time.time() - t0
err = err.decode(errors="replace")
check(p.returncode == 130 and "interrupted after" in err, "sigint_exits_130",
      f"rc={p.returncode} stderr={err!r} ({took:.1f} s)")
check(took < 10, "sigint_stops_promptly", f"{took:.1f} s")
check((first + out).endswith(b"\n") and len(first + out) > 64, "sigint_flushes_text", repr((first + out)[-40:]))
lines = open(log).read().split("\n") if os.path.exists(log) else []
try:
    recs = [json.loads(x) for x in lines[:-1]]
except ValueError as e:
    recs = []
    print(f"bad log line: {e}")
check(len(recs) > 0 and lines[-1] == "" and [x["pos"] for x in recs] == list(range(recs[0]["pos"], recs[0]["pos"] + len(recs))),
      "sigint_flushes_metrics_log", f"{len(recs)} complete lines, last {lines[-1][:60] if lines else None!r}")
m = "interrupted after "
n_tok = int(err.split(m)[1].split()[0]) if m in err else -1
check(n_tok == len(recs), "sigint_log_matches_token_count", f"stderr says {n_tok}, log has {len(recs)}")

shutil.rmtree(work, ignore_errors=True)
done()
