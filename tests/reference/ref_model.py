"""ref_model: an independent numpy forward of HF LlamaForCausalLM / Qwen2ForCausalLM /
Qwen3ForCausalLM, used as the ground truth for the C engine's logits.

Computes in float64 by default (weights are widened exactly from bf16/f16/f32), so that
a correct fp32 engine agrees to ~1e-6 and the 1e-4 test tolerance only measures bugs.
Semantics follow transformers' modeling_llama / modeling_qwen2 / modeling_qwen3:
  RMSNorm(x) = x / sqrt(mean(x^2) + eps) * weight
  RoPE in rotate-half layout: x*cos + rotate_half(x)*sin, the frequency i applied to the
    pair (i, i + head_dim/2); optional "llama3" frequency scaling
  Qwen2: q/k/v projections have biases; Qwen3: per-head RMSNorm on q and k before RoPE
  causal grouped-query attention with scale 1/sqrt(head_dim); SwiGLU MLP
Biases are applied whenever the checkpoint has them (Qwen2 q/k/v; attention_bias models).
"""
import json
import math
import os

import numpy as np

from safetensors_np import CheckpointReader


class Config:
    def __init__(self, d):
        self.raw = d
        self.arch = (d.get("architectures") or ["LlamaForCausalLM"])[0]
        self.model_type = d.get("model_type", "llama")
        self.dim = d["hidden_size"]
        self.hidden = d["intermediate_size"]
        self.n_layers = d["num_hidden_layers"]
        self.n_heads = d["num_attention_heads"]
        self.n_kv = d.get("num_key_value_heads") or self.n_heads
        self.head_dim = d.get("head_dim") or self.dim // self.n_heads
        self.vocab = d["vocab_size"]
        self.eps = d.get("rms_norm_eps", 1e-6)
        self.theta = d.get("rope_theta", 10000.0)
        self.rope_scaling = d.get("rope_scaling")
        self.tied = d.get("tie_word_embeddings", False)
        self.max_pos = d.get("max_position_embeddings", 2048)
        self.qk_norm = self.model_type == "qwen3" or "Qwen3" in self.arch

    @staticmethod
    def load(model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return Config(json.load(f))


def rope_inv_freq(cfg):
    """Per-pair inverse frequencies [head_dim/2], with the llama3 scaling if configured."""
    d = cfg.head_dim
    inv = 1.0 / (float(cfg.theta) ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv
    if kind != "llama3":
        raise NotImplementedError(f"rope_scaling type {kind}")
    factor = rs["factor"]
    low, high = rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    low_wl, high_wl = old_ctx / low, old_ctx / high
    wl = 2 * math.pi / inv
    # long wavelengths (low frequencies) are slowed down by `factor`, short ones kept,
    # and the band between is blended linearly in old_ctx / wavelength
    out = np.where(wl > low_wl, inv / factor, inv)
    smooth = (old_ctx / wl - low) / (high - low)
    blended = (1 - smooth) * out / factor + smooth * out
    medium = (wl >= high_wl) & (wl <= low_wl)
    return np.where(medium, blended, out)


def rope_bands(cfg):
    """(n_high, n_medium, n_low) frequency counts under llama3 scaling (for tests)."""
    d = cfg.head_dim
    inv = 1.0 / (float(cfg.theta) ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling
    wl = 2 * math.pi / inv
    old = rs["original_max_position_embeddings"]
    low_wl, high_wl = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
    return int((wl < high_wl).sum()), int(((wl >= high_wl) & (wl <= low_wl)).sum()), int((wl > low_wl).sum())


def rope_rotate_half(x, pos, inv_freq):
    """x [T, H, D] at positions pos [T]: HF layout, frequency i rotates (x[i], x[i+D/2])."""
    ang = np.outer(pos, inv_freq)  # [T, D/2]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def softmax(s, axis=-1):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class Model:
    """Config + weights (all loaded, widened to `dtype`). Fine for test-sized models."""

    def __init__(self, model_dir, dtype=np.float64):
        self.cfg = cfg = Config.load(model_dir)
        ck = CheckpointReader(model_dir)
        self.dtype = dtype

        def get(name, shape=None):
            a = ck.get(name, dtype)
            if shape is not None and a.shape != tuple(shape):
                raise ValueError(f"{name}: shape {a.shape}, expected {tuple(shape)}")
            return a

        def opt(name, shape):
            return get(name, shape) if name in ck else None

        D, hd = cfg.dim, cfg.head_dim
        self.embed = get("model.embed_tokens.weight", (cfg.vocab, D))
        self.norm = get("model.norm.weight", (D,))
        if cfg.tied:
            self.lm_head = self.embed
        elif "lm_head.weight" in ck:
            self.lm_head = get("lm_head.weight", (cfg.vocab, D))
        else:
            raise ValueError("untied model without lm_head.weight")
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            L = {
                "ln1": get(p + "input_layernorm.weight", (D,)),
                "ln2": get(p + "post_attention_layernorm.weight", (D,)),
                "wq": get(a + "q_proj.weight", (cfg.n_heads * hd, D)),
                "wk": get(a + "k_proj.weight", (cfg.n_kv * hd, D)),
                "wv": get(a + "v_proj.weight", (cfg.n_kv * hd, D)),
                "wo": get(a + "o_proj.weight", (D, cfg.n_heads * hd)),
                "bq": opt(a + "q_proj.bias", (cfg.n_heads * hd,)),
                "bk": opt(a + "k_proj.bias", (cfg.n_kv * hd,)),
                "bv": opt(a + "v_proj.bias", (cfg.n_kv * hd,)),
                "bo": opt(a + "o_proj.bias", (D,)),
                "qn": get(a + "q_norm.weight", (hd,)) if cfg.qk_norm else None,
                "kn": get(a + "k_norm.weight", (hd,)) if cfg.qk_norm else None,
                "wg": get(p + "mlp.gate_proj.weight", (cfg.hidden, D)),
                "wu": get(p + "mlp.up_proj.weight", (cfg.hidden, D)),
                "wd": get(p + "mlp.down_proj.weight", (D, cfg.hidden)),
            }
            self.layers.append(L)
        self.inv_freq = rope_inv_freq(cfg)


def _linear(x, w, b):
    y = x @ w.T
    return y if b is None else y + b


def round_bf16(x):
    """x rounded to bfloat16 (nearest even, through float32), as float64."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def _ident(x):
    return x


def _attention(cfg, L, h, pos, inv_freq, ablate=(), kv_bf16=False, rin=_ident):
    """Returns (attn output [T, D], scaled pre-softmax scores of the last query [H, T]).
    ablate: heads whose output is zeroed before o_proj. kv_bf16: keys (after RoPE) and
    values are stored as bfloat16 (varent --kv-type bf16). rin: applied to the inputs of
    the projections (round_bf16 for varent --gemm-inputs bf16)."""
    T, hd, H, KV = h.shape[0], cfg.head_dim, cfg.n_heads, cfg.n_kv
    h = rin(h)
    q = _linear(h, L["wq"], L["bq"]).reshape(T, H, hd)
    k = _linear(h, L["wk"], L["bk"]).reshape(T, KV, hd)
    v = _linear(h, L["wv"], L["bv"]).reshape(T, KV, hd)
    if L["qn"] is not None:  # Qwen3: RMSNorm over each head's vector, before RoPE
        q, k = rmsnorm(q, L["qn"], cfg.eps), rmsnorm(k, L["kn"], cfg.eps)
    q, k = rope_rotate_half(q, pos, inv_freq), rope_rotate_half(k, pos, inv_freq)
    if kv_bf16:
        k, v = round_bf16(k), round_bf16(v)
    g = H // KV  # query head j reads kv head j // g
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)  # [H, T, T]
    s = np.where(np.tril(np.ones((T, T), dtype=bool))[None], s, -np.inf)
    o = np.einsum("hts,shd->thd", softmax(s), v)
    for head in ablate:
        o[:, head, :] = 0
    return _linear(rin(o.reshape(T, H * hd)), L["wo"], L["bo"]), s[:, -1, :].copy()


def forward(model, ids, scores_layer=None, return_scores=False, dtype=np.float64, kv_bf16=False, gemm_bf16=False):
    """Logits [T, vocab] for token ids (positions 0..T-1).

    model: a Model or a model directory. With return_scores, also returns the last query's
    scaled pre-softmax attention scores [n_heads, T] at scores_layer (default: last layer).
    gemm_bf16: the inputs of every block projection rounded to bfloat16 (varent's CPU GEMM
    with --gemm-inputs bf16, for a prompt fed as one batch; the lm_head is not rounded).
    """
    rin = round_bf16 if gemm_bf16 else _ident
    if not isinstance(model, Model):
        model = Model(model, dtype)
    cfg = model.cfg
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or len(ids) == 0 or ids.min() < 0 or ids.max() >= cfg.vocab:
        raise ValueError("ids must be a non-empty list of token ids below vocab_size")
    if scores_layer is None:
        scores_layer = cfg.n_layers - 1
    pos = np.arange(len(ids), dtype=np.float64)
    x = model.embed[ids]
    scores = None
    for i, L in enumerate(model.layers):
        a, s = _attention(cfg, L, rmsnorm(x, L["ln1"], cfg.eps), pos, model.inv_freq, kv_bf16=kv_bf16, rin=rin)
        if i == scores_layer:
            scores = s
        x = x + a
        h = rin(rmsnorm(x, L["ln2"], cfg.eps))
        gate = _linear(h, L["wg"], None)
        x = x + rin(gate / (1 + np.exp(-gate)) * _linear(h, L["wu"], None)) @ L["wd"].T
    logits = rmsnorm(x, model.norm, cfg.eps) @ model.lm_head.T
    return (logits, scores) if return_scores else logits


def forward_hooked(model, ids, cvec=None, ablate=(), skip=()):
    """The forward with interventions and every capture (docs/research.md):
    cvec {layer: [D]} added to block layer's output; ablate {(layer, head)} zeroes that
    head's attention output before o_proj; skip {layer} makes the block the identity.
    Returns (logits [T, vocab], acts {(layer, point): [T, D]} for the points resid_pre,
    resid_mid, resid_post, attn_out, mlp_out, scores {layer: [H, T]} of the last query,
    absent for skipped layers)."""
    cfg = model.cfg
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.arange(len(ids), dtype=np.float64)
    x = model.embed[ids]
    acts, scores = {}, {}
    for i, L in enumerate(model.layers):
        acts[(i, "resid_pre")] = x
        if i in skip:
            a = m = np.zeros_like(x)
        else:
            heads = [h for (l, h) in ablate if l == i]
            a, scores[i] = _attention(cfg, L, rmsnorm(x, L["ln1"], cfg.eps), pos, model.inv_freq, heads)
        acts[(i, "attn_out")] = a
        x = x + a
        acts[(i, "resid_mid")] = x
        if i not in skip:
            h = rmsnorm(x, L["ln2"], cfg.eps)
            gate = _linear(h, L["wg"], None)
            m = (gate / (1 + np.exp(-gate)) * _linear(h, L["wu"], None)) @ L["wd"].T
        acts[(i, "mlp_out")] = m
        x = x + m
        if cvec is not None and i in cvec:
            x = x + cvec[i]
        acts[(i, "resid_post")] = x
    return rmsnorm(x, model.norm, cfg.eps) @ model.lm_head.T, acts, scores


def logit_lens(model, resid_post_row):
    """The final norm and lm_head on one residual row: logits [vocab]."""
    return rmsnorm(resid_post_row, model.norm, model.cfg.eps) @ model.lm_head.T


if __name__ == "__main__":
    import argparse
    import ref_metrics
    ap = argparse.ArgumentParser(description="numpy reference logits of an HF model dir")
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write the last position's logits as float32 LE here")
    ap.add_argument("--layer", type=int, help="layer for the attention metrics (default last)")
    args = ap.parse_args()
    lg, sc = forward(args.model_dir, [int(t) for t in args.ids.split(",")], args.layer, True)
    if args.out:
        lg[-1].astype("<f4").tofile(args.out)
    print("argmax", int(lg[-1].argmax()), "max", float(lg[-1].max()))
    for k, v in ref_metrics.metrics(lg[-1], sc).items():
        print(k, f"{v:.6f}")
