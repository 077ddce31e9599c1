"""LoRA adapters in PEFT's format (issue 24 item 1), against the numpy reference with the
adapters folded into its weights (tests/reference/ref_lora.py, from PEFT's definition):

  - random adapters (written here: adapter_config.json + adapter_model.safetensors) on
    tiny Llama 3, untied MHA, Qwen2 (biases) and Qwen3 (q/k norms) checkpoints, all seven
    projections or a subset, some layers only, F32 and BF16 adapters, rsLoRA: `varent
    logits --lora` equals the reference's logits, in prefill and in one-token decode
    steps; `--lora-scaled DIR S` and two adapters stacked; scale 0 gives logits bit for
    bit equal to the base model's; `run --lora` greedy text follows the reference;
  - `varent lora merge`: the merged directory's logits equal the reference's, its f32
    weights equal W + s*c*B@A, its bf16 weights are that rounded (within one bf16 step),
    the other files are copied; a failed merge leaves no directory;
  - the server loads --lora-modules NAME=DIR and a request's "model" selects one: its
    logprobs are the adapted model's, the base id's are the base model's; /v1/models
    lists both;
  - bad adapters (DoRA, modules_to_save, embedding/lm_head targets and tensors, a wrong
    shape or rank, a missing half, a layer the model lacks, a missing key, a pickled
    .bin, an unknown tensor, PEFT variants such as aLoRA, lora_bias, layer_replication,
    trainable tokens and KaSA) fail naming the file and the key, and write nothing;
  - PEFT's own adapters, logits and merge_and_unload(), where torch and peft import:
    tests/py/test_lora_peft.py (VARENT_HF_PYTHON); the CUDA device: tests/py/test_lora_cuda.py;
    tensor parallelism over MPI: tests/py/test_lora_tp.py.
"""
import json
import os
import shutil

import numpy as np

import servertest
import vtest
from vtest import check, expect_fail, stories_dir, tmpdir, varent
import gen_random_checkpoint as gen
import ref_lora
import ref_model
from safetensors_np import save_file, CheckpointReader, f32_to_bf16, bf16_to_f32

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IDS = [1, 17, 200, 35, 99, 4, 123, 250, 7, 64, 300]
TOL = 1e-4


def proj_dims(cfg):
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv * cfg.head_dim
    return {"q_proj": (cfg.dim, q), "k_proj": (cfg.dim, kv), "v_proj": (cfg.dim, kv), "o_proj": (q, cfg.dim),
            "gate_proj": (cfg.dim, cfg.hidden), "up_proj": (cfg.dim, cfg.hidden), "down_proj": (cfg.hidden, cfg.dim)}


def write_adapter(out, base_dir, r=4, alpha=8, targets=ALL, layers=None, rslora=False, seed=0, dtype="F32",
                  config_extra=None, edit=None):
    """A random PEFT LoRA adapter for base_dir; edit(tensors) may change the tensors first."""
    cfg = ref_model.Config.load(base_dir)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in (layers if layers is not None else range(cfg.n_layers)):
        for mod in (t for t in targets if t in ALL):  # other targets: only named in the config
            n_in, n_out = proj_dims(cfg)[mod]
            grp = "self_attn" if mod in ALL[:4] else "mlp"
            pre = f"base_model.model.model.layers.{layer}.{grp}.{mod}"
            tensors[pre + ".lora_A.weight"] = rng.normal(0, 1 / np.sqrt(n_in), (r, n_in))
            tensors[pre + ".lora_B.weight"] = rng.normal(0, 0.3 / np.sqrt(r), (n_out, r))
    if edit:
        edit(tensors)
    os.makedirs(out, exist_ok=True)
    conf = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": rslora, "target_modules": targets,
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
            "use_dora": False, "rank_pattern": {}, "alpha_pattern": {}, "base_model_name_or_path": base_dir,
            "task_type": "CAUSAL_LM"}
    conf.update(config_extra or {})
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(conf, f)
    save_file(os.path.join(out, "adapter_model.safetensors"), tensors, dtype)
    return out


def logits(d, out, *extra, ids=IDS):
    if os.path.exists(out):
        os.remove(out)
    r = varent("logits", "-m", d, "--ids", ",".join(map(str, ids)), "--out", out, "-t", 1, *extra)
    return (np.fromfile(out, dtype="<f4"), "") if r.returncode == 0 else (None, r.stderr.strip()[-400:])


