"""Experiments on weights against HF transformers itself, where torch and transformers
import (VARENT_HF_PYTHON, or python3; SKIP otherwise): varent's --dump-acts against
output_hidden_states, --dump-attn against output_attentions (eager), and control vectors,
--ablate-head and --skip-layer against forward hooks on HF's own modules, on a random
tiny Llama checkpoint in f32."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import gguf_np

TOL = 1e-4

# Runs in the HF python: prints JSON with HF's logits and captures, with and without hooks.
HF_SCRIPT = r'''
import json, sys
try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError:
    sys.exit(2)
d, ids, vec_layer, vec_path, abl_layer, abl_head, skip_layer = sys.argv[1:8]
ids, vec_layer, abl_layer, abl_head, skip_layer = ([int(x) for x in ids.split(",")], int(vec_layer), int(abl_layer),
                                                   int(abl_head), int(skip_layer))
torch.set_grad_enabled(False)
m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
x = torch.tensor([ids])
layers, hd = m.model.layers, m.config.hidden_size // m.config.num_attention_heads
hd = getattr(m.config, "head_dim", None) or hd

def last(out):
    return out.logits[0, -1].tolist()

def with_hidden(out, f):  # decoder layers return a tensor or a tuple, by transformers version
    return (f(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else f(out)

base = m(x, output_hidden_states=True, output_attentions=True, use_cache=False)
res = {"logits": last(base), "hidden": [h[0].tolist() for h in base.hidden_states],
       "attn": [a[0, :, -1, :].tolist() for a in base.attentions]}
vec = torch.tensor(json.load(open(vec_path)), dtype=torch.float32)
h = layers[vec_layer].register_forward_hook(lambda mod, inp, out: with_hidden(out, lambda t: t + vec))
res["cvec"] = last(m(x, use_cache=False))
h.remove()
def ablate(mod, args):
    a = args[0].clone()
    a[..., abl_head * hd:(abl_head + 1) * hd] = 0
    return (a,) + tuple(args[1:])
h = layers[abl_layer].self_attn.o_proj.register_forward_pre_hook(ablate)
res["ablate"] = last(m(x, use_cache=False))
h.remove()
def skip(mod, args, kwargs, out):
    hs = args[0] if args else kwargs["hidden_states"]
    return with_hidden(out, lambda t: hs)
h = layers[skip_layer].register_forward_hook(skip, with_kwargs=True)
res["skip"] = last(m(x, use_cache=False))
h.remove()
print(json.dumps(res))
'''


def hf_python():
    want = os.environ.get("VARENT_HF_PYTHON")
    for py in [want] if want else list(dict.fromkeys(["python3", sys.executable])):
        try:
            if subprocess.run([py, "-c", "import torch, transformers"], capture_output=True, timeout=120).returncode == 0:
                return py
        except OSError:
            pass
    return None


def read_tensors(path):
    h, data = vtest.read_st(path)
    out = {}
    for k, v in h.items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            out[k] = np.frombuffer(data[a:b], dtype="<f4" if v["dtype"] == "F32" else "<i4").reshape(v["shape"])
    return out


def rel(a, b):
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


def varent_logits(d, ids, out, *extra):
    if os.path.exists(out):
        os.remove(out)
    r = vtest.varent("logits", "-m", d, "--ids", ",".join(map(str, ids)), "--out", out, *extra, timeout=120)
    return np.fromfile(out, dtype="<f4") if r.returncode == 0 else None


def main():
    py = hf_python()
    if not py:
        vtest.skip("interp_hf", "no python with torch and transformers; set VARENT_HF_PYTHON")
        return
    tmp = vtest.tmpdir("interp-hf")
    d = os.path.join(tmp, "llama3-tiny")
    cfg = gen.generate("llama3-tiny", d, seed=31, dtype="f32")
    D, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    ids = [int(x) for x in np.random.default_rng(31).integers(3, cfg["vocab_size"], 9)]
    vec = np.random.default_rng(32).standard_normal(D).astype(np.float32)
    vec_json, cv = os.path.join(tmp, "vec.json"), os.path.join(tmp, "cv.gguf")
    json.dump(vec.tolist(), open(vec_json, "w"))
    gguf_np.write_gguf(cv, {"general.architecture": "controlvector", "controlvector.layer_count": 1},
                       [("direction.1", gguf_np.F32, [D], vec.tobytes())])
    r = subprocess.run([py, "-c", HF_SCRIPT, d, ",".join(map(str, ids)), "1", vec_json, "0", "2", "0"],
                       capture_output=True, text=True, timeout=600)
    if not check(r.returncode == 0, "interp_hf_run", r.stderr[-500:]):
        return
    hf = json.loads(r.stdout)
    out, acts, attn = (os.path.join(tmp, x) for x in ("l.f32", "acts.st", "attn.st"))
    base = varent_logits(d, ids, out, "--dump-acts", acts, "--dump-points", "resid_pre,resid_post",
                         "--attn-layers", "all", "--dump-attn", attn)
    check(base is not None and rel(base, hf["logits"]) <= TOL, "interp_hf_logits")
    t = read_tensors(acts)
    # hidden_states[l] is block l's input; [l + 1] its output, except the last (final-normed)
    worst = max([rel(t[f"layers.{l}.resid_pre"], hf["hidden"][l]) for l in range(L)] +
                [rel(t[f"layers.{l}.resid_post"], hf["hidden"][l + 1]) for l in range(L - 1)])
    check(worst <= TOL, "interp_hf_hidden_states", f"worst {worst:.3g}")
    a = read_tensors(attn)
    worst = max(float(np.max(np.abs(a[f"layers.{l}.attn"][0] - np.array(hf["attn"][l])))) for l in range(L))
    check(worst < 1e-5, "interp_hf_attentions_eager", f"worst {worst:.3g}")
    for name, extra in (("cvec", ["--control-vector", cv]), ("ablate", ["--ablate-head", "0:2"]),
                        ("skip", ["--skip-layer", "0"])):
        got = varent_logits(d, ids, out, *extra)
        check(got is not None and rel(got, hf[name]) <= TOL and rel(hf[name], hf["logits"]) > 1e-3,
              f"interp_hf_{name}_forward_hook", "" if got is None else f"rel {rel(got, hf[name]):.3g}")
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)


main()
vtest.done()
