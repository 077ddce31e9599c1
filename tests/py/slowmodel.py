"""slowmodel: a random Llama large enough that decoding takes visible time on a CPU (to
stop a reply mid-way, or to watch a progress bar move), with a real tokenizer."""
import json
import os
import shutil

import numpy as np


def write_slow_model(out, tokenizer_dir):
    """A random Llama (dim 384, 6 layers, 10M parameters, bf16) with the tokenizer of
    tokenizer_dir (stories260K's: 512 ids); ids 0-2 never win, so replies run to -n."""
    os.makedirs(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, f), out)
    D, F, L, V = 384, 1024, 6, 512
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "intermediate_size": F,
         "num_hidden_layers": L, "num_attention_heads": 6, "num_key_value_heads": 6, "vocab_size": V,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
         "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
    json.dump(c, open(os.path.join(out, "config.json"), "w"))
    rng = np.random.default_rng(5)
    t = {"model.embed_tokens.weight": (V, D), "lm_head.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                  p + "self_attn.q_proj.weight": (D, D), p + "self_attn.k_proj.weight": (D, D),
                  p + "self_attn.v_proj.weight": (D, D), p + "self_attn.o_proj.weight": (D, D),
                  p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D), p + "mlp.down_proj.weight": (D, F)})
    header, blobs, off = {}, [], 0
    for name, shape in sorted(t.items()):
        a = np.ones(shape, np.float32) if name.endswith("norm.weight") else \
            (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        if name == "lm_head.weight":
            a[:3] = 0  # <unk>, <s>, </s> never win: replies run to -n
        b = (a.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