def rel_err(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def check_close(name, got, want, why=""):
    if got is None:
        return check(False, name, why)
    e = rel_err(got, want)
    return check(e <= TOL, name, f"max rel err {e:.2e} {why}")


def test_presets(tmp):
    out = os.path.join(tmp, "l.f32")
    for preset, dtype, seed in (("llama3-tiny", "f32", 1), ("llama3-tiny", "bf16", 2), ("llama-mha-untied", "f32", 3),
                                ("qwen2-tiny", "bf16", 4), ("qwen3-tiny", "bf16", 5)):
        d = os.path.join(tmp, f"{preset}-{dtype}")
        gen.generate(preset, d, seed=seed, dtype=dtype)
        model = ref_model.Model(d)
        base = ref_model.forward(model, IDS)[-1]
        tag = f"{preset}_{dtype}"
        ad = write_adapter(os.path.join(tmp, f"ad-{tag}"), d, seed=seed)
        want = ref_model.forward(ref_lora.with_adapters(model, [(ad, 1.0)]), IDS)[-1]
        got, why = logits(d, out, "--lora", ad)
        check(rel_err(want, base) > 100 * TOL, f"lora_{tag}_adapter_matters", f"{rel_err(want, base):.2e}")
        check_close(f"lora_{tag}_logits_equal_reference", got, want, why)
        got1, why = logits(d, out, "--lora", ad, "--chunk", 1)  # one-token decode steps
        check_close(f"lora_{tag}_decode_steps_equal_reference", got1, want, why)
        b0, _ = logits(d, out)
        g0, why = logits(d, out, "--lora-scaled", ad, 0)
        check(g0 is not None and b0 is not None and g0.tobytes() == b0.tobytes(), f"lora_{tag}_scale_0_bit_identical",
              why)
    d = os.path.join(tmp, "llama3-tiny-f32")
    test_variants(tmp, d, ref_model.Model(d), out)


def test_variants(tmp, d, model, out):
    sub = write_adapter(os.path.join(tmp, "ad-sub"), d, targets=["q_proj", "v_proj", "down_proj"], layers=[1],
                        r=3, alpha=5, seed=7, dtype="BF16")
    rs = write_adapter(os.path.join(tmp, "ad-rs"), d, r=8, alpha=4, rslora=True, seed=8)
    for name, adapters, args in (
            ("subset_bf16_adapter", [(sub, 1.0)], ["--lora", sub]),
            ("rslora", [(rs, 1.0)], ["--lora", rs]),
            ("scaled", [(rs, 0.35)], ["--lora-scaled", rs, 0.35]),
            ("two_stacked", [(sub, 1.0), (rs, -1.5)], ["--lora", sub, "--lora-scaled", rs, -1.5])):
        want = ref_model.forward(ref_lora.with_adapters(model, adapters), IDS)[-1]
        got, why = logits(d, out, *args)
        check_close(f"lora_{name}_equals_reference", got, want, why)
    # generation: greedy text through run (ids printed: no tokenizer in the dir)
    m = ref_lora.with_adapters(model, [(rs, 1.0)])
    seq = list(IDS[:4])
    for _ in range(6):
        seq.append(int(ref_model.forward(m, seq)[-1].argmax()))
    r = varent("run", "-m", d, "--ids", ",".join(map(str, IDS[:4])), "-n", 6, "--temp", 0, "--lora", rs, "-t", 1)
    got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else r.stderr[-300:]
    check(got == seq[4:], "lora_run_greedy_follows_reference", f"{got} vs {seq[4:]}")
    test_merge(tmp, d, model, out, rs)
    test_bad_adapters(tmp, d)


def test_merge(tmp, d, model, out, ad):
    m_dir = os.path.join(tmp, "merged")
    r = varent("lora", "merge", d, ad, m_dir, "--scale", 0.6)
    if not check(r.returncode == 0, "lora_merge_runs", r.stderr[-300:]):
        return
    want = ref_model.forward(ref_lora.with_adapters(model, [(ad, 0.6)]), IDS)[-1]
    got, why = logits(m_dir, out)
    check_close("lora_merge_logits_equal_reference", got, want, why)
    ck, mk = CheckpointReader(d), CheckpointReader(m_dir)
    scaling, pairs = ref_lora.read_adapter(ad)
    bad = [k for k in ck.keys() if k not in mk]
    for (layer, mod), (a, b) in pairs.items():
        grp = "self_attn" if mod in ALL[:4] else "mlp"
        name = f"model.layers.{layer}.{grp}.{mod}.weight"
        w = ck.get(name, np.float64) + 0.6 * scaling * (b @ a)
        if np.abs(mk.get(name, np.float64) - w).max() > 1e-6 * max(1.0, np.abs(w).max()):
            bad.append(name)
    same = [fn for fn in ("config.json",) if open(os.path.join(d, fn), "rb").read() !=
            open(os.path.join(m_dir, fn), "rb").read()]
    check(not bad and not same, "lora_merge_weights_are_w_plus_scaled_ba", f"{bad[:3]} {same}")
    # bf16 base: merged weights are the f64 sum rounded to bf16
    d16 = os.path.join(tmp, "llama3-tiny-bf16")
    ad16 = os.path.join(tmp, "ad-llama3-tiny_bf16")
    m16 = os.path.join(tmp, "merged16")
    r = varent("lora", "merge", d16, ad16, m16)
    ok = r.returncode == 0
    if ok:
        ck16, mk16 = CheckpointReader(d16), CheckpointReader(m16)
        scaling, pairs = ref_lora.read_adapter(ad16)
        for (layer, mod), (a, b) in pairs.items():
            grp = "self_attn" if mod in ALL[:4] else "mlp"
            name = f"model.layers.{layer}.{grp}.{mod}.weight"
            w = (ck16.get(name, np.float64) + scaling * (b @ a)).astype(np.float32)
            want16 = bf16_to_f32(f32_to_bf16(w)).astype(np.float64)
            got16 = mk16.get(name, np.float64)
            step = np.abs(want16) * 2.0 ** -7 + 1e-30
            ok = ok and mk16.info(name)[0] == "BF16" and bool((np.abs(got16 - want16) <= step).all())
    check(ok, "lora_merge_bf16_rounded_once", r.stderr[-300:])
    # a failed merge writes nothing
    bad_ad = write_adapter(os.path.join(tmp, "ad-badshape"), d, targets=["q_proj"], seed=9,
                           edit=lambda t: t.update({k: v[:, :-1] for k, v in t.items() if "lora_A" in k}))
    m_bad = os.path.join(tmp, "merged-bad")
    r = varent("lora", "merge", d, bad_ad, m_bad)
    check(r.returncode == 1 and not os.path.exists(m_bad) and "lora_A" in r.stderr, "lora_merge_bad_adapter_writes_nothing",
          f"rc {r.returncode} exists {os.path.exists(m_bad)} {r.stderr[-300:]}")
    r = varent("lora", "merge", d, ad, d)
    # usage errors (the arguments themselves) exit 2, as every command's (docs/cli.md)
    expect_fail("lora_merge_into_base_refused", r, "new directory", rc=2)
    expect_fail("lora_merge_usage", varent("lora", "merge", d), "need BASE_DIR", rc=2)
    expect_fail("lora_unknown_subcommand", varent("lora", "frob"), "unknown subcommand 'frob'", rc=2)


def test_bad_adapters(tmp, d):
    cfg = ref_model.Config.load(d)
    q_in, q_out = proj_dims(cfg)["q_proj"]

    def drop_b(t):
        del t["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]

    def add(name, shape):
        return lambda t: t.update({name: np.zeros(shape)})

    cases = [
        ("dora", {"config_extra": {"use_dora": True}}, ["adapter_config.json", "use_dora"]),
        ("modules_to_save", {"config_extra": {"modules_to_save": ["lm_head"]}}, ["modules_to_save"]),
        ("embed_target", {"targets": ["q_proj", "embed_tokens"]}, ["target_modules", "embed_tokens"]),
        ("rank_pattern", {"config_extra": {"rank_pattern": {"q_proj": 2}}}, ["rank_pattern"]),
        ("missing_r", {"config_extra": {"r": None}}, ["'r'"]),
        # PEFT variants that are not W x + c B A x on every token (as PEFT 0.21 writes their keys)
        ("alora", {"config_extra": {"alora_invocation_tokens": [5, 6]}}, ["alora_invocation_tokens", "aLoRA"]),
        ("layer_replication", {"config_extra": {"layer_replication": [[0, 1], [0, 2]]}}, ["layer_replication"]),
        ("lora_bias", {"config_extra": {"lora_bias": True}}, ["'lora_bias'"]),
        ("trainable_tokens", {"config_extra": {"trainable_token_indices": [3, 4]}}, ["trainable_token_indices"]),
        ("kasa", {"config_extra": {"kasa_config": {"r": 4}}}, ["kasa_config"]),
        ("bias_all", {"config_extra": {"bias": "all"}}, ["'bias'"]),
        ("wrong_rank", {"targets": ["q_proj"], "config_extra": {"r": 5}}, ["q_proj.lora_A.weight", "shape", "r = 5"]),
        ("wrong_shape", {"targets": ["q_proj"],
                         "edit": lambda t: t.update({k: v[:-1] for k, v in t.items() if "lora_B" in k})},
         ["q_proj.lora_B.weight", f"expected [{q_out}, 4]"]),
        ("missing_half", {"targets": ["q_proj"], "edit": drop_b}, ["layers.0.self_attn.q_proj.lora_B.weight", "missing"]),
        ("layer_out_of_range", {"targets": ["q_proj"], "layers": [cfg.n_layers]}, [f"layer {cfg.n_layers}"]),
        ("lm_head_tensor", {"targets": ["q_proj"], "edit": add("base_model.model.lm_head.lora_A.weight", (4, cfg.dim))},
         ["lm_head.lora_A.weight", "lm_head"]),
        ("dora_tensor", {"targets": ["q_proj"], "edit": add(
            "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", (q_out,))},
         ["lora_magnitude_vector", "DoRA"]),
        ("unknown_tensor", {"targets": ["q_proj"], "edit": add("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight",
                                                               (4, q_in))}, ["mlp.q_proj.lora_A.weight"]),
        ("untargeted_module", {"targets": ["q_proj"], "edit": add(
            "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", (4, cfg.dim))},
         ["k_proj.lora_A.weight", "target_modules"]),
    ]
    out = os.path.join(tmp, "bad.f32")
    for name, kw, needles in cases:
        ad = write_adapter(os.path.join(tmp, f"bad-{name}"), d, seed=11, **kw)
        if name == "missing_r":
            c = json.load(open(os.path.join(ad, "adapter_config.json")))
            del c["r"]
            json.dump(c, open(os.path.join(ad, "adapter_config.json"), "w"))
        if os.path.exists(out):
            os.remove(out)
        r = varent("logits", "-m", d, "--ids", "1,2", "--out", out, "--lora", ad)
        ok = expect_fail(f"lora_bad_{name}", r, ad, *needles)
        if ok:
            check(not os.path.exists(out), f"lora_bad_{name}_writes_nothing")
    bin_dir = os.path.join(tmp, "bad-bin")
    write_adapter(bin_dir, d, targets=["q_proj"])
    os.rename(os.path.join(bin_dir, "adapter_model.safetensors"), os.path.join(bin_dir, "adapter_model.bin"))
    expect_fail("lora_bad_pickle_bin", varent("logits", "-m", d, "--ids", "1", "--out", out, "--lora", bin_dir),
                "adapter_model.bin", "safetensors")
    expect_fail("lora_bad_missing_dir", varent("logits", "-m", d, "--ids", "1", "--out", out, "--lora",
                                               os.path.join(tmp, "nope")), "nope/adapter_config.json")
    expect_fail("lora_scaled_needs_two", varent("logits", "-m", d, "--ids", "1", "--out", out, "--lora-scaled", "x"),
                "--lora-scaled", rc=2)
    expect_fail("lora_scaled_bad_number", varent("logits", "-m", d, "--ids", "1", "--out", out, "--lora-scaled",
                                                 bin_dir, "abc"), "scale must be a number", rc=2)


def test_server(tmp):
    stories = stories_dir("f32")
    model = ref_model.Model(stories)
    ad = write_adapter(os.path.join(tmp, "ad-stories"), stories, seed=21)
    adapted = ref_lora.with_adapters(model, [(ad, 1.0)])
    srv = servertest.Server(stories, "-t", 1, "--lora-modules", f"story-lora={ad}", name="lora")
    try:
        st, models = srv.json("GET", "/v1/models")
        ids = [m["id"] for m in models.get("data", [])]
        check(st == 200 and ids == ["stories260K-f32", "story-lora"] and models["data"][1]["parent"] == ids[0],
              "lora_server_lists_modules", str(models)[:300])
        prompt = [1, 403, 407, 261]
        for name, m in (("story-lora", adapted), ("stories260K-f32", model)):
            st, r = srv.post("/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 0, "echo": True,
                                                 "logprobs": 1})
            lg = ref_model.forward(m, prompt)
            want = [None] + [float(lg[i - 1][prompt[i]] - np.log(np.exp(lg[i - 1] - lg[i - 1].max()).sum())
                                   - lg[i - 1].max()) for i in range(1, len(prompt))]
            got = r["choices"][0]["logprobs"]["token_logprobs"] if st == 200 else str(r)[:300]
            ok = st == 200 and got[0] is None and all(abs(a - b) < 1e-4 for a, b in zip(got[1:], want[1:]))
            check(ok and r.get("model") is not None, f"lora_server_model_{name}_logprobs", f"{got} vs {want}")
        st, r = srv.post("/v1/completions", {"model": "nope", "prompt": "x"})
        check(st == 404 and r["error"]["param"] == "model", "lora_server_unknown_model_404", str(r)[:200])
    finally:
        srv.stop()
    r = varent("serve", "-m", stories, "--port", 0, "--lora-modules", "noequals")
    expect_fail("lora_server_bad_module_syntax", r, "--lora-modules", "NAME=DIR", rc=2)
    r = varent("serve", "-m", stories, "--port", 0, "--lora-modules", f"x={tmp}/nope")
    expect_fail("lora_server_missing_module_dir", r, "--lora-modules x", "nope/adapter_config.json")


def main():
    tmp = tmpdir("lora")
    test_presets(tmp)
    test_server(tmp)
    return 1 if vtest.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
