"""Issue 32 ("Nothing lost, round two"), the input rows: each check failed before its fix.

  row 5:  an eval item that fails mid-run, and a GGUF whose conversion fails on first use,
          end their progress bars (the CLI aborts when a command leaves one running: the
          ticker thread would read a dead stack frame, which ASan caught as
          stack-use-after-scope with a 10,000-choice item);
  row 6:  "gold": 1e300 (a float-to-int cast UBSan reports), 1.5, -1: an error naming the
          file and line;
  row 14: a task prompt holding "\\u0000", or a raw NUL byte in the file: an error naming
          the file and line, not a prompt cut short or lines dropped;
  row 11: names that hold a quote (calibrate --name, an eval task name, a profile file's
          name) come out as valid JSON with the name intact;
  row 9:  lora merge of NaN, infinite or overflowing (3e38) adapter values, or a lora_alpha
          of 1e308: an error naming the tensor or key, nothing written;
  row 10: target_modules' string form is a regular expression matched against the whole
          module name (PEFT's re.fullmatch; the expected sets are written here from PEFT's
          check_target_module_exists, and cross-checked against peft itself when
          VARENT_HF_PYTHON imports it), the list form by name or "." suffix,
          exclude_modules and layers_to_transform as PEFT reads them;
  minor:  --dump-layers "" is an error; a control vector tensor "direction. 2" is refused;
          an invalid adapter_config.json names the line and column; a FIFO in place of
          generation_config.json is an error (no hang, not ignored); safetensors
          data_offsets 0.5 is refused; a llama2.c file cut inside its RoPE tables is
          refused at convert; eval -o on a full disk names the path and the errno.
"""
import json
import lzma
import os
import re
import shutil
import subprocess
import sys

import numpy as np

import vtest
from vtest import check, expect_fail, stories_dir, tmpdir, varent
import gguf_np as G
from safetensors_np import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_lora import ALL, proj_dims, write_adapter  # noqa: E402
import ref_model  # noqa: E402

work = tmpdir("hostile")
stories = stories_dir("f32")


def path(name):
    return os.path.join(work, name)


def write_lines(name, lines, raw=False):
    p = path(name)
    with open(p, "wb") as f:
        f.write(b"".join(x + b"\n" for x in lines) if raw else "".join(x + "\n" for x in lines).encode())
    return p


def no_internal_error(name, r):
    """The command ended every progress bar: no abort, no 'internal error' line."""
    check(r.returncode not in (-6, 134) and "internal error" not in r.stderr, name,
          f"rc {r.returncode}: {r.stderr[-400:]}")


# ---- row 5: every exit path stops the progress thread ----------------------------------

def test_progress():
    long_prompt = "Once upon a time there was a dog. " * 40
    tasks = write_lines("late_error.jsonl", [json.dumps({"prompt": "Once upon a time", "answer": "1"}),
                                             json.dumps({"prompt": long_prompt, "answer": "1"})])
    for quiet in ([], ["-q"]):
        r = varent("eval", "-m", stories, "--tasks", tasks, "--ctx", "64", "--samplers", "greedy", "-n", "2", *quiet)
        tag = "quiet" if quiet else "bar"
        expect_fail(f"row5_eval_item_error_{tag}", r, "late_error item 1 line 2", "context holds 64")
        no_internal_error(f"row5_eval_item_error_ends_progress_{tag}", r)
    # a GGUF whose conversion fails after its "converting" bar began (an unsupported type)
    cache = path("cache")
    q4k = make_gguf("q4k.gguf", q4k_tensor="blk.0.ffn_up.weight")
    r = varent("info", "-m", q4k, env={"XDG_CACHE_HOME": cache})
    expect_fail("row5_gguf_first_use_fails", r, "unsupported type Q4_K", "blk.0.ffn_up.weight")
    no_internal_error("row5_gguf_first_use_ends_progress", r)


# ---- rows 6 and 14: task files --------------------------------------------------------

