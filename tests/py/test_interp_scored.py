"""The captures (--dump-acts, --dump-attn, --attn-layers, --logit-lens; docs/research.md)
in ppl and eval, against the numpy reference (tests/reference/ref_model.py forward_hooked)
on stories260K. ppl: the windows (and llama.cpp's chunks) are recomputed here from the
protocol's definition, every captured row from the ids its window fed, every scored
token's record (and logprob) from the context the protocol gives it. eval: a file per
item, repeat and arm, its rows recomputed from the prompt and the trial's output ids, and
the --metrics-out records from the context each token was drawn in. Bad combinations are
usage errors that write nothing."""
import json
import os
import re
import shutil
import threading

import numpy as np

import vtest
from vtest import check
import ref_model
from test_interp import read_tensors
from servertest import Server
from test_interp_cmds import POINTS, Ref, capture_args, check_acts, check_attn_file, check_records, gone

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with "
        "her dog. One day, she saw a big red ball.\n")


def logprob(model, ctx, tok):
    lg = ref_model.forward_hooked(model, list(ctx))[0][-1]
    return float(lg[tok] - lg.max() - np.log(np.exp(lg - lg.max()).sum()))


def strided(ids, ctx, stride):
    """[(fed ids, first text index, {scored text index: its context})] per window."""
    out, end, b, n = [], 1, 0, len(ids)
    while end < n:
        e = min(b + ctx, n)
        out.append((ids[b:e - 1], b, {i: ids[b:i] for i in range(end, e)}))
        end, b = e, b + stride
    return out


