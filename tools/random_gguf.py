#!/usr/bin/env python3
"""random_gguf: a BF16 GGUF that llama.cpp loads, with the weights of
tools/gen_random_checkpoint.py's preset (the same seed gives the same numbers), so that
llama.cpp and varent run the same shapes in the GPU window (tools/gpu-window.sh):

    tools/random_gguf.py --preset llama-3.2-1b --seed 1 OUT.gguf

Norm weights are F32 and matrices BF16, as llama.cpp's converter writes them; llama's
q/k rows are permuted into llama.cpp's interleaved order, as its converter does. The
vocabulary is a made-up SentencePiece one (ids, no merges) of the preset's size: enough
to load and to time, not to read text. Written tensor by tensor; memory stays about
one tensor whatever the model size. Architectures: llama, qwen2, qwen3.
"""
import argparse
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import gen_random_checkpoint as grc  # noqa: E402
from gguf_np import (ARR, BF16, F32, F32V, I32, STR, U32, Val, _auto, _enc_str, _enc_value,  # noqa: E402
                     f32_to_bf16_bits, permute_qk)

ALIGN = 32
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def gguf_name(hf):
    if hf in TOP:
        return TOP[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.weight|bias
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{LAYER[module]}.{parts[-1]}"


def metadata(cfg, arch):
    D, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or D // H
    V = cfg["vocab_size"]
    kv = {"general.architecture": arch, "general.name": f"varent random {cfg['model_type']}",
          "general.file_type": Val(U32, 32),  # LLAMA_FTYPE_MOSTLY_BF16
          f"{arch}.context_length": Val(U32, cfg["max_position_embeddings"]),
          f"{arch}.embedding_length": Val(U32, D), f"{arch}.block_count": Val(U32, cfg["num_hidden_layers"]),
          f"{arch}.feed_forward_length": Val(U32, cfg["intermediate_size"]),
          f"{arch}.attention.head_count": Val(U32, H), f"{arch}.attention.head_count_kv": Val(U32, KV),
          f"{arch}.attention.key_length": Val(U32, hd), f"{arch}.attention.value_length": Val(U32, hd),
          f"{arch}.rope.dimension_count": Val(U32, hd),
          f"{arch}.rope.freq_base": Val(F32V, float(cfg["rope_theta"])),
          f"{arch}.attention.layer_norm_rms_epsilon": Val(F32V, float(cfg["rms_norm_eps"])),
          f"{arch}.vocab_size": Val(U32, V),
          "tokenizer.ggml.model": "llama",
          "tokenizer.ggml.tokens": Val(ARR, ["<unk>"] + [f"<t{i}>" for i in range(1, V)], STR),
          "tokenizer.ggml.scores": Val(ARR, [0.0] * V, F32V),
          "tokenizer.ggml.token_type": Val(ARR, [2] + [1] * (V - 1), I32),
          "tokenizer.ggml.bos_token_id": Val(U32, cfg["bos_token_id"]),
          "tokenizer.ggml.eos_token_id": Val(U32, cfg["eos_token_id"])}
    return kv


def tensor_data(cfg, name, shape, init, seed, llama):
    """The tensor as GGUF stores it: (ggml type, bytes)."""
    x = np.concatenate([b.reshape(-1) for b in grc._blocks(name, shape, init, seed)]).reshape(shape)
    if len(shape) == 1:
        return F32, x.astype(np.float32).tobytes()
    if llama and name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = cfg["num_attention_heads"] if "q_proj" in name else cfg["num_key_value_heads"]
        x = permute_qk(x, heads)
    return BF16, f32_to_bf16_bits(x).tobytes()


def write(preset, path, seed):
    cfg = grc.make_config(preset, "bf16")
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[cfg["model_type"]]
    specs = grc.tensor_specs(cfg)
    kv = metadata(cfg, arch)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(specs), len(kv))
    for k, v in kv.items():
        v = _auto(v)
        head += _enc_str(k) + struct.pack("<I", v.vtype) + _enc_value(v.vtype, v.value, v.elem)
    offs, off = [], 0
    for name, shape, _ in specs:
        offs.append(off)
        n = int(np.prod(shape, dtype=np.int64)) * (4 if len(shape) == 1 else 2)
        off = (off + n + ALIGN - 1) // ALIGN * ALIGN
    for (name, shape, _), o in zip(specs, offs):
        ttype = F32 if len(shape) == 1 else BF16
        ne = list(reversed(shape))  # GGUF lists the fastest dimension first
        head += _enc_str(gguf_name(name)) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", ttype, o)
    head += b"\0" * ((-len(head)) % ALIGN)
    with open(path + ".tmp", "wb") as f:
        f.write(head)
        pos = 0
        for (name, shape, init), o in zip(specs, offs):
            f.write(b"\0" * (o - pos))
            _, raw = tensor_data(cfg, name, shape, init, seed, arch == "llama")
            f.write(raw)
            pos = o + len(raw)
    os.replace(path + ".tmp", path)
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", required=True, choices=sorted(grc.PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write(a.preset, a.out, a.seed)
    print(f"wrote {a.preset} (bf16 GGUF) to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