def test_task_files():
    ok = json.dumps({"prompt": "p", "answer": "1"})
    for name, gold in (("1e300", "1e300"), ("minus_1e300", "-1e300"), ("half", "1.5"), ("negative", "-1")):
        p = write_lines(f"gold_{name}.jsonl", [ok, '{"prompt":"p","choices":["a","b"],"gold":%s}' % gold])
        r = varent("eval", "--tasks", p, "--write", path(f"gold_{name}_out.jsonl"))
        expect_fail(f"row6_gold_{name}", r, f"gold_{name}.jsonl:2:", "gold: must be an index into choices (0..1)")
    p = write_lines("nul_prompt.jsonl", [ok, ok, '{"prompt":"x\\u0000y","answer":"1"}'])
    r = varent("eval", "--tasks", p, "--write", path("nul_prompt_out.jsonl"))
    expect_fail("row14_escaped_nul_prompt", r, "nul_prompt.jsonl:3:", "prompt", "NUL")
    check(not os.path.exists(path("nul_prompt_out.jsonl")), "row14_escaped_nul_writes_nothing")
    p = write_lines("nul_choice.jsonl", ['{"prompt":"p","choices":["a","b\\u0000"],"gold":0}'])
    expect_fail("row14_escaped_nul_choice", varent("eval", "--tasks", p, "--write", path("x.jsonl")),
                "nul_choice.jsonl:1:", "choices[1]", "NUL")
    p = write_lines("nul_raw.jsonl", [ok.encode(), b'{"prompt":"x\x00y","answer":"1"}', ok.encode()], raw=True)
    expect_fail("row14_raw_nul_byte", varent("eval", "--tasks", p, "--write", path("x.jsonl")),
                "nul_raw.jsonl", "NUL byte at line 2")


# ---- row 11: every string written into JSON is escaped ---------------------------------

def test_json_names():
    name = 'a"b\\c'
    out = path("cal.json")
    r = varent("calibrate", "-m", stories, "-n", "3", "-o", out, "--name", name, "-t", "1", "-q")
    try:
        cal = json.load(open(out)) if r.returncode == 0 else None
    except ValueError as e:
        cal = f"invalid JSON: {e}"
    check(isinstance(cal, dict) and cal.get("name") == name and name in cal["calibration"]["quadrant_share"],
          "row11_calibrate_name_with_quote", f"{str(cal)[:300]} {r.stderr[-300:]}")
    if isinstance(cal, dict):  # the profile written back loads with its name
        r = varent("run", "-m", stories, "-p", "Once", "-n", "2", "--sampler", "entropix", "--profile", out)
        check(r.returncode == 0, "row11_calibrated_profile_loads", r.stderr[-300:])
    task = 't"a\n'
    tasks = write_lines("quoted_task.jsonl", [json.dumps({"task": task, "prompt": "Once", "answer": "x"}),
                                              json.dumps({"task": "plain", "prompt": "Once", "answer": "y"})])
    summary = path("quoted_sum.json")
    r = varent("eval", "-m", stories, "--tasks", tasks, "--samplers", "greedy,entropix", "-n", "2", "-q",
               "--summary", summary, "-o", path("quoted_out.jsonl"))
    try:
        s = json.load(open(summary)) if r.returncode == 0 else None
        recs = [json.loads(x) for x in open(path("quoted_out.jsonl"))] if r.returncode == 0 else []
    except ValueError as e:
        s, recs = f"invalid JSON: {e}", []
    check(isinstance(s, dict) and task in [t["task"] for t in s["tasks"]], "row11_eval_summary_task_with_quote",
          f"{str(s)[:300]} {r.stderr[-300:]}")
    check(recs and {x["task"] for x in recs} == {task, "plain"}, "row11_eval_records_task_with_quote", str(recs)[:300])
    prof = path("quoted_prof.json")
    with open(prof, "w") as f:
        json.dump({"name": 'p"x', "profile": "seed"}, f)
    prompts = write_lines("prompts.txt", ["Once upon a time"])
    out = path("cmp.jsonl")
    r = varent("compare", "-m", stories, "--prompts", prompts, "--samplers", "entropix", "--profile", prof, "-n", "2",
               "-o", out, "-q")
    try:
        recs = [json.loads(x) for x in open(out)] if r.returncode == 0 else []
    except ValueError as e:
        recs = [f"invalid JSON: {e}"]
    check(recs and all(isinstance(x, dict) and x.get("profile") == 'p"x' for x in recs),
          "row11_compare_profile_name_with_quote", f"{str(recs)[:300]} {r.stderr[-300:]}")


