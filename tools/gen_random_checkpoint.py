#!/usr/bin/env python3
"""gen_random_checkpoint: write a real HF model directory (config.json, safetensors,
generation_config.json) with random weights, for tests and benchmarks.

  gen_random_checkpoint.py --preset NAME OUT_DIR [--seed S] [--dtype bf16|f32] [--shards N]
  gen_random_checkpoint.py --list

Weights are uniform with a chosen std, scaled so the model is numerically "alive": every
projection has std 1/sqrt(fan_in) (activations stay O(1)), norm weights are ~1, and the
output head has std 2.5/sqrt(dim) so the next-token distribution is neither one-hot nor
uniform. Each tensor
draws from its own generator seeded by (seed, tensor name), so values do not depend on
sharding or dtype (bf16 is f32 rounded to nearest even). Big presets are streamed tensor
by tensor in row blocks; memory stays bounded whatever the model size.
"""
import argparse
import copy
import json
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from safetensors_np import StreamWriter  # noqa: E402

_L3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}

# arch: llama | qwen2 | qwen3. Fields are HF config names; bos/eos become token ids.
PRESETS = {
    # --- tiny test presets (numpy reference forward of 130 tokens in a few ms) ---
    # original_max_position_embeddings 64 at theta 1e4, head_dim 32 puts 2 frequencies in
    # the kept high band, 3 in the blended middle band and 11 in the slowed low band.
    "llama3-tiny": dict(arch="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1000,
                        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
                        rope_scaling=dict(_L3_SCALING, original_max_position_embeddings=64),
                        tie_word_embeddings=True, bos=1, eos=2),
    "llama-mha-untied": dict(arch="llama", hidden_size=96, intermediate_size=200, num_hidden_layers=3,
                             num_attention_heads=6, num_key_value_heads=6, head_dim=16, vocab_size=997,
                             rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256,
                             rope_scaling=None, tie_word_embeddings=False, bos=1, eos=2),
    "qwen2-tiny": dict(arch="qwen2", hidden_size=112, intermediate_size=300, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1100, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, max_position_embeddings=512, rope_scaling=None,
                       tie_word_embeddings=True, bos=1099, eos=1098),
    "qwen3-tiny": dict(arch="qwen3", hidden_size=96, intermediate_size=264, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1003,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=512,
                       rope_scaling=None, tie_word_embeddings=True, bos=1000, eos=1001),
    # head_dim 64 and 128: the device decode attention's tiled kernel (kernels/cuda/attention_decode.cu)
    "llama-hd64-tiny": dict(arch="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=64, vocab_size=1000,
                            rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
                            rope_scaling=None, tie_word_embeddings=True, bos=1, eos=2),
    "qwen3-hd128-tiny": dict(arch="qwen3", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=128, vocab_size=1003,
                             rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=512,
                             rope_scaling=None, tie_word_embeddings=True, bos=1000, eos=1001),
    # rows longer than the matvec's 128 chunks a round (down: 3080 inputs, 385 chunks: 12
    # or 13 a lane, past the deep matvec's 8) and a vocabulary over 32 rows an SM (the
    # four-rows-a-warp lm_head): the persistent kernel's weight ring feeding whole and
    # partial rows, in every matvec's loop, and its deep units (tests/c/test_cuda_persist.c)
    "llama-wide-tiny": dict(arch="llama", hidden_size=320, intermediate_size=3080, num_hidden_layers=2,
                            num_attention_heads=5, num_key_value_heads=1, head_dim=64, vocab_size=4400,
                            rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
                            rope_scaling=None, tie_word_embeddings=True, bos=1, eos=2),
    # --- real shapes, for benchmarks (values from the published config.json files) ---
    "llama-3.2-1b": dict(arch="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                         rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
                         rope_scaling=dict(_L3_SCALING, factor=32.0), tie_word_embeddings=True,
                         bos=128000, eos=128001),
    "llama-3.1-8b": dict(arch="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
                         rope_scaling=dict(_L3_SCALING), tie_word_embeddings=False, bos=128000, eos=128001),
    "qwen3-0.6b": dict(arch="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
                       rope_scaling=None, tie_word_embeddings=True, bos=151643, eos=151645),
    "smollm2-135m": dict(arch="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
                         rope_scaling=None, tie_word_embeddings=True, bos=0, eos=0),
    # llama2.c-compatible (theta 1e4, eps 1e-5, no scaling) so run.c can be a speed peer
    "bench512": dict(arch="llama", hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=8, head_dim=64, vocab_size=32000,
                     rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=1024,
                     rope_scaling=None, tie_word_embeddings=False, bos=1, eos=2),
}

