"""Every malformed input gets a clear message naming the file/field, a non-zero exit
(not a crash) and leaves no partial output behind."""
import json
import os
import shutil
import struct

from vtest import check, done, stories_dir, tmpdir, varent

base = stories_dir("f32")
work = tmpdir("bad")


def clone(name):
    d = os.path.join(work, name)
    shutil.copytree(base, d)
    return d


def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


def edit_header(d, fn):
    p = os.path.join(d, "model.safetensors")
    hdr, data = read_st(p)
    fn(hdr)
    write_st(p, hdr, data)


def expect_fail(name, args, *needles):
    r = varent(*args)
    crashed = r.returncode < 0 or r.returncode > 125
    msg = r.stderr.strip()
    ok = r.returncode != 0 and not crashed and all(n in msg for n in needles)
    check(ok, name, f"rc={r.returncode} stderr={msg!r} (want {needles})")


def logits_args(d, ids="1,2,3"):
    return ["logits", "-m", d, "--ids", ids, "--out", os.path.join(work, "out.bin")]


# --- safetensors -------------------------------------------------------------------
d = clone("truncated")
p = os.path.join(d, "model.safetensors")
raw = open(p, "rb").read()
open(p, "wb").write(raw[: len(raw) // 2])
expect_fail("truncated_file", logits_args(d), "model.safetensors", "outside the data region")

d = clone("hdrlen")
p = os.path.join(d, "model.safetensors")
raw = bytearray(open(p, "rb").read())
raw[:8] = struct.pack("<Q", len(raw) * 4)
open(p, "wb").write(raw)
expect_fail("header_length_past_eof", logits_args(d), "model.safetensors", "header length")

d = clone("badjson")
p = os.path.join(d, "model.safetensors")
raw = bytearray(open(p, "rb").read())
raw[8:20] = b"{not json!!!"
open(p, "wb").write(raw)
expect_fail("invalid_header_json", logits_args(d), "model.safetensors", "JSON")

d = clone("offsets")
edit_header(d, lambda h: h["model.norm.weight"].update(data_offsets=[10**9, 10**9 + 256]))
expect_fail("offsets_outside_file", logits_args(d), "model.norm.weight", "outside the data region")

d = clone("overlap")
def overlap(h):
    a, b = h["model.norm.weight"]["data_offsets"]
    other = next(k for k, v in h.items() if k != "model.norm.weight" and k != "__metadata__" and v["data_offsets"][1] - v["data_offsets"][0] >= 256)
    s = h[other]["data_offsets"][0]
    h["model.norm.weight"]["data_offsets"] = [s, s + (b - a)]
edit_header(d, overlap)
expect_fail("overlapping_offsets", logits_args(d), "overlap")

d = clone("dtype")
edit_header(d, lambda h: h["model.norm.weight"].update(dtype="F8_E4M3"))
expect_fail("unknown_dtype", logits_args(d), "model.norm.weight", "unknown dtype", "F8_E4M3")

d = clone("shape")
edit_header(d, lambda h: h["model.layers.0.self_attn.q_proj.weight"].update(shape=[32, 128]))
expect_fail("shape_disagrees_with_config", logits_args(d), "model.layers.0.self_attn.q_proj.weight", "[32, 128]", "[64, 64]")

d = clone("bytes")
edit_header(d, lambda h: h["model.norm.weight"].update(shape=[65]))
expect_fail("shape_vs_byte_length", logits_args(d), "model.norm.weight", "bytes")

d = clone("missing")
edit_header(d, lambda h: h.pop("model.layers.3.mlp.up_proj.weight"))
expect_fail("missing_tensor", logits_args(d), "model.layers.3.mlp.up_proj.weight", "missing")

d = clone("nofile")
os.remove(os.path.join(d, "model.safetensors"))
expect_fail("no_weights_file", logits_args(d), "model.safetensors")

# --- config.json -------------------------------------------------------------------
def edit_config(d, fn):
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    fn(c)
    json.dump(c, open(p, "w"))

d = clone("arch")
edit_config(d, lambda c: c.update(architectures=["MistralForCausalLM"]))
expect_fail("unsupported_architecture", logits_args(d), "config.json", "MistralForCausalLM")

d = clone("rope")
edit_config(d, lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
expect_fail("unsupported_rope_scaling", logits_args(d), "config.json", "yarn")

d = clone("cfgjson")
open(os.path.join(d, "config.json"), "w").write('{"architectures": ["LlamaForCausalLM"], "hidden_size": ')
expect_fail("invalid_config_json", logits_args(d), "config.json", "invalid JSON")

d = clone("cfgfield")
edit_config(d, lambda c: c.pop("num_hidden_layers"))
expect_fail("config_missing_field", logits_args(d), "config.json", "num_hidden_layers")

d = clone("cfgtype")
edit_config(d, lambda c: c.update(hidden_size="64"))
expect_fail("config_wrong_type", logits_args(d), "config.json", "hidden_size")

d = clone("nocfg")
os.remove(os.path.join(d, "config.json"))
expect_fail("missing_config_json", logits_args(d), "config.json", "cannot open")

expect_fail("nonexistent_model_dir", logits_args(os.path.join(work, "no-such-dir")), "no-such-dir", "does not exist")

# --- ids and context ---------------------------------------------------------------
expect_fail("logits_id_out_of_range", logits_args(base, "1,2,512"), "512", "out of range", "vocab_size 512")
expect_fail("run_id_out_of_range", ["run", "-m", base, "--ids", "1,999999", "-n", "4"], "999999", "out of range")
expect_fail("ids_not_numbers", ["run", "-m", base, "--ids", "1,x,3"], "--ids")
long_ids = ",".join(["5"] * 40)
expect_fail("run_prompt_longer_than_context", ["run", "-m", base, "--ids", long_ids, "--ctx", "16"], "40 tokens", "context")
expect_fail("logits_prompt_longer_than_context", logits_args(base, long_ids) + ["--ctx", "16"], "context")
expect_fail("ctx_beyond_model", ["run", "-m", base, "--ctx", "100000"], "max_position_embeddings")
expect_fail("unknown_option", ["run", "-m", base, "--tmep", "0"], "--tmep")
expect_fail("unknown_device", ["run", "-m", base, "--device", "tpu"], "tpu")
for cmd in ("run", "chat"):
    for flag, val in (("--top-p", "5"), ("--temp", "-1"), ("--min-p", "1.5"), ("--top-k", "-3")):
        r = varent(cmd, "-m", base, flag, val, "-n", "2", stdin="")
        # a bad option value is a usage error: exit 2 (issue 23)
        check(r.returncode == 2 and flag in r.stderr, f"{cmd}_rejects_{flag[2:]}_{val}", f"rc={r.returncode} {r.stderr!r}")
check(not os.path.exists(os.path.join(work, "out.bin")) and not os.path.exists(os.path.join(work, "out.bin.tmp")),
      "no_partial_logits_file")

# --ctx beyond the model names the model's own limit (it read the config after freeing
# the model and said "max_position_embeddings (0)"; issue 23)
max_pos = json.load(open(os.path.join(base, "config.json")))["max_position_embeddings"]
expect_fail("ctx_beyond_max_pos_names_the_limit", ["run", "-m", base, "--ctx", str(max_pos * 200), "-p", "hi"],
            f"--ctx {max_pos * 200}", f"max_position_embeddings ({max_pos})")

# --- converter ---------------------------------------------------------------------
src = os.path.join(os.environ.get("TESTTMP", work), "stories260K.bin")
cut = os.path.join(work, "cut.bin")
open(cut, "wb").write(open(src, "rb").read()[:100000])
out = os.path.join(work, "converted")
tok = os.path.join(os.environ["TESTDATA"], "stories260K", "tok512.bin")
expect_fail("convert_truncated_checkpoint", ["convert", "llama2c", cut, tok, out], "cut.bin", "truncated")
check(not os.path.exists(out), "convert_leaves_no_output", str(os.listdir(out)) if os.path.exists(out) else "")
open(cut, "wb").write(b"\x00" * 10)
expect_fail("convert_tiny_file", ["convert", "llama2c", cut, tok, out], "cut.bin")
# vocab_size INT_MIN: negating it overflowed (UBSan), and -O3 dropped the <= 0 check
import struct  # noqa: E402
open(cut, "wb").write(struct.pack("<7i", 64, 128, 2, 4, 4, -2**31, 256) + b"\x00" * 4096)
expect_fail("convert_header_vocab_int_min", ["convert", "llama2c", cut, tok, out], "cut.bin", "implausible llama2.c header")
done()
