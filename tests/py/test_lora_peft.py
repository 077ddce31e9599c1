"""LoRA adapters against PEFT itself (issue 24), where torch, transformers and peft
import (VARENT_HF_PYTHON; SKIP otherwise). tests/py/test_lora.py checks the same flags
against the numpy reference in every `make test`; here the adapters and the reference
logits both come from PEFT:

  - each adapter is made by peft: get_peft_model(base, LoraConfig(r, lora_alpha,
    target_modules, use_rslora, layers_to_transform, exclude_modules,
    init_lora_weights=False)) on a random tiny checkpoint (tools/gen_random_checkpoint.py),
    then save_pretrained, so varent reads the adapter_config.json and safetensors that
    PEFT really writes (F32, and BF16 tensors);
  - `varent logits --lora DIR` (one prefill, and one-token steps with --chunk 1) against
    PeftModel.from_pretrained(base, DIR) unmerged, and against merge_and_unload();
  - `--lora-scaled DIR S` against PEFT inside peft.helpers.rescale_adapter_scale(model, S);
  - two adapters stacked against PEFT with both adapters active (set_adapter([a, b]),
    the second one's LoraLayer scaling times S, as rescale_adapter_scale does);
  - `varent lora merge BASE DIR OUT [--scale S]`: `varent logits -m OUT` against PEFT's
    merge_and_unload() (under rescale_adapter_scale for S), and OUT loaded by transformers
    itself: its logits and its every weight against PEFT's merged model (f32 base), or
    its weights within one bf16 step of PEFT's f32 merge (bf16 base);
  - `varent serve --lora-modules a=DIR --lora-modules b=DIR` (stories260K, which has a
    tokenizer): each request's "model" selects its adapter (or none), its echoed prompt
    logprobs against PEFT's log_softmax with that adapter, within 1e-4 nats;
  - PEFT adapters that are not W x + c B A x on every token (aLoRA, lora_bias) are refused
    naming the key.
Logits: max|diff| / max|ref| <= 1e-4 at the last position of an 11-token prompt, and the
adapter must move PEFT's logits by more than 100 times that (else the check could not
fail). Every measured difference is printed.
"""
import json
import os
import shutil
import subprocess

import numpy as np

import servertest
import vtest
from vtest import check, skip, varent
import gen_random_checkpoint as gen

IDS = [1, 17, 200, 35, 99, 4, 123, 250, 7, 64, 300]
TOL = 1e-4
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# name, preset, base dtype, LoraConfig kwargs, adapter dtype, --lora-scaled scales, merge --scale
CASES = [
    ("llama3_f32_all", "llama3-tiny", "f32", dict(r=4, lora_alpha=8, target_modules=ALL), "f32", [0.5, -1.5], 0.6),
    ("qwen2_bf16_subset_layer1", "qwen2-tiny", "bf16",
     dict(r=3, lora_alpha=5, target_modules=["q_proj", "v_proj", "down_proj"], layers_to_transform=[1]), "bf16",
     [2.0], 1.0),
    ("qwen3_f32_rslora_bf16_adapter", "qwen3-tiny", "f32", dict(r=8, lora_alpha=4, use_rslora=True, target_modules=ALL),
     "bf16", [0.35], 1.0),
    ("mha_untied_all_linear_exclude_k", "llama-mha-untied", "f32",
     dict(r=2, lora_alpha=16, target_modules="all-linear", exclude_modules=["k_proj"]), "f32", [-1.0], 1.0),
]
# a second adapter on the first case's base, stacked on the first one's at this scale
STACK = ("llama3_f32_mlp_second", dict(r=2, lora_alpha=3, target_modules=["gate_proj", "up_proj"]), "f32", -1.5)
# PEFT variants varent must refuse: LoraConfig kwargs, the key the error names
REFUSED = [("alora", dict(alora_invocation_tokens=[5, 6], task_type="CAUSAL_LM"), "alora_invocation_tokens"),
           ("lora_bias", dict(lora_bias=True), "lora_bias")]

# the server: a base request and one per adapter (PEFT-made on stories260K), by "model"
SERVER_ADAPTERS = [("base", None), ("story-a", dict(r=4, lora_alpha=8, target_modules=ALL)),
                   ("story-b", dict(r=2, lora_alpha=4, use_rslora=True,
                                    target_modules=["q_proj", "v_proj", "up_proj"]))]
SERVER_IDS = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298]

