"""Experiments on weights against HF transformers itself, where torch and transformers
import (VARENT_HF_PYTHON, or python3; SKIP otherwise), on random tiny Llama 3 (f32),
Qwen2 (bf16: q/k/v biases), Qwen3 (q/k norms) and untied 3-layer MHA checkpoints. HF runs
in f32 with eager attention; its reference is a forward over the sequence `varent run
--temp 0` generated (prompt + generated tokens), so the decode steps are checked too:

  - `--dump-acts` (every point, prompt and generated rows): resid_pre against
    output_hidden_states[L], resid_post against hidden_states[L+1] (the last layer's, whose
    HF entry is final-normed, against a forward hook on the block), attn_out and mlp_out
    against forward hooks on self_attn and mlp, resid_mid against hidden_states[L] + HF's
    attn_out;
  - `--dump-attn` (the prompt's last query, then each decode step's) against
    output_attentions (eager), and `--attn-layers`' per-head entropy and varentropy (bits)
    against the same probabilities;
  - `--logit-lens`: each layer's entropy and top-5 against HF's own final norm and lm_head
    applied to hidden_states (the last layer: the model's logits);
  - control vectors (two files, scaled, a layer range), `--ablate-head` (several heads)
    and `--skip-layer` against forward hooks on HF's modules;
  - prompt scoring: `varent ppl --per-token` on stories260K, in one window and in several
    overlapping ones, against HF's "perplexity of fixed-length models" loop (labels -100
    but for each window's new tokens), token by token; the ids varent scored are the ones
    HF's AutoTokenizer makes of the text from the converted directory (BOS first).
Tolerances: logits and activations max|diff| / max|ref| <= 1e-4 per tensor; attention
probabilities 1e-5 absolute; entropies and varentropies 1e-4 bits; logit-lens top-5 the
same ids (but for near ties) and probabilities within 1e-5; per-token logprobs 1e-4
nats. Every hooked intervention must move HF's logits by more than 1e-3 (else its check
could not fail). The measured differences are printed.
"""
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

TOL = 1e-4       # logits, activations: max|diff| / max|ref|
ATTN_TOL = 1e-5  # attention probabilities, absolute
BITS_TOL = 1e-4  # entropies and varentropies in bits, absolute
P_TOL = 1e-5     # logit-lens probabilities, absolute
GEN = 4
PPL_TOL = 1e-4   # per-token logprobs, nats, absolute
PPL_TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
            "One day, she saw a big red ball in the park.\n")
PPL_WINDOWS = ((128, 64), (16, 5), (12, 11))  # (--ctx, --stride): one window, then several
POINTS = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")

# name, preset, dtype, seed, prompt length, control vectors [(file, {layer: seed}, scale)], layer range,
# ablated heads, skipped layers
CASES = [
    ("llama3_f32", "llama3-tiny", "f32", 31, 9, [("a", {1: 32}, 1.0)], None, ["0:2", "1:1"], [0]),
    ("qwen2_bf16", "qwen2-tiny", "bf16", 32, 12, [("a", {1: 33}, 2.5)], None, ["1:3"], [1]),
    ("qwen3_f32", "qwen3-tiny", "f32", 33, 7, [("a", {1: 34}, -1.5)], None, ["0:0", "0:3"], [0]),
    ("mha_untied_f32", "llama-mha-untied", "f32", 34, 10,
     [("a", {1: 35, 2: 36}, 1.0), ("b", {2: 37}, -0.7)], (2, 2), ["2:5", "1:0"], [1]),
]

