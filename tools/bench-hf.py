#!/usr/bin/env python3
"""bench-hf: the Hugging Face transformers baseline for `varent bench` and `varent logits`,
on the same model directory (config.json + *.safetensors, e.g. one written by
tools/gen_random_checkpoint.py). HF's own Llama/Qwen2/Qwen3 code, eager attention, greedy.

  bench-hf.py -m DIR [-n 256] [--prompt-len 512] [--runs 3] [--warmup 1] [--json]
              [--device auto|cpu|cuda[:N]] [--dtype auto|bf16|f32] [--method generate|loop]
  bench-hf.py -m DIR [-m DIR2 ...] --logits 1,2,3[;4,5,6 ...] [--greedy N] [--device cpu] [--dtype f32]

Bench mode prints prefill and decode tok/s like `varent bench` (the same pseudo-random
prompt ids, medians over --runs after --warmup runs). --logits prints, as JSON, the
last-position logits of each ';'-separated id list (and with --greedy N the next N greedy
tokens and, per step, the gap between the top two logits), so a test can compare
`varent logits` with HF on the same checkpoint (tests/py/test_hf_compare.py); several
-m directories share one torch start-up.

Defaults: bf16 on CUDA when torch sees a GPU, else f32 on the CPU. Exit status: 0 ok,
1 bad arguments or a failed run, 2 torch or transformers cannot be imported.
"""
import argparse
import inspect
import json
import os
import statistics
import sys
import time


class Usage(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2, which here means "torch missing"
        raise Usage(message)


def parse_args(argv):
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, action="append",
                    help="model directory (config.json + safetensors); --logits takes several")
    ap.add_argument("-n", type=int, default=256, help="decode steps (default 256)")
    ap.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs; medians are reported (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bf16", "f32"),
                    help="compute dtype (auto: bf16 on cuda, f32 on cpu)")
    ap.add_argument("--attn", default="eager", help="attn_implementation (default eager)")
    ap.add_argument("--method", default="generate", choices=("generate", "loop"),
                    help="decode timing: model.generate (default) or a manual past_key_values loop")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--logits", metavar="IDS", help="print last-position logits of IDS (1,2,3;4,5) as JSON")
    ap.add_argument("--greedy", type=int, default=0, help="with --logits: also N greedy tokens per list")
    a = ap.parse_args(argv)
    for name, v, lo in (("-n", a.n, 1), ("--prompt-len", a.prompt_len, 1), ("--runs", a.runs, 1),
                        ("--warmup", a.warmup, 0), ("--greedy", a.greedy, 0)):
        if v < lo:
            raise Usage(f"{name} {v}: must be >= {lo}")
    if a.greedy and not a.logits:
        raise Usage("--greedy needs --logits")
    if len(a.model) > 1 and not a.logits:
        raise Usage("bench mode takes one -m DIR")
    if not (a.device in ("auto", "cpu", "cuda") or (a.device.startswith("cuda:") and a.device[5:].isdigit())):
        raise Usage(f"--device {a.device}: use auto, cpu, cuda or cuda:N")
    return a


def read_config(model_dir):
    """config.json, checked before torch is imported, so bad paths fail fast and clearly."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isdir(model_dir):
        raise Usage(f"-m {model_dir}: not a directory")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        raise Usage(f"{path}: cannot read: {e.strerror}")
    except ValueError as e:
        raise Usage(f"{path}: not valid JSON: {e}")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("vocab_size"), int):
        raise Usage(f"{path}: no integer vocab_size")
    return cfg


def parse_ids(text, vocab):
    """'1,2,3;4,5' -> [[1,2,3],[4,5]], every id in [0, vocab)."""
    lists = []
    for part in text.split(";"):
        try:
            ids = [int(t) for t in part.split(",")]
        except ValueError:
            raise Usage(f"--logits {text!r}: expected comma-separated integers, lists separated by ';'")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise Usage(f"--logits: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        lists.append(ids)
    return lists


def import_hf():
    """(torch, transformers), or exit 2 with what is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only: never wait on a network
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"bench-hf: needs torch and transformers ({e}); install them "
              f"(pip install torch transformers safetensors) or point VARENT_HF_PYTHON at a python that has them",
              file=sys.stderr)
        sys.exit(2)
    return torch, transformers


