"""test_gguf: `varent convert gguf` against an independent numpy GGUF writer and
numpy (de)quantizers (tests/reference/gguf_np.py)."""
import json
import os
import shutil
import struct
import sys

import numpy as np

import vtest
from vtest import check
import gguf_np as G

RNG = np.random.default_rng(1234)
ALL_TYPES = [G.F32, G.F16, G.BF16, G.Q8_0, G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q6_K]
TYPE_NAME = {G.F32: "F32", G.F16: "F16", G.BF16: "BF16", G.Q8_0: "Q8_0", G.Q4_0: "Q4_0", G.Q4_1: "Q4_1",
             G.Q5_0: "Q5_0", G.Q5_1: "Q5_1", G.Q6_K: "Q6_K"}
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"] + \
         [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ġa", "ab", "abc", "Ġab"]
MERGES = ["Ġ a", "a b", "ab c", "Ġ ab"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def tok_kv(pre):
    types = [3, 3, 3, 4] + [1] * (len(TOKENS) - 4)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.token_type": G.Val(G.ARR, types, G.I32),
            "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 0,
            "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": TEMPLATE}


def hparams_kv(arch, L, D, F, H, KV, ctx=4096, theta=1e6, eps=1e-6, head_dim=None):
    kv = {"general.architecture": arch, f"{arch}.block_count": L, f"{arch}.embedding_length": D,
          f"{arch}.feed_forward_length": F, f"{arch}.attention.head_count": H,
          f"{arch}.attention.head_count_kv": KV, f"{arch}.context_length": ctx,
          f"{arch}.rope.freq_base": float(theta), f"{arch}.attention.layer_norm_rms_epsilon": float(eps)}
    if head_dim:
        kv[f"{arch}.attention.key_length"] = head_dim
        kv[f"{arch}.attention.value_length"] = head_dim
    return kv


def hf_tensors(L, D, F, H, KV, hd, V, bias=False, qk_norm=False, tied=True):
    """Random HF-layout weights: name -> float32 array (shape as HF stores it)."""
    t = {"model.embed_tokens.weight": RNG.standard_normal((V, D)),
         "model.norm.weight": 1 + 0.1 * RNG.standard_normal(D)}
    if not tied:
        t["lm_head.weight"] = RNG.standard_normal((V, D))
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = RNG.standard_normal((H * hd, D))
        t[p + "self_attn.k_proj.weight"] = RNG.standard_normal((KV * hd, D))
        t[p + "self_attn.v_proj.weight"] = RNG.standard_normal((KV * hd, D))
        t[p + "self_attn.o_proj.weight"] = RNG.standard_normal((D, H * hd))
        t[p + "mlp.gate_proj.weight"] = RNG.standard_normal((F, D))
        t[p + "mlp.up_proj.weight"] = RNG.standard_normal((F, D))
        t[p + "mlp.down_proj.weight"] = RNG.standard_normal((D, F))
        t[p + "input_layernorm.weight"] = 1 + 0.1 * RNG.standard_normal(D)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * RNG.standard_normal(D)
        if bias:
            for n, rows in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                t[p + f"self_attn.{n}_proj.bias"] = RNG.standard_normal(rows)
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = 1 + 0.1 * RNG.standard_normal(hd)
            t[p + "self_attn.k_norm.weight"] = 1 + 0.1 * RNG.standard_normal(hd)
    return {k: (0.05 * v).astype(np.float32) for k, v in t.items()}


# HF name -> GGUF name, written out independently of the converter's table.
HF2GGUF = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
           "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
           "self_attn.k_norm": "attn_k_norm"}


def gguf_name(hf):
    base, kind = hf.rsplit(".", 1)
    if base.startswith("model.layers."):
        _, _, i, rest = base.split(".", 3)
        return f"blk.{i}.{HF2GGUF[rest]}.{kind}"
    return f"{HF2GGUF[base]}.{kind}"