# Runs in the HF python. argv: "make" SPEC.json OUT.json, or "load" SPEC.json OUT.json.
HF_SCRIPT = r'''
import json, sys
try:
    import torch
    import transformers, peft
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.helpers import rescale_adapter_scale
    from peft.tuners.lora import LoraLayer
    from safetensors import safe_open
except ImportError:
    sys.exit(2)
mode, spec, out = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
torch.set_grad_enabled(False)
x = torch.tensor([spec["ids"]])

def base(d):
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

def last(m):
    return m(input_ids=x).logits[0, -1].tolist()

def make(d, ad, kw, dtype, seed):
    torch.manual_seed(seed)
    pm = get_peft_model(base(d), LoraConfig(init_lora_weights=False, **kw))
    if dtype == "bf16":
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.data = p.data.to(torch.bfloat16)
    pm.save_pretrained(ad)

def merged(d, ad, s):
    pm = PeftModel.from_pretrained(base(d), ad).eval()
    with rescale_adapter_scale(pm, s):
        return pm.merge_and_unload()

res = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}}
if mode == "make":
    for c in spec["cases"]:
        make(c["base"], c["adapter"], c["kw"], c["dtype"], c["seed"])
        r = res[c["name"]] = {"base": last(base(c["base"]))}
        pm = PeftModel.from_pretrained(base(c["base"]), c["adapter"]).eval()
        r["unmerged"] = last(pm)
        for s in c["scales"]:
            with rescale_adapter_scale(pm, s):
                r[f"scaled {s}"] = last(pm)
        r["merge_and_unload"] = last(pm.merge_and_unload())
        r["merged_scaled"] = last(merged(c["base"], c["adapter"], c["merge_scale"]))
    for c in spec["second"]:
        make(c["base"], c["adapter"], c["kw"], c["dtype"], c["seed"])
        pm = PeftModel.from_pretrained(base(c["base"]), c["first"], adapter_name="a").eval()
        pm.load_adapter(c["adapter"], adapter_name="b")
        pm.base_model.set_adapter(["a", "b"])
        for mod in pm.modules():
            if isinstance(mod, LoraLayer) and "b" in mod.scaling:
                mod.scaling["b"] *= c["scale"]
        res[c["name"]] = {"stacked": last(pm)}
    for c in spec["refused"]:
        make(c["base"], c["adapter"], c["kw"], "f32", c["seed"])
    for c in spec["server"]:  # every prompt token's logprob, base and per adapter
        if c["adapter"]:
            make(c["base"], c["adapter"], c["kw"], "f32", c["seed"])
            m = PeftModel.from_pretrained(base(c["base"]), c["adapter"]).eval()
        else:
            m = base(c["base"])
        lp = torch.log_softmax(m(input_ids=torch.tensor([c["ids"]])).logits[0].double(), -1)
        res["server " + c["name"]] = [None] + [lp[i - 1, t].item() for i, t in enumerate(c["ids"]) if i > 0]
else:  # varent's merged directories, loaded by transformers
    for c in spec["merged"]:
        ref, got = merged(c["base"], c["adapter"], c["scale"]), AutoModelForCausalLM.from_pretrained(c["out"]).eval()
        rw, gw = ref.state_dict(), got.state_dict()
        with safe_open(c["out"] + "/model.safetensors", framework="pt") as f:  # the dtypes as stored
            stored = sorted({str(f.get_slice(k).get_dtype()) for k in f.keys()})
        r = res[c["name"]] = {"logits": last(got.float()), "ref_logits": last(ref),
                              "missing": sorted(set(rw) ^ set(gw)), "dtype": ",".join(stored)}
        worst, steps = 0.0, 0.0
        for k in sorted(set(rw) & set(gw)):
            w, g = rw[k].double(), gw[k].double()
            worst = max(worst, float((g - w).abs().max() / w.abs().max().clamp_min(1e-30)))
            # one bf16 step at |w|: 2^-7 of the power of two below it
            step = torch.exp2(torch.floor(torch.log2(w.abs().clamp_min(1e-30))) - 7)
            steps = max(steps, float(((g - w).abs() / step).max()))
        r["weights_rel"], r["weights_bf16_steps"] = worst, steps
json.dump(res, open(out, "w"))
'''


def hf_python():
    py = os.environ.get("VARENT_HF_PYTHON")
    if not py:
        return None, "VARENT_HF_PYTHON is not set (a python with torch, transformers and peft)"
    try:
        r = subprocess.run([py, "-c", "import torch, transformers, peft"], capture_output=True, text=True, timeout=300)
    except OSError as e:
        return None, f"{py}: {e}"
    if r.returncode != 0:
        return None, f"{py} cannot import torch, transformers and peft: {r.stderr.strip()[-200:]}"
    return py, ""