def _version(v):
    out = []
    for p in v.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def load_model(torch, transformers, model_dir, device, dtype, attn):
    """HF's model class for config.json's model_type, weights from the directory's
    safetensors (tied lm_head as HF ties it). Any tensor HF expected but did not find, or
    found but does not know, is an error: a silently re-initialised weight would make
    every comparison meaningless."""
    from transformers import AutoModelForCausalLM
    transformers.utils.logging.disable_progress_bar()
    kw = {"attn_implementation": attn, "output_loading_info": True}
    # transformers 4.56 renamed torch_dtype to dtype (older versions would take `dtype`
    # as a config attribute and ignore it).
    kw["dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"] = dtype
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, **kw)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]
    problems = [(what, sorted(info.get(key) or [])) for what, key in
                (("unexpected", "unexpected_keys"), ("mismatched", "mismatched_keys"))]
    problems.insert(0, ("missing", sorted(missing)))
    msg = "; ".join(f"{what}: {', '.join(map(str, ks[:5]))}{' ...' if len(ks) > 5 else ''}"
                    for what, ks in problems if ks)
    if msg:
        raise RuntimeError(f"transformers could not map the checkpoint onto {type(model).__name__} ({msg})")
    # Only the device: .to(dtype) would also round the f32 RoPE inv_freq buffers, which
    # from_pretrained(dtype=...) leaves in f32.
    model.to(device)
    if next(model.parameters()).dtype != dtype:
        model.to(dtype=dtype)
    model.eval()
    return model


def bench_prompt(n, vocab):
    """The prompt of `varent bench` (host/cli/bench.c): the same 64-bit LCG."""
    x, ids = 12345, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1) & (2 ** 64 - 1)
        ids.append((x >> 33) % vocab)
    return ids


class Timer:
    """Wall seconds of a block, with the device drained before and after."""

    def __init__(self, torch, device):
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def __call__(self, fn):
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out


def prefill(model, ids):
    """The prompt's forward with a cache; logits of the last position only where the model
    takes logits_to_keep (as generate asks for, and as varent computes)."""
    kw = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    return model(input_ids=ids, use_cache=True, **kw)


# Decode timing must leave the prefill out. --method generate times model.generate twice
# per run on the same prompt: max_new_tokens=1 is the prefill forward plus picking the
# first token, max_new_tokens=n+1 is that plus n one-token decode forwards (each with its
# argmax, cache update and stopping check), so decode = t(n+1) - t(1): HF's per-step
# overhead is included, its setup cost cancels. min_new_tokens keeps a random model's EOS
# from ending a run early. Prefill is one timed forward of the prompt with use_cache (no
# generate set-up in it), in both methods. --method loop times n one-token forwards with
# past_key_values by hand: the same work as `varent bench`.
def run_generate(torch, model, timer, prompt, n):
    ids = torch.tensor([prompt], device=model.device)
    mask = torch.ones_like(ids)
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0

    def gen(k):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=k, min_new_tokens=k, do_sample=False,
                             num_beams=1, use_cache=True, pad_token_id=pad)
        if out.shape[1] != len(prompt) + k:
            raise RuntimeError(f"generate returned {out.shape[1] - len(prompt)} new tokens, wanted {k}")
        return out

    tp, _ = timer(lambda: prefill(model, ids))
    t1, _ = timer(lambda: gen(1))
    tn, _ = timer(lambda: gen(n + 1))
    return tp, tn - t1


def run_loop(torch, model, timer, prompt, n):
    ids = torch.tensor([prompt], device=model.device)
    tp, out = timer(lambda: prefill(model, ids))

    def decode():
        o = out
        for _ in range(n):
            nxt = o.logits[:, -1].argmax(-1, keepdim=True)
            o = model(input_ids=nxt, past_key_values=o.past_key_values, use_cache=True)
        return o

    td, _ = timer(decode)
    return tp, td