def to_gguf(hf, types, permute=None):
    """Quantize HF tensors into GGUF tensor records. types: hf name -> ggml type.
    permute: (n_head, n_kv) to apply llama.cpp's q/k row permutation. Returns
    (records, expected f32 arrays after dequantization, in HF layout)."""
    recs, expect = [], {}
    for name, w in hf.items():
        g = w
        if permute and (".q_proj." in name or ".k_proj." in name):
            g = G.permute_qk(w, permute[0] if ".q_proj." in name else permute[1])
        tt = types.get(name, G.F32)
        raw = G.quantize(g, tt)
        deq = G.dequantize(raw, tt, g.size).reshape(g.shape)
        if permute and (".q_proj." in name or ".k_proj." in name):
            n = permute[0] if ".q_proj." in name else permute[1]
            inv = np.argsort(G.permute_qk(np.arange(g.shape[0]), n))
            deq = deq[inv]
        recs.append((gguf_name(name), tt, list(reversed(g.shape)), raw))
        expect[name] = deq
    return recs, expect


def convert(path, out, *extra):
    return vtest.varent("convert", "gguf", path, out, *extra, timeout=120)


def load_out(out):
    st, hdr = G.read_safetensors(os.path.join(out, "model.safetensors"))
    cfg = json.load(open(os.path.join(out, "config.json")))
    return st, hdr, cfg


def test_quant_types(tmp):
    """qwen2 (no permutation, q/k/v biases): every tensor type, f32 and bf16 output."""
    L, D, F, H, KV, hd, V = 2, 256, 512, 4, 2, 64, len(TOKENS)
    hf = hf_tensors(L, D, F, H, KV, hd, V, bias=True, tied=False)
    # Include f16 subnormals and a zero block so the edge cases are exercised.
    hf["model.layers.0.mlp.up_proj.weight"][0, :8] = [1e-7, -3e-6, 6e-8, 0, 0, 0, 0, 0]
    hf["model.layers.0.mlp.up_proj.weight"][1, :32] = 0
    mats = [n for n in hf if hf[n].ndim == 2]
    types = {n: ALL_TYPES[i % len(ALL_TYPES)] for i, n in enumerate(mats)}
    types["model.layers.0.self_attn.q_proj.bias"] = G.Q8_0
    types["model.layers.1.self_attn.k_proj.bias"] = G.Q5_1
    types["model.layers.0.input_layernorm.weight"] = G.F16
    covered = set(types.values())
    check(covered >= set(ALL_TYPES), "gguf_quant_cover", f"types covered {sorted(covered)}")
    recs, expect = to_gguf(hf, types)
    kv = hparams_kv("qwen2", L, D, F, H, KV, theta=1e6, eps=1e-6)
    kv.update(tok_kv("qwen2"))
    path = os.path.join(tmp, "q.gguf")
    G.write_gguf(path, kv, recs)
    out = os.path.join(tmp, "q-f32")
    r = convert(path, out, "--dtype", "f32")
    if not check(r.returncode == 0, "gguf_convert_f32", r.stderr.strip()):
        return
    st, hdr, cfg = load_out(out)
    check(set(st) == set(hf), "gguf_names", f"extra {set(st) - set(hf)} missing {set(hf) - set(st)}")
    for tt in ALL_TYPES:
        names = [n for n in hf if types.get(n, G.F32) == tt and n in st]
        bad = [n for n in names if st[n].shape != hf[n].shape or not np.array_equal(st[n], expect[n])]
        check(names and not bad, f"gguf_dequant_{TYPE_NAME[tt]}", f"{len(names)} tensors, mismatched: {bad[:3]}")
    # The quantizers are not trivial: dequantized values are close to the originals.
    err = max(float(np.abs(expect[n] - hf[n]).max() / (np.abs(hf[n]).max() + 1e-9)) for n in hf)
    check(err < 0.2, "gguf_quant_sane", f"max relative error {err}")
    check(all(hdr[n]["dtype"] == "F32" for n in st), "gguf_dtype_f32", "non-F32 output")
    want = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": D, "intermediate_size": F,
            "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd,
            "rope_theta": 1e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "vocab_size": V,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    diff = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
    check(not diff, "gguf_config_qwen2", f"{diff}")
    check_tokenizer(out, "qwen2")

    out16 = os.path.join(tmp, "q-bf16")
    r = convert(path, out16)
    if check(r.returncode == 0, "gguf_convert_bf16", r.stderr.strip()):
        st16, hdr16, cfg16 = load_out(out16)
        bad = [n for n in hf if hdr16[n]["dtype"] != "BF16" or
               not np.array_equal(st16[n].view(np.uint32) >> 16, G.f32_to_bf16_bits(expect[n]).astype(np.uint32))]
        check(not bad, "gguf_bf16_values", f"mismatched {bad[:3]}")
        check(cfg16.get("torch_dtype") == "bfloat16", "gguf_bf16_config", str(cfg16.get("torch_dtype")))