# Runs in the HF python: argv SPEC.json OUT.json. Writes JSON with, per case, HF's
# captures over the whole sequence and the prompt's last logits with and without hooks.
HF_SCRIPT = r'''
import json, sys
try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError:
    sys.exit(2)
spec, out = json.load(open(sys.argv[1])), sys.argv[2]
torch.set_grad_enabled(False)
res = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__}}

def with_hidden(out, f):  # decoder layers return a tensor or a tuple, by transformers version
    return (f(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else f(out)

def first(out):
    return out[0] if isinstance(out, tuple) else out

for c in spec["cases"]:
    m = AutoModelForCausalLM.from_pretrained(c["dir"], dtype=torch.float32, attn_implementation="eager").eval()
    layers = m.model.layers
    hd = getattr(m.config, "head_dim", None) or m.config.hidden_size // m.config.num_attention_heads
    seq, P = torch.tensor([c["seq"]]), c["prompt_len"]
    prompt = seq[:, :P]
    cap, hooks = {}, []
    for l, layer in enumerate(layers):
        for mod, key in ((layer.self_attn, "attn_out"), (layer.mlp, "mlp_out"), (layer, "post")):
            hooks.append(mod.register_forward_hook(
                lambda mod, inp, out, k=(key, l): cap.__setitem__(k, first(out)[0])))
    o = m(seq, output_hidden_states=True, output_attentions=True, use_cache=False)
    for h in hooks:
        h.remove()
    L = len(layers)
    r = res[c["name"]] = {
        "logits": o.logits[0, P - 1].tolist(),
        "resid_pre": [o.hidden_states[l][0].tolist() for l in range(L)],
        "resid_post_hidden": [o.hidden_states[l + 1][0].tolist() for l in range(L - 1)],
        "resid_post_hook": [cap["post", l].tolist() for l in range(L)],
        "attn_out": [cap["attn_out", l].tolist() for l in range(L)],
        "mlp_out": [cap["mlp_out", l].tolist() for l in range(L)],
        "attn": [a[0].tolist() for a in o.attentions],  # [H, T, T] per layer
        # the logit lens: HF's final norm and lm_head on every block's output at the prompt's last position
        "lens": [m.lm_head(m.model.norm(o.hidden_states[l + 1][0, P - 1])).tolist() for l in range(L - 1)]
                + [o.logits[0, P - 1].tolist()],
    }
    def last():
        return m(prompt, use_cache=False).logits[0, -1].tolist()
    vecs = {int(l): torch.tensor(v, dtype=torch.float32) for l, v in c["vectors"].items()}
    hooks = [layers[l].register_forward_hook(lambda mod, inp, out, v=v: with_hidden(out, lambda t: t + v))
             for l, v in vecs.items()]
    r["cvec"] = last()
    for h in hooks:
        h.remove()
    def ablate(heads):
        def pre(mod, args):
            a = args[0].clone()
            for h in heads:
                a[..., h * hd:(h + 1) * hd] = 0
            return (a,) + tuple(args[1:])
        return pre
    by_layer = {}
    for lh in c["ablate"]:
        l, h = map(int, lh.split(":"))
        by_layer.setdefault(l, []).append(h)
    hooks = [layers[l].self_attn.o_proj.register_forward_pre_hook(ablate(hs)) for l, hs in by_layer.items()]
    r["ablate"] = last()
    for h in hooks:
        h.remove()
    def skip(mod, args, kwargs, out):
        hs = args[0] if args else kwargs["hidden_states"]
        return with_hidden(out, lambda t: hs)
    hooks = [layers[l].register_forward_hook(skip, with_kwargs=True) for l in c["skip"]]
    r["skip"] = last()
    for h in hooks:
        h.remove()
res["ppl"], res["tokenized"] = [], None
if spec["ppl"]:  # the text through HF's own tokenizer of the directory
    from transformers import AutoTokenizer
    res["tokenized"] = AutoTokenizer.from_pretrained(spec["ppl"][0]["dir"])(spec["ppl_text"])["input_ids"]
for p in spec["ppl"]:  # HF's "perplexity of fixed-length models" loop, per token
    m = AutoModelForCausalLM.from_pretrained(p["dir"], dtype=torch.float32, attn_implementation="eager").eval()
    ids, ctx, stride = torch.tensor([p["ids"]]), p["ctx"], p["stride"]
    seq_len, lp, prev_end = ids.size(1), [None] * ids.size(1), 0
    for begin in range(0, seq_len, stride):
        end = min(begin + ctx, seq_len)
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        logp = torch.log_softmax(m(input_ids).logits[0, :-1].double(), -1)
        for j, t in enumerate(target_ids[0, 1:].tolist()):
            if t != -100:
                lp[begin + j + 1] = logp[j, t].item()
        prev_end = end
        if end == seq_len:
            break
    res["ppl"].append(lp)
json.dump(res, open(out, "w"))
'''