def describe_device(torch, device):
    if device.type == "cuda":
        i = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{i} ({torch.cuda.get_device_name(i)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def cmd_bench(a, cfgs, torch, transformers, device, dtype, dname):
    path, cfg = a.model[0], cfgs[0]
    model = load_model(torch, transformers, path, device, dtype, a.attn)
    timer = Timer(torch, device)
    prompt = bench_prompt(a.prompt_len, cfg["vocab_size"])
    fn = run_generate if a.method == "generate" else run_loop
    pf, dc = [], []
    with torch.inference_mode():
        for r in range(a.warmup + a.runs):
            p, d = fn(torch, model, timer, prompt, a.n)
            if r >= a.warmup:
                pf.append(p)
                dc.append(d)
    p, d = statistics.median(pf), statistics.median(dc)
    if d <= 0:
        raise RuntimeError(f"decode time {d:.6f} s is not positive: raise -n so it stands above timing noise")
    res = {"model": path, "arch": cfg.get("model_type"), "class": type(model).__name__,
           "params": sum(x.numel() for x in model.parameters()), "device": describe_device(torch, device),
           "dtype": dname, "attn": a.attn, "method": a.method, "torch": torch.__version__,
           "transformers": transformers.__version__, "prompt_len": a.prompt_len, "n": a.n, "runs": a.runs,
           "prefill_s": pf, "decode_s": dc, "prefill_tok_s": a.prompt_len / p, "decode_tok_s": a.n / d,
           "decode_ms_per_token": 1e3 * d / a.n}
    if a.json:
        print(json.dumps(res))
        return
    print(f"model       {path} ({res['arch']}, {res['class']}, {res['params'] / 1e6:.1f} M params)")
    print(f"device      {res['device']}, {dname}, attention {a.attn}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"prefill     {a.prompt_len} tokens: {res['prefill_tok_s']:.1f} tok/s (median of {a.runs})")
    print(f"decode      {a.n} tokens: {res['decode_tok_s']:.1f} tok/s, {res['decode_ms_per_token']:.3f} ms/token "
          f"(median of {a.runs}, {a.method})")


def cmd_logits(a, cfgs, torch, transformers, device, dtype, dname):
    results = []
    for path, cfg in zip(a.model, cfgs):
        try:
            model = load_model(torch, transformers, path, device, dtype, a.attn)
            with torch.inference_mode():
                for ids in parse_ids(a.logits, cfg["vocab_size"]):
                    results.append(dict(model=path, **logits_of(torch, model, device, ids, a.greedy)))
        except Exception as e:
            e.model_dir = path  # for main's message
            raise
        del model
    print(json.dumps({"models": a.model, "device": describe_device(torch, device), "dtype": dname, "attn": a.attn,
                      "torch": torch.__version__, "transformers": transformers.__version__, "results": results}))


def logits_of(torch, model, device, ids, greedy):
    out = model(input_ids=torch.tensor([ids], device=device), use_cache=bool(greedy))
    logits = out.logits[0, -1].float()
    r = {"ids": ids, "logits": logits.cpu().tolist(), "argmax": int(logits.argmax())}
    if greedy:  # greedy continuation; gap = top-1 minus top-2 logit at each step
        toks, gaps = [], []
        for step in range(greedy):
            lg = out.logits[0, -1].float()
            top = torch.topk(lg, 2).values
            toks.append(int(lg.argmax()))
            gaps.append(float(top[0] - top[1]))
            if step + 1 < greedy:
                nxt = torch.tensor([[toks[-1]]], device=device)
                out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        r["greedy"], r["gaps"] = toks, gaps
    return r


def main(argv=None):
    try:
        a = parse_args(argv)
        cfgs = [read_config(m) for m in a.model]
        for cfg in cfgs if a.logits else []:
            parse_ids(a.logits, cfg["vocab_size"])
    except Usage as e:
        print(f"bench-hf: {e}", file=sys.stderr)
        return 1
    torch, transformers = import_hf()
    dev = a.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        print(f"bench-hf: --device {dev}: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 1
    device = torch.device(dev)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        print(f"bench-hf: --device {dev}: only {torch.cuda.device_count()} CUDA device(s)", file=sys.stderr)
        return 1
    dname = a.dtype if a.dtype != "auto" else ("bf16" if device.type == "cuda" else "f32")
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dname]
    try:
        (cmd_logits if a.logits else cmd_bench)(a, cfgs, torch, transformers, device, dtype, dname)
    except Exception as e:  # noqa: BLE001 -- one clear line, not a traceback, for the shell scripts
        where = getattr(e, "model_dir", ", ".join(a.model))
        print(f"bench-hf: {where}: {type(e).__name__}: {e}", file=sys.stderr)
        if os.environ.get("BENCH_HF_TRACEBACK"):
            raise
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
