#!/usr/bin/env python3
"""hf_to_llama2c: export an HF Llama directory to Karpathy's llama2.c legacy (version 0)
checkpoint, so llama2.c's run.c can run the very same weights as a speed peer.

  hf_to_llama2c.py HF_DIR OUT.bin [--seq-len N] [--force]

Layout (what run.c's read_checkpoint / memory_map_weights expect):
  int32 header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
    (vocab_size negative when the classifier is not shared with the embedding)
  float32: token_embedding [vocab, dim]; rms_att [L, dim]; wq [L, dim, dim];
    wk [L, kv_dim, dim]; wv [L, kv_dim, dim]; wo [L, dim, dim]; rms_ffn [L, dim];
    w1 [L, hidden, dim]; w2 [L, dim, hidden]; w3 [L, hidden, dim]; rms_final [dim];
    freq_cis_real [seq_len, head_size/2]; freq_cis_imag [same] (run.c skips both);
    wcls [vocab, dim] only when unshared.
HF's q/k rows are in rotate-half order (frequency i pairs rows i and i+hd/2 of each head);
llama2.c rotates adjacent pairs (2i, 2i+1), so those rows are interleaved back.
run.c hardcodes RoPE base 10000, RMSNorm eps 1e-5, head_size = dim/n_heads and has no
biases, q/k norms or rope scaling: other models are refused (unless --force).
"""
import argparse
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from safetensors_np import CheckpointReader  # noqa: E402
from ref_model import Config  # noqa: E402


def hf_to_interleaved(w, n_heads):
    """Rows of a q/k weight (or bias) from rotate-half to interleaved-pair order, per head."""
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def problems(cfg, ck):
    """Reasons run.c would not compute the same function as HF on this model."""
    out = []
    if cfg.model_type != "llama":
        out.append(f"model_type {cfg.model_type} (run.c is Llama only)")
    if cfg.head_dim * cfg.n_heads != cfg.dim:
        out.append("head_dim != hidden_size / num_attention_heads")
    if float(cfg.theta) != 10000.0:
        out.append(f"rope_theta {cfg.theta} (run.c uses 10000)")
    if cfg.rope_scaling:
        out.append("rope_scaling (run.c has none)")
    if abs(cfg.eps - 1e-5) > 1e-12:
        out.append(f"rms_norm_eps {cfg.eps} (run.c uses 1e-5)")
    if any(k.endswith(".bias") for k in ck.keys()):
        out.append("biases (run.c has none)")
    return out


def export(hf_dir, out_path, seq_len=None, force=False):
    cfg = Config.load(hf_dir)
    ck = CheckpointReader(hf_dir)
    bad = problems(cfg, ck)
    if bad and not force:
        raise SystemExit("hf_to_llama2c: not llama2.c-compatible: " + "; ".join(bad))
    seq_len = seq_len or cfg.max_pos
    shared = cfg.tied or "lm_head.weight" not in ck
    L = cfg.n_layers
    hs = cfg.dim // cfg.n_heads
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<7i", cfg.dim, cfg.hidden, L, cfg.n_heads, cfg.n_kv,
                            cfg.vocab if shared else -cfg.vocab, seq_len))

        def put(a):
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())

        def per_layer(suffix, fix=None):
            for i in range(L):
                a = ck.get(f"model.layers.{i}.{suffix}")
                put(fix(a) if fix else a)

        put(ck.get("model.embed_tokens.weight"))
        per_layer("input_layernorm.weight")
        per_layer("self_attn.q_proj.weight", lambda w: hf_to_interleaved(w, cfg.n_heads))
        per_layer("self_attn.k_proj.weight", lambda w: hf_to_interleaved(w, cfg.n_kv))
        per_layer("self_attn.v_proj.weight")
        per_layer("self_attn.o_proj.weight")
        per_layer("post_attention_layernorm.weight")
        per_layer("mlp.gate_proj.weight")  # w1
        per_layer("mlp.down_proj.weight")  # w2
        per_layer("mlp.up_proj.weight")    # w3
        put(ck.get("model.norm.weight"))
        # legacy freq_cis tables (unused by run.c, but part of the format)
        ang = np.outer(np.arange(seq_len), 1.0 / 10000.0 ** (np.arange(0, hs, 2) / hs))
        put(np.cos(ang))
        put(np.sin(ang))
        if not shared:
            put(ck.get("lm_head.weight"))
    os.replace(tmp, out_path)
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description="HF Llama directory -> llama2.c v0 checkpoint")
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--seq-len", type=int, help="header seq_len (default max_position_embeddings)")
    ap.add_argument("--force", action="store_true", help="export even if run.c would compute something else")
    a = ap.parse_args(argv)
    cfg = export(a.hf_dir, a.out, a.seq_len, a.force)
    print(f"wrote {a.out}: dim {cfg.dim}, {cfg.n_layers} layers, vocab {cfg.vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
