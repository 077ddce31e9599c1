"""Prompt scoring and logit_bias (issue 24 item 6), against the numpy reference
(tests/reference/ref_model.py) and Python softmaxes of its logits:

  - /v1/completions with echo and logprobs: a logprob for every prompt token (null for
    the first) and every completion token, each equal to log_softmax of the reference's
    logits at the position before it, with the same top alternatives; echo with
    max_tokens 0 scores the prompt alone; streaming sends the prompt first; n > 1 choices
    each echo it; text_offset points into the echoed text;
  - `varent ppl --per-token FILE.jsonl`: one record per token, logprobs equal the
    reference's (one window, and strided windows where each token's context is its
    window's), texts join to the decoded text;
  - logit_bias (server) and -l/--logit-bias (CLI): greedy output follows the argmax of
    the reference logits plus the bias, step by step; under sampling, a bias that leaves
    two tokens draws them in the proportion a Python softmax of their reference logits
    gives; the metrics and logprobs stay those of the raw logits;
  - on the emulated CUDA device (build/emu/varent), greedy -l output follows the reference too;
  - bad input: a logit_bias that is not an object of token ids to numbers in
    [-100, 100], an id outside the vocabulary, a malformed -l, an unknown request
    field (a 400 naming it), a no-op OpenAI field at a value that would need an effect;
    the documented no-op fields are accepted.
"""
import json
import math
import os
import shutil

import numpy as np

import servertest
import vtest
from vtest import check, expect_fail, stories_dir, tmpdir, varent
import gen_random_checkpoint as gen
import ref_model

PROMPT = "Once upon a time, there was a little girl"


def log_softmax(x):
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def close(a, b, tol=1e-4):
    return a is not None and abs(a - b) <= tol * max(1.0, abs(b))


def ids_of(model_dir, text):
    r = varent("tokenize", "-m", model_dir, text)
    assert r.returncode == 0, r.stderr
    return [1] + json.loads(r.stdout)  # both tokenizers here add BOS = 1


def check_logprobs(name, model, ids, lp, k):
    """lp: the completions logprobs object covering ids (prompt + generated)."""
    logits = ref_model.forward(model, ids)
    bad = []
    if len(lp["token_logprobs"]) != len(ids):
        bad.append(f"{len(lp['token_logprobs'])} entries for {len(ids)} tokens")
    if lp["token_logprobs"][0] is not None or lp["top_logprobs"][0] is not None:
        bad.append("the first token has a logprob")
    for i in range(1, min(len(ids), len(lp["token_logprobs"]))):
        row = log_softmax(logits[i - 1])
        if not close(lp["token_logprobs"][i], row[ids[i]]):
            bad.append(f"token {i}: {lp['token_logprobs'][i]} vs {row[ids[i]]}")
        # keyed by token text: ids that read alike repeat a key (random models, ids past the
        # tokenizer's vocabulary), so the pairs are compared as parsed (post_pairs)
        want = sorted(row, reverse=True)[:k]
        got = sorted((v for _, v in lp["top_logprobs"][i].pairs), reverse=True)
        if len(got) != len(want) or not all(close(a, b) for a, b in zip(got, want)):
            bad.append(f"token {i}: top {got} vs {want}")
    return check(not bad, name, "; ".join(bad[:4]))