def check_tokenizer(out, pre):
    tj = json.load(open(os.path.join(out, "tokenizer.json")))
    tc = json.load(open(os.path.join(out, "tokenizer_config.json")))
    m = tj["model"]
    ok = m["type"] == "BPE" and m["vocab"] == {t: i for i, t in enumerate(TOKENS)} and m["merges"] == MERGES
    check(ok, f"gguf_tok_vocab_{pre}", f"type {m['type']}, {len(m['vocab'])} vocab, merges {m['merges'][:4]}")
    added = [(a["id"], a["content"], a["special"]) for a in tj["added_tokens"]]
    want = [(0, TOKENS[0], True), (1, TOKENS[1], True), (2, TOKENS[2], True), (3, TOKENS[3], False)]
    check(added == want, f"gguf_tok_added_{pre}", f"{added}")
    pt = tj["pre_tokenizer"]
    if pre == "qwen2":
        ok = (pt["type"] == "Sequence" and pt["pretokenizers"][0]["type"] == "Split" and
              "\\p{N}|" in pt["pretokenizers"][0]["pattern"]["Regex"] and
              pt["pretokenizers"][1] == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                         "use_regex": False} and tj["normalizer"] == {"type": "NFC"})
    else:  # smollm
        ok = (pt["type"] == "Sequence" and pt["pretokenizers"][0] == {"type": "Digits", "individual_digits": True}
              and pt["pretokenizers"][1]["type"] == "ByteLevel" and pt["pretokenizers"][1]["use_regex"] is True
              and pt["pretokenizers"][1]["add_prefix_space"] is False and tj["normalizer"] is None)
    check(ok, f"gguf_tok_pretok_{pre}", json.dumps(pt)[:300])
    check(tj["decoder"]["type"] == "ByteLevel", f"gguf_tok_decoder_{pre}", json.dumps(tj["decoder"]))
    ok = (tc.get("chat_template") == TEMPLATE and tc.get("bos_token") == TOKENS[1] and
          tc.get("eos_token") == TOKENS[2] and tc.get("add_bos_token") is False)
    check(ok, f"gguf_tok_config_{pre}", json.dumps({k: tc.get(k) for k in ("bos_token", "eos_token", "add_bos_token")}))


