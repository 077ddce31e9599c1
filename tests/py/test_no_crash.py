"""Issue 22, "nothing crashes" rows (docs/robustness.md): non-finite logits, a first token
that is EOS in the server, misaligned tensor data, FIFOs in place of model files, NUL in a
request string. Each is a clear error naming what was wrong (or, for the aligned copy,
the same logits), never a crash, a hang or a garbage token. The sanitizer build
(make test-asan) runs this file too, so an out-of-bounds read or undefined behaviour on
any of these paths is a failure there."""
import json
import os
import shutil
import struct
import subprocess
import sys

from vtest import check, done, skip, stories_dir, tmpdir, varent, expect_fail, read_st, write_st, poison_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servertest import Server  # noqa: E402

work = tmpdir("nocrash")
base = stories_dir("f32")



def model_copy(name):
    d = os.path.join(work, name)
    shutil.copytree(base, d)
    return d


def poisoned(name, tensor, value):
    """A copy of stories260K with every f32 of one tensor set to value."""
    d = model_copy(name)
    poison_tensor(d, tensor, value)
    return d


# --- Row 5: non-finite logits are an error naming the position (and the layer) -------
CASES = [  # name, tensor, value, what the message names
    ("nan_layer1", "model.layers.1.mlp.down_proj.weight", float("nan"), "after layer 1 of 5"),
    ("inf_embed", "model.embed_tokens.weight", float("inf"), "after layer 0 of 5"),
    ("huge_norm", "model.norm.weight", 3e38, "final norm or lm_head"),
]
SAMPLERS = [("default", []), ("min_p", ["--min-p", "0.1"]), ("entropix", ["--sampler", "entropix"]),
            ("greedy", ["--temp", "0"])]
dirs = {}
for name, tensor, value, where in CASES:
    d = dirs[name] = poisoned(name, tensor, value)
    for sname, flags in SAMPLERS:
        r = varent("run", "-m", d, "-p", "Once upon a time", "-n", "4", "--seed", "7", *flags, timeout=120)
        expect_fail(f"nonfinite_{name}_{sname}", r, "non-finite logits at position", where)
    out = os.path.join(work, name + ".logits")
    r = varent("logits", "-m", d, "--ids", "1,403,407", "--out", out, timeout=120)
    expect_fail(f"nonfinite_{name}_logits", r, "non-finite logits at position 2", where)
    check(not os.path.exists(out), f"nonfinite_{name}_logits_no_file", "a logits file was left")

# The server answers with an error naming the position, and stays up.
srv = Server(dirs["nan_layer1"], name="nocrash-serve")
try:
    for sname, extra in [("default", {}), ("min_p", {"min_p": 0.1})]:
        st, body = srv.post("/v1/completions", dict({"prompt": "Once upon a time", "max_tokens": 4}, **extra))
        msg = json.dumps(body)
        check(400 <= st < 600 and "non-finite logits at position" in msg, f"nonfinite_serve_{sname}",
              f"status {st} body {msg[:300]}")
    check(srv.proc.poll() is None and srv.health().get("status") == "ok", "nonfinite_serve_stays_up",
          f"health {srv.health() if srv.proc.poll() is None else 'server died: ' + srv.text()[-400:]}")
finally:
    srv.stop()

# --- Row 7: a header length that is not a multiple of 4 misaligns every tensor --------
# (f32 loads from odd addresses: undefined behaviour, which UBSan's alignment check
# reports in make test-asan). The loader copies such tensors once into an aligned buffer;
# the logits are bit for bit those of the aligned file.
def logits_of(d, name):
    out = os.path.join(work, name + ".bin")
    r = varent("logits", "-m", d, "--ids", "1,403,407,261,378", "--out", out, timeout=120)
    if r.returncode != 0:
        return None, r.stderr.strip()
    with open(out, "rb") as f:
        return f.read(), ""