class Pairs(dict):
    """A JSON object that also keeps its pairs in order, repeated keys included."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.pairs = pairs


def post_pairs(srv, path, body):
    st, _, data = srv.request("POST", path, body)
    return st, json.loads(data, object_pairs_hook=Pairs)


def test_echo(srv, model_dir, model, tag):
    ids = ids_of(model_dir, PROMPT)
    st, r = post_pairs(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "echo": True, "logprobs": 3,
                                         "temperature": 0, "metrics": False})
    if not check(st == 200, f"{tag}_echo_status", str(r)[:300]):
        return
    c = r["choices"][0]
    lp = c["logprobs"]
    gen_ids = ids_of(model_dir, PROMPT)  # the prompt, then the generated tokens' ids below
    n_gen = r["usage"]["completion_tokens"]
    check(n_gen == 5 and len(lp["tokens"]) == len(ids) + n_gen, f"{tag}_echo_covers_prompt_and_completion",
          f"{len(lp['tokens'])} entries, prompt {len(ids)}, generated {n_gen}")
    # The generated ids: greedy, so the reference's argmax chain.
    full = list(gen_ids)
    for _ in range(n_gen):
        full.append(int(ref_model.forward(model, full)[-1].argmax()))
    check_logprobs(f"{tag}_echo_logprobs_equal_reference", model, full, lp, 3)
    check(c["text"].startswith(PROMPT), f"{tag}_echo_text_starts_with_prompt", repr(c["text"][:80]))
    offs = lp["text_offset"]
    check(offs == sorted(offs) and offs[-1] <= len(c["text"].encode()), f"{tag}_echo_text_offsets", str(offs))

    st, r0 = post_pairs(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 2})
    ok = st == 200 and r0["usage"]["completion_tokens"] == 0 and r0["choices"][0]["text"] == PROMPT
    if ok:
        check_logprobs(f"{tag}_echo_max_tokens_0_scores_prompt", model, ids, r0["choices"][0]["logprobs"], 2)
    else:
        check(False, f"{tag}_echo_max_tokens_0_scores_prompt", str(r0)[:300])

    st, r2 = srv.post("/v1/completions", {"prompt": ids, "max_tokens": 2, "echo": True, "logprobs": 1, "n": 2,
                                          "seed": 4})
    ok = st == 200 and all(ch["logprobs"]["token_logprobs"][:len(ids)] ==
                           r2["choices"][0]["logprobs"]["token_logprobs"][:len(ids)] for ch in r2["choices"])
    check(ok and len(r2["choices"]) == 2, f"{tag}_echo_n2_token_ids_prompt", str(r2)[:300])

    st, ctype, ev, done = srv.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "echo": True,
                                                         "logprobs": 1, "stream": True, "temperature": 0})
    first = ev[0]["choices"][0] if ev else {}
    text = "".join(e["choices"][0]["text"] for e in ev if e["choices"])
    ok = st == 200 and done and first.get("text") == PROMPT and \
        len(first["logprobs"]["tokens"]) == len(ids) and text == c["text"][:len(text)] and text.startswith(PROMPT)
    check(ok, f"{tag}_echo_stream_sends_prompt_first", f"{st} {first} {text!r}")


def greedy_with_bias(model, ids, bias, n):
    out = list(ids)
    for _ in range(n):
        lg = ref_model.forward(model, out)[-1].copy()
        for t, b in bias.items():
            lg[t] += b
        out.append(int(lg.argmax()))
    return out[len(ids):]


def pick_bias(model, ids):
    """A bias that makes the runner-up win the first greedy step."""
    lg = ref_model.forward(model, ids)[-1]
    order = np.argsort(-lg)
    return {int(order[1]): float(lg[order[0]] - lg[order[1]] + 0.5)}


def test_bias_server(srv, model_dir, model, tag):
    ids = ids_of(model_dir, PROMPT)
    bias = pick_bias(model, ids)
    want = greedy_with_bias(model, ids, bias, 6)
    plain = greedy_with_bias(model, ids, {}, 6)
    st, r = srv.post("/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                                         "logit_bias": {str(k): v for k, v in bias.items()}, "metrics": True})
    got = [m["token"] for m in r["choices"][0]["metrics"]] if st == 200 else None
    check(got == want and want != plain, f"{tag}_logit_bias_greedy_follows_reference",
          f"got {got}, want {want} (unbiased {plain})")
    if st != 200:
        return
    # the metrics and logprobs are those of the raw logits
    logits = ref_model.forward(model, ids + want)
    bad = []
    for i, m in enumerate(r["choices"][0]["metrics"]):
        row = log_softmax(logits[len(ids) - 1 + i])
        p = np.exp(row)
        h = float(-(p * row).sum() / math.log(2))
        if not close(m["entropy"], h, 1e-3):
            bad.append(f"step {i}: entropy {m['entropy']} vs raw {h}")
        if not close(r["choices"][0]["logprobs"]["token_logprobs"][i], row[want[i]]):
            bad.append(f"step {i}: logprob vs raw {row[want[i]]}")
    check(not bad, f"{tag}_logit_bias_metrics_read_raw_logits", "; ".join(bad[:3]))


def test_bias_sampling(srv, model_dir, model, tag):
    """Every token but two banned with -100: the draws follow the softmax of those two."""
    ids = ids_of(model_dir, PROMPT)
    lg = ref_model.forward(model, ids)[-1]
    order = np.argsort(-lg)
    a, b = int(order[1]), int(order[2])
    vocab = len(lg)
    bias = {str(t): -100 for t in range(vocab) if t not in (a, b)}
    if len(bias) > 2048:
        return
    pa = 1 / (1 + math.exp(lg[b] - lg[a]))
    counts, total = {a: 0, b: 0}, 0
    for seed in range(0, 400, 16):
        st, r = srv.post("/v1/completions", {"prompt": ids, "max_tokens": 1, "n": 16, "seed": seed,
                                             "temperature": 1, "logit_bias": bias, "metrics": True})
        if st != 200:
            check(False, f"{tag}_logit_bias_sampling", str(r)[:300])
            return
        for c in r["choices"]:
            t = c["metrics"][0]["token"]
            counts[t] = counts.get(t, 0) + 1
            total += 1
    frac = counts[a] / total
    sigma = math.sqrt(pa * (1 - pa) / total)
    check(counts[a] + counts[b] == total and abs(frac - pa) <= 4 * sigma + 1e-9,
          f"{tag}_logit_bias_sampling_follows_softmax",
          f"token {a}: {counts[a]}/{total} = {frac:.3f}, softmax {pa:.3f} (4 sigma {4 * sigma:.3f}); {counts}")


def error_of(srv, path, body):
    st, r = srv.post(path, body)
    e = r.get("error", {}) if isinstance(r, dict) else {}
    return st, e.get("param"), e.get("code"), e.get("message", "")


def test_errors(srv):
    C, CH = "/v1/completions", "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ("bias_array", C, {"prompt": "x", "logit_bias": [1, 2]}, "logit_bias", "invalid_type"),
        ("bias_string_value", C, {"prompt": "x", "logit_bias": {"5": "1"}}, "logit_bias", "invalid_type"),
        ("bias_key_not_id", C, {"prompt": "x", "logit_bias": {"hello": 1}}, "logit_bias", "invalid_value"),
        ("bias_key_negative", C, {"prompt": "x", "logit_bias": {"-3": 1}}, "logit_bias", "invalid_value"),
        ("bias_key_spaces", C, {"prompt": "x", "logit_bias": {" 3": 1}}, "logit_bias", "invalid_value"),
        ("bias_over_100", C, {"prompt": "x", "logit_bias": {"5": 100.5}}, "logit_bias", "invalid_value"),
        ("bias_under_minus_100", CH, {"messages": msgs, "logit_bias": {"5": -101}}, "logit_bias", "invalid_value"),
        ("bias_id_outside_vocab", C, {"prompt": "x", "logit_bias": {"100000": 1}}, "logit_bias", "invalid_value"),
        ("unknown_field", C, {"prompt": "x", "frobnicate": 1}, "frobnicate", "unknown_parameter"),
        ("unknown_field_null", C, {"prompt": "x", "typo_field": None}, "typo_field", "unknown_parameter"),
        ("echo_on_chat", CH, {"messages": msgs, "echo": True}, "echo", "unknown_parameter"),
        ("prompt_on_chat", CH, {"messages": msgs, "prompt": "x"}, "prompt", "unknown_parameter"),
        ("top_logprobs_on_completions", C, {"prompt": "x", "top_logprobs": 2}, "top_logprobs", "unknown_parameter"),
        ("presence_penalty_over_2", C, {"prompt": "x", "presence_penalty": 2.5}, "presence_penalty",
         "invalid_value"),
        ("frequency_penalty_string", CH, {"messages": msgs, "frequency_penalty": "1"}, "frequency_penalty",
         "invalid_type"),
        ("repeat_penalty_zero", C, {"prompt": "x", "repeat_penalty": 0}, "repeat_penalty", "invalid_value"),
        ("repeat_last_n_under_minus_1", C, {"prompt": "x", "repeat_last_n": -2}, "repeat_last_n", "invalid_value"),
        ("best_of_2", C, {"prompt": "x", "best_of": 2}, "best_of", "unsupported_parameter"),
        ("suffix_text", C, {"prompt": "x", "suffix": "end"}, "suffix", "unsupported_parameter"),
        ("tools_given", CH, {"messages": msgs, "tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
        ("response_format_json", CH, {"messages": msgs, "response_format": {"type": "json_object"}},
         "response_format", "unsupported_parameter"),
        ("max_tokens_0_without_echo", C, {"prompt": "x", "max_tokens": 0}, "max_tokens", "invalid_value"),
        ("echo_not_bool", C, {"prompt": "x", "echo": 1}, "echo", "invalid_type"),
    ]
    for name, path, body, param, code in cases:
        st, p, c, msg = error_of(srv, path, body)
        check(st == 400 and p == param and c == code and param in msg, f"error_{name}",
              f"status {st} param {p} code {c}: {msg}")
    ok_cases = [
        ("noop_user_store_metadata", C, {"prompt": "x", "max_tokens": 1, "user": "u1", "store": False,
                                         "metadata": {"a": "b"}, "service_tier": "auto"}),
        ("noop_penalties_zero", C, {"prompt": "x", "max_tokens": 1, "frequency_penalty": 0, "presence_penalty": 0,
                                    "best_of": 1, "suffix": None}),
        ("noop_chat_fields", CH, {"messages": msgs, "max_tokens": 1, "tools": [], "tool_choice": "none",
                                  "response_format": {"type": "text"}, "user": "u"}),
        ("bias_empty_object", C, {"prompt": "x", "max_tokens": 1, "logit_bias": {}}),
        ("bias_null", C, {"prompt": "x", "max_tokens": 1, "logit_bias": None}),
    ]
    for name, path, body in ok_cases:
        st, r = srv.post(path, body)
        check(st == 200, f"accepted_{name}", str(r)[:300])


def ids_only(model_dir, tmp):
    """The model without its tokenizer: `varent run` then prints token ids."""
    d = os.path.join(tmp, os.path.basename(model_dir) + "-ids")
    os.makedirs(d, exist_ok=True)
    for fn in ("config.json", "model.safetensors"):
        if not os.path.exists(os.path.join(d, fn)):
            os.symlink(os.path.abspath(os.path.join(model_dir, fn)), os.path.join(d, fn))
    return d


def test_cli_bias(tok_dir, model, tag, tmp):
    ids = ids_of(tok_dir, PROMPT)
    model_dir = ids_only(tok_dir, tmp)
    bias = pick_bias(model, ids)
    (t, b), = bias.items()
    want = greedy_with_bias(model, ids, bias, 6)
    r = varent("run", "-m", model_dir, "--ids", ",".join(map(str, ids)), "-n", 6, "--temp", 0, "-l", f"{t}+{b}",
               "-l", f"{t}-0", timeout=60)
    got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else r.stderr[-300:]
    check(got == want, f"{tag}_cli_logit_bias_greedy_follows_reference", f"{got} vs {want}")
    # -inf bans: the banned token never appears
    top = want[0]
    r2 = varent("run", "-m", model_dir, "--ids", ",".join(map(str, ids)), "-n", 6, "--temp", 0, "-l", f"{t}-inf",
                "--logit-bias", f"{top}-inf", timeout=60)
    want2 = greedy_with_bias(model, ids, {t: -1e30, top: -1e30}, 6)
    got2 = [int(x) for x in r2.stdout.split()] if r2.returncode == 0 else r2.stderr[-300:]
    check(got2 == want2 and t not in want2 and top not in want2, f"{tag}_cli_logit_bias_inf_bans",
          f"{got2} vs {want2}")


EMU = os.path.join(os.environ.get("EMU_BUILD", os.path.join(vtest.ROOT, "build", "emu")), "varent")


def test_emu_bias(tok_dir, model, tag, tmp):
    """--device cuda on the emulated GPU (docs/cuda.md): a biased step draws on the host
    from the device's logits; greedy output still follows the reference plus the bias."""
    if not os.path.exists(EMU):
        return vtest.skip(f"{tag}_emu_logit_bias", f"{EMU} not built (make emu)")
    import subprocess
    ids = ids_of(tok_dir, PROMPT)
    bias = pick_bias(model, ids)
    (t, b), = bias.items()
    want = greedy_with_bias(model, ids, bias, 6)
    r = subprocess.run([EMU, "run", "-m", ids_only(tok_dir, tmp), "--device", "cuda", "--ids", ",".join(map(str, ids)),
                        "-n", "6", "--temp", "0", "-l", f"{t}+{b}"], capture_output=True, text=True, timeout=600)
    got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else r.stderr[-300:]
    check(got == want, f"{tag}_emu_logit_bias_greedy_follows_reference", f"{got} vs {want}")