def test_llama_unpermute(tmp):
    """llama: llama.cpp's q/k permutation is undone (F32 and Q8_0 storage); tied embeddings."""
    L, D, F, H, KV, hd, V = 2, 64, 96, 4, 2, 16, len(TOKENS)
    hf = hf_tensors(L, D, F, H, KV, hd, V)
    kv = hparams_kv("llama", L, D, F, H, KV, ctx=2048, theta=10000.0, eps=1e-5)
    kv.update(tok_kv("smollm"))
    recs, _ = to_gguf(hf, {}, permute=(H, KV))
    path = os.path.join(tmp, "llama.gguf")
    G.write_gguf(path, kv, recs, version=2, alignment=64)
    out = os.path.join(tmp, "llama-out")
    r = convert(path, out, "--dtype", "f32")
    if check(r.returncode == 0, "gguf_llama_convert", r.stderr.strip()):
        st, _, cfg = load_out(out)
        bad = [n for n in hf if n not in st or not np.array_equal(st[n], hf[n])]
        check(not bad, "gguf_llama_unpermute_f32", f"differ from the HF originals: {bad[:4]}")
        check(cfg.get("tie_word_embeddings") is True and "lm_head.weight" not in st and
              cfg.get("architectures") == ["LlamaForCausalLM"] and cfg.get("rope_theta") == 10000 and
              cfg.get("rms_norm_eps") == 1e-5 and cfg.get("head_dim") == hd, "gguf_llama_config", json.dumps(cfg))
        check_tokenizer(out, "smollm")
    # Quantized q/k: un-permuting the dequantized rows must give the same values as
    # dequantizing then un-permuting in numpy.
    types = {n: G.Q8_0 for n in hf if hf[n].ndim == 2}
    recs, expect = to_gguf(hf, types, permute=(H, KV))
    path = os.path.join(tmp, "llama-q8.gguf")
    G.write_gguf(path, kv, recs)
    out = os.path.join(tmp, "llama-q8-out")
    r = convert(path, out, "--dtype", "f32")
    if check(r.returncode == 0, "gguf_llama_q8_convert", r.stderr.strip()):
        st, _, _ = load_out(out)
        bad = [n for n in hf if not np.array_equal(st[n], expect[n])]
        check(not bad, "gguf_llama_unpermute_q8", f"mismatched: {bad[:4]}")


def test_qwen3(tmp):
    """qwen3: q/k norms, explicit head_dim (key_length != hidden/heads), not permuted."""
    L, D, F, H, KV, hd, V = 1, 64, 96, 4, 2, 32, len(TOKENS)
    hf = hf_tensors(L, D, F, H, KV, hd, V, qk_norm=True)
    kv = hparams_kv("qwen3", L, D, F, H, KV, head_dim=hd)
    kv.update(tok_kv("qwen2"))
    # Extra metadata of every scalar type plus nested arrays must parse.
    kv.update({"x.u8": G.Val(G.U8, 7), "x.i8": G.Val(G.I8, -7), "x.u16": G.Val(G.U16, 700),
               "x.i16": G.Val(G.I16, -700), "x.i32": G.Val(G.I32, -7), "x.u64": G.Val(G.U64, 2**40),
               "x.i64": G.Val(G.I64, -2**40), "x.f64": G.Val(G.F64V, 0.5), "x.bool": True,
               "x.nested": G.Val(G.ARR, [G.Val(G.ARR, [1, 2], G.U32), G.Val(G.ARR, ["a", "bc"], G.STR)], G.ARR),
               "x.empty": G.Val(G.ARR, [], G.STR)})
    recs, _ = to_gguf(hf, {})
    path = os.path.join(tmp, "qwen3.gguf")
    G.write_gguf(path, kv, recs)
    out = os.path.join(tmp, "qwen3-out")
    r = convert(path, out, "--dtype", "f32")
    if check(r.returncode == 0, "gguf_qwen3_convert", r.stderr.strip()):
        st, _, cfg = load_out(out)
        bad = [n for n in hf if n not in st or not np.array_equal(st[n], hf[n])]
        check(not bad, "gguf_qwen3_tensors", f"differ: {bad[:4]}")
        check(cfg.get("architectures") == ["Qwen3ForCausalLM"] and cfg.get("head_dim") == hd,
              "gguf_qwen3_config", json.dumps(cfg))