ref, why = logits_of(base, "aligned")
header, data = read_st(os.path.join(base, "model.safetensors"))
for pad in (1, 2, 3):
    d = model_copy(f"misaligned{pad}")
    write_st(os.path.join(d, "model.safetensors"), header, data, mod4=pad)
    hlen = struct.unpack("<Q", open(os.path.join(d, "model.safetensors"), "rb").read(8))[0]
    got, why = logits_of(d, f"misaligned{pad}")
    check(hlen % 4 != 0 and ref is not None and got == ref, f"misaligned_header_{pad}_same_logits",
          f"header length {hlen}: {why or 'logits differ from the aligned file'}")
    r = varent("run", "-m", d, "-p", "Once upon a time", "-n", "8", "--temp", "0", timeout=120)
    r0 = varent("run", "-m", base, "-p", "Once upon a time", "-n", "8", "--temp", "0", timeout=120)
    check(r.returncode == 0 and r.stdout == r0.stdout, f"misaligned_header_{pad}_same_text",
          f"rc={r.returncode} {r.stdout!r} vs {r0.stdout!r} {r.stderr[-300:]}")

# bf16 tensors at an odd header length (2-byte alignment)
bf = os.path.join(work, "bf16")
if not os.path.exists(bf):
    bf_src = stories_dir("bf16")
    ref_bf, _ = logits_of(bf_src, "aligned-bf16")
    h2, d2 = read_st(os.path.join(bf_src, "model.safetensors"))
    shutil.copytree(bf_src, bf)
    write_st(os.path.join(bf, "model.safetensors"), h2, d2, mod4=1)
    hlen = struct.unpack("<Q", open(os.path.join(bf, "model.safetensors"), "rb").read(8))[0]
    got, why = logits_of(bf, "misaligned-bf16")
    check(hlen % 2 == 1 and ref_bf is not None and got == ref_bf, "misaligned_header_bf16_same_logits",
          f"header length {hlen}: {why or 'logits differ'}")

# --- Row 9: a FIFO in place of a model file: open() must not block ---------------------
# Every input is stat'ed first and must be a regular file; the error names the path.
def fifo_case(name, fname, args):
    d = model_copy("fifo-" + name)
    path = os.path.join(d, fname)
    os.unlink(path)
    os.mkfifo(path)
    try:
        r = varent(*args(d), timeout=10)
    except subprocess.TimeoutExpired:
        return check(False, f"fifo_{name}", "varent blocked on the FIFO for 10 s")
    expect_fail(f"fifo_{name}", r, path, "is a FIFO, not a regular file")


run_args = lambda d: ("run", "-m", d, "-p", "Once upon a time", "-n", "2")  # noqa: E731
for fname in ("config.json", "model.safetensors", "tokenizer.json"):
    fifo_case(fname.split(".")[0], fname, run_args)
fifo_case("tokenize_tokenizer", "tokenizer.json", lambda d: ("tokenize", "-m", d, "hello"))
fifo_case("logits_safetensors", "model.safetensors", lambda d: ("logits", "-m", d, "--ids", "1,2", "--out",
                                                               os.path.join(work, "fifo.logits")))
# tokenizer_config.json is optional, but one that is there must be readable
if os.path.exists(os.path.join(base, "tokenizer_config.json")):
    fifo_case("tokenizer_config", "tokenizer_config.json", run_args)
else:
    d = model_copy("fifo-tokcfg")
    os.mkfifo(os.path.join(d, "tokenizer_config.json"))
    try:
        r = varent(*run_args(d), timeout=10)
        expect_fail("fifo_tokenizer_config", r, "tokenizer_config.json", "is a FIFO, not a regular file")
    except subprocess.TimeoutExpired:
        check(False, "fifo_tokenizer_config", "varent blocked on the FIFO for 10 s")