def hf_python():
    want = os.environ.get("VARENT_HF_PYTHON")
    for py in [want] if want else list(dict.fromkeys(["python3", sys.executable])):
        try:
            r = subprocess.run([py, "-c", "import torch, transformers"], capture_output=True, timeout=120)
            if r.returncode == 0:
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
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def report(name, err, tol, what="max|diff|/max|ref|"):
    print(f"  {name}: {what} = {err:.3g} (tol {tol:g})", flush=True)
    return check(err <= tol, name, f"{what} = {err:.3g} > {tol:g}")


def varent_logits(d, ids, out, *extra):
    if os.path.exists(out):
        os.remove(out)
    r = vtest.varent("logits", "-m", d, "--ids", ",".join(map(str, ids)), "--out", out, *extra, timeout=120)
    return (np.fromfile(out, dtype="<f4") if r.returncode == 0 else None), r


def entropy_bits(p):
    p = np.asarray(p, np.float64)
    p = p[p > 0]
    lp = np.log2(p)
    h = -float(np.sum(p * lp))
    return h, float(np.sum(p * (lp + h) ** 2))


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def write_vectors(tmp, name, case_dir, cfg, cvecs, lrange):
    """The control-vector files, the varent flags that apply them, and the summed vector
    per steered block that HF's hooks add."""
    D, total, flags = cfg["hidden_size"], {}, []
    for fname, layers, scale in cvecs:
        path = os.path.join(tmp, f"{name}-cv-{fname}.gguf")
        tensors = []
        for layer, seed in sorted(layers.items()):
            v = np.random.default_rng(seed).standard_normal(D).astype(np.float32)
            tensors.append((f"direction.{layer}", gguf_np.F32, [D], v.tobytes()))
            if lrange is None or lrange[0] <= layer <= lrange[1]:
                total[layer] = total.get(layer, 0) + scale * v.astype(np.float64)
        gguf_np.write_gguf(path, {"general.architecture": "controlvector", "controlvector.layer_count": len(tensors)},
                           tensors)
        flags += ["--control-vector", path] if scale == 1.0 else ["--control-vector-scaled", path, scale]
    if lrange:
        flags += ["--control-vector-layer-range", *lrange]
    return flags, {str(k): v.tolist() for k, v in total.items()}


