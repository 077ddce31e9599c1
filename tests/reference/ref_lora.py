"""ref_lora: PEFT LoRA adapters on the numpy reference (ref_model), written from PEFT's
definition rather than from varent's code:

  adapter_config.json: r, lora_alpha, use_rslora; scaling = lora_alpha / r, or
    lora_alpha / sqrt(r) with rsLoRA (PEFT's LoraLayer.update_layer)
  adapter_model.safetensors: base_model.model.<module>.lora_A.weight [r, in] and
    lora_B.weight [out, r]; the layer computes W x + scaling * B (A x), which for the
    reference is the merged weight W + s * scaling * B @ A, in float64.

with_adapters(model, [(dir, scale), ...]) returns a copy of a ref_model.Model whose
projection weights carry every adapter; ref_model.forward runs it unchanged.
"""
import copy
import json
import math
import os

import numpy as np

from safetensors_np import SafeTensorsFile

# PEFT module name -> ref_model's layer key
KEYS = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo",
        "gate_proj": "wg", "up_proj": "wu", "down_proj": "wd"}


def read_adapter(adapter_dir):
    """(scaling, {(layer, module): (A, B)}) of a PEFT adapter directory, in float64."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scaling = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
    st = SafeTensorsFile(os.path.join(adapter_dir, "adapter_model.safetensors"))
    pairs = {}
    for name in st.keys():
        parts = name.split(".")
        # base_model.model.model.layers.L.<self_attn|mlp>.<module>.lora_<A|B>.weight
        layer, module, half = int(parts[4]), parts[6], parts[7][-1]
        pairs.setdefault((layer, module), {})[half] = st.get(name, np.float64)
    return scaling, {k: (v["A"], v["B"]) for k, v in pairs.items()}


def with_adapters(model, adapters):
    """A copy of model with W += scale * scaling * B @ A for each (dir, scale)."""
    m = copy.copy(model)
    m.layers = [dict(L) for L in model.layers]
    for adapter_dir, scale in adapters:
        scaling, pairs = read_adapter(adapter_dir)
        for (layer, module), (a, b) in pairs.items():
            key = KEYS[module]
            m.layers[layer][key] = m.layers[layer][key] + scale * scaling * (b @ a)
    return m
