#!/usr/bin/env python3
"""Builds the seed corpora of the fuzz targets (tests/fuzz/fuzz_*.c) from the real
files in tests/data, plus small synthetic files that keep the fuzzer fast.

usage: make_seeds.py OUT_DIR
Writes OUT_DIR/<target>/<seed> for every target, and OUT_DIR/tokenizers/{llama3,qwen3,
stories260K}/ (the tokenizers fuzz_encode loads). stories260K seeds need a varent
binary (VARENT, default ./varent) to convert the checkpoint; without one they are left
out. Nothing here is committed: the corpora are rebuilt on demand."""
import json
import lzma
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import numpy as np  # noqa: E402

import gguf_np as G  # noqa: E402

CFG_SEP = b"\n#tokenizer_config.json#\n"
GEN_SEP = b"\n#generation_config.json#\n"


def put(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def stories_dir():
    """stories260K converted by varent (vtest caches it in tests/tmp), or None."""
    os.environ.setdefault("VARENT", os.path.join(ROOT, "varent"))
    if not os.access(os.environ["VARENT"], os.X_OK):
        return None
    import vtest
    try:
        return vtest.stories_dir("bf16")
    except RuntimeError as e:
        print(f"make_seeds: no stories260K seeds: {e}", file=sys.stderr)
        return None


# ---- safetensors --------------------------------------------------------------------

def st_bytes(entries, meta=None):
    """entries: list of (name, dtype, shape, raw bytes). Returns a safetensors file."""
    hdr, data = {}, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, raw in entries:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors(out, stories):
    size = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "I32": 4}
    ents = [(f"t.{dt}", dt, [2, 3], bytes(range(6 * n))) for dt, n in size.items()]
    put(out, "safetensors", "all_dtypes", st_bytes(ents, {"format": "pt"}))
    put(out, "safetensors", "empty", st_bytes([]))
    put(out, "safetensors", "scalar_and_zero", st_bytes([("s", "F32", [], b"\0" * 4), ("z", "F16", [0, 4], b"")]))
    put(out, "safetensors", "w_f32", st_bytes([("w", "F32", [2], b"\0" * 8)]))
    put(out, "safetensors", "index", json.dumps({"metadata": {"total_size": 8},
                                                  "weight_map": {"w": "shard.safetensors"}}))
    if stories:
        raw = open(os.path.join(stories, "model.safetensors"), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        # The real tensor names with every shape shrunk to 2 elements: small but realistic.
        ents = [(k, v["dtype"], [1] * (len(v["shape"]) - 1) + [2], b"\1\2\3\4") for k, v in hdr.items()
                if k != "__metadata__"]
        put(out, "safetensors", "stories_names", st_bytes(ents, hdr.get("__metadata__")))
        put(out, "safetensors", "stories_header_only", raw[:8 + n])


# ---- config.json --------------------------------------------------------------------

def seeds_config(out, stories):
    import gen_random_checkpoint as R
    for name in R.PRESETS:
        put(out, "config", f"preset_{name}", json.dumps(R.make_config(name), indent=1))
    gen = json.dumps({"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True}).encode()
    put(out, "config", "llama3_with_gen", json.dumps(R.make_config("llama3-tiny")).encode() + GEN_SEP + gen)
    if stories:
        cfg = open(os.path.join(stories, "config.json"), "rb").read()
        put(out, "config", "stories", cfg + GEN_SEP + open(os.path.join(stories, "generation_config.json"), "rb").read())


# ---- tokenizer.json -----------------------------------------------------------------

def unpack_tokenizer(out, name):
    d = os.path.join(out, "tokenizers", name)
    os.makedirs(d, exist_ok=True)
    src = os.path.join(DATA, "tokenizers", name)
    with lzma.open(os.path.join(src, "tokenizer.json.xz")) as f:
        raw = f.read()
    with open(os.path.join(d, "tokenizer.json"), "wb") as f:
        f.write(raw)
    shutil.copy(os.path.join(src, "tokenizer_config.json"), d)
    return d, json.loads(raw)


def shrink(tok, keep=300, added=8):
    """A real tokenizer.json cut to its first keep ids (merges between kept tokens only)."""
    t = json.loads(json.dumps(tok))
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < keep}
    merges = []
    for m in t["model"].get("merges", []):
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    t["model"]["vocab"], t["model"]["merges"] = vocab, merges
    t["added_tokens"] = [dict(a, id=keep + i) for i, a in enumerate(t.get("added_tokens", [])[:added])]
    return t


def small_config(path):
    cfg = json.load(open(path))
    cfg.pop("added_tokens_decoder", None)
    return json.dumps(cfg).encode()


def seeds_tokenizer(out, stories):
    tiny = {"added_tokens": [{"id": 3, "content": "<s>", "special": True}],
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}
    put(out, "tokenizer_load", "tiny", json.dumps(tiny))
    put(out, "tokenizer_load", "tiny_pair_merges", json.dumps(
        {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]], "byte_fallback": True},
         "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"},
                                                       {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}))
    for name in ("llama3", "qwen3"):
        d, tok = unpack_tokenizer(out, name)
        small = json.dumps(shrink(tok), ensure_ascii=False).encode()
        put(out, "tokenizer_load", f"{name}_small", small)
        put(out, "tokenizer_load", f"{name}_small_cfg", small + CFG_SEP + small_config(os.path.join(d, "tokenizer_config.json")))
    if stories:
        d = os.path.join(out, "tokenizers", "stories260K")
        os.makedirs(d, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(stories, f), d)
        raw = open(os.path.join(stories, "tokenizer.json"), "rb").read()
        put(out, "tokenizer_load", "stories", raw + CFG_SEP + open(os.path.join(stories, "tokenizer_config.json"), "rb").read())