def compare_case(c, hf, tmp):
    name, d, L, P = c["name"], c["dir"], c["n_layers"], c["prompt_len"]
    ids, out = c["seq"][:P], os.path.join(tmp, f"{name}.f32")
    tag = f"interp_hf_{name}"
    # captures of the run (prompt + decode steps)
    t, a = read_tensors(c["acts"]), read_tensors(c["attn"])
    T = len(c["seq"])
    worst = {p: 0.0 for p in POINTS}
    for layer in range(L):
        post = hf["resid_post_hook"][layer] if layer == L - 1 else hf["resid_post_hidden"][layer]
        mid = np.asarray(hf["resid_pre"][layer]) + np.asarray(hf["attn_out"][layer])
        for p, ref in (("resid_pre", hf["resid_pre"][layer]), ("attn_out", hf["attn_out"][layer]),
                       ("resid_mid", mid), ("mlp_out", hf["mlp_out"][layer]), ("resid_post", post)):
            worst[p] = max(worst[p], rel(t[f"layers.{layer}.{p}"], ref))
    for p in POINTS:  # named after the HF side each is compared with
        src = {"resid_pre": "hidden_states", "resid_post": "hidden_states_and_block_hook",
               "resid_mid": "hidden_states_plus_self_attn_hook", "attn_out": "self_attn_hook", "mlp_out": "mlp_hook"}[p]
        report(f"{tag}_dump_acts_{p}_vs_{src}", worst[p], TOL, f"worst layer, {T} rows, max|diff|/max|ref|")
    # attention probabilities: row s is the query at positions[s]
    pos = [int(x) for x in a["positions"]]
    err = 0.0
    for layer in range(L):
        got, ref = a[f"layers.{layer}.attn"], np.asarray(hf["attn"][layer])
        K = got.shape[2]
        for s, q in enumerate(pos):
            err = max(err, float(np.max(np.abs(got[s] - ref[:, q, :K]))))
    check(pos == [P - 1] + list(range(P, T)), f"{tag}_dump_attn_positions", f"{pos}, prompt {P}, T {T}")
    report(f"{tag}_dump_attn_{len(pos)}_queries_vs_output_attentions", err, ATTN_TOL, "max|diff|")
    # prompt logits, --attn-layers statistics and the logit lens
    got, r = varent_logits(d, ids, out, "--attn-layers", "all", "--logit-lens")
    if not check(got is not None, f"{tag}_logits_runs", r.stderr[-300:]):
        return
    report(f"{tag}_logits", rel(got, hf["logits"]), TOL)
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    err = 0.0
    for st in rec["attn_layers"]:
        probs = np.asarray(hf["attn"][st["layer"]])[:, P - 1, :P]
        for h, (e, v) in enumerate(zip(st["entropy"], st["varentropy"])):
            he, hv = entropy_bits(probs[h])
            err = max(err, abs(e - he), abs(v - hv))
    check(len(rec["attn_layers"]) == L, f"{tag}_attn_layers_every_layer", f"{len(rec['attn_layers'])} of {L}")
    report(f"{tag}_attn_layers_entropy_varentropy_bits_vs_output_attentions", err, BITS_TOL, "max|diff|")
    err_h, err_p, ids_ok = 0.0, 0.0, True
    for entry in rec["logit_lens"]:
        p = softmax(hf["lens"][entry["layer"]])
        err_h = max(err_h, abs(entry["entropy"] - entropy_bits(p)[0]))
        top = [x["id"] for x in entry["top"]]
        err_p = max(err_p, max(abs(x["p"] - p[x["id"]]) for x in entry["top"]))
        want = list(np.argsort(-p, kind="stable")[:5])
        # a different order passes only where HF's probabilities tie within P_TOL
        ids_ok &= all(g == w or abs(p[g] - p[w]) <= P_TOL for g, w in zip(top, want))
    check(len(rec["logit_lens"]) == L, f"{tag}_logit_lens_every_layer", f"{len(rec['logit_lens'])} of {L}")
    report(f"{tag}_logit_lens_entropy_bits_vs_norm_lm_head", err_h, BITS_TOL, "max|diff|")
    report(f"{tag}_logit_lens_top5_p_vs_norm_lm_head", err_p, P_TOL, "max|diff|")
    check(ids_ok, f"{tag}_logit_lens_top5_ids_vs_norm_lm_head")
    # interventions against forward hooks
    for what, extra in (("cvec", c["cvec_flags"]), ("ablate", [x for h in c["ablate"] for x in ("--ablate-head", h)]),
                        ("skip", [x for s in c["skip"] for x in ("--skip-layer", s)])):
        got, r = varent_logits(d, ids, out, *extra)
        moved = rel(hf[what], hf["logits"])
        check(moved > 1e-3, f"{tag}_{what}_moves_hf_logits", f"{moved:.3g}")
        if check(got is not None, f"{tag}_{what}_runs", r.stderr[-300:]):
            print(f"  {tag}_{what}: {' '.join(os.path.basename(str(x)) for x in extra)}", flush=True)
            report(f"{tag}_{what}_vs_forward_hook", rel(got, hf[what]), TOL)