def rope_freqs(cfg):
    """llama.cpp's rope_freqs tensor for HF llama3 rope_scaling: per-frequency divisors."""
    rs, hd = cfg["rope_scaling"], cfg["head_dim"]
    f, lo, hi, orig = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    out = []
    for i in range(hd // 2):
        wl = 2 * np.pi * cfg["rope_theta"] ** (2 * i / hd)
        if wl < orig / hi:
            out.append(1.0)
        elif wl > orig / lo:
            out.append(f)
        else:
            s = (orig / wl - lo) / (hi - lo)
            out.append(1 / ((1 - s) / f + s))
    return np.array(out, np.float32)


def test_llama3_roundtrip(tmp):
    """tools/gen_random_checkpoint.py llama3-tiny -> GGUF (permuted q/k, rope_freqs) ->
    varent convert: same tensors, same rope_scaling and identical logits."""
    import subprocess
    src = os.path.join(tmp, "l3-hf")
    gen = os.path.join(vtest.ROOT, "tools", "gen_random_checkpoint.py")
    if not os.path.exists(gen):
        vtest.skip("gguf_llama3_roundtrip", "tools/gen_random_checkpoint.py missing")
        return
    r = subprocess.run([sys.executable, gen, "--preset", "llama3-tiny", src, "--dtype", "f32"],
                       capture_output=True, text=True)
    if not check(r.returncode == 0, "gguf_llama3_gen", r.stderr[-300:]):
        return
    cfg = json.load(open(os.path.join(src, "config.json")))
    hf, _ = G.read_safetensors(os.path.join(src, "model.safetensors"))
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    kv = hparams_kv("llama", cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], H, KV,
                    ctx=cfg["max_position_embeddings"], theta=cfg["rope_theta"], eps=cfg["rms_norm_eps"],
                    head_dim=cfg["head_dim"])
    recs, _ = to_gguf(hf, {}, permute=(H, KV))
    rf = rope_freqs(cfg)
    recs.append(("rope_freqs.weight", G.F32, [len(rf)], rf.tobytes()))
    path = os.path.join(tmp, "l3.gguf")
    G.write_gguf(path, kv, recs)
    out = os.path.join(tmp, "l3-out")
    r = convert(path, out, "--dtype", "f32")
    if not check(r.returncode == 0, "gguf_llama3_convert", r.stderr.strip()):
        return
    st, _, got = load_out(out)
    bad = [n for n in hf if n not in st or not np.array_equal(st[n], hf[n])]
    check(not bad and set(st) == set(hf), "gguf_llama3_tensors", f"differ: {bad[:4]}")
    rs_ok = {k: float(v) for k, v in got.get("rope_scaling", {}).items() if k != "rope_type"} == \
        {k: float(v) for k, v in cfg["rope_scaling"].items() if k != "rope_type"}
    check(rs_ok and got["rope_scaling"]["rope_type"] == "llama3", "gguf_llama3_rope_scaling",
          f"{got.get('rope_scaling')} vs {cfg['rope_scaling']}")
    ids = "1,5,17,300,999,42,7"
    outs = []
    for d in (src, out):
        f = os.path.join(tmp, os.path.basename(d) + ".logits")
        r = vtest.varent("logits", "-m", d, "--ids", ids, "--out", f, timeout=120)
        if r.returncode != 0:
            vtest.skip("gguf_llama3_logits", f"varent logits failed: {r.stderr.strip()[:200]}")
            return
        outs.append(np.fromfile(f, np.float32))
    check(outs[0].size == cfg["vocab_size"] and np.array_equal(outs[0], outs[1]), "gguf_llama3_logits",
          f"sizes {outs[0].size}/{outs[1].size}, max diff {np.abs(outs[0] - outs[1]).max() if outs[0].size == outs[1].size else '-'}")


def expect_error(tmp, name, data, words):
    """Convert a broken file: non-zero exit, a message containing words, no output left."""
    path = os.path.join(tmp, name + ".gguf")
    with open(path, "wb") as f:
        f.write(data)
    out = os.path.join(tmp, name + "-out")
    r = convert(path, out, "--dtype", "f32")
    msg = r.stderr.strip()
    ok = r.returncode != 0 and all(w.lower() in msg.lower() for w in words) and not os.path.exists(out)
    check(ok, f"gguf_bad_{name}", f"rc {r.returncode}, stderr {msg!r}, out exists {os.path.exists(out)}")
    # A pre-existing output directory is left empty.
    shutil.rmtree(out, ignore_errors=True)  # (what a wrongly successful conversion wrote)
    os.makedirs(out)
    r = convert(path, out)
    check(r.returncode != 0 and os.listdir(out) == [], f"gguf_bad_{name}_existing_dir",
          f"rc {r.returncode}, left {os.listdir(out)}")


