"""The captures (--dump-acts, --dump-attn, --attn-layers, --logit-lens; docs/research.md)
in chat, compare, agents and serve, against the numpy reference (tests/reference/ref_model.py
forward_hooked) on stories260K: every captured row is recomputed from the ids the file says
were fed at its positions, every per-token record from the context it was drawn in.
chat: rows over the whole conversation, a re-fed position repeating; compare: a file per
prompt and arm, the scoring pass after each run not captured; agents: the accepted
sequence only (lookahead branches, a rollback and the critic never reach the files or the
step records); serve: the members in each token's metrics (its files: test_interp_scored.py). Bad combinations are usage
errors that write nothing."""
import json
import os
import shutil

import numpy as np

import vtest
from vtest import check
import ref_model
from servertest import Server
from test_interp import head_stats, read_tensors, rel

TOL = 1e-4
POINTS = ("resid_post", "attn_out")


class Ref:
    """The reference forward of each context, cached: (acts, last-query scores)."""

    def __init__(self, model):
        self.model, self.cache = model, {}

    def __call__(self, ctx):
        key = tuple(int(x) for x in ctx)
        if key not in self.cache:
            _, acts, scores = ref_model.forward_hooked(self.model, list(key))
            self.cache[key] = (acts, scores)
        return self.cache[key]


def contexts(pos, ids):
    """For each captured row: the ids its position saw (the sequence as fed so far)."""
    seq, out = [], []
    for p, t in zip(pos, ids):
        seq = seq[:p] + [int(t)]
        if len(seq) != p + 1:
            return None  # a gap: a position fed without the ones before it
        out.append(list(seq))
    return out


def check_acts(name, path, ref, layers, tol=TOL, misaligned=False):
    """Every row of every (layer, point) against the reference at its context; returns the
    contexts. misaligned: also require each row to be far (over 3 tol) from the previous
    row's context, so that a loose tol still catches a capture of the wrong position."""
    if not check(os.path.exists(path), name + "_written", path):
        return None
    t = read_tensors(path)
    pos, ids = [int(x) for x in t["positions"]], [int(x) for x in t["ids"]]
    ctx = contexts(pos, ids)
    if not check(ctx is not None and len(ctx) == t[f"layers.{layers[0]}.{POINTS[0]}"].shape[0], name + "_rows",
                 f"positions {pos}"):
        return None
    worst, shifted = 0.0, []
    for i, c in enumerate(ctx):
        acts, _ = ref(c)
        for layer in layers:
            for p in POINTS:
                worst = max(worst, rel(t[f"layers.{layer}.{p}"][i], acts[(layer, p)][-1]))
        if misaligned and i > 0:
            prev, _ = ref(ctx[i - 1])
            shifted.append(max(rel(t[f"layers.{layer}.resid_post"][i], prev[(layer, "resid_post")][-1])
                               for layer in layers))
    check(worst <= tol, name + "_acts_match_numpy", f"worst rel {worst:.3g}")
    if misaligned:
        check(shifted and min(shifted) > 3 * tol, name + "_misaligned_rows_would_fail",
              f"closest misaligned row {min(shifted) if shifted else None}")
    return pos, ctx


def check_attn_file(name, path, ref, pos, ctx, want_pos=None):
    """Each --dump-attn row: the last query of a forward, whose last fed row is the next
    acts row at that position."""
    t = read_tensors(path)
    apos, at, worst, ok = [int(x) for x in t["positions"]], 0, 0.0, True
    for s, q in enumerate(apos):
        while at < len(pos) and pos[at] != q:
            at += 1
        if at == len(pos):
            ok = False
            break
        _, scores = ref(ctx[at])
        for layer in scores:
            p = ref_model.softmax(scores[layer])
            worst = max(worst, float(np.max(np.abs(t[f"layers.{layer}.attn"][s][:, :q + 1] - p))))
        at += 1
    ok = ok and (want_pos is None or apos == want_pos)
    check(ok and worst < 1e-5, name + "_attn_rows_match_numpy", f"positions {apos} worst {worst:.3g}")