_ARCH = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
         "qwen3": ("Qwen3ForCausalLM", "qwen3")}
_TORCH_DTYPE = {"bf16": "bfloat16", "f32": "float32"}
_ST_DTYPE = {"bf16": "BF16", "f32": "F32"}


def make_config(preset, dtype="bf16"):
    """The config.json dict of a preset."""
    p = copy.deepcopy(PRESETS[preset])
    arch = p.pop("arch")
    bos, eos = p.pop("bos"), p.pop("eos")
    cls, mtype = _ARCH[arch]
    cfg = {"architectures": [cls], "model_type": mtype, "hidden_act": "silu", "initializer_range": 0.02,
           "attention_dropout": 0.0, "bos_token_id": bos, "eos_token_id": eos,
           "torch_dtype": _TORCH_DTYPE[dtype], "use_cache": True, "transformers_version": "4.51.0"}
    cfg.update(p)
    if arch == "llama":
        cfg.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif arch == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg["num_hidden_layers"])
    else:
        cfg.update(attention_bias=False, use_sliding_window=False, sliding_window=None,
                   max_window_layers=cfg["num_hidden_layers"])
    return cfg


def tensor_specs(cfg):
    """[(name, shape, init)], init = ("normal", std) or ("around", center, std), sorted by
    name like the safetensors library writes them (so layers.10 precedes layers.2)."""
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or D // H
    qwen2, qwen3 = cfg["model_type"] == "qwen2", cfg["model_type"] == "qwen3"
    head_std = 2.5 / np.sqrt(D)
    s = [("model.embed_tokens.weight", (V, D), ("normal", head_std if cfg["tie_word_embeddings"] else 1.0)),
         ("model.norm.weight", (D,), ("around", 1.0, 0.1))]
    if not cfg["tie_word_embeddings"]:
        s.append(("lm_head.weight", (V, D), ("normal", head_std)))
    for i in range(cfg["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        s += [(p + "input_layernorm.weight", (D,), ("around", 1.0, 0.1)),
              (p + "post_attention_layernorm.weight", (D,), ("around", 1.0, 0.1)),
              # q/k a little larger than 1/sqrt(D) so attention is visibly non-uniform
              (a + "q_proj.weight", (H * hd, D), ("normal", 1.3 / np.sqrt(D))),
              (a + "k_proj.weight", (KV * hd, D), ("normal", 1.3 / np.sqrt(D))),
              (a + "v_proj.weight", (KV * hd, D), ("normal", 1.0 / np.sqrt(D))),
              (a + "o_proj.weight", (D, H * hd), ("normal", 1.0 / np.sqrt(H * hd))),
              (p + "mlp.gate_proj.weight", (F, D), ("normal", 1.0 / np.sqrt(D))),
              (p + "mlp.up_proj.weight", (F, D), ("normal", 1.0 / np.sqrt(D))),
              (p + "mlp.down_proj.weight", (D, F), ("normal", 1.0 / np.sqrt(F)))]
        if qwen2:  # real Qwen2 k biases are large; make them matter
            s += [(a + "q_proj.bias", (H * hd,), ("normal", 0.3)),
                  (a + "k_proj.bias", (KV * hd,), ("normal", 0.5)),
                  (a + "v_proj.bias", (KV * hd,), ("normal", 0.1))]
        if qwen3:
            s += [(a + "q_norm.weight", (hd,), ("around", 1.2, 0.2)),
                  (a + "k_norm.weight", (hd,), ("around", 1.2, 0.2))]
    return sorted(s)


def _blocks(name, shape, init, seed, max_elems=1 << 24):
    """Yield the tensor's values as float32 row blocks."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    rows = shape[0]
    cols = int(np.prod(shape[1:], dtype=np.int64))
    step = max(1, max_elems // max(cols, 1))
    for r in range(0, rows, step):
        n = min(step, rows - r)
        # uniform with the wanted std: 3x cheaper to draw than normal, same scale
        x = rng.random((n,) + tuple(shape[1:]), dtype=np.float32)
        x -= np.float32(0.5)
        std = init[1] if init[0] == "normal" else init[2]
        x *= np.float32(std * np.sqrt(12.0))
        if init[0] == "around":
            x += np.float32(init[1])
        yield x


def _split(specs, n, itemsize):
    """Contiguous groups of specs, about equal in bytes."""
    sizes = [int(np.prod(sh, dtype=np.int64)) * itemsize for _, sh, _ in specs]
    total, groups, acc = sum(sizes), [[] for _ in range(n)], 0
    for spec, sz in zip(specs, sizes):
        k = min(n - 1, acc * n // max(total, 1))
        groups[k].append(spec)
        acc += sz
    return [g for g in groups if g]


def generate(preset, out_dir, seed=0, dtype="bf16", shards=1, log=None):
    """Write the model directory; returns the config dict."""
    cfg = make_config(preset, dtype)
    specs = tensor_specs(cfg)
    st = _ST_DTYPE[dtype]
    os.makedirs(out_dir, exist_ok=True)
    for stale in ("model.safetensors", "model.safetensors.index.json"):
        if os.path.exists(os.path.join(out_dir, stale)):
            os.remove(os.path.join(out_dir, stale))
    groups = _split(specs, max(1, shards), 2 if dtype == "bf16" else 4)
    names = (["model.safetensors"] if len(groups) == 1 else
             [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
    wmap, total = {}, 0
    for fn, group in zip(names, groups):
        w = StreamWriter(os.path.join(out_dir, fn), [(nm, st, sh) for nm, sh, _ in group], {"format": "pt"})
        for nm, sh, init in group:
            if log:
                log(f"{fn}: {nm} {list(sh)}")
            for blk in _blocks(nm, sh, init, seed):
                w.write(nm, blk)
            wmap[nm] = fn
            total += int(np.prod(sh, dtype=np.int64)) * (2 if dtype == "bf16" else 4)
        w.close()
    if len(groups) > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False,
           "transformers_version": cfg["transformers_version"]}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--preset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--shards", type=int, default=0, help="number of files (default: one per ~5 GB)")
    ap.add_argument("--list", action="store_true", help="list presets")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        for k, p in PRESETS.items():
            n = sum(int(np.prod(sh)) for _, sh, _ in tensor_specs(make_config(k)))
            print(f"{k:18s} {p['arch']:6s} {n / 1e6:10.1f}M params")
        return 0
    if not a.preset or not a.out_dir:
        ap.error("--preset and OUT_DIR are required")
    if a.preset not in PRESETS:
        ap.error(f"unknown preset {a.preset} (see --list)")
    shards = a.shards
    if shards <= 0:
        n = sum(int(np.prod(sh)) for _, sh, _ in tensor_specs(make_config(a.preset)))
        shards = max(1, -(-n * (2 if a.dtype == "bf16" else 4) // 5_000_000_000))
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if a.verbose else None
    generate(a.preset, a.out_dir, a.seed, a.dtype, shards, log)
    print(f"wrote {a.preset} ({a.dtype}, {shards} file(s)) to {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