# ---- rows 9 and 10: LoRA adapters -----------------------------------------------------

def merge_fails(name, ad, *needles):
    out = path(f"merged-{name}")
    r = varent("lora", "merge", stories, ad, out)
    if expect_fail(f"row9_{name}", r, *needles):
        check(not os.path.exists(out), f"row9_{name}_writes_nothing")


def test_lora_values():
    t0 = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"

    def poison(value, name=t0, at=(3, 1)):
        def edit(t):
            t[name] = t[name].copy()
            t[name][at] = value
        return edit

    for tag, value in (("nan", float("nan")), ("inf", float("inf")), ("minus_inf", -float("inf"))):
        ad = write_adapter(path(f"ad-{tag}"), stories, edit=poison(value), seed=3)
        merge_fails(f"merge_{tag}_value", ad, t0, "non-finite", "[3, 1]")
    big = write_adapter(path("ad-big"), stories, seed=3, edit=lambda t: t.update(
        {k: np.full_like(v, 3e38) for k, v in t.items() if ".0.self_attn.q_proj." in k}))
    merge_fails("merge_overflow", big, "model.layers.0.self_attn.q_proj.weight", "overflow")
    huge = write_adapter(path("ad-alpha"), stories, seed=3, alpha=1e308)
    merge_fails("merge_alpha_1e308", huge, "adapter_config.json", "lora_alpha", "beyond a float")
    r = varent("run", "-m", stories, "-p", "Once", "-n", "2", "--lora-scaled", big, "1e300")
    expect_fail("row9_lora_scaled_1e300", r, "--lora-scaled", "-1e30..1e30", rc=2)
    ok = write_adapter(path("ad-ok"), stories, seed=3)
    r = varent("lora", "merge", stories, ok, path("merged-ok"))
    check(r.returncode == 0, "row9_merge_finite_adapter_works", r.stderr[-300:])


def peft_expected(target, key, exclude=None, layers=None, pattern=None):
    """PEFT's check_target_module_exists, written from its definition (peft/tuners/tuners_utils.py)."""
    if exclude is not None:
        if isinstance(exclude, str):
            if re.fullmatch(exclude, key):
                return False
        elif key in exclude or any(key.endswith("." + e) for e in exclude):
            return False
    if isinstance(target, str):
        return target.lower() == "all-linear" or re.fullmatch(target, key) is not None
    if key in target:
        return True
    found = any(key.endswith("." + t) for t in target)
    if layers is not None and (layers != [] if isinstance(layers, list) else True) and found:
        if not pattern:
            m = re.match(r".*?\.[^.]*\.(\d+)\.", key)
        else:
            m = None
            for p in [pattern] if isinstance(pattern, str) else pattern:
                m = re.match(rf".*?\.{p}\.(\d+)\.", key)
                if m:
                    break
        if m is None:
            return False
        idx = int(m.group(1))
        return idx == layers if isinstance(layers, int) else idx in layers
    return found


PEFT_CASES = [  # name, config keys
    ("regex_v_proj", {"target_modules": "v_proj"}),
    ("regex_suffix", {"target_modules": r".*\.(q_proj|v_proj)"}),
    ("regex_layer_1", {"target_modules": r"model\.layers\.1\..*_proj"}),
    ("regex_alternation", {"target_modules": r".*(k|up)_proj|model\.layers\.0\.mlp\.down_proj"}),
    ("regex_partial_name", {"target_modules": r"q_pro"}),
    ("all_linear", {"target_modules": "ALL-LINEAR"}),
    ("list_qualified", {"target_modules": ["self_attn.q_proj", "mlp.up_proj"]}),
    ("list_exclude_regex", {"target_modules": ALL, "exclude_modules": r".*\.1\.self_attn\..*"}),
    ("list_exclude_list", {"target_modules": ["q_proj", "v_proj"], "exclude_modules": ["layers.0.self_attn.v_proj"]}),
    ("layers_to_transform", {"target_modules": ["q_proj", "down_proj"], "layers_to_transform": [0, 2]}),
    ("layers_to_transform_int", {"target_modules": ["q_proj"], "layers_to_transform": 1,
                                 "layers_pattern": "layers"}),
    ("layers_pattern_other", {"target_modules": ["q_proj"], "layers_to_transform": [1], "layers_pattern": "h"}),
]