def check_records(name, recs, ctx_of, ref, model):
    """Each record's attn_layers and logit_lens against the forward it was drawn from:
    the context ctx_of(rec) (its last id at position pos - 1)."""
    worst_h, worst_l, ok = 0.0, 0.0, len(recs) > 0
    for rec in recs:
        c = ctx_of(rec)
        if c is None or "attn_layers" not in rec or "logit_lens" not in rec:
            ok = False
            break
        acts, scores = ref(c)
        for layer in rec["attn_layers"]:
            h, v, _ = head_stats(scores[layer["layer"]])
            worst_h = max(worst_h, float(np.max(np.abs(np.array(layer["entropy"]) - h))),
                          float(np.max(np.abs(np.array(layer["varentropy"]) - v))))
        for lens in rec["logit_lens"]:
            lg = ref_model.logit_lens(model, acts[(lens["layer"], "resid_post")][-1])
            p = ref_model.softmax(lg)
            worst_l = max(worst_l, abs(lens["entropy"] + float((p * np.log2(p)).sum())))
            ok = ok and lens["top"][0]["id"] == int(np.argmax(lg))
        ok = ok and len(rec["attn_layers"]) == model.cfg.n_layers and len(rec["logit_lens"]) == model.cfg.n_layers
    check(ok and worst_h < 1e-3 and worst_l < 1e-3, name + "_records_match_numpy",
          f"{len(recs)} records, attn {worst_h:.3g} lens {worst_l:.3g}")


def gone(*paths):
    return not any(os.path.exists(p) for p in paths)


def capture_args(tmp, stem):
    acts, attn, log = (os.path.join(tmp, f"{stem}{x}") for x in (".acts.st", ".attn.st", ".jsonl"))
    for p in (acts, attn, log):
        if os.path.exists(p):
            os.remove(p)
    return acts, attn, log, ["--dump-acts", acts, "--dump-points", ",".join(POINTS), "--dump-attn", attn,
                             "--attn-layers", "all", "--logit-lens"]


def test_chat(model_dir, model, ref, tmp):
    cm = os.path.join(tmp, "chat-model")
    shutil.copytree(model_dir, cm)
    cfg = json.load(open(os.path.join(cm, "tokenizer_config.json")))
    cfg["chat_template"] = open(os.path.join(vtest.TESTDATA, "chat-templates", "meta-llama-Llama-2-chat.jinja")).read()
    json.dump(cfg, open(os.path.join(cm, "tokenizer_config.json"), "w"))
    acts, attn, log, extra = capture_args(tmp, "chat")
    r = vtest.varent("chat", "-m", cm, "--temp", "0", "-n", "8", "--metrics-out", log, *extra,
                     stdin="Tell me about a dog.\nWhat did it do next?\n", timeout=120)
    if not check(r.returncode == 0, "chat_capture_runs", r.stderr[-400:]):
        return
    layers = list(range(model.cfg.n_layers))
    got = check_acts("chat", acts, ref, layers)
    if not got:
        return
    pos, ctx = got
    restarts = [i for i in range(1, len(pos)) if pos[i] != pos[i - 1] + 1]
    check(pos[0] == 0 and len(restarts) == 1 and pos[restarts[0]] <= pos[restarts[0] - 1],
          "chat_rows_cover_both_turns", f"positions {pos}")
    check_attn_file("chat", attn, ref, pos, ctx)
    recs = [json.loads(x) for x in open(log)]
    turns = sorted({x["turn"] for x in recs})
    # a record's token sits at its pos in that turn's rows; it was drawn from the row before
    seg = [0] + restarts + [len(pos)]

    def ctx_of(rec):
        a, b = seg[rec["turn"] - 1], seg[rec["turn"]]
        rows = [i for i in range(a, b) if pos[i] == rec["pos"] - 1]
        nxt = [i for i in range(a, b) if pos[i] == rec["pos"]]
        if not rows or (nxt and ctx[nxt[0]][-1] != rec["token"]):
            return None
        return ctx[rows[0]]

    check(turns == [1, 2], "chat_metrics_with_turn", f"turns {turns}, {len(recs)} records")
    check_records("chat", recs, ctx_of, ref, model)
    for what, args, needle in (("lens_without_log", ["--logit-lens", "--dump-acts", acts + "2"], "--metrics-out"),
                               ("points_without_acts", ["--dump-points", "resid_pre"], "--dump-acts")):
        r = vtest.varent("chat", "-m", cm, *args, stdin="hi\n")
        vtest.expect_fail(f"chat_bad_{what}", r, needle, rc=2)
        check(gone(acts + "2"), f"chat_bad_{what}_nothing_written")
    r = vtest.varent("chat", "-m", cm, "--attn-layers", "0,99", "--metrics-out", log + "2", "--dump-acts", acts + "2",
                     stdin="hi\n")
    vtest.expect_fail("chat_bad_layer", r, "--attn-layers", "layer 99")
    check(gone(acts + "2", log + "2"), "chat_bad_layer_nothing_written")