def run_hf(py, mode, spec, tmp):
    sp, out = os.path.join(tmp, f"{mode}.spec.json"), os.path.join(tmp, f"{mode}.out.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([py, "-c", HF_SCRIPT, mode, sp, out], capture_output=True, text=True, timeout=900)
    if not check(r.returncode == 0 and os.path.exists(out), f"lora_peft_{mode}_runs",
                 f"rc {r.returncode}: {r.stderr.strip()[-600:]}"):
        return None
    with open(out) as f:
        return json.load(f)


def rel(got, want):
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def logits(d, out, *extra):
    if os.path.exists(out):
        os.remove(out)
    r = varent("logits", "-m", d, "--ids", ",".join(map(str, IDS)), "--out", out, "-t", 1, *extra)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip()[-400:]}"
    return np.fromfile(out, dtype="<f4"), ""


def close(name, got, want, why="", tol=TOL):
    """got (varent) within tol of want (PEFT / transformers); prints the measured difference."""
    if got is None or len(got) != len(want):
        return check(False, name, why or f"{0 if got is None else len(got)} logits, want {len(want)}")
    e = rel(got, want)
    print(f"  {name}: max|diff|/max|ref| = {e:.3g} (tol {tol:g})", flush=True)
    return check(e <= tol, name, f"max|diff|/max|ref| = {e:.3g} > {tol:g}")


def test_server(cases, hf):
    """`varent serve --lora-modules NAME=DIR ...`: a request's "model" picks the adapter;
    its echoed prompt logprobs against PEFT's log_softmax with that adapter."""
    base_id = os.path.basename(cases[0]["base"])
    mods = [x for c in cases if c["adapter"] for x in ("--lora-modules", f"{c['name']}={c['adapter']}")]
    try:
        srv = servertest.Server(cases[0]["base"], "-t", 1, *mods, name="lora-peft-serve")
    except RuntimeError as e:
        return check(False, "lora_peft_server_starts", str(e))
    try:
        for c in cases:
            model = c["name"] if c["adapter"] else base_id
            st, r = srv.post("/v1/completions", {"model": model, "prompt": c["ids"], "max_tokens": 0, "echo": True,
                                                 "logprobs": 1})
            got = r["choices"][0]["logprobs"]["token_logprobs"] if st == 200 else None
            want = hf["server " + c["name"]]
            name = f"lora_peft_server_model_{c['name']}_echo_logprobs_vs_peft"
            if not check(got is not None and len(got) == len(want) and got[0] is None,
                         f"lora_peft_server_model_{c['name']}_responds", str(r)[:300]):
                continue
            e = max(abs(g - w) for g, w in zip(got[1:], want[1:]))
            print(f"  {name}: max|diff| = {e:.3g} nats over {len(want) - 1} tokens (tol {TOL:g})", flush=True)
            check(e <= TOL, name, f"max|diff| = {e:.3g} nats")
        # the adapters must matter, or the checks above could not fail
        moved = min(max(abs(a - b) for a, b in zip(hf["server " + c["name"]][1:], hf["server base"][1:]))
                    for c in cases if c["adapter"])
        check(moved > 100 * TOL, "lora_peft_server_adapters_matter", f"{moved:.3g} nats")
    finally:
        srv.stop()