def test_cli_errors(model_dir):
    base = ("run", "-m", model_dir, "-p", "x", "-n", 2)
    for name, val, needle in (("no_sign", "15043", "TOKEN_ID+BIAS"), ("not_number", "5+abc", "not a number"),
                              ("double_sign", "5+-1", "not a number"), ("too_big", "5+101", "-100..100"),
                              ("plus_inf", "5+inf", "not a number"), ("nan", "5+nan", "not a number"),
                              ("negative_id", "-5+1", "TOKEN_ID+BIAS")):
        expect_fail(f"cli_logit_bias_{name}", varent(*base, "-l", val), "--logit-bias", needle, rc=2)  # usage
    expect_fail("cli_logit_bias_outside_vocab", varent(*base, "-l", "100000+1"), "token id 100000", "vocabulary")
    expect_fail("cli_logit_bias_chat_bad", varent("chat", "-m", model_dir, "--logit-bias", "x"), "--logit-bias", rc=2)
    expect_fail("cli_logit_bias_compare_bad", varent("compare", "-m", model_dir, "--prompts", "/dev/null",
                                                     "-l", "1+"), "--logit-bias", rc=2)


def test_ppl_per_token(model_dir, model, tag, tmp):
    text_path = os.path.join(tmp, "text.txt")
    text = PROMPT + ". She liked to play with her ball."
    with open(text_path, "w") as f:
        f.write(text)
    ids = ids_of(model_dir, text)
    for ctx, stride in ((None, None), (12, 5)):
        out = os.path.join(tmp, f"{tag}-pt-{ctx}.jsonl")
        args = ["ppl", "-m", model_dir, "-f", text_path, "-q", "--per-token", out, "--json"]
        if ctx:
            args += ["--ctx", ctx, "--stride", stride]
        r = varent(*args, timeout=120)
        name = f"{tag}_ppl_per_token" + (f"_ctx{ctx}_stride{stride}" if ctx else "")
        if not check(r.returncode == 0, name + "_runs", r.stderr[-300:]):
            continue
        recs = [json.loads(line) for line in open(out)]
        bad = []
        if [x["id"] for x in recs] != ids or [x["pos"] for x in recs] != list(range(len(ids))):
            bad.append("ids/pos differ from the tokenized text")
        if recs[0]["logprob"] is not None:
            bad.append("token 0 has a logprob")
        # token i's context: its window's tokens before it (perplexity.h)
        c = ctx or len(ids)
        s = stride or 1
        end, b = 1, 0
        while end < len(ids):
            e = min(b + c, len(ids))
            lg = ref_model.forward(model, ids[b:e])
            for i in range(end, e):
                want = log_softmax(lg[i - b - 1])[ids[i]]
                if not close(recs[i]["logprob"], want):
                    bad.append(f"token {i}: {recs[i]['logprob']} vs {want}")
            end, b = e, b + s
        nll = -sum(x["logprob"] for x in recs[1:]) / (len(recs) - 1)
        if not close(json.loads(r.stdout)["nll_mean"], nll, 1e-9):
            bad.append("mean of the per-token logprobs is not the reported NLL")
        if "".join(x["text"] for x in recs) != text:
            bad.append(f"texts join to {''.join(x['text'] for x in recs)!r}, not the file's {text!r}")
        check(not bad, name, "; ".join(bad[:4]))
    # a directory as the output is an error, and nothing is written
    r = varent("ppl", "-m", model_dir, "-f", text_path, "-q", "--per-token", tmp)
    expect_fail(f"{tag}_ppl_per_token_to_directory", r, "--per-token")


def main():
    tmp = tmpdir("scoring")
    stories = stories_dir("f32")
    rnd = os.path.join(tmp, "rnd")
    gen.generate("llama3-tiny", rnd, seed=5, dtype="f32")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(stories, fn), rnd)
    for tag, d in (("stories", stories), ("random", rnd)):
        model = ref_model.Model(d)
        srv = servertest.Server(d, "-t", 1, "--max-tokens-limit", 64, name="scoring")
        try:
            test_echo(srv, d, model, tag)
            test_bias_server(srv, d, model, tag)
            if tag == "stories":
                test_bias_sampling(srv, d, model, tag)
                test_errors(srv)
        finally:
            srv.stop()
        test_cli_bias(d, model, tag, tmp)
        if tag == "stories":
            test_emu_bias(d, model, tag, tmp)
        test_ppl_per_token(d, model, tag, tmp)
    test_cli_errors(stories)
    return 1 if vtest.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