def test_compare(model_dir, model, ref, tmp):
    prompts = os.path.join(tmp, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("Once upon a time\nThe dog ran\n")
    acts, attn, log, extra = capture_args(tmp, "cmp")
    rows = os.path.join(tmp, "cmp_rows.jsonl")
    r = vtest.varent("compare", "-m", model_dir, "--prompts", prompts, "--samplers", "greedy,entropix:seed", "-n", "5",
                     "--seed", "3", "-q", "-o", rows, "--metrics-out", log, *extra, timeout=120)
    if not check(r.returncode == 0, "compare_capture_runs", r.stderr[-400:]):
        return
    runs = [json.loads(x) for x in open(rows)]
    recs = [json.loads(x) for x in open(log)]
    layers = list(range(model.cfg.n_layers))
    by_run = {}
    for run in runs:
        arm = run["sampler"].replace(":", "_")
        name = f"compare_p{run['prompt_index']}_{arm}"
        got = check_acts(name, acts.replace(".st", f".p{run['prompt_index']}.{arm}.st"), ref, layers)
        if not got:
            continue
        pos, ctx = got
        ids = ctx[-1]
        n_prompt = run["prompt_tokens"]
        check(pos == list(range(len(ids))) and ids[n_prompt:] == run["ids"], name + "_prompt_and_generated_ids",
              f"{len(pos)} rows for {n_prompt}+{run['tokens']}")
        check_attn_file(name, attn.replace(".st", f".p{run['prompt_index']}.{arm}.st"), ref, pos, ctx,
                        list(range(n_prompt - 1, len(ids))))
        by_run[(run["prompt_index"], run["sampler"])] = ids
    mine = [x for x in recs if (x["prompt_index"], x["sampler"]) in by_run]
    check(len(mine) == len(recs) == sum(x["tokens"] for x in runs), "compare_metrics_every_token_tagged",
          f"{len(recs)} records")
    check_records("compare", mine, lambda x: by_run[(x["prompt_index"], x["sampler"])][:x["pos"]], ref, model)
    for what, args, needle in (("same_arm_twice", ["--samplers", "greedy,greedy", "--dump-acts", acts + "2"],
                                "would write one capture file"),
                               ("attn_without_log", ["--attn-layers", "0", "--dump-acts", acts + "2"], "--metrics-out")):
        r = vtest.varent("compare", "-m", model_dir, "--prompts", prompts, "-q", *args)
        vtest.expect_fail(f"compare_bad_{what}", r, needle, rc=2)
        check(gone(acts + "2", acts.replace(".st", ".p0.greedy.st2")), f"compare_bad_{what}_nothing_written")


def accepted(events, prompt):
    """The text as the log builds it: each step's chosen tokens, rollbacks cutting it."""
    ids = list(prompt)
    for e in events:
        if e["event"] == "step":
            ids += [t for t in e.get("tokens", [e["token"]]) if t != 2]
        elif e["event"] == "rollback":
            ids = ids[:e["to_pos"]]
    return ids


def test_agents(model_dir, model, ref, tmp):
    acts, attn, log, extra = capture_args(tmp, "agents")
    # agent 1 (top-k off, T 0.5) wins most steps and runs on replica 1: replica 0 replays its
    # branch into the trunk (forwards that must not reach the step records), and the
    # critic every 2 steps rolls back
    r = vtest.varent("agents", "-m", model_dir, "--ids", "1,403,407,261,400", "-n", "12", "--seed", "3",
                     "--agents", "1.5:100,0.5:0,1.2:50,0.8:5", "--lookahead", "3", "--devices", "cpu,cpu",
                     "--check-every", "2", "--rollback", "2", "--log", log, *extra, timeout=120)
    if not check(r.returncode == 0, "agents_capture_runs", r.stderr[-400:]):
        return
    events = [json.loads(x) for x in open(log)]
    prompt = [1, 403, 407, 261, 400]
    final = accepted(events, prompt)
    check(any(e["event"] == "rollback" for e in events), "agents_log_has_a_rollback", "no rollback: pick another seed")
    got = check_acts("agents", acts, ref, list(range(model.cfg.n_layers)))
    if not got:
        return
    pos, ctx = got
    check(ctx[-1] == final and pos == list(range(len(final))), "agents_files_hold_the_accepted_sequence",
          f"{ctx[-1]} vs {final}")
    check_attn_file("agents", attn, ref, pos, ctx, list(range(len(prompt) - 1, len(final))))
    steps, cur = [], list(prompt)
    for e in events:  # each step's statistics: the forward of the text so far, as the log builds it
        if e["event"] == "step":
            steps.append((e, list(cur[:e["pos"]])))
            cur = cur[:e["pos"]] + [t for t in e.get("tokens", [e["token"]]) if t != 2]
        elif e["event"] == "rollback":
            cur = cur[:e["to_pos"]]
    by_step = {e["step"]: c for e, c in steps}
    check_records("agents", [e for e, _ in steps], lambda e: by_step[e["step"]], ref, model)
    r = vtest.varent("agents", "-m", model_dir, "--ids", "1,403", "-n", "2", "--logit-lens", "--dump-acts", acts + "2")
    vtest.expect_fail("agents_bad_lens_without_log", r, "--log", rc=2)
    check(gone(acts + "2"), "agents_bad_lens_without_log_nothing_written")


def test_serve(model_dir, model, ref, tmp):
    for flag in ("--dump-acts", "--dump-attn"):  # a directory there (test_interp_scored.py)
        out = os.path.join(tmp, "serve.st")
        r = vtest.varent("serve", "-m", model_dir, "--port", "0", flag, out)
        vtest.expect_fail(f"serve_refuses_{flag[2:]}_not_a_dir", r, flag, "not a directory", rc=2)
        check(gone(out), f"serve_refuses_{flag[2:]}_nothing_written")
    srv = Server(model_dir, "--attn-layers", "all", "--logit-lens", "--parallel", "2", name="interp-serve")
    try:
        prompt = [1, 403, 407, 261]
        st, resp = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 5, "temperature": 0, "seed": 1})
        recs = resp["choices"][0].get("metrics", []) if st == 200 else []
        ids = prompt + [x["token"] for x in recs]
        check(st == 200 and len(recs) == 5 and recs[0]["pos"] == len(prompt), "serve_metrics_per_token", str(resp)[:300])
        check_records("serve", recs, lambda x: ids[:x["pos"]], ref, model)
        st, resp = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "metrics": False})
        check(st == 200 and "metrics" not in resp["choices"][0], "serve_metrics_off_no_captures", str(resp)[:300])
    finally:
        srv.stop()


def main():
    tmp = vtest.tmpdir("interp-cmds")
    model_dir = vtest.stories_dir()
    model = ref_model.Model(model_dir)
    ref = Ref(model)
    test_chat(model_dir, model, ref, tmp)
    test_compare(model_dir, model, ref, tmp)
    test_agents(model_dir, model, ref, tmp)
    test_serve(model_dir, model, ref, tmp)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    vtest.done()


if __name__ == "__main__":
    main()
