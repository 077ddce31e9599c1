"""Sanity checks of the numpy reference (tests/reference) and the checkpoint tools,
independent of the C engine: bf16 rounding, safetensors layout, RoPE layouts, llama3
frequency bands, GQA head mapping, sharding, the llama2.c exporter and the metrics."""
import json
import lzma
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import hf_to_llama2c
import ref_llama2c
import ref_metrics
import ref_model
import safetensors_np as stn

TMP = vtest.tmpdir("refcheck")


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b)))


def test_bf16():
    cases = {  # f32 value -> expected bf16 bits (round to nearest, ties to even)
        1.0: 0x3F80, -2.0: 0xC000, 1 + 2**-8: 0x3F80, 1 + 3 * 2**-8: 0x3F82,
        1 + 2**-8 + 2**-20: 0x3F81, 1 + 2**-9: 0x3F80, float("inf"): 0x7F80,
        3.4028235e38: 0x7F80, 3.3895314e38: 0x7F7F, 1e-40: 0x0001, 0.0: 0x0000}
    xs = np.array(list(cases), dtype=np.float32)
    got = stn.f32_to_bf16(xs)
    check(list(got) == list(cases.values()), "bf16_round_nearest_even",
          f"{[hex(g) for g in got]}")
    nan = stn.f32_to_bf16(np.array([np.nan], dtype=np.float32))
    check(np.isnan(stn.bf16_to_f32(nan))[0], "bf16_nan_stays_nan")
    check(stn.bf16_to_f32(np.array([0x3F80, 0xC0A0], dtype=np.uint16)).tolist() == [1.0, -5.0], "bf16_widen")