def chunks(ids, ctx, bos):
    out = []
    for c in range(len(ids) // ctx):
        ch = [bos] + ids[c * ctx + 1:(c + 1) * ctx]
        out.append((ch[:-1], c * ctx, {c * ctx + j: ch[:j] for j in range(ctx // 2 + 1, ctx)}))
    return out


def check_ppl(name, model, ref, tmp, args, windows_of):
    acts, attn, log, extra = capture_args(tmp, name)
    r = vtest.varent("ppl", "-m", model.dir, "-f", os.path.join(tmp, "text.txt"), "-q", "--per-token", log, *extra,
                     *args, timeout=300)
    plain = vtest.varent("ppl", "-m", model.dir, "-f", os.path.join(tmp, "text.txt"), "-q", *args)
    if not check(r.returncode == 0 and plain.returncode == 0, name + "_runs", r.stderr[-400:] + plain.stderr[-400:]):
        return
    # With attention or lens captures every position is its own forward; without, the
    # windows go in batches, whose attention and matrix products sum in another order.
    nums = [[float(x) for x in re.findall(r"[-+]?\d+\.\d+", out)] for out in (r.stdout, plain.stdout)]
    close = len(nums[0]) == len(nums[1]) > 0 and all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(*nums))
    check(close, name + "_same_ppl_as_without_captures", r.stdout + plain.stdout)
    recs = [json.loads(x) for x in open(log)]
    ids = [x["id"] for x in recs]
    windows = windows_of(ids)
    fed = [t for w in windows for t in w[0]]
    text_pos = [w[1] + j for w in windows for j in range(len(w[0]))]
    positions = [j for w in windows for j in range(len(w[0]))]
    t = read_tensors(acts)
    check([int(x) for x in t["ids"]] == fed and [int(x) for x in t["text_pos"]] == text_pos and
          [int(x) for x in t["positions"]] == positions, name + "_rows_are_the_windows_fed",
          f"{len(fed)} rows expected, {len(t['ids'])} written")
    got = check_acts(name, acts, ref, list(range(model.cfg.n_layers)))
    if not got:
        return
    pos, ctx = got
    check_attn_file(name, attn, ref, pos, ctx, positions)
    context = {i: c for w in windows for i, c in w[2].items()}
    scored = [x for x in recs if x["logprob"] is not None]
    check(sorted(x["pos"] for x in scored) == sorted(context) and
          all("logit_lens" not in x for x in recs if x["logprob"] is None), name + "_records_on_scored_tokens",
          f"{len(scored)} scored of {len(recs)}")
    check_records(name, scored, lambda x: context[x["pos"]], ref, model)
    worst = max(abs(x["logprob"] - logprob(model, context[x["pos"]], x["id"])) for x in scored)
    check(worst < 1e-4, name + "_logprobs_match_numpy", f"worst {worst:.3g}")


def test_ppl(model, ref, tmp):
    with open(os.path.join(tmp, "text.txt"), "w") as f:
        f.write(TEXT)
    check_ppl("ppl_strided", model, ref, tmp, ["--ctx", "16", "--stride", "6"], lambda ids: strided(ids, 16, 6))
    check_ppl("ppl_llamacpp", model, ref, tmp, ["--ctx", "16", "--protocol", "llamacpp"],
              lambda ids: chunks(ids, 16, 1))
    acts = os.path.join(tmp, "bad.st")
    for what, args, needle in (("lens_without_per_token", ["--logit-lens", "--dump-acts", acts], "--per-token"),
                               ("bad_layer", ["--attn-layers", "0,99", "--per-token", acts + ".jsonl",
                                              "--dump-acts", acts], "layer 99")):
        r = vtest.varent("ppl", "-m", model.dir, "-f", os.path.join(tmp, "text.txt"), "--ctx", "16", "-q", *args)
        vtest.expect_fail(f"ppl_bad_{what}", r, needle, rc=2 if what == "lens_without_per_token" else 1)
        check(gone(acts, acts + ".jsonl"), f"ppl_bad_{what}_nothing_written")


def test_eval(model, ref, tmp):
    acts, attn, log, extra = capture_args(tmp, "eval")
    trials = os.path.join(tmp, "trials.jsonl")
    r = vtest.varent("eval", "-m", model.dir, "--tasks", "add2,decimal-choice", "--items", "2", "--samplers",
                     "greedy,entropix:seed", "--repeats", "2", "--seed", "5", "-n", "4", "-q", "-o", trials,
                     "--metrics-out", log, *extra, timeout=300)
    if not check(r.returncode == 0, "eval_capture_runs", r.stderr[-400:]):
        return
    runs = [json.loads(x) for x in open(trials)]
    recs = [json.loads(x) for x in open(log)]
    layers = list(range(model.cfg.n_layers))
    gen = [x for x in runs if "choices" not in x]
    by_trial = {}
    for run in gen:
        key = (run["item"], run["repeat"], run["arm"])
        tag = f".i{run['item']}.r{run['repeat']}.{run['arm'].replace(':', '_')}.st"
        name = "eval_i{}_r{}_{}".format(*key).replace(":", "_")
        got = check_acts(name, acts.replace(".st", tag), ref, layers)
        if not got:
            continue
        pos, ctx = got
        ids, n_prompt = ctx[-1], run["prompt_tokens"]
        mine = [x for x in recs if (x["item"], x["repeat"], x["sampler"]) == key]
        check(pos == list(range(len(ids))) and ids[n_prompt:] == [x["token"] for x in mine] and
              len(mine) == run["tokens"], name + "_prompt_and_generated_ids", f"{len(pos)} rows, {len(mine)} records")
        check_attn_file(name, attn.replace(".st", tag), ref, pos, ctx, list(range(n_prompt - 1, len(ids))))
        by_trial[key] = ids
    check(len(by_trial) == 8 and len(recs) == sum(x["tokens"] for x in gen), "eval_a_file_per_trial",
          f"{len(by_trial)} trials, {len(recs)} records")
    check_records("eval", recs, lambda x: by_trial[(x["item"], x["repeat"], x["sampler"])][:x["pos"]], ref, model)
    for item in sorted({x["item"] for x in runs if "choices" in x}):
        run = next(x for x in runs if x["item"] == item)
        for c, k in enumerate(run["choice_tokens"]):
            name, tag = f"eval_i{item}_c{c}", f".i{item}.c{c}.st"
            got = check_acts(name, acts.replace(".st", tag), ref, layers)
            if got:
                pos, ctx = got
                check(pos == list(range(run["prompt_tokens"] + k - 1)), name + "_prompt_and_choice_rows", f"{pos}")
                check_attn_file(name, attn.replace(".st", tag), ref, pos, ctx, pos)
    bad = os.path.join(tmp, "bad.st")
    for what, args, needle in (("agents_arm", ["--samplers", "greedy,agents", "--dump-acts", bad], "agents arm"),
                               ("branch_arm", ["--samplers", "branch", "--dump-acts", bad], "--branch"),
                               ("lens_without_log", ["--logit-lens", "--dump-acts", bad], "--metrics-out")):
        r = vtest.varent("eval", "-m", model.dir, "--tasks", "add2", "--items", "1", "-q", *args)
        vtest.expect_fail(f"eval_bad_{what}", r, needle, rc=2)
        check(gone(bad, bad.replace(".st", ".i0.r0.greedy.st")), f"eval_bad_{what}_nothing_written")


def check_served(name, resp, prompt, dirs, ref, model):
    """One captured choice: its files in both directories, rows recomputed from the
    prompt and the tokens its metrics name, and the records in its metrics."""
    choice = resp["choices"][0]
    recs = choice.get("metrics", [])
    ids = prompt + [x["token"] for x in recs]
    want = choice.get("capture", {}).get("acts", "")  # the response id and a random part (one name in both dirs)
    if not check(re.fullmatch(re.escape(resp["id"]) + r"-[0-9a-f]{16}\.safetensors", want) and
                 choice.get("capture") == {"acts": want, "attn": want}, name + "_capture_member", str(choice)[:300]):
        return
    got = check_acts(name, os.path.join(dirs[0], want), ref, list(range(model.cfg.n_layers)))
    if got:
        pos, ctx = got
        check(ctx[-1] == ids and pos == list(range(len(ids))), name + "_rows_are_the_request", f"{ctx[-1]} vs {ids}")
        check_attn_file(name, os.path.join(dirs[1], want), ref, pos, ctx, list(range(len(prompt) - 1, len(ids))))
    check_records(name, recs, lambda x: ids[:x["pos"]], ref, model)


def test_serve(model, ref, tmp):
    dirs = [os.path.join(tmp, "serve-acts"), os.path.join(tmp, "serve-attn")]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    srv = Server(model.dir, "--parallel", "2", "--token-delay-ms", "30", "--dump-acts", dirs[0], "--dump-attn", dirs[1],
                 "--dump-points", ",".join(POINTS), "--attn-layers", "all", "--logit-lens", "--dump-max-files", "4",
                 name="interp-serve-dump")
    try:
        prompts = [[1, 403, 407, 261], [1, 385, 400, 261, 396, 415]]
        out = [None, None]

        def ask(k):
            out[k] = srv.post("/v1/completions", {"prompt": prompts[k], "max_tokens": 5, "temperature": 0})

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ok = all(x and x[0] == 200 for x in out)
        if check(ok, "serve_two_concurrent_requests", str(out)[:300]):
            q = [x[1]["timings"]["queued_s"] for x in out]
            check(max(q) < 0.1, "serve_requests_ran_on_two_slots", f"queued {q}")
            for k in range(2):
                check_served(f"serve_req{k}", out[k][1], prompts[k], dirs, ref, model)
        st, _, events, done = srv.stream("/v1/completions", {"prompt": prompts[1], "max_tokens": 2, "stream": True})
        last = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
        name = last[0]["choices"][0].get("capture", {}).get("acts", "?") if last else "?"
        check(st == 200 and done and len(last) == 1 and re.fullmatch(re.escape(last[0]["id"]) + r"-[0-9a-f]{16}\.safetensors", name)
              and os.path.exists(os.path.join(dirs[0], name)), "serve_stream_capture_in_final_chunk", str(last)[:300])
        st, resp = srv.post("/v1/completions", {"prompt": prompts[0], "max_tokens": 2, "n": 2, "temperature": 0})
        caps = [c.get("capture", {}) for c in resp.get("choices", [])] if st == 200 else []
        check(len(caps) == 2 and re.fullmatch(re.escape(resp["id"]) + r"-[0-9a-f]{16}\.c0\.safetensors", caps[0].get("acts", "")) and
              "--dump-max-files 4" in caps[1].get("skipped", ""), "serve_n2_then_limit", str(caps))
        files = sorted(os.listdir(dirs[0])) + sorted(os.listdir(dirs[1]))
        check(len(files) == 8 and all(f.endswith(".safetensors") for f in files), "serve_dump_files_bounded", str(files))
    finally:
        srv.stop()
    for what, args, needle in (("not_a_dir", ["--dump-acts", os.path.join(tmp, "nodir")], "not a directory"),
                               ("one_dir", ["--dump-acts", dirs[0], "--dump-attn", dirs[0]], "one directory"),
                               ("max_without_dump", ["--dump-max-files", "3"], "--dump-acts DIR")):
        r = vtest.varent("serve", "-m", model.dir, "--port", "0", *args)
        vtest.expect_fail(f"serve_bad_{what}", r, needle, rc=2)


def main():
    tmp = vtest.tmpdir("interp-scored")
    model_dir = vtest.stories_dir()
    model = ref_model.Model(model_dir)
    model.dir = model_dir
    ref = Ref(model)
    test_ppl(model, ref, tmp)
    test_eval(model, ref, tmp)
    test_serve(model, ref, tmp)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