# convert: a FIFO checkpoint, and a FIFO llama2.c tokenizer
src = os.path.join(os.path.dirname(base), "stories260K.bin")
for name, ckpt, tok in [("convert_checkpoint", None, "tok"), ("convert_tokenizer", src, None)]:
    fifo = os.path.join(work, f"fifo-{name}.bin")
    os.mkfifo(fifo)
    tok_bin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "stories260K", "tok512.bin")
    try:
        r = varent("convert", "llama2c", ckpt or fifo, tok_bin if tok else fifo, os.path.join(work, "out-" + name),
                   timeout=10)
        expect_fail(f"fifo_{name}", r, fifo, "is a FIFO, not a regular file")
    except subprocess.TimeoutExpired:
        check(False, f"fifo_{name}", "varent blocked on the FIFO for 10 s")
fifo = os.path.join(work, "fifo.gguf")
os.mkfifo(fifo)
try:
    r = varent("convert", "gguf", fifo, os.path.join(work, "out-gguf"), timeout=10)
    expect_fail("fifo_convert_gguf", r, fifo, "is a FIFO, not a regular file")
except subprocess.TimeoutExpired:
    check(False, "fifo_convert_gguf", "varent blocked on the FIFO for 10 s")

# --- Row 6: a first generated token that is EOS appends an empty text (sb_put(b, NULL, 0),
# undefined behaviour that aborted the sanitizer build's server) ----------------------
EOS_FIRST = {"prompt": "Once upon a time", "max_tokens": 1, "temperature": 100, "top_p": 1, "seed": 392}
srv = Server(base, name="nocrash-serve")
try:
    st, body = srv.post("/v1/completions", EOS_FIRST)
    ch = (body.get("choices") or [{}])[0]
    check(st == 200 and ch.get("finish_reason") == "stop" and ch.get("text") == "", "eos_first_completion",
          f"status {st} body {json.dumps(body)[:300]}")
    chat = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 1, "temperature": 100,
            "top_p": 1, "seed": 392}
    st, body = srv.post("/v1/chat/completions", chat)
    ch = (body.get("choices") or [{}])[0]
    check(st == 200 and ch.get("message", {}).get("content") == "", "eos_first_chat",
          f"status {st} body {json.dumps(body)[:300]}")
    st, _, events, saw_done = srv.stream("/v1/completions", dict(EOS_FIRST, stream=True))
    check(st == 200 and saw_done, "eos_first_stream", f"status {st} events {events[:3]}")
    check(srv.proc.poll() is None and srv.health().get("status") == "ok", "eos_first_server_stays_up",
          "server died: " + srv.text()[-400:])

    # --- Row 14: "\u0000" in any string is a 400 naming the field (it was cut at the NUL)
    NUL_CASES = [  # name, endpoint, body, param
        ("prompt", "/v1/completions", {"prompt": "a\u0000b", "max_tokens": 2}, "prompt"),
        ("prompt_list", "/v1/completions", {"prompt": ["a\u0000b"], "max_tokens": 2}, "prompt[0]"),
        ("stop", "/v1/completions", {"prompt": "a", "stop": ["x", "y\u0000"], "max_tokens": 2}, "stop[1]"),
        ("unknown_field", "/v1/completions", {"prompt": "a", "user": "\u0000", "max_tokens": 2}, "user"),
        ("message", "/v1/chat/completions",
         {"messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": 'a"\\\u0000'}]},
         "messages[1].content"),
        ("message_part", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\u0000"}]}]},
         "messages[0].content[0].text"),
        ("key", "/v1/completions", {"prompt": "a", "x\u0000": 1}, "(a key)"),
    ]
    for name, path, body, param in NUL_CASES:
        st, resp = srv.post(path, body)
        e = resp.get("error") or {}
        check(st == 400 and e.get("param") == param and "NUL" in e.get("message", ""), f"nul_{name}_is_400",
              f"status {st} {json.dumps(resp)[:300]}")
    # an escaped backslash before "u0000" is plain text, not a NUL
    st, resp = srv.post("/v1/completions", {"prompt": "a\\u0000b", "max_tokens": 2})
    check(st == 200, "nul_escaped_backslash_is_text", f"status {st} {json.dumps(resp)[:300]}")
finally:
    srv.stop()

done()