def ppl_runs(tmp):
    """`varent ppl --per-token` on stories260K (its tokenizer makes the ids), in one window
    and in several overlapping ones: the runs, each with the ids varent scored."""
    d, text = vtest.stories_dir("f32"), os.path.join(tmp, "story.txt")
    with open(text, "w") as f:
        f.write(PPL_TEXT)
    runs = []
    for ctx, stride in PPL_WINDOWS:
        pt = os.path.join(tmp, f"ppl-{ctx}-{stride}.jsonl")
        r = vtest.varent("ppl", "-m", d, "-f", text, "--ctx", ctx, "--stride", stride, "--per-token", pt, "--json",
                         "-q", timeout=120)
        if not check(r.returncode == 0, f"interp_hf_ppl_ctx{ctx}_stride{stride}_runs", r.stderr[-300:]):
            continue
        rows = [json.loads(line) for line in open(pt)]
        runs.append({"dir": d, "ctx": ctx, "stride": stride, "ids": [x["id"] for x in rows],
                     "logprobs": [x["logprob"] for x in rows], "summary": json.loads(r.stdout)})
    return runs


def compare_ppl(p, ref):
    tag = f"interp_hf_ppl_ctx{p['ctx']}_stride{p['stride']}_per_token"
    got = p["logprobs"]
    same_scored = [g is None for g in got] == [w is None for w in ref]
    check(same_scored, f"{tag}_scores_the_same_tokens", f"varent scores {sum(g is not None for g in got)}, "
          f"HF's loop {sum(w is not None for w in ref)} of {len(ref)}")
    if not same_scored:
        return
    err = max(abs(g - w) for g, w in zip(got, ref) if w is not None)
    report(f"{tag}_logprobs_vs_hf_strided_loop", err, PPL_TOL, f"max|diff| nats over {len(ref)} tokens, "
           f"{p['summary']['windows']} windows")


def main():
    py = hf_python()
    if not py:
        vtest.skip("interp_hf", "no python with torch and transformers; set VARENT_HF_PYTHON")
        return
    tmp = vtest.tmpdir("interp-hf")
    spec = {"cases": []}
    for name, preset, dtype, seed, plen, cvecs, lrange, ablate, skip in CASES:
        d = os.path.join(tmp, f"{preset}-{dtype}")
        cfg = gen.generate(preset, d, seed=seed, dtype=dtype)
        ids = [int(x) for x in np.random.default_rng(seed).integers(3, cfg["vocab_size"] - 5, plen)]
        acts, attn = os.path.join(tmp, f"{name}-acts.st"), os.path.join(tmp, f"{name}-attn.st")
        r = vtest.varent("run", "-m", d, "--ids", ",".join(map(str, ids)), "-n", GEN, "--temp", 0, "--dump-acts", acts,
                         "--dump-points", ",".join(POINTS), "--dump-attn", attn, timeout=120)
        if not check(r.returncode == 0, f"interp_hf_{name}_run_dumps", r.stderr[-300:]):
            continue
        seq = [int(x) for x in read_tensors(acts)["ids"]]
        flags, total = write_vectors(tmp, name, d, cfg, cvecs, lrange)
        spec["cases"].append({"name": name, "dir": d, "seq": seq, "prompt_len": plen, "n_layers":
                              cfg["num_hidden_layers"], "acts": acts, "attn": attn, "vectors": total,
                              "cvec_flags": flags, "ablate": ablate, "skip": skip})
    spec["ppl"], spec["ppl_text"] = ppl_runs(tmp), PPL_TEXT
    sp, outp = os.path.join(tmp, "spec.json"), os.path.join(tmp, "hf.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([py, "-c", HF_SCRIPT, sp, outp], capture_output=True, text=True, timeout=900)
    if not check(r.returncode == 0, "interp_hf_run", r.stderr[-500:]):
        return
    with open(outp) as f:
        hf = json.load(f)
    print(f"  versions: {json.dumps(hf['versions'])}", flush=True)
    for c in spec["cases"]:
        compare_case(c, hf[c["name"]], tmp)
    if spec["ppl"]:  # `varent convert llama2c`'s tokenizer.json, read by HF, gives varent's ids (BOS first)
        got, want = spec["ppl"][0]["ids"], hf["tokenized"]
        check(got == want, "interp_hf_ppl_ids_vs_hf_tokenizer", f"varent {got[:8]}... ({len(got)}), "
              f"HF {want[:8]}... ({len(want)})")
    for p, ref in zip(spec["ppl"], hf["ppl"]):
        compare_ppl(p, ref)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)


main()
vtest.done()
