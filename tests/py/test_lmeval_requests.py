"""lm-evaluation-harness's requests to `varent serve` (issue 33), as its `local-completions`
model sends them (lm_eval/models/openai_completions.py: LocalCompletionsAPI._create_payload
and parse_logprobs), checked against the numpy reference (tests/reference/ref_model.py).

A loglikelihood request is {"prompt": [[ids], ...], "temperature": 0, "max_tokens": 1,
"logprobs": 1, "echo": true, "seed": ...}: one token-id list per (context + continuation)
of the batch. lm-eval sorts the choices by index and reads token_logprobs[ctxlen:-1] as the
continuation's logprobs: every entry but the last, the generated token. So the arrays must
hold the prompt's tokens and then the generated one even when that token is EOS (OpenAI and
vLLM list it, with empty text); otherwise the slice loses the continuation's last token.

The model is a random checkpoint (tools/gen_random_checkpoint.py, untied head) whose EOS row
of lm_head copies a frequent winner's, so the reference's greedy next token is EOS after
some prefixes. Cases: continuations of one and several tokens, one-token contexts, some
followed by a greedy EOS; each alone (batch_size 1) and four in one request (batch_size 4);
one streamed; and a generate_until request with a batch and lm-eval's whole list of stop
strings.
"""
import json
import math
import os
import shutil

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import ref_model
import servertest

EOS = 2
SEED = 1234  # lm-eval's default seed, sent in every payload


def log_softmax(x):
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def eos_model(d, stories, seqs):
    """The random model, its EOS row set to the most frequent greedy winner's (times 1.05)."""
    gen.generate("llama-mha-untied", d, seed=5, dtype="f32")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(stories, fn), d)
    model = ref_model.Model(d)
    wins = np.concatenate([ref_model.forward(model, seq).argmax(-1) for seq in seqs])
    k = int(np.bincount(wins).argmax())
    path = os.path.join(d, "model.safetensors")
    header, data = vtest.read_st(path)
    lo, hi = header["lm_head.weight"]["data_offsets"]
    head = np.frombuffer(data[lo:hi], dtype=np.float32).reshape(header["lm_head.weight"]["shape"]).copy()
    head[EOS] = head[k] * 1.05
    vtest.write_st(path, header, data[:lo] + head.tobytes() + data[hi:])
    return ref_model.Model(d)


def margin(row):
    top = np.sort(row)[-2:]
    return top[1] - top[0]


def cases(model, seqs):
    """Four (context, continuation, EOS next) cases after which the reference's greedy token
    is EOS, and four after which it is not (each by a clear margin): continuations of 1 and
    3 tokens; contexts of the whole prefix, a window, or one token (lm-eval's empty context)."""
    found = {True: [], False: []}
    for want in (True, False):
        for seq in seqs:
            lg = ref_model.forward(model, seq)
            for end in [i for i in range(4, len(seq)) if (lg[i].argmax() == EOS) == want]:
                for v in range(3 if len(found[want]) < 4 else 0):  # the first variant whose prefix still gives the wanted next token
                    n = len(found[want]) + v
                    cont = 1 if n % 2 == 0 else 3
                    start = (0, max(0, end - 12), end - cont)[n % 3]
                    ctx, cn = seq[start:end + 1 - cont], seq[end + 1 - cont:end + 1]
                    nxt = ref_model.forward(model, ctx + cn)[-1]
                    if (nxt.argmax() == EOS) == want and margin(nxt) > 0.05:
                        found[want].append((ctx, cn, want))
                        break
    return found[True] + found[False]


def reference(model, ctx, cont):
    """(loglikelihood, is_greedy, greedy next token) of cont after ctx."""
    full = ctx + cont
    lg = ref_model.forward(model, full)
    ll = sum(float(log_softmax(lg[i - 1])[full[i]]) for i in range(len(ctx), len(full)))
    greedy = all(int(lg[i - 1].argmax()) == full[i] for i in range(len(ctx), len(full)))
    return ll, greedy, int(lg[-1].argmax())


def loglikelihood_payload(inputs):
    return {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "prompt": inputs, "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": SEED, "echo": True}