def main():
    py, why = hf_python()
    if not py:
        skip("lora_peft", why)
        return
    tmp = vtest.tmpdir("lora-peft")
    out = os.path.join(tmp, "l.f32")
    spec = {"ids": IDS, "cases": [], "second": [], "refused": [], "server": []}
    bases = {}
    for k, (name, preset, dtype, kw, ad_dtype, scales, mscale) in enumerate(CASES):
        d = os.path.join(tmp, f"{preset}-{dtype}")
        if d not in bases:
            bases[d] = gen.generate(preset, d, seed=40 + k, dtype=dtype)
        spec["cases"].append({"name": name, "base": d, "adapter": os.path.join(tmp, f"ad-{name}"), "kw": kw,
                              "dtype": ad_dtype, "seed": 50 + k, "scales": scales, "merge_scale": mscale})
    first = spec["cases"][0]
    spec["second"].append({"name": STACK[0], "base": first["base"], "first": first["adapter"],
                           "adapter": os.path.join(tmp, f"ad-{STACK[0]}"), "kw": STACK[1], "dtype": STACK[2],
                           "seed": 60, "scale": STACK[3]})
    for k, (name, kw, _) in enumerate(REFUSED):
        spec["refused"].append({"name": name, "base": first["base"], "adapter": os.path.join(tmp, f"ad-refused-{name}"),
                                "kw": dict(r=4, lora_alpha=8, target_modules=ALL, **kw), "seed": 70 + k})
    stories = vtest.stories_dir("f32")  # the server needs a tokenizer: stories260K has one
    for k, (name, kw) in enumerate(SERVER_ADAPTERS):
        spec["server"].append({"name": name, "base": stories, "ids": SERVER_IDS, "seed": 80 + k, "kw": kw,
                               "adapter": os.path.join(tmp, f"ad-server-{name}") if kw else None})
    hf = run_hf(py, "make", spec, tmp)
    if hf is None:
        return
    print(f"  versions: {json.dumps(hf['versions'])}", flush=True)
    merged = []
    for c in spec["cases"]:
        name, d, ad, ref = c["name"], c["base"], c["adapter"], hf[c["name"]]
        moved = rel(ref["unmerged"], ref["base"])
        check(moved > 100 * TOL, f"lora_peft_{name}_adapter_matters", f"PEFT moves the logits by {moved:.3g}")
        base_got, why = logits(d, out)
        close(f"lora_peft_{name}_base", base_got, ref["base"], why)
        got, why = logits(d, out, "--lora", ad)
        close(f"lora_peft_{name}_lora_vs_peft_unmerged", got, ref["unmerged"], why)
        close(f"lora_peft_{name}_lora_vs_merge_and_unload", got, ref["merge_and_unload"], why)
        got, why = logits(d, out, "--lora", ad, "--chunk", 1)
        close(f"lora_peft_{name}_lora_decode_steps_vs_peft", got, ref["unmerged"], why)
        for s in c["scales"]:
            got, why = logits(d, out, "--lora-scaled", ad, s)
            close(f"lora_peft_{name}_lora_scaled_{s:g}_vs_rescale_adapter_scale", got, ref[f"scaled {s}"], why)
        m_dir = os.path.join(tmp, f"merged-{name}")
        r = varent("lora", "merge", d, ad, m_dir, "--scale", c["merge_scale"])
        if check(r.returncode == 0, f"lora_peft_{name}_varent_merge_runs", r.stderr.strip()[-400:]):
            merged.append({"name": name, "base": d, "adapter": ad, "scale": c["merge_scale"], "out": m_dir,
                           "bf16": d.endswith("bf16")})
            if not merged[-1]["bf16"]:  # a bf16 merge rounds W + delta to bf16: not PEFT's f32 model
                got, why = logits(m_dir, out)
                close(f"lora_peft_{name}_varent_merge_scale_{c['merge_scale']:g}_vs_merge_and_unload", got,
                      ref["merged_scaled"], why)
    c = spec["second"][0]
    got, why = logits(c["base"], out, "--lora", c["first"], "--lora-scaled", c["adapter"], c["scale"])
    close(f"lora_peft_stacked_{first['name']}_plus_{c['name']}_{c['scale']:g}", got, hf[c["name"]]["stacked"], why)
    for (name, _, key), c in zip(REFUSED, spec["refused"]):
        r = varent("logits", "-m", c["base"], "--ids", "1,2", "--out", out, "--lora", c["adapter"])
        vtest.expect_fail(f"lora_peft_{name}_refused", r, c["adapter"], key)
    test_server(spec["server"], hf)
    if merged:
        hl = run_hf(py, "load", {"ids": IDS, "merged": merged}, tmp)
        for c in merged if hl else []:
            r, name = hl[c["name"]], c["name"]
            check(not r["missing"], f"lora_peft_{name}_merged_dir_has_every_weight", str(r["missing"][:4]))
            if c["bf16"]:
                print(f"  lora_peft_{name}_merged_weights: {r['dtype']}, worst {r['weights_bf16_steps']:.3g} bf16 "
                      f"steps from PEFT's f32 merge (tol 1)", flush=True)
                check(r["dtype"] == "BF16" and r["weights_bf16_steps"] <= 1,
                      f"lora_peft_{name}_merged_weights_within_one_bf16_step",
                      f"{r['dtype']}, {r['weights_bf16_steps']:.3g} steps")
            else:
                print(f"  lora_peft_{name}_merged_weights: max|diff|/max|w| = {r['weights_rel']:.3g} per tensor "
                      f"(tol 1e-6)", flush=True)
                check(r["weights_rel"] <= 1e-6, f"lora_peft_{name}_merged_weights_vs_merge_and_unload",
                      f"{r['weights_rel']:.3g}")
                close(f"lora_peft_{name}_merged_dir_in_transformers_vs_merge_and_unload", r["logits"], r["ref_logits"])
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)


main()
vtest.done()
