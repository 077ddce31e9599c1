"""llamacpp_gguf: writes a BF16 GGUF that llama.cpp loads, holding exactly the BF16 weights
of a varent/HF model directory, so that varent and llama.cpp run the same numbers.

The directory was itself converted from a GGUF (weights/fetch-smollm2.sh: `varent convert
gguf` dequantises Q4_1 and rounds to BF16); that source GGUF supplies the metadata
(architecture, hyperparameters, tokenizer) and the tensor names, order and shapes. Each
tensor's data comes from the directory's safetensors, bit for bit (1-D norm weights widened
to F32, exactly, as llama.cpp's converter stores them), with llama's q/k rows
put back into llama.cpp's per-head interleaved order (the inverse of what varent's
converter undid). Uses the `gguf` package from PyPI (installed in the benchmark's venv).

    make_bf16_gguf(model_dir, source_gguf, out_path)

Check: `varent convert gguf OUT DIR2 --dtype bf16` must give back the same tensors
(tools/bench-llamacpp.py does it before measuring).
"""
import json
import os
import struct

import numpy as np

LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}


def hf_name(gguf_name):
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in LAYER_NAMES:
        raise ValueError(f"tensor {gguf_name}: no HF name for it")
    return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"


def read_safetensors_raw(path):
    """{name: (dtype string, shape, bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[a:b])
    return out


def interleave_heads(w, n_head):
    """llama.cpp's q/k row order: per head, rows [x0..x(d/2-1), y0..] become [x0, y0, x1, y1, ...]."""
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field_value(field):
    """(python value, value type, array item type or None) of a GGUFReader field."""
    import gguf
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else None
        return field.contents(), vtype, sub
    return field.contents(), vtype, None


def make_bf16_gguf(model_dir, source_gguf, out_path):
    import gguf
    src = gguf.GGUFReader(source_gguf)
    arch = src.fields["general.architecture"].contents()
    n_head = int(src.fields[f"{arch}.attention.head_count"].contents())
    n_head_kv = int(src.fields.get(f"{arch}.attention.head_count_kv", src.fields[f"{arch}.attention.head_count"]).contents())
    tensors = read_safetensors_raw(os.path.join(model_dir, "model.safetensors"))
    w = gguf.GGUFWriter(out_path + ".tmp", arch)
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            w.add_file_type(int(gguf.LlamaFileType.MOSTLY_BF16))
            continue
        val, vtype, sub = field_value(field)
        w.add_key_value(key, val, vtype, sub_type=sub)
    for t in src.tensors:
        name = hf_name(t.name)
        if name not in tensors:
            if t.name == "output.weight":
                continue  # tied: llama.cpp uses token_embd
            raise ValueError(f"{model_dir}: no tensor {name} (for {t.name})")
        dtype, shape, raw = tensors[name]
        if dtype != "BF16":
            raise ValueError(f"{model_dir}: tensor {name} is {dtype}, not BF16 (convert with --dtype bf16)")
        a = np.frombuffer(raw, dtype=np.uint16).reshape(shape)
        if arch == "llama" and (".attn_q." in t.name or ".attn_k." in t.name):
            a = interleave_heads(a, n_head if ".attn_q." in t.name else n_head_kv)
        if a.ndim == 1:  # llama.cpp adds norm weights to F32 activations: F32 (exact from BF16)
            w.add_tensor(t.name, (a.astype(np.uint32) << 16).view(np.float32))
        else:
            w.add_tensor(t.name, np.ascontiguousarray(a), raw_shape=list(a.shape),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(out_path + ".tmp", out_path)


def same_tensors(dir_a, dir_b):
    """List of differences between two model directories' safetensors (empty: identical data)."""
    a = read_safetensors_raw(os.path.join(dir_a, "model.safetensors"))
    b = read_safetensors_raw(os.path.join(dir_b, "model.safetensors"))
    diffs = [f"only in {dir_a}: {k}" for k in a if k not in b] + [f"only in {dir_b}: {k}" for k in b if k not in a]
    diffs += [f"{k} differs" for k in a if k in b and a[k] != b[k]]
    return diffs