def test_bad_inputs(tmp):
    L, D, F, H, KV, hd, V = 1, 256, 256, 4, 2, 64, len(TOKENS)
    hf = hf_tensors(L, D, F, H, KV, hd, V, bias=True)  # qwen2 has q/k/v biases
    kv = hparams_kv("qwen2", L, D, F, H, KV)
    kv.update(tok_kv("qwen2"))
    recs, _ = to_gguf(hf, {})
    good = G.write_gguf(os.path.join(tmp, "good.gguf"), kv, recs)
    expect_error(tmp, "magic", b"GGML" + good[4:], ["magic", "offset 0"])
    expect_error(tmp, "tensor_count", good[:8] + struct.pack("<Q", 10**12) + good[16:], ["tensor count"])
    expect_error(tmp, "kv_count", good[:16] + struct.pack("<Q", 10**9) + good[24:], ["metadata count"])
    hdr = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    expect_error(tmp, "key_length", hdr + struct.pack("<Q", 1000) + b"general", ["length 1000", "offset 24"])
    val_len = hdr + G._enc_str("general.name") + struct.pack("<IQ", G.STR, 10**6) + b"abc"
    expect_error(tmp, "string_length", val_len, ["general.name", "past the end"])
    bad_type = hdr + G._enc_str("general.name") + struct.pack("<I", 99) + b"\0" * 16
    expect_error(tmp, "value_type", bad_type, ["unknown metadata value type 99", "general.name"])
    bad_arr = hdr + G._enc_str("x.arr") + struct.pack("<IIQ", G.ARR, G.U32, 10**12) + b"\0" * 16
    expect_error(tmp, "array_count", bad_arr, ["array count", "x.arr"])
    expect_error(tmp, "truncated", good[:len(good) - 100], ["past the end", "truncated"])
    expect_error(tmp, "truncated_header", good[:200], ["size 200"])
    # Unsupported block type (Q4_K: 144 bytes per 256) for one tensor.
    recs2 = [(n, G.Q4_K, ne, bytes(144 * int(np.prod(ne)) // 256)) if n == "blk.0.ffn_up.weight"
             else (n, t, ne, raw) for n, t, ne, raw in recs]
    data = G.write_gguf(os.path.join(tmp, "q4k.gguf"), kv, recs2)
    expect_error(tmp, "unsupported_type", data, ["unsupported type Q4_K", "blk.0.ffn_up.weight"])
    kv_arch = dict(kv, **{"general.architecture": "gpt2"})
    data = G.write_gguf(os.path.join(tmp, "arch.gguf"), kv_arch, recs)
    expect_error(tmp, "architecture", data, ["architecture 'gpt2'"])


def test_inconsistent(tmp):
    """Well-formed GGUFs whose metadata disagrees with the tensors or is out of range
    (issue 22, row 17): each fails naming the key, and writes nothing."""
    L, D, F, H, KV, hd, V = 2, 256, 256, 4, 2, 64, len(TOKENS)
    recs, _ = to_gguf(hf_tensors(L, D, F, H, KV, hd, V, bias=True), {})  # qwen2 has q/k/v biases
    a = "qwen2"
    kv = hparams_kv(a, L, D, F, H, KV)
    kv.update(tok_kv(a))

    def case(name, words, recs_=recs, **changes):
        k = dict(kv)
        for key, v in changes.items():
            key = key.replace("__", ".").replace("ARCH", a)
            if v is None:
                k.pop(key, None)
            else:
                k[key] = v
        data = G.write_gguf(os.path.join(tmp, f"inc-{name}.gguf"), k, recs_)
        expect_error(tmp, f"inconsistent_{name}", data, words)

    nan = float("nan")
    case("block_count_3", ["ARCH.block_count".replace("ARCH", a), "3", "blk.2"], ARCH__block_count=3)
    case("ffn_127", ["feed_forward_length", "127"], ARCH__feed_forward_length=127)
    case("embedding_length", ["embedding_length", "128"], ARCH__embedding_length=128)
    # 16 heads of 16 still fill attn_q (256 rows); attn_k's 128 rows are not 2 heads of 16
    case("head_count", ["attention.head_count_kv", "2 x 16", "blk.0.attn_k.weight"], ARCH__attention__head_count=16)
    case("context_0", ["context_length", "0"], ARCH__context_length=0)
    case("context_2_40", ["context_length", str(2**40)], ARCH__context_length=G.Val(G.U64, 2**40))
    case("freq_base_0", ["rope.freq_base", "positive"], ARCH__rope__freq_base=0.0)
    case("freq_base_negative", ["rope.freq_base", "-1"], ARCH__rope__freq_base=-1.0)
    case("freq_base_nan", ["rope.freq_base", "nan"], ARCH__rope__freq_base=nan)
    case("rms_eps_0", ["layer_norm_rms_epsilon", "positive"], ARCH__attention__layer_norm_rms_epsilon=0.0)
    case("rms_eps_nan", ["layer_norm_rms_epsilon", "nan"], ARCH__attention__layer_norm_rms_epsilon=nan)
    case("key_length_0", ["key_length", "0"], ARCH__attention__key_length=0)
    case("key_length_mismatch", ["key_length", "32"], ARCH__attention__key_length=32)
    case("merges_unknown_token", ["tokenizer.ggml.merges", "merges[4]", "zz"], tokenizer__ggml__merges=MERGES + ["a zz"])
    case("merges_unknown_result", ["tokenizer.ggml.merges", "merges[4]", '"b" + "c"'], tokenizer__ggml__merges=MERGES + ["b c"])
    case("bos_out_of_range", ["bos_token_id", "999"], tokenizer__ggml__bos_token_id=999)
    # A layer's tensor missing though block_count covers it.
    short = [r for r in recs if r[0] != "blk.1.ffn_down.weight"]
    case("missing_tensor", ["blk.1.ffn_down.weight", "missing"], recs_=short)
    # Issue 32, row 13: the architecture's tensors (a qwen2 model without its q/k/v biases
    # converted, then could not run), and partial rotary (it ran with full rotary: wrong
    # logits).
    no_bias = [r for r in recs if not r[0].endswith(".bias")]
    case("qwen2_without_biases", ["blk.0.attn_q.bias", "missing", "qwen2 model has q/k/v biases"], recs_=no_bias)
    no_v1 = [r for r in recs if r[0] != "blk.1.attn_v.bias"]
    case("qwen2_missing_one_bias", ["blk.1.attn_v.bias", "missing"], recs_=no_v1)
    qk, _ = to_gguf({k: v for k, v in hf_tensors(1, D, F, H, KV, hd, V, qk_norm=True).items() if "q_norm" in k}, {})
    case("qwen2_with_qk_norm", ["blk.0.attn_q_norm.weight", "q/k norm", "qwen3"], recs_=recs + qk)
    case("rope_dimension_count_32", ["rope.dimension_count", "32", "head size is 64", "partial rotary"],
         ARCH__rope__dimension_count=32)
    case("rope_dimension_count_63", ["rope.dimension_count", "63", "partial rotary"], ARCH__rope__dimension_count=63)
    k = dict(kv, **{"qwen2.rope.dimension_count": hd})
    data = G.write_gguf(os.path.join(tmp, "rope-full.gguf"), k, recs)
    r = convert(os.path.join(tmp, "rope-full.gguf"), os.path.join(tmp, "rope-full-out"))
    check(r.returncode == 0, "gguf_rope_dimension_count_full", r.stderr[-300:])


def main():
    if not os.access(vtest.VARENT, os.X_OK):
        vtest.skip("gguf", f"no varent binary at {vtest.VARENT}")
        vtest.done()
    tmp = vtest.tmpdir("gguf")
    test_quant_types(tmp)
    test_llama_unpermute(tmp)
    test_qwen3(tmp)
    test_llama3_roundtrip(tmp)
    test_bad_inputs(tmp)
    test_inconsistent(tmp)
    if not vtest.failures:  # keep the files for debugging only when something failed
        shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