def seeds_encode(out):
    texts = []
    for f in ("ggml-vocab-qwen2.gguf.inp", "ggml-vocab-llama-bpe.gguf.inp"):
        raw = open(os.path.join(DATA, "tokenizers", "vectors", f), "rb").read()
        texts += [t.strip(b"\n") for t in raw.split(b"__ggml_vocab_test__")]
    with lzma.open(os.path.join(DATA, "tokenizers", "vectors", "llama3.jsonl.xz"), "rt") as f:
        texts += [json.loads(line)["text"].encode() for line in list(f)[:40] if line.strip()]
    texts += [b"<|im_start|>user\nhi<|im_end|>", b"<|begin_of_text|>x", b"\xff\xfe\xc3(", "日本語 🦙".encode()]
    seen = set()
    for i, t in enumerate(texts):
        if t in seen or len(t) > 4000:
            continue
        seen.add(t)
        put(out, "encode", f"text{i:03d}", bytes([(i % 4) | (i & 4) | (i & 8)]) + t)
    put(out, "encode", "ids", bytes([0x10]) + struct.pack("<8H", 1, 2, 300, 7000, 65535, 65534, 12, 99))


# ---- GGUF ---------------------------------------------------------------------------

TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"] + \
    [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ġa", "ab", "abc", "Ġab"]
MERGES = ["Ġ a", "a b", "ab c", "Ġ ab"]


def gguf_model(arch, D=32, F=32, H=2, KV=1, hd=16, qtype=G.F32, tok=True, extra=None):
    rng = np.random.default_rng(7)
    V = len(TOKENS)
    kv = {"general.architecture": arch, f"{arch}.block_count": 1, f"{arch}.embedding_length": D,
          f"{arch}.feed_forward_length": F, f"{arch}.attention.head_count": H,
          f"{arch}.attention.head_count_kv": KV, f"{arch}.context_length": 256,
          f"{arch}.rope.freq_base": 10000.0, f"{arch}.attention.layer_norm_rms_epsilon": 1e-6}
    if tok:
        kv.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2" if arch != "llama" else "llama-bpe",
                   "tokenizer.ggml.tokens": TOKENS,
                   "tokenizer.ggml.token_type": G.Val(G.ARR, [3, 3, 3, 4] + [1] * (V - 4), G.I32),
                   "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 1,
                   "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
                   "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    kv.update(extra or {})
    shapes = {"token_embd.weight": [D, V], "output_norm.weight": [D], "blk.0.attn_norm.weight": [D],
              "blk.0.ffn_norm.weight": [D], "blk.0.attn_q.weight": [D, H * hd], "blk.0.attn_k.weight": [D, KV * hd],
              "blk.0.attn_v.weight": [D, KV * hd], "blk.0.attn_output.weight": [H * hd, D],
              "blk.0.ffn_gate.weight": [D, F], "blk.0.ffn_up.weight": [D, F], "blk.0.ffn_down.weight": [F, D]}
    if arch == "qwen2":
        shapes.update({"blk.0.attn_q.bias": [H * hd], "blk.0.attn_k.bias": [KV * hd], "blk.0.attn_v.bias": [KV * hd]})
    if arch == "qwen3":
        shapes.update({"blk.0.attn_q_norm.weight": [hd], "blk.0.attn_k_norm.weight": [hd]})
    recs = []
    for name, ne in shapes.items():
        x = (0.05 * rng.standard_normal(int(np.prod(ne)))).astype(np.float32)
        t = qtype if len(ne) == 2 else G.F32
        recs.append((name, t, ne, G.quantize(x, t)))
    return kv, recs


