"""Writes the tiny-llama fixture twice, as the same model in two forms:

  hf/          a Hugging Face directory (config.json, model.safetensors, tokenizer.json,
               tokenizer_config.json with a ChatML template), written with numpy and json;
  tiny.gguf    a GGUF written by the `gguf` package from PyPI (llama.cpp's own writer, an
               independent implementation of the format), F32 tensors, with the
               llama.cpp q/k row permutation and a gpt2 (byte-level BPE) vocabulary.

`varent run -m hf` and `varent run -m tiny.gguf` must give the same text
(tests/py/test_gguf_path.py). The weights come from a seeded numpy generator, so a rerun
writes the same bytes; the test checks that when the gguf package imports.

usage: python3 make_fixture.py [OUT_DIR] [--hf-only]   (the gguf package is needed
without --hf-only: `python3 -m venv build/venv-gguf && build/venv-gguf/bin/pip install gguf`)
"""
import json
import os
import struct
import sys

import numpy as np

L, D, F, H, KV, V_MERGES, CTX = 2, 32, 64, 4, 2, 40, 256
HD = D // H
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
            "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = ("the cat sat on the mat. the dog ran to the park and the cat saw the dog. "
          "once upon a time there was a little girl who liked to play in the sun.")


def byte_chars():
    """GPT-2's byte -> printable character table."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train_merges(n):
    """n BPE merges learned greedily from CORPUS's words (the space goes with the next word)."""
    bc = byte_chars()
    words = [[bc[b] for b in (w if i == 0 else " " + w).encode()] for i, w in enumerate(CORPUS.split(" "))]
    merges = []
    for _ in range(n):
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])
        merges.append(best)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    return merges


def vocab_and_merges():
    bc = byte_chars()
    merges = train_merges(V_MERGES)
    tokens = SPECIAL + [bc[b] for b in range(256)] + [a + b for a, b in merges]
    return tokens, [f"{a} {b}" for a, b in merges]


def weights(V):
    rng = np.random.default_rng(20261127)
    n = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)
    t = {"model.embed_tokens.weight": n(V, D), "model.norm.weight": 1 + n(D)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + n(D)
        t[p + "post_attention_layernorm.weight"] = 1 + n(D)
        t[p + "self_attn.q_proj.weight"] = n(H * HD, D)
        t[p + "self_attn.k_proj.weight"] = n(KV * HD, D)
        t[p + "self_attn.v_proj.weight"] = n(KV * HD, D)
        t[p + "self_attn.o_proj.weight"] = n(D, H * HD)
        t[p + "mlp.gate_proj.weight"] = n(F, D)
        t[p + "mlp.up_proj.weight"] = n(F, D)
        t[p + "mlp.down_proj.weight"] = n(D, F)
    return t


def write_hf(out, tokens, merges, t):
    os.makedirs(out, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "vocab_size": len(tokens),
           "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 2, "torch_dtype": "float32"}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    header, blobs, off = {}, [], 0
    for name in sorted(t):
        b = t[name].tobytes()
        header[name] = {"dtype": "F32", "shape": list(t[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, s in enumerate(SPECIAL)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": {s: i for i, s in enumerate(tokens)}, "merges": merges}}
    json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"))
    tcfg = {"add_bos_token": False, "bos_token": SPECIAL[0], "eos_token": SPECIAL[2], "chat_template": TEMPLATE,
            "model_max_length": CTX}
    json.dump(tcfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)


def permute(w, n_head):
    """llama.cpp's q/k row order: each head's rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_gguf(path, tokens, merges, t):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("varent tiny fixture")
    w.add_block_count(L)
    w.add_context_length(CTX)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HD)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    for i in range(L):
        for hf, g in GGUF_NAMES.items():
            a = t[f"model.layers.{i}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                a = permute(a, H)
            elif hf == "self_attn.k_proj":
                a = permute(a, KV)
            w.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else os.path.dirname(os.path.abspath(__file__))
    tokens, merges = vocab_and_merges()
    t = weights(len(tokens))
    write_hf(os.path.join(out, "hf"), tokens, merges, t)
    if "--hf-only" not in sys.argv:
        write_gguf(os.path.join(out, "tiny.gguf"), tokens, merges, t)


if __name__ == "__main__":
    main()