def test_safetensors_layout():
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((3, 5)), rng.standard_normal(7), rng.standard_normal((2, 2, 2))
    p = os.path.join(TMP, "t.safetensors")
    stn.save_file(p, {"a": ("F32", a), "b": ("F16", b), "c": ("BF16", c)}, metadata={"format": "pt"})
    raw = open(p, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    ok = (8 + n) % 8 == 0 and hdr["__metadata__"] == {"format": "pt"}
    off = hdr["a"]["data_offsets"]
    a_back = np.frombuffer(raw[8 + n + off[0]:8 + n + off[1]], dtype="<f4").reshape(3, 5)
    ok = ok and hdr["b"]["dtype"] == "F16" and hdr["c"]["shape"] == [2, 2, 2]
    ok = ok and np.array_equal(a_back, a.astype(np.float32))
    ok = ok and hdr["c"]["data_offsets"][1] == len(raw) - 8 - n
    check(ok, "safetensors_header_by_hand", str(hdr))
    f = stn.SafeTensorsFile(p)
    ok = np.array_equal(f.get("a"), a.astype(np.float32))
    ok = ok and np.array_equal(f.get("b"), b.astype(np.float16).astype(np.float32))
    ok = ok and np.max(np.abs(f.get("c") - c)) <= np.max(np.abs(c)) * 2**-8
    check(ok, "safetensors_roundtrip_f32_f16_bf16")


def test_rope_layouts():
    """rotate-half on HF rows == adjacent-pair rotation (as complex numbers) on the
    rows permuted by hf_to_interleaved; attention dot products are unchanged."""
    rng = np.random.default_rng(1)
    H, hd, T = 3, 8, 5
    q = rng.standard_normal((T, H, hd))
    k = rng.standard_normal((T, H, hd))
    pos = np.arange(T) * 7.0
    inv = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    q_hf = ref_model.rope_rotate_half(q, pos, inv)
    # interleaved, computed as complex multiplication z * e^{i pos f}
    qi = hf_to_interleaved_rows(q, H)
    z = (qi[..., 0::2] + 1j * qi[..., 1::2]) * np.exp(1j * np.outer(pos, inv))[:, None, :]
    q_il = np.stack([z.real, z.imag], axis=-1).reshape(T, H, hd)
    check(np.allclose(hf_to_interleaved_rows(q_hf, H), q_il, atol=1e-12), "rope_rotate_half_eq_interleaved")
    k_hf = ref_model.rope_rotate_half(k, pos, inv)
    k_il = ref_llama2c._rope_pairs(hf_to_interleaved_rows(k, H), pos, hd)
    d1 = np.einsum("thd,shd->hts", q_hf, k_hf)
    d2 = np.einsum("thd,shd->hts", q_il, k_il)
    check(np.allclose(d1, d2, atol=1e-10), "rope_scores_layout_invariant")
    # a rotation by position p then scores depend only on relative position
    k0 = ref_model.rope_rotate_half(k[:1], np.array([3.0]), inv)
    q0 = ref_model.rope_rotate_half(q[:1], np.array([10.0]), inv)
    k1 = ref_model.rope_rotate_half(k[:1], np.array([0.0]), inv)
    q1 = ref_model.rope_rotate_half(q[:1], np.array([7.0]), inv)
    check(np.allclose((q0 * k0).sum(-1), (q1 * k1).sum(-1)), "rope_relative_position")


def hf_to_interleaved_rows(x, H):
    """Apply the exporter's row permutation to activations [T, H, hd]."""
    T, _, hd = x.shape
    return np.stack([hf_to_llama2c.hf_to_interleaved(x[t].reshape(H * hd), H) for t in range(T)]).reshape(T, H, hd)


def test_llama3_freqs():
    cfg = ref_model.Config(gen.make_config("llama3-tiny"))
    check(ref_model.rope_bands(cfg) == (2, 3, 11), "llama3_tiny_has_three_bands", str(ref_model.rope_bands(cfg)))
    rs, d = cfg.rope_scaling, cfg.head_dim
    want = []
    for i in range(d // 2):  # the published piecewise rule, one frequency at a time
        f = cfg.theta ** (-2 * i / d)
        wavelen = 2 * math.pi / f
        ratio = rs["original_max_position_embeddings"] / wavelen
        if ratio > rs["high_freq_factor"]:
            want.append(f)
        elif ratio < rs["low_freq_factor"]:
            want.append(f / rs["factor"])
        else:
            t = (ratio - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
            want.append((1 - t) * f / rs["factor"] + t * f)
    check(np.allclose(ref_model.rope_inv_freq(cfg), want, rtol=1e-12), "llama3_inv_freq_piecewise")
    c8 = ref_model.Config(gen.make_config("llama-3.1-8b"))
    inv = ref_model.rope_inv_freq(c8)
    check(inv[0] == 1.0 and np.isclose(inv[-1], 500000 ** (-126 / 128) / 8), "llama3_8b_inv_freq_ends")


def test_prefix_causal(model):
    ids = np.random.default_rng(2).integers(0, model.cfg.vocab, 20)
    full = ref_model.forward(model, ids)
    part = ref_model.forward(model, ids[:9])
    check(np.allclose(full[:9], part, rtol=1e-12, atol=1e-12), "forward_causal_prefix")


def test_gqa_mapping(src):
    """A GQA model equals the MHA model whose k/v heads are copied per query group."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    ck = stn.CheckpointReader(src)
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["head_dim"]
    t = {k: ck.get(k) for k in ck.keys()}
    for k in list(t):
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            w = t[k].reshape(KV, hd, -1)
            t[k] = np.repeat(w, H // KV, axis=0).reshape(H * hd, -1)
    dst = os.path.join(TMP, "mha-copy")
    os.makedirs(dst, exist_ok=True)
    stn.save_file(os.path.join(dst, "model.safetensors"), t)
    json.dump(dict(cfg, num_key_value_heads=H), open(os.path.join(dst, "config.json"), "w"))
    ids = np.random.default_rng(3).integers(0, cfg["vocab_size"], 11)
    check(np.allclose(ref_model.forward(src, ids), ref_model.forward(dst, ids), rtol=1e-10, atol=1e-10),
          "gqa_equals_mha_with_copied_kv")


def test_sharding_and_dtype():
    one = os.path.join(TMP, "q3-one")
    three = os.path.join(TMP, "q3-three")
    f32 = os.path.join(TMP, "q3-f32")
    gen.generate("qwen3-tiny", one, seed=5)
    gen.generate("qwen3-tiny", three, seed=5, shards=3)
    gen.generate("qwen3-tiny", f32, seed=5, dtype="f32")
    idx = json.load(open(os.path.join(three, "model.safetensors.index.json")))
    files = sorted(set(idx["weight_map"].values()))
    check(files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
          and not os.path.exists(os.path.join(three, "model.safetensors")), "sharded_files_named_like_hf", str(files))
    ids = np.random.default_rng(4).integers(0, 1003, 13)
    check(np.array_equal(ref_model.forward(one, ids), ref_model.forward(three, ids)), "sharded_equals_unsharded")
    a, b = stn.CheckpointReader(f32), stn.CheckpointReader(one)
    same = all(np.array_equal(stn.bf16_to_f32(stn.f32_to_bf16(a.get(k))), b.get(k)) for k in a.keys())
    check(same and sorted(a.keys()) == sorted(b.keys()), "bf16_is_rounded_f32_same_seed")
    cfg = json.load(open(os.path.join(one, "config.json")))
    check(cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]
          and "model.layers.0.self_attn.q_norm.weight" in b and "lm_head.weight" not in b, "qwen3_tiny_shape")


def test_cli():
    d = os.path.join(TMP, "cli-qwen2")
    tool = os.path.join(vtest.ROOT, "tools", "gen_random_checkpoint.py")
    r = subprocess.run([sys.executable, tool, "--preset", "qwen2-tiny", d, "--seed", "3", "--dtype", "f32",
                        "--shards", "2"], capture_output=True, text=True)
    files = sorted(os.listdir(d)) if os.path.isdir(d) else []
    want = ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    check(r.returncode == 0 and files == want, "gen_cli_sharded_f32", r.stderr[-200:] + str(files))
    cfg = json.load(open(os.path.join(d, "config.json")))
    ck = stn.CheckpointReader(d)
    check(cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["torch_dtype"] == "float32"
          and ck.info("model.embed_tokens.weight") == ("F32", (1100, 112)), "gen_cli_config")


def test_presets_alive():
    """Logits neither one-hot nor uniform; Qwen2 has q/k/v biases; untied has lm_head."""
    for p in ("llama3-tiny", "llama-mha-untied", "qwen2-tiny", "qwen3-tiny"):
        d = os.path.join(TMP, p)
        gen.generate(p, d, seed=1)
        m = ref_model.Model(d)
        lg = ref_model.forward(m, np.arange(1, 40) * 7 % m.cfg.vocab)
        H, _ = ref_metrics.logit_entropy(lg)
        check(1.0 < H.min() and H.max() < math.log2(m.cfg.vocab) - 1, f"preset_alive_{p}",
              f"entropy range {H.min():.2f}..{H.max():.2f}")
    ck = stn.CheckpointReader(os.path.join(TMP, "qwen2-tiny"))
    check(all(f"model.layers.1.self_attn.{x}_proj.bias" in ck for x in "qkv")
          and "model.layers.1.self_attn.o_proj.bias" not in ck, "qwen2_has_qkv_bias")
    check("lm_head.weight" in stn.CheckpointReader(os.path.join(TMP, "llama-mha-untied")), "untied_has_lm_head")


def test_llama2c_export():
    # llama-mha-untied: MHA + untied; llama3-tiny without rope scaling: GQA + tied
    gqa = os.path.join(TMP, "llama-gqa-noscale")
    shutil.copytree(os.path.join(TMP, "llama3-tiny"), gqa, dirs_exist_ok=True)
    cfg = json.load(open(os.path.join(gqa, "config.json")))
    json.dump(dict(cfg, rope_scaling=None), open(os.path.join(gqa, "config.json"), "w"))
    ids = np.random.default_rng(6).integers(0, 997, 33)
    for name, d in (("mha_untied", os.path.join(TMP, "llama-mha-untied")), ("gqa_tied", gqa)):
        out = os.path.join(TMP, name + ".bin")
        hf_to_llama2c.export(d, out, seq_len=64)
        c = json.load(open(os.path.join(d, "config.json")))
        hs = c["hidden_size"] // c["num_attention_heads"]
        kv = c["num_key_value_heads"] * hs
        D, F, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
        nfloat = V * D + L * (2 * D + 2 * D * D + 2 * kv * D + 3 * D * F) + D + 64 * hs + \
            (0 if c["tie_word_embeddings"] else V * D)
        hdr = struct.unpack("<7i", open(out, "rb").read(28))
        check(os.path.getsize(out) == 28 + 4 * nfloat and hdr[5] == (V if c["tie_word_embeddings"] else -V),
              f"llama2c_layout_{name}", f"header {hdr}")
        want = ref_model.forward(d, ids)
        got = ref_llama2c.forward(out, ids)
        check(rel(got, want) < 1e-9, f"llama2c_forward_equals_hf_{name}", f"rel {rel(got, want):.2e}")
    try:
        hf_to_llama2c.export(os.path.join(TMP, "qwen3-tiny"), os.path.join(TMP, "bad.bin"))
        check(False, "llama2c_refuses_qwen3", "exported")
    except SystemExit:
        check(True, "llama2c_refuses_qwen3")


def test_stories260K():
    """A real trained llama2.c model: ref_llama2c's greedy text must match run.c's published
    output, and ref_model on the same weights converted to HF layout must agree."""
    src = os.path.join(vtest.TESTDATA, "stories260K")
    binp = os.path.join(TMP, "stories260K.bin")
    with lzma.open(os.path.join(src, "stories260K.bin.xz")) as f, open(binp, "wb") as g:
        g.write(f.read())
    raw, off, vocab = open(os.path.join(src, "tok512.bin"), "rb").read(), 4, []
    for _ in range(512):  # llama2.c tokenizer: max_len, then (score f32, len i32, bytes)*
        n = struct.unpack("<fi", raw[off:off + 8])[1]
        vocab.append(raw[off + 8:off + 8 + n])
        off += 8 + n
    ids = [1]  # BOS
    for _ in range(24):
        ids.append(int(ref_llama2c.forward(binp, ids)[-1].argmax()))
    text = b"".join(vocab[i] for i in ids[1:]).decode().lstrip()
    want = open(os.path.join(src, "greedy.txt")).read()
    check(want.startswith(text) and len(text) > 60, "llama2c_stories260K_greedy_matches_runc", repr(text))
    c, w = ref_llama2c.load(binp)
    H, KV, D = c["n_heads"], c["n_kv"], c["dim"]

    def to_hf(m, n):  # interleaved pairs -> rotate-half rows, per head
        return m.reshape(n, -1, 2, D).swapaxes(1, 2).reshape(m.shape)

    t = {"model.embed_tokens.weight": w["tok"], "model.norm.weight": w["rms_final"]}
    for i in range(c["n_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": w["rms_att"][i], p + "post_attention_layernorm.weight": w["rms_ffn"][i],
                  p + "self_attn.q_proj.weight": to_hf(w["wq"][i], H), p + "self_attn.k_proj.weight": to_hf(w["wk"][i], KV),
                  p + "self_attn.v_proj.weight": w["wv"][i], p + "self_attn.o_proj.weight": w["wo"][i],
                  p + "mlp.gate_proj.weight": w["w1"][i], p + "mlp.down_proj.weight": w["w2"][i],
                  p + "mlp.up_proj.weight": w["w3"][i]})
    d = os.path.join(TMP, "stories260K-hf")
    os.makedirs(d, exist_ok=True)
    stn.save_file(os.path.join(d, "model.safetensors"), t)
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
               "intermediate_size": c["hidden"], "num_hidden_layers": c["n_layers"], "num_attention_heads": H,
               "num_key_value_heads": KV, "vocab_size": c["vocab"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": True, "max_position_embeddings": c["seq_len"]},
              open(os.path.join(d, "config.json"), "w"))
    e = rel(ref_model.forward(d, ids), ref_llama2c.forward(binp, ids))
    check(e < 1e-9, "ref_model_stories260K_equals_llama2c", f"rel {e:.2e}")


def test_metrics_by_hand():
    h = 0.5 - 0.75 * math.log2(0.75)  # p = (1/4, 3/4)
    v = 0.25 * (-2 + h) ** 2 + 0.75 * (math.log2(0.75) + h) ** 2
    H, V = ref_metrics.logit_entropy(np.array([0.0, math.log(3)]) + 5.0)
    check(abs(H - h) < 1e-12 and abs(V - v) < 1e-12, "entropy_varentropy_two_tokens", f"{H} {V}")
    H, V = ref_metrics.logit_entropy(np.zeros(8))
    check(abs(H - 3) < 1e-12 and abs(V) < 1e-12, "entropy_uniform_8")
    m = ref_metrics.attention_metrics(np.array([[0.0, 0.0], [math.log(3), 0.0]]))
    want = {"attn_entropy": (1 + h) / 2, "attn_varentropy": ((1 - h) / 2) ** 2, "agreement": 0.125,
            "interaction_strength": math.log(3) / 4}
    check(all(abs(m[k] - want[k]) < 1e-12 for k in want), "attention_metrics_two_heads", str(m))
    m = ref_metrics.attention_metrics(np.array([[50.0, 0.0, 0.0]]))  # one-hot: clip keeps log finite
    check(abs(m["attn_entropy"]) < 1e-9 and m["agreement"] == 0.0, "attention_metrics_one_hot", str(m))


def test_scores_output(model):
    ids = np.random.default_rng(7).integers(0, model.cfg.vocab, 6)
    lg, s = ref_model.forward(model, ids, return_scores=True)
    _, s0 = ref_model.forward(model, ids, scores_layer=0, return_scores=True)
    check(s.shape == (model.cfg.n_heads, 6) and np.isfinite(s).all() and not np.allclose(s, s0),
          "scores_last_query_shape", str(s.shape))


test_bf16()
test_safetensors_layout()
test_rope_layouts()
test_llama3_freqs()
test_presets_alive()
m3 = ref_model.Model(os.path.join(TMP, "llama3-tiny"))
test_prefix_causal(m3)
test_scores_output(m3)
test_gqa_mapping(os.path.join(TMP, "llama3-tiny"))
test_sharding_and_dtype()
test_llama2c_export()
test_metrics_by_hand()
test_cli()
test_stories260K()
shutil.rmtree(TMP, ignore_errors=True)
vtest.done()