def module_keys(n_layers):
    return [f"model.layers.{l}.{'self_attn' if m in ALL[:4] else 'mlp'}.{m}" for l in range(n_layers) for m in ALL]


def varent_applies(name, config, keys):
    """Whether varent applies an adapter whose config is config and whose pairs are keys':
    True, False (refused naming the config's keys), or the error text."""
    ad = write_adapter(path(f"tm-{name}"), stories, targets=[], seed=5, config_extra=config)
    rng = np.random.default_rng(5)
    dims = proj_dims(ref_model.Config.load(stories))
    tensors = {}
    for k in keys:
        n_in, n_out = dims[k.split(".")[-1]]
        tensors[f"base_model.model.{k}.lora_A.weight"] = rng.normal(0, 0.1, (4, n_in))
        tensors[f"base_model.model.{k}.lora_B.weight"] = rng.normal(0, 0.1, (n_out, 4))
    save_file(os.path.join(ad, "adapter_model.safetensors"), tensors, "F32")
    r = varent("logits", "-m", stories, "--ids", "1,2", "--out", path("tm.f32"), "--lora", ad)
    shutil.rmtree(ad)
    if r.returncode == 0:
        return True
    if re.search("target_modules|exclude_modules|layers_to_transform|holds no LoRA weights", r.stderr):
        return False
    return r.stderr.strip()[-300:]


