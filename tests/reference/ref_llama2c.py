"""ref_llama2c: reads a llama2.c legacy (v0) checkpoint the way run.c's read_checkpoint
and memory_map_weights do, and runs run.c's forward in numpy (float64): RoPE on
adjacent pairs (2i, 2i+1) with frequency 10000^(-2i/head_size), eps 1e-5.
Written independently of ref_model so the two can check each other (and the exporter).
"""
import struct

import numpy as np


def load(path):
    """(config dict, weights dict) from a v0 .bin file."""
    raw = open(path, "rb").read()
    dim, hidden, L, H, KV, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // H
    kv_dim = dim * KV // H
    f = np.frombuffer(raw, dtype="<f4", offset=28).astype(np.float64)
    w, off = {}, 0

    def take(name, *shape):
        nonlocal off
        n = int(np.prod(shape))
        w[name] = f[off:off + n].reshape(shape)
        off += n

    take("tok", vocab, dim)
    take("rms_att", L, dim)
    take("wq", L, dim, dim)
    take("wk", L, kv_dim, dim)
    take("wv", L, kv_dim, dim)
    take("wo", L, dim, dim)
    take("rms_ffn", L, dim)
    take("w1", L, hidden, dim)
    take("w2", L, dim, hidden)
    take("w3", L, hidden, dim)
    take("rms_final", dim)
    off += seq_len * hs // 2 * 2  # freq_cis_real, freq_cis_imag: skipped, as run.c does
    if shared:
        w["wcls"] = w["tok"]
    else:
        take("wcls", vocab, dim)
    if off != f.size:
        raise ValueError(f"{path}: {f.size - off} floats unaccounted for")
    cfg = dict(dim=dim, hidden=hidden, n_layers=L, n_heads=H, n_kv=KV, vocab=vocab, seq_len=seq_len)
    return cfg, w


def _rmsnorm(x, w):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5))


def _rope_pairs(x, pos, hs):
    """x [T, n, hs]: rotate (x[2i], x[2i+1]) by pos * 10000^(-2i/hs)."""
    freq = 1.0 / 10000.0 ** (np.arange(0, hs, 2) / hs)
    ang = np.outer(pos, freq)[:, None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def forward(path, ids):
    """Logits [T, vocab] of run.c's transformer on token ids at positions 0..T-1."""
    c, w = load(path)
    T, H, KV = len(ids), c["n_heads"], c["n_kv"]
    hs = c["dim"] // H
    pos = np.arange(T)
    x = w["tok"][np.asarray(ids)]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(c["n_layers"]):
        h = _rmsnorm(x, w["rms_att"][l])
        q = _rope_pairs((h @ w["wq"][l].T).reshape(T, H, hs), pos, hs)
        k = _rope_pairs((h @ w["wk"][l].T).reshape(T, KV, hs), pos, hs)
        v = (h @ w["wv"][l].T).reshape(T, KV, hs)
        out = np.empty((T, H, hs))
        for hh in range(H):
            kh = hh // (H // KV)
            s = q[:, hh] @ k[:, kh].T / np.sqrt(hs)
            s = np.where(mask, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, hh] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kh]
        x = x + out.reshape(T, -1) @ w["wo"][l].T
        h = _rmsnorm(x, w["rms_ffn"][l])
        g = h @ w["w1"][l].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w["w3"][l].T)) @ w["w2"][l].T
    return _rmsnorm(x, w["rms_final"]) @ w["wcls"].T