def seeds_gguf(out, tmp):
    cases = {"qwen2_f32": ("qwen2", G.F32, {}), "llama_q8": ("llama", G.Q8_0, {}), "qwen3_q4": ("qwen3", G.Q4_0, {}),
             "llama_f16_rope": ("llama", G.F16, {"llama.rope.scaling.type": "linear"}),
             "qwen2_bf16_notok": ("qwen2", G.BF16, None)}
    for name, (arch, qt, extra) in cases.items():
        kv, recs = gguf_model(arch, qtype=qt, tok=extra is not None, extra=extra)
        put(out, "gguf", name, G.write_gguf(os.path.join(tmp, "seed.gguf"), kv, recs))
    # Metadata only: every value type, nested arrays, a custom alignment.
    kv = {"u8": G.Val(G.U8, 7), "i8": G.Val(G.I8, -7), "u16": G.Val(G.U16, 700), "i16": G.Val(G.I16, -700),
          "u32": G.Val(G.U32, 7), "i32": G.Val(G.I32, -7), "f32": G.Val(G.F32V, 0.5), "b": True, "s": "text",
          "u64": G.Val(G.U64, 2**40), "i64": G.Val(G.I64, -2**40), "f64": G.Val(G.F64V, 0.25),
          "arr": [1, 2, 3], "nested": G.Val(G.ARR, [[1, 2], [3]], G.ARR), "strs": ["a", "bc"]}
    put(out, "gguf", "all_types", G.write_gguf(os.path.join(tmp, "seed.gguf"), kv, [], alignment=64))
    put(out, "gguf", "v2_empty", G.write_gguf(os.path.join(tmp, "seed.gguf"), {}, [], version=2))
    os.remove(os.path.join(tmp, "seed.gguf"))


# ---- chat templates -----------------------------------------------------------------

def seeds_chat(out):
    d = os.path.join(DATA, "chat-templates")
    convs = [b"\x01\x00You are terse.\x01\x01Hi!\x01\x02Hello.\x01\x01Bye",
             b"\x01\x01What is 2+2?\x01\x02\x02thinking...\x024\x01\x03{\"r\": 4}\x01\x01thanks",
             b"\x01\x02only assistant", b""]
    for i, f in enumerate(sorted(os.listdir(d))):
        if not f.endswith(".jinja"):
            continue
        tpl = open(os.path.join(d, f), "rb").read().replace(b"\x01", b"").replace(b"\x00", b"")
        for k, c in enumerate(convs):
            put(out, "chat", f"{f[:-6]}_{k}", bytes([(i * 16 + k * 3) & 0xFF]) + tpl + c)
    for k in range(8):
        put(out, "chat", f"byname_{k}", bytes([k << 4 | 1]) + b"no template" + convs[k % 2])


# ---- server request bodies ------------------------------------------------------------

def seeds_server(out):
    comp = [{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0},
            {"model": "stories260K", "prompt": [1, 403, 407], "n": 2, "seed": 7, "stop": ["\n", "."],
             "logprobs": 3, "stream": True, "stream_options": {"include_usage": True}},
            {"prompt": ["one"], "top_p": 0.9, "top_k": 40, "min_p": 0.05, "sampler": "entropix", "profile": "seed",
             "metrics": False, "user": "x"},
            {"prompt": [[1, 2, 3]], "max_tokens": None, "stop": "END"},
            {"prompt": [[1, 2, 3], "two", [4]], "n": 3, "echo": True, "max_tokens": 1, "logprobs": 1,
             "stop": ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "</s>"]}]
    chat = [{"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 8},
            {"messages": [{"role": "developer", "content": "Be brief."},
                          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                          {"role": "assistant", "content": None}, {"role": "tool", "content": "{}"}],
             "logprobs": True, "top_logprobs": 5, "stream": True, "seed": 1, "temperature": 0.7}]
    for i, b in enumerate(comp):
        put(out, "server_request", f"completions{i}", b"\0" + json.dumps(b).encode())
    for i, b in enumerate(chat):
        put(out, "server_request", f"chat{i}", b"\1" + json.dumps(b).encode())
    put(out, "server_request", "not_object", b"\1[1,2]")


def seeds_llama2c(out):
    raw = open(os.path.join(DATA, "stories260K", "tok512.bin"), "rb").read()
    put(out, "llama2c_vocab", "tok512", struct.pack("<H", 511) + raw)
    put(out, "llama2c_vocab", "tok512_first64", struct.pack("<H", 63) + raw)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    stories = stories_dir()
    seeds_safetensors(out, stories)
    seeds_config(out, stories)
    seeds_tokenizer(out, stories)
    seeds_encode(out)
    seeds_gguf(out, out)
    seeds_chat(out)
    seeds_server(out)
    seeds_llama2c(out)
    for t in sorted(os.listdir(out)):
        if t != "tokenizers":
            print(f"make_seeds: {t}: {len(os.listdir(os.path.join(out, t)))} seeds")


if __name__ == "__main__":
    main()