def test_target_modules():
    n_layers = json.load(open(os.path.join(stories, "config.json")))["num_hidden_layers"]
    keys = module_keys(n_layers)
    table = {}
    for name, config in PEFT_CASES:
        want = [k for k in keys if peft_expected(config["target_modules"], k, config.get("exclude_modules"),
                                                 config.get("layers_to_transform"), config.get("layers_pattern"))]
        table[name] = want
        # the modules PEFT adapts, all in one adapter; then some of the others, one at a time
        got = varent_applies(name, config, want) if want else True
        others = [k for k in keys if k not in want]
        sample = others[:2] + others[len(others) // 2:len(others) // 2 + 1] + others[-1:]
        refused = [varent_applies(f"{name}-{i}", config, [k]) for i, k in enumerate(sample)]
        check(got is True and all(x is False for x in refused), f"row10_peft_{name}",
              f"PEFT adapts {len(want)} modules ({want[:3]}...): varent: {got}; {sample}: {refused}")
    cross_check_peft(keys, table)
    for name, config, needles in (
            ("bad_regex", {"target_modules": "q_proj("}, ["target_modules", "does not compile"]),
            ("regex_embed", {"target_modules": r".*embed_tokens|.*q_proj"}, ["target_modules", "embedding"]),
            ("regex_with_layers", {"target_modules": "q_proj", "layers_to_transform": [0]},
             ["layers_to_transform", "PEFT refuses it too"]),
            ("pattern_without_layers", {"target_modules": ["q_proj"], "layers_pattern": "layers"},
             ["layers_pattern", "needs layers_to_transform"])):
        ad = write_adapter(path(f"tm-{name}"), stories, targets=["q_proj"], seed=5, config_extra=config)
        r = varent("logits", "-m", stories, "--ids", "1,2", "--out", path("tm.f32"), "--lora", ad)
        expect_fail(f"row10_{name}", r, "adapter_config.json", *needles)


def cross_check_peft(keys, table):
    """The same cases through peft.tuners.tuners_utils.check_target_module_exists."""
    py = os.environ.get("VARENT_HF_PYTHON")
    if not py:
        return vtest.skip("row10_peft_cross_check", "VARENT_HF_PYTHON is not set (a python with peft)")
    script = ("import json, sys\nfrom peft import LoraConfig\n"
              "from peft.tuners.tuners_utils import check_target_module_exists\n"
              "cases, keys = json.load(sys.stdin)\nout = {}\n"
              "for name, cfg in cases:\n"
              "    c = LoraConfig(**cfg)\n"
              "    if isinstance(c.target_modules, str) and c.target_modules.lower() == 'all-linear':\n"
              "        out[name] = keys\n        continue\n"
              "    out[name] = [k for k in keys if check_target_module_exists(c, k) is not None and "
              "check_target_module_exists(c, k) is not False and type(check_target_module_exists(c, k)).__name__ "
              "!= '_ExcludedModule']\n"
              "print(json.dumps(out))\n")
    p = subprocess.run([py, "-c", script], input=json.dumps([PEFT_CASES, keys]), capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        return vtest.skip("row10_peft_cross_check", f"peft did not run: {p.stderr.strip()[-200:]}")
    got = json.loads(p.stdout)
    bad = {k: (got.get(k), v) for k, v in table.items() if got.get(k) != v}
    check(not bad, "row10_peft_cross_check", str(bad)[:600])


def test_adapter_config_errors():
    ad = write_adapter(path("ad-badjson"), stories, seed=3)
    with open(os.path.join(ad, "adapter_config.json"), "w") as f:
        f.write('{\n  "r": 4,\n  "lora_alpha": 8,\n  "target_modules": ["q_proj",]\n}\n')
    r = varent("logits", "-m", stories, "--ids", "1,2", "--out", path("x.f32"), "--lora", ad)
    expect_fail("minor_adapter_config_syntax_error", r, "adapter_config.json", "invalid JSON at line 4, column")
    with open(os.path.join(ad, "adapter_config.json"), "w") as f:
        f.write('[1, 2]')
    r = varent("logits", "-m", stories, "--ids", "1,2", "--out", path("x.f32"), "--lora", ad)
    expect_fail("minor_adapter_config_not_object", r, "adapter_config.json", "an array, not a JSON object")


# ---- the minor list ---------------------------------------------------------------------

def test_minor():
    for flag, val, tag in (("--dump-layers", "", "empty"), ("--dump-layers", "1,", "trailing_comma"),
                           ("--dump-layers", " 1", "space"), ("--dump-layers", "+1", "plus"),
                           ("--attn-layers", "", "empty")):
        extra = ["--dump-acts", path("a.safetensors")] if flag == "--dump-layers" else ["--metrics-out", path("m.jsonl")]
        r = varent("run", "-m", stories, "-p", "Once", "-n", "2", *extra, flag, val)
        expect_fail(f"minor_{flag[2:].replace('-', '_')}_{tag}", r, flag, "is not all or a list")
    check(not os.path.exists(path("a.safetensors")), "minor_dump_layers_empty_writes_nothing")
    dim = json.load(open(os.path.join(stories, "config.json")))["hidden_size"]
    for tag, tname in (("space", "direction. 2"), ("plus", "direction.+2"), ("trailing", "direction.2 ")):
        p = path(f"cvec-{tag}.gguf")
        G.write_gguf(p, {"general.architecture": "controlvector", "controlvector.model_hint": "llama",
                         "controlvector.layer_count": G.Val(G.I32, 1)},
                     [(tname, G.F32, [dim], np.ones(dim, np.float32).tobytes())])
        r = varent("run", "-m", stories, "-p", "Once", "-n", "2", "--control-vector", p)
        expect_fail(f"minor_cvec_name_{tag}", r, f"cvec-{tag}.gguf", f"tensor {tname} is not direction.<layer>")
    # generation_config.json as a FIFO with no writer: an error at once, not a hang or a silent default
    d = path("fifo-model")
    shutil.copytree(stories, d)
    os.remove(os.path.join(d, "generation_config.json"))
    os.mkfifo(os.path.join(d, "generation_config.json"))
    try:
        r = varent("run", "-m", d, "-p", "Once", "-n", "2", timeout=30)
        expect_fail("minor_fifo_generation_config", r, "generation_config.json", "FIFO")
    except subprocess.TimeoutExpired:
        check(False, "minor_fifo_generation_config", "varent run hung on the FIFO")
    os.remove(os.path.join(d, "generation_config.json"))
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        f.write('{"eos_token_id": [2,}')
    expect_fail("minor_invalid_generation_config", varent("run", "-m", d, "-p", "Once", "-n", "2"),
                "generation_config.json", "invalid JSON at line 1")
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        f.write('{"eos_token_id": 1e300}')
    expect_fail("minor_generation_config_eos_1e300", varent("run", "-m", d, "-p", "Once", "-n", "2"),
                "generation_config.json", "eos_token_id", "token id")
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    for key, value, needles in (("rope_theta", 1e300, ["rope_theta", "positive"]),
                                ("partial_rotary_factor", 0.5, ["partial_rotary_factor", "not supported"])):
        bad = dict(cfg, **{key: value})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(bad, f)
        expect_fail(f"minor_config_{key}", varent("run", "-m", d, "-p", "Once", "-n", "2"), "config.json", *needles)
    # safetensors data_offsets 0.5 (read as 0 before)
    st = path("half-offset")
    shutil.copytree(stories, st)
    header, data = vtest.read_st(os.path.join(st, "model.safetensors"))
    name = next(k for k, v in header.items() if k != "__metadata__" and v["data_offsets"][0] == 0)
    header[name]["data_offsets"][0] = 0.5
    vtest.write_st(os.path.join(st, "model.safetensors"), header, data)
    expect_fail("minor_safetensors_offset_half", varent("run", "-m", st, "-p", "Once", "-n", "2"),
                "model.safetensors", name, "data_offsets")
    # a llama2.c checkpoint cut inside its RoPE tables (tied weights: nothing follows them)
    ckpt = path("stories260K.bin")
    with lzma.open(os.path.join(vtest.TESTDATA, "stories260K", "stories260K.bin.xz")) as f:
        blob = f.read()
    with open(ckpt, "wb") as f:
        f.write(blob[:len(blob) - 100])
    out = path("l2c-out")
    r = varent("convert", "llama2c", ckpt, os.path.join(vtest.TESTDATA, "stories260K", "tok512.bin"), out)
    expect_fail("minor_llama2c_cut_in_rope_tables", r, "stories260K.bin", "truncated in the RoPE tables")
    check(not os.path.exists(out), "minor_llama2c_cut_writes_nothing")
    # eval -o on a full disk: the path and the errno
    if os.path.exists("/dev/full"):
        tasks = write_lines("one.jsonl", [json.dumps({"prompt": "Once", "answer": "x"})])
        r = varent("eval", "-m", stories, "--tasks", tasks, "--samplers", "greedy", "-n", "2", "-q", "-o", "/dev/full")
        expect_fail("minor_eval_out_full_disk", r, "-o /dev/full", "No space left on device")
    else:
        vtest.skip("minor_eval_out_full_disk", "no /dev/full")


# ---- GGUF helpers -----------------------------------------------------------------------

TOKENS = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]


def make_gguf(name, q4k_tensor=None):
    """A tiny llama GGUF (random weights), one tensor Q4_K when asked (unsupported)."""
    L, D, F, H, V = 1, 256, 256, 4, len(TOKENS)
    rng = np.random.default_rng(7)
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
    for n, s in (("attn_norm", (D,)), ("ffn_norm", (D,)), ("attn_q", (D, D)), ("attn_k", (D, D)), ("attn_v", (D, D)),
                 ("attn_output", (D, D)), ("ffn_gate", (F, D)), ("ffn_up", (F, D)), ("ffn_down", (D, F))):
        shapes[f"blk.0.{n}.weight"] = s
    recs = []
    for n, s in shapes.items():
        w = (0.05 * rng.standard_normal(s)).astype(np.float32)
        t = G.Q4_K if n == q4k_tensor else G.F32
        raw = bytes(144 * w.size // 256) if t == G.Q4_K else w.tobytes()
        recs.append((n, t, list(reversed(s)), raw))
    kv = {"general.architecture": "llama", "llama.block_count": L, "llama.embedding_length": D,
          "llama.feed_forward_length": F, "llama.attention.head_count": H, "llama.attention.head_count_kv": H,
          "llama.context_length": 256, "llama.rope.freq_base": 10000.0,
          "llama.attention.layer_norm_rms_epsilon": 1e-5}
    p = path(name)
    G.write_gguf(p, kv, recs)
    return p


def main():
    test_progress()
    test_task_files()
    test_json_names()
    test_lora_values()
    test_target_modules()
    test_adapter_config_errors()
    test_minor()
    if not vtest.failures:
        shutil.rmtree(work, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