def parse_logprobs(out, ctxlens):
    """lm-eval's parse_logprobs: the continuation is token_logprobs[ctxlen:-1]."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(tok == max(top.values()) for tok, top in zip(lps, tops))
        res.append((sum(lps), greedy))
    return res


def check_batch(name, srv, model, batch):
    inputs = [ctx + cont for ctx, cont, _ in batch]
    st, out = srv.post("/v1/completions", loglikelihood_payload(inputs))
    if not check(st == 200 and len(out.get("choices", [])) == len(batch), name + "_answers", str(out)[:300]):
        return None
    bad = []
    for (ctx, cont, eos), (ll, greedy), c in zip(batch, parse_logprobs(out, [len(x[0]) for x in batch]),
                                                  sorted(out["choices"], key=lambda c: c["index"])):
        want_ll, want_greedy, nxt = reference(model, ctx, cont)
        lp = c["logprobs"]
        if len(lp["token_logprobs"]) != len(ctx) + len(cont) + 1:
            bad.append(f"{len(lp['token_logprobs'])} entries for {len(ctx) + len(cont)} prompt tokens + 1")
        if abs(ll - want_ll) > 1e-4 * max(1.0, abs(want_ll)):
            bad.append(f"loglikelihood {ll} vs reference {want_ll} (EOS next: {eos})")
        if greedy != want_greedy:
            bad.append(f"is_greedy {greedy} vs reference {want_greedy}")
        if (nxt == EOS) != eos:
            bad.append("the case's next token is not what it was picked for")
        if eos and not (c["finish_reason"] == "stop" and lp["tokens"][-1] == "" and lp["token_logprobs"][-1] is not None
                        and abs(lp["token_logprobs"][-1] - float(log_softmax(ref_model.forward(model, ctx + cont)[-1])[EOS])) < 1e-4):
            bad.append(f"the EOS entry: finish {c['finish_reason']}, token {lp['tokens'][-1]!r}, "
                       f"logprob {lp['token_logprobs'][-1]}")
    u = out["usage"]
    if u["completion_tokens"] != len(batch) or u["prompt_tokens"] != sum(len(x) for x in inputs):
        bad.append(f"usage {u}: every choice generated one token (EOS counts)")
    check(not bad, name + "_slices_equal_reference", "; ".join(bad[:4]))
    return [(ll, greedy) for ll, greedy in parse_logprobs(out, [len(x[0]) for x in batch])]


def main():
    tmp = vtest.tmpdir("lmeval-requests")
    model_dir = os.path.join(tmp, "eos-model")
    rng = np.random.default_rng(0)
    seqs = [[1] + [int(x) for x in rng.integers(3, 500, size=200)] for _ in range(3)]
    model = eos_model(model_dir, vtest.stories_dir("f32"), seqs)
    batch = cases(model, seqs)
    if not check(len(batch) == 8 and sum(eos for _, _, eos in batch) == 4, "cases_found",
                 f"{len(batch)} cases, {sum(eos for _, _, eos in batch)} with EOS next"):
        return 1
    srv = servertest.Server(model_dir, "-t", 1, name="lmeval-requests")
    try:
        alone = []
        for k, case in enumerate(batch):  # batch_size 1: [[ids]]
            r = check_batch(f"batch_size_1_case{k}{'_eos_next' if case[2] else ''}", srv, model, [case])
            alone += r or [None]
        together = []
        for k in range(0, len(batch), 4):  # batch_size 4, each batch with EOS cases and others
            four = [batch[k // 4], batch[k // 4 + 2], batch[4 + k // 4], batch[6 + k // 4]]
            got = check_batch(f"batch_size_4_batch{k // 4}", srv, model, four)
            if got:
                together += list(zip([k // 4, k // 4 + 2, 4 + k // 4, 6 + k // 4], got))
        check(len(together) == 8 and all(alone[i] is not None and abs(alone[i][0] - g[0]) < 1e-9 and alone[i][1] == g[1]
                                         for i, g in together), "batch_size_4_equals_batch_size_1",
              f"{together} vs {alone}")
        # streamed, the EOS entry comes with the last event: the same arrays as plain
        ctx, cont, _ = batch[0]
        body = dict(loglikelihood_payload([ctx + cont]), stream=True)
        st, _, ev, done = srv.stream("/v1/completions", body)
        _, plain = srv.post("/v1/completions", loglikelihood_payload([ctx + cont]))
        got = [x for e in ev for c in e["choices"] for x in (c["logprobs"] or {}).get("token_logprobs", [])]
        check(st == 200 and done and got == plain["choices"][0]["logprobs"]["token_logprobs"] and
              len(got) == len(ctx) + len(cont) + 1, "stream_lists_the_eos_entry", f"{got[-3:]} vs plain")
        # generate_until: a batch, greedy, and the task's whole list of stop strings
        until = ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "</s>", "Question:"]
        body = {"model": "local", "prompt": [batch[4][0], batch[0][0] + batch[0][1]], "max_tokens": 8, "temperature": 0,
                "stop": until, "seed": SEED}
        st, out = srv.post("/v1/completions", body)
        ok = st == 200 and [c["index"] for c in out["choices"]] == [0, 1] and \
            out["choices"][1]["finish_reason"] == "stop" and out["choices"][1]["text"] == ""
        check(ok, "generate_until_batch_with_7_stop_strings", str(out)[:300])
    finally:
        srv.stop()
    vtest.done()


if __name__ == "__main__":
    raise SystemExit(main())
