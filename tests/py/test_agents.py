"""`varent agents` (docs/agents.md): decoding agents, the critic with rollback, lookahead
branches and device replicas, checked from its JSONL log against independent references.

  - log invariants: the chosen proposal has the minimum entropy (ties: lower agent);
    critic records exactly after steps N, 2N, ...; each rollback verdict is followed by
    a rollback of min(--rollback, generated tokens) that never reaches into the prompt;
    after 3 rollbacks at one position BAD is accepted; the done record and stdout hold
    the text the log's steps and rollbacks spell;
  - proposal entropies vs numpy (temperature, top-k, top-p truncation) from logits of
    `varent logits` on the same prefix (stories260K) and from the numpy reference
    forward (random checkpoints); every token is inside its agent's kept set;
  - rollback correctness: the logits after a rollback equal a fresh run on the
    truncated text (--dump-logits rows vs `varent logits`);
  - lookahead: each branch's mean entropy recomputed token by token from fresh logits;
  - the critic's log-probabilities vs the numpy reference forward on the prompt the
    docs specify (plain, and rendered with a Llama 3 chat template); crafted critic
    checkpoints whose lm_head makes " GOOD" or " BAD" win exercise both verdicts and
    the 3-rollback guard;
  - fixed seed -> identical logs; --max-parallel and cpu,cpu replicas change nothing;
  - bad inputs: clear error, exit 1, no log file left, nothing on stdout.
"""
import json
import lzma
import os
import shutil
import subprocess
import time

import numpy as np

import vtest
from vtest import check
import gen_random_checkpoint as gen
import ref_model
from safetensors_np import save_file

QUESTION = "\nQuestion: Is this text coherent and not nonsense?\nReply GOOD or BAD.\nAnswer:"
PROMPT = "Once upon a time"


# ---------------------------------------------------------------- helpers

def agents(d, tmp, name, *extra, prompt=("-p", PROMPT), timeout=120):
    """Runs `varent agents`; returns (records, stdout, text log, dumped logits) or None, why."""
    log, txt, dump = (os.path.join(tmp, name + ext) for ext in (".jsonl", ".txt", ".f32"))
    for p in (log, txt, dump):
        if os.path.exists(p):
            os.remove(p)
    r = subprocess.run([vtest.VARENT, "agents", "-m", d, *map(str, prompt), "--log", log, "--log-text", txt,
                        "--dump-logits", dump, *map(str, extra)], capture_output=True, text=True,
                       errors="surrogateescape", timeout=timeout)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip()[-400:]}"
    with open(log) as f:
        recs = [json.loads(line) for line in f]
    with open(txt, errors="surrogateescape") as f:
        text_log = f.read()
    return (recs, r.stdout, text_log, np.fromfile(dump, dtype="<f4")), ""


def f32(x):
    return float(np.float32(x))


def agent_entropy(logits, t, k, top_p=1.0):
    """Entropy (bits) of the agent's truncated, renormalised distribution, and its kept ids."""
    x = np.asarray(logits, dtype=np.float64)
    if t <= 0:
        return 0.0, {int(np.argmax(x))}
    p = np.exp((x - x.max()) / f32(t))
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    if 0 < k < len(order):
        order = order[:k]
    kept = p[order]
    if top_p < 1:
        tot, cum, m = kept.sum(), 0.0, 0
        while m < len(kept) and cum < f32(top_p) * tot:
            cum += kept[m]
            m += 1
        order, kept = order[:max(m, 1)], kept[:max(m, 1)]
    q = kept / kept.sum()
    q = q[q > 0]
    return float(-(q * np.log2(q)).sum()), set(order)


def replay(recs, n_prompt, prompt_ids=None, stops=(2,)):
    """Walks the log: [(record, committed ids before it)] and the final ids. A stop id
    ends the text and is not part of it (only a branch's last token can be one)."""
    seq = list(prompt_ids) if prompt_ids is not None else [None] * n_prompt
    out = []
    for r in recs:
        out.append((r, list(seq)))
        if r["event"] == "step":
            seq += [t for t in r.get("tokens", [r["token"]]) if t not in stops]
        elif r["event"] == "rollback":
            del seq[r["to_pos"]:]
    return out, seq


def stories_prompt_ids(d):
    r = vtest.varent("tokenize", "-m", d, "--no-special", PROMPT)
    return [1] + json.loads(r.stdout)  # stories260K adds BOS = 1


def engine_logits(d, ids, tmp):
    out = os.path.join(tmp, "fresh.f32")
    if os.path.exists(out):
        os.remove(out)
    r = vtest.varent("logits", "-m", d, "--ids", ",".join(map(str, ids)), "--out", out)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return np.fromfile(out, dtype="<f4")


def close(a, b, tol):
    return abs(a - b) <= tol * max(1.0, abs(b))


# ---------------------------------------------------------------- invariants

def check_invariants(name, recs, n_prompt, every, rollback, stop_ids=(2,), interrupted=False):
    steps = [r for r in recs if r["event"] == "step"]
    if not check(bool(steps) and recs[-1]["event"] == "done", f"{name}_log_shape", f"{len(recs)} records"):
        return None
    bad = ""
    for s in steps:
        es = [p["entropy"] for p in s["proposals"]]
        want = min(range(len(es)), key=lambda i: (es[i], i))
        if s["chosen_agent"] != want or s["token"] != s["proposals"][want]["token"]:
            bad = bad or f"step {s['step']}: chose {s['chosen_agent']}, entropies {es}"
        if [p["agent"] for p in s["proposals"]] != list(range(len(es))):
            bad = bad or f"step {s['step']}: agents out of order"
    check(not bad, f"{name}_min_entropy_chosen", bad)
    nums = [s["step"] for s in steps]
    check(nums == list(range(1, len(steps) + 1)), f"{name}_steps_numbered", f"{nums[:10]}")
    crit = [r for r in recs if r["event"] == "critic"]
    want = [n for n in nums if every and n % every == 0]
    if interrupted and want and want[-1] == nums[-1] and [c["step"] for c in crit] == want[:-1]:
        want = want[:-1]  # Ctrl-C landed after the last step's record, before its check ran
    check([c["step"] for c in crit] == want, f"{name}_critic_every_{every}",
          f"critic at {[c['step'] for c in crit][:10]}, want {want[:10]}")
    # each verdict's action, and each rollback right after its critic record
    walk, seq = replay(recs, n_prompt, stops=stop_ids)
    at, bad = {}, ""
    for i, (r, before) in enumerate(walk):
        if r["event"] == "step" and r["pos"] != len(before):
            bad = bad or f"step {r['step']} at pos {r['pos']}, text has {len(before)} ids"
        if r["event"] != "critic":
            continue
        if r["pos"] != len(before):
            bad = bad or f"critic at pos {r['pos']}, text has {len(before)} ids"
        good = r["logp_good"] >= r["logp_bad"]
        if r["verdict"] != ("GOOD" if good else "BAD"):
            bad = bad or f"step {r['step']}: verdict {r['verdict']} with logps {r['logp_good']} {r['logp_bad']}"
        nxt = recs[i + 1] if i + 1 < len(recs) else {}
        removable = r["pos"] - n_prompt
        if good:
            ok = r["action"] == "none" and nxt.get("event") != "rollback"
        elif at.get(r["pos"], 0) >= 3 or removable == 0:
            ok = r["action"] == "accept" and nxt.get("event") != "rollback"
        else:
            at[r["pos"]] = at.get(r["pos"], 0) + 1
            ok = (r["action"] == "rollback" and nxt.get("event") == "rollback" and nxt["step"] == r["step"]
                  and nxt["from_pos"] == r["pos"] and nxt["tokens_removed"] == min(rollback, removable)
                  and nxt["to_pos"] == r["pos"] - nxt["tokens_removed"] and nxt["to_pos"] >= n_prompt)
        if not ok:
            bad = bad or f"step {r['step']}: {r} then {nxt} (rollbacks here so far {at.get(r['pos'], 0)})"
    check(not bad, f"{name}_critic_actions_and_rollbacks", bad)
    rbs = [r for r in recs if r["event"] == "rollback"]
    check(all(r["to_pos"] >= n_prompt for r in rbs), f"{name}_never_into_prompt")
    done = recs[-1]
    final = seq[n_prompt:]
    check(done["tokens"] == len(final) and done["rollbacks"] == len(rbs) and done["critic_checks"] == len(crit),
          f"{name}_done_counts", f"{done} vs {len(final)} tokens, {len(rbs)} rollbacks, {len(crit)} checks")
    return seq, final


def check_text(name, d, final, out, text_log, recs):
    want = detok(d, final)
    done = recs[-1]
    check(done["text"] == want, f"{name}_done_text",
          f"{done['text']!r} vs detokenize {want!r}")
    check(out == done["text"] + "\n", f"{name}_stdout_is_text", f"{out!r}")
    steps = [r for r in recs if r["event"] == "step"]
    lines = [ln for ln in text_log.splitlines() if ln.startswith("Step ")]
    ok = len(lines) == len(steps) and all(
        ln.startswith(f"Step {s['step']}: chosen=") and ln.endswith(
            "(entropy=%.3f)" % s["proposals"][s["chosen_agent"]]["entropy"]) for ln, s in zip(lines, steps))
    n_eval = text_log.count("Evaluator after step")
    n_rb = text_log.count("→ rolling back")
    ok = ok and n_eval == sum(r["event"] == "critic" for r in recs) and n_rb == done["rollbacks"]
    ok = ok and text_log.rstrip("\n").endswith("Final text:\n" + done["text"])
    check(ok, f"{name}_text_log", text_log[:300])


def check_entropies(name, recs, walk_logits, top_p=1.0):
    """walk_logits(record, ids before) -> logits or None; every proposal vs numpy."""
    walk, _ = replay(recs, 0)
    worst, n = "", 0
    for r, before in walk:
        if r["event"] != "step":
            continue
        lg = walk_logits(r, before)
        if lg is None:
            continue
        n += 1
        for p in r["proposals"]:
            h, kept = agent_entropy(lg, p["temperature"], p["top_k"], top_p)
            if not close(p["entropy"], h, 2e-4):
                worst = worst or f"step {r['step']} agent {p['agent']}: {p['entropy']} vs numpy {h}"
            if p["token"] not in kept:
                worst = worst or f"step {r['step']} agent {p['agent']}: token {p['token']} outside its top-{p['top_k']}"
    check(n > 0 and not worst, f"{name}_entropies_vs_numpy", worst or "no step checked")


# ---------------------------------------------------------------- stories260K

def test_stories(d, tmp):
    ids = stories_prompt_ids(d)
    n_p = len(ids)
    res, why = agents(d, tmp, "basic", "-n", 24, "--seed", 7, "--check-every", 4, "--rollback", 3)
    if not check(res is not None, "stories_runs", why):
        return
    recs, out, text_log, dump = res
    got = check_invariants("stories", recs, n_p, 4, 3)
    if got is None:
        return
    seq, final = got
    check_text("stories", d, final, out, text_log, recs)
    V = 512
    rows = dump.reshape(-1, V)
    steps = [r for r in recs if r["event"] == "step"]
    check(rows.shape[0] == len(steps), "stories_dump_rows", f"{rows.shape} for {len(steps)} steps")
    # the shared logits of a few steps (first, a step after each rollback, last) vs a fresh run
    walk, _ = replay(recs, n_p, ids)
    after_rb = {recs[i + 1]["step"] for i, r in enumerate(recs[:-1]) if r["event"] == "rollback"}
    pick = {1, steps[-1]["step"]} | after_rb
    fresh, worst = {}, ""
    for r, before in walk:
        if r["event"] != "step" or r["step"] not in pick:
            continue
        lg = engine_logits(d, before, tmp)
        fresh[r["step"]] = lg
        row = rows[r["step"] - 1]
        err = float(np.max(np.abs(row - lg)) / np.max(np.abs(lg)))
        if err > 1e-4:
            worst = worst or f"step {r['step']} (after rollback: {r['step'] in after_rb}): {err:.3g}"
    check(not worst, "stories_logits_equal_fresh_run", worst)
    check_entropies("stories_fresh", recs, lambda r, b: fresh.get(r["step"]))
    check_entropies("stories_all_steps", recs, lambda r, b: rows[r["step"] - 1])
    # fixed seed -> identical logs (tok_per_s aside); another seed -> another run
    again, _ = agents(d, tmp, "basic2", "-n", 24, "--seed", 7, "--check-every", 4, "--rollback", 3)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "tok_per_s"} for r in rs]
    check(again is not None and strip(again[0]) == strip(recs) and again[1] == out, "stories_same_seed_same_log")
    hot = ("--agents", "1.5:0,1.2:50,1.4:0")
    a1, _ = agents(d, tmp, "hot1", "-n", 12, "--seed", 1, "--check-every", 0, *hot)
    a2, _ = agents(d, tmp, "hot2", "-n", 12, "--seed", 2, "--check-every", 0, *hot)
    check(a1 and a2 and a1[1] != a2[1], "stories_other_seed_other_text")
    # top-p and no top-k (K=0) in the numpy check too
    res, why = agents(d, tmp, "topp", "-n", 10, "--seed", 3, "--check-every", 0, "--agents", "0.8:0,1.3:7,1:0",
                      "--top-p", 0.9)
    if check(res is not None, "stories_top_p_runs", why):
        rows = res[3].reshape(-1, V)
        check_entropies("stories_top_p", res[0], lambda r, b: rows[r["step"] - 1], top_p=0.9)
    # ties go to the lower index; a greedy agent has entropy 0 and always wins
    res, why = agents(d, tmp, "tie", "-n", 8, "--seed", 4, "--check-every", 0, "--agents", "1:20,1:20,0:0")
    if check(res is not None, "stories_tie_runs", why):
        steps = [r for r in res[0] if r["event"] == "step"]
        rows = res[3].reshape(-1, V)
        check(all(s["chosen_agent"] == 2 and s["token"] == int(np.argmax(rows[i])) for i, s in enumerate(steps)),
              "stories_greedy_agent_wins")
        res2, _ = agents(d, tmp, "tie2", "-n", 8, "--seed", 4, "--check-every", 0, "--agents", "1:20,1:20")
        steps = [r for r in res2[0] if r["event"] == "step"] if res2 else []
        check(steps and all(s["chosen_agent"] == 0 for s in steps), "stories_tie_to_lower_index")
    # --max-parallel bounds concurrency, never the result
    base, _ = agents(d, tmp, "mp0", "-n", 10, "--seed", 5, "--check-every", 0)
    one, _ = agents(d, tmp, "mp1", "-n", 10, "--seed", 5, "--check-every", 0, "--max-parallel", 1)
    three, _ = agents(d, tmp, "mp3", "-n", 10, "--seed", 5, "--check-every", 0, "--max-parallel", 3)
    check(base and one and three and strip(base[0]) == strip(one[0]) == strip(three[0]), "stories_max_parallel_same")


def test_critic_reference(d, tmp):
    """The default critic (second context on stories260K) vs the numpy forward on the documented prompt."""
    ids = stories_prompt_ids(d)
    res, why = agents(d, tmp, "critic", "-n", 12, "--seed", 11, "--check-every", 3, "--rollback", 2,
                      "--agents", "1.3:40,1.5:0")
    if not check(res is not None, "critic_ref_runs", why):
        return
    recs = res[0]
    model = ref_model.Model(d)
    good, bad = continuation(d, "Answer:", False, " GOOD"), continuation(d, "Answer:", False, " BAD")
    walk, _ = replay(recs, len(ids), ids)
    worst, n = "", 0
    for r, before in walk:
        if r["event"] != "critic" or n >= 3:
            continue
        n += 1
        text = detok(d, before[len(ids):])
        prompt = [1] + tok(d, "Text:\n" + text + QUESTION, special=False)
        lg, lb = ref_logps(model, prompt, good), ref_logps(model, prompt, bad)
        if not (close(r["logp_good"], lg, 1e-4) and close(r["logp_bad"], lb, 1e-4)):
            worst = worst or f"step {r['step']}: {r['logp_good']}, {r['logp_bad']} vs numpy {lg}, {lb}"
    check(n >= 2 and not worst, "critic_logps_vs_numpy", worst or f"{n} critic records")


def tok(d, text, special):
    """Token ids of text (str or raw bytes) by `varent tokenize`."""
    arg = text if isinstance(text, bytes) else text.encode("utf-8")
    r = subprocess.run([vtest.VARENT, "tokenize", "-m", d, "--special" if special else "--no-special", arg],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout)


def detok(d, ids):
    if not ids:
        return ""
    return detok_bytes(d, ids).decode("utf-8")


def detok_bytes(d, ids):
    """The decoded text as raw bytes (random ids can make invalid UTF-8); the command ends it with a newline."""
    if not ids:
        return b""
    r = subprocess.run([vtest.VARENT, "detokenize", "-m", d, "--skip-special", ",".join(map(str, ids))],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return r.stdout[:-1] if r.stdout.endswith(b"\n") else r.stdout


def continuation(d, tail, special, word):
    """The documented rule: ids of tail+word beyond the ids of tail."""
    a, b = tok(d, tail, special), tok(d, tail + word, special)
    assert b[:len(a)] == a and len(b) > len(a), (a, b)
    return b[len(a):]


def ref_logps(model, prompt, cont):
    lg = ref_model.forward(model, np.array(prompt + cont[:-1]))
    total = 0.0
    for j, t in enumerate(cont):
        x = lg[len(prompt) - 1 + j].astype(np.float64)
        m = x.max()
        total += x[t] - m - np.log(np.exp(x - m).sum())
    return float(total)


# ---------------------------------------------------------------- crafted critics

def crafted_critic(d, out, favour):
    """stories260K's config and tokenizer with weights that make every position's logits
    the same: layers add nothing (o_proj, down_proj = 0), every embedding is e0, and the
    untied lm_head gives the favoured continuation's own tokens +16. Returns its logits."""
    os.makedirs(out, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(d, f), out)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["tie_word_embeddings"] = False
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    D, F, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = D // H
    good, bad = continuation(d, "Answer:", False, " GOOD"), continuation(d, "Answer:", False, " BAD")
    mine, other = (good, bad) if favour == "GOOD" else (bad, good)
    emb = np.zeros((V, D), np.float32)
    emb[:, 0] = 1
    head = np.zeros((V, D), np.float32)
    for t in set(mine) - set(other):
        head[t, 0] = 2.0
    t = {"model.embed_tokens.weight": emb, "model.norm.weight": np.ones(D, np.float32), "lm_head.weight": head}
    for i in range(L):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        t.update({p + "input_layernorm.weight": np.ones(D, np.float32),
                  p + "post_attention_layernorm.weight": np.ones(D, np.float32),
                  a + "q_proj.weight": np.zeros((H * hd, D), np.float32), a + "k_proj.weight": np.zeros((KV * hd, D), np.float32),
                  a + "v_proj.weight": np.zeros((KV * hd, D), np.float32), a + "o_proj.weight": np.zeros((D, H * hd), np.float32),
                  p + "mlp.gate_proj.weight": np.zeros((F, D), np.float32), p + "mlp.up_proj.weight": np.zeros((F, D), np.float32),
                  p + "mlp.down_proj.weight": np.zeros((D, F), np.float32)})
    save_file(os.path.join(out, "model.safetensors"), t, dtype="F32")
    h = np.zeros(D)
    h[0] = 1 / np.sqrt(1 / D + cfg["rms_norm_eps"])
    x = head.astype(np.float64) @ h
    logz = x.max() + np.log(np.exp(x - x.max()).sum())
    return sum(x[t] - logz for t in good), sum(x[t] - logz for t in bad)


def test_crafted_critics(d, tmp):
    ids = stories_prompt_ids(d)
    n_p = len(ids)
    cg = os.path.join(tmp, "critic-good")
    want = crafted_critic(d, cg, "GOOD")
    res, why = agents(d, tmp, "cgood", "-n", 15, "--seed", 1, "--check-every", 3, "--critic-model", cg)
    if check(res is not None, "critic_good_runs", why):
        recs = res[0]
        crit = [r for r in recs if r["event"] == "critic"]
        check(len(crit) == 5 and all(r["verdict"] == "GOOD" and r["action"] == "none" for r in crit)
              and not any(r["event"] == "rollback" for r in recs), "critic_good_never_rolls_back", f"{crit[:2]}")
        check(all(close(r["logp_good"], want[0], 1e-5) and close(r["logp_bad"], want[1], 1e-5) for r in crit),
              "critic_good_logps_exact", f"{crit[0]} vs {want}")
        check_invariants("critic_good", recs, n_p, 3, 5)
    cb = os.path.join(tmp, "critic-bad")
    want = crafted_critic(d, cb, "BAD")
    # check every 2 steps, roll back 2: each position is rolled back 3 times, then accepted
    res, why = agents(d, tmp, "cbad", "-n", 6, "--seed", 1, "--check-every", 2, "--rollback", 2, "--critic-model", cb)
    if check(res is not None, "critic_bad_runs", why):
        recs, out, text_log, dump = res
        crit = [r for r in recs if r["event"] == "critic"]
        check(all(r["verdict"] == "BAD" and close(r["logp_bad"], want[1], 1e-5) for r in crit), "critic_bad_verdicts")
        acts = [(r["pos"] - n_p, r["action"]) for r in crit]
        want_acts = [(g, a) for g in (2, 4, 6) for a in ("rollback",) * 3 + ("accept",)]
        check(acts == want_acts, "critic_bad_three_rollbacks_then_accept", f"{acts}")
        got = check_invariants("critic_bad", recs, n_p, 2, 2)
        check("BAD → accepted" in text_log and text_log.count("BAD → rolling back 2 tokens") == 9,
              "critic_bad_text_log", text_log[-400:])
        # rollback correctness: each step right after a rollback sees the logits of a fresh run
        walk, _ = replay(recs, n_p, ids)
        after = {recs[i + 1]["step"] for i, r in enumerate(recs[:-1]) if r["event"] == "rollback"}
        rows, worst, n = dump.reshape(-1, 512), "", 0
        for r, before in walk:
            if r["event"] == "step" and r["step"] in after:
                lg = engine_logits(d, before, tmp)
                n += 1
                err = float(np.max(np.abs(rows[r["step"] - 1] - lg)) / np.max(np.abs(lg)))
                if err > 1e-4:
                    worst = worst or f"step {r['step']}: {err:.3g}"
        check(n == 9 and not worst, "rollback_logits_equal_fresh_run", worst or f"{n} steps after rollbacks")
    # rollback larger than the text: stops at the prompt
    res, why = agents(d, tmp, "cbad5", "-n", 4, "--seed", 2, "--check-every", 2, "--rollback", 5, "--critic-model", cb)
    if check(res is not None, "critic_bad_clamp_runs", why):
        rbs = [r for r in res[0] if r["event"] == "rollback"]
        check(rbs and all(r["to_pos"] == n_p for r in rbs), "rollback_stops_at_prompt", f"{rbs[:3]}")
        check_invariants("critic_bad_clamp", res[0], n_p, 2, 5)
    # the same BAD critic with lookahead: rollbacks count tokens, not steps
    res, why = agents(d, tmp, "cbadla", "-n", 9, "--seed", 3, "--check-every", 1, "--rollback", 2, "--lookahead", 3,
                      "--critic-model", cb)
    if check(res is not None, "critic_bad_lookahead_runs", why):
        check_invariants("critic_bad_lookahead", res[0], n_p, 1, 2)


# ---------------------------------------------------------------- lookahead and replicas

def test_lookahead(d, tmp):
    ids = stories_prompt_ids(d)
    n_p = len(ids)
    args = ("-n", 14, "--seed", 9, "--lookahead", 3, "--check-every", 2, "--rollback", 4,
            "--agents", "0.9:20,1.2:0,1.5:40,1.1:5")
    res, why = agents(d, tmp, "la", *args)
    if not check(res is not None, "lookahead_runs", why):
        return
    recs, out, text_log, dump = res
    got = check_invariants("lookahead", recs, n_p, 2, 4)
    if got:
        check_text("lookahead", d, got[1], out, text_log, recs)
    steps = [r for r in recs if r["event"] == "step"]
    check(all(1 <= len(p["tokens"]) <= 3 and p["tokens"][0] == p["token"] for s in steps for p in s["proposals"]),
          "lookahead_branch_shapes")
    # every branch's mean entropy, token by token from fresh logits (first two steps)
    walk, _ = replay(recs, n_p, ids)
    worst, n = "", 0
    for r, before in walk:
        if r["event"] != "step" or r["step"] > 2:
            continue
        cache = {}
        for p in r["proposals"]:
            hs = []
            for j in range(len(p["tokens"])):
                key = tuple(p["tokens"][:j])
                if key not in cache:
                    cache[key] = engine_logits(d, before + list(key), tmp)
                h, kept = agent_entropy(cache[key], p["temperature"], p["top_k"])
                hs.append(h)
                if p["tokens"][j] not in kept:
                    worst = worst or f"step {r['step']} agent {p['agent']} token {j} outside top-k"
            n += 1
            if not close(p["entropy"], float(np.mean(hs)), 2e-4):
                worst = worst or f"step {r['step']} agent {p['agent']}: {p['entropy']} vs numpy mean {np.mean(hs)}"
    check(n > 0 and not worst, "lookahead_branch_entropies_vs_numpy", worst)
    rows = dump.reshape(-1, 512)
    worst = ""
    for r, before in walk:
        if r["event"] == "step" and r["step"] > 1:
            lg = engine_logits(d, before, tmp)
            err = float(np.max(np.abs(rows[r["step"] - 1] - lg)) / np.max(np.abs(lg)))
            if err > 1e-4:
                worst = worst or f"step {r['step']}: {err:.3g}"
    check(not worst, "lookahead_commit_logits_equal_fresh_run", worst)
    # replicas: cpu,cpu and cpu,cpu,cpu give the same log and text as cpu
    strip = lambda rs: [{k: v for k, v in x.items() if k != "tok_per_s"} for x in rs]
    for devs in ("cpu,cpu", "cpu,cpu,cpu"):
        other, why = agents(d, tmp, "la-" + devs.replace(",", "-"), *args, "--devices", devs)
        check(other is not None and strip(other[0]) == strip(recs) and other[1] == out,
              f"lookahead_replicas_{devs.replace(',', '_')}_same_as_cpu", why or "logs differ")
    # without lookahead several devices: generation on the first, critic on the last
    plain = ("-n", 10, "--seed", 4, "--check-every", 3)
    one, _ = agents(d, tmp, "plain1", *plain)
    two, why = agents(d, tmp, "plain2", *plain, "--devices", "cpu,cpu")
    check(one and two and strip(one[0]) == strip(two[0]), "replicas_without_lookahead_same_as_cpu", why)


# ---------------------------------------------------------------- random checkpoints

def test_random(tmp):
    for preset, seed in (("llama3-tiny", 31), ("qwen3-tiny", 32)):
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=seed, dtype="bf16")
        model = ref_model.Model(d)
        prompt = [1, 17, 45, 300, 9]
        res, why = agents(d, tmp, preset, "-n", 10, "--seed", 3, "--check-every", 0, "--lookahead", 2,
                          "--devices", "cpu,cpu", prompt=("--ids", ",".join(map(str, prompt))))
        if not check(res is not None, f"{preset}_runs", why):
            continue
        recs = res[0]
        stops = (gen.PRESETS[preset]["eos"],)
        check_invariants(preset, recs, len(prompt), 0, 5, stop_ids=stops)
        steps = [r for r in recs if r["event"] == "step"]
        walk, seq = replay(recs, len(prompt), prompt, stops)
        full = ref_model.forward(model, np.array(seq[:-1]))  # causal: one forward gives every prefix
        worst = ""
        for r, before in walk:
            if r["event"] != "step":
                continue
            for p in r["proposals"]:
                hs = []
                for j in range(len(p["tokens"])):
                    ctx = before + p["tokens"][:j]
                    lg = (full[len(ctx) - 1] if ctx == seq[:len(ctx)]
                          else ref_model.forward(model, np.array(ctx))[-1])
                    hs.append(agent_entropy(lg, p["temperature"], p["top_k"])[0])
                if not close(p["entropy"], float(np.mean(hs)), 1e-3):
                    worst = worst or f"step {r['step']} agent {p['agent']}: {p['entropy']} vs {np.mean(hs)}"
        check(steps and not worst, f"{preset}_entropies_vs_reference_forward", worst)
        check(res[1].strip() == " ".join(map(str, seq[len(prompt):])), f"{preset}_ids_printed", res[1][:100])


def test_chat_critic(tmp):
    """A random model with the Llama 3 tokenizer: the critic prompt is rendered with the
    chat template; its logps vs numpy on the documented ids; --chat prompts generate."""
    d = os.path.join(tmp, "l3chat")
    gen.PRESETS["l3-vocab"] = dict(gen.PRESETS["llama3-tiny"], hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                   vocab_size=128256, bos=128000, eos=128001)
    gen.generate("l3-vocab", d, seed=5, dtype="bf16")
    src = os.path.join(vtest.TESTDATA, "tokenizers", "llama3")
    with lzma.open(os.path.join(src, "tokenizer.json.xz")) as f, open(os.path.join(d, "tokenizer.json"), "wb") as g:
        shutil.copyfileobj(f, g)
    shutil.copy(os.path.join(src, "tokenizer_config.json"), d)
    res, why = agents(d, tmp, "l3", "-n", 6, "--seed", 2, "--check-every", 3, "--agents", "1.5:0,1.2:0",
                      prompt=("--chat", "-p", "Tell me a story."))
    if not check(res is not None, "chat_critic_runs", why):
        return
    recs = res[0]
    msgs = os.path.join(tmp, "msgs.json")
    json.dump([{"role": "user", "content": "@@Q@@"}], open(msgs, "w"))
    rendered = vtest.varent("template", "-m", d, "--messages", msgs).stdout
    pre, post = rendered.split("@@Q@@")
    n_prompt = len(tok(d, pre + "Tell me a story." + post, True))
    steps = [r for r in recs if r["event"] == "step"]
    check(steps and steps[0]["pos"] == n_prompt, "chat_prompt_rendered", f"first pos {steps[0]['pos'] if steps else None}, want {n_prompt}")
    good, bad = continuation(d, post, True, " GOOD"), continuation(d, post, True, " BAD")
    model = ref_model.Model(d)
    walk, _ = replay(recs, n_prompt, stops=(128001, 128008, 128009))
    worst, n = "", 0
    for r, before in walk:
        if r["event"] != "critic" or n == 2:
            continue
        text = detok_bytes(d, before[n_prompt:])
        ids = tok(d, pre, True) + tok(d, b"Text:\n" + text + QUESTION.encode(), False) + tok(d, post, True)
        lg, lb = ref_logps(model, ids, good), ref_logps(model, ids, bad)
        n += 1
        if not (close(r["logp_good"], lg, 1e-3) and close(r["logp_bad"], lb, 1e-3)):
            worst = worst or f"step {r['step']}: {r['logp_good']}, {r['logp_bad']} vs numpy {lg}, {lb}"
    check(n == 2 and not worst, "chat_critic_logps_vs_numpy", worst or f"{n} checks compared")


# ---------------------------------------------------------------- bad inputs

def test_logit_bias(d, tmp):
    """-l: every agent draws from the biased logits (entropies vs numpy on the dumped raw
    logits plus the biases), the dump and the log keep the raw ones, a ban holds with
    and without lookahead."""
    res, why = agents(d, tmp, "bias", "-n", 10, "-s", 4, "--check-every", 0, "-l", "432-50", "-l", "383+2.5")
    if not check(res is not None, "logit_bias_runs", why):
        return
    recs, rows = res[0], res[3].reshape(-1, 512)
    bias = np.zeros(512)
    bias[432], bias[383] = -50, 2.5
    check_entropies("logit_bias", recs, lambda r, before: rows[r["step"] - 1].astype(np.float64) + bias)
    raw = engine_logits(d, stories_prompt_ids(d), tmp)
    check(np.max(np.abs(rows[0] - raw)) <= 1e-4 * np.max(np.abs(raw)), "logit_bias_dump_is_raw",
          f"max diff {np.max(np.abs(rows[0] - raw))}")
    for tag, extra in (("plain", ()), ("lookahead", ("--lookahead", 3))):
        res, why = agents(d, tmp, "ban-" + tag, "-n", 16, "-s", 4, "--check-every", 0, "-l", "432-inf", *extra)
        toks = [t for r in (res[0] if res else []) if r["event"] == "step" for p in r["proposals"]
                for t in p.get("tokens", [p["token"]])]
        check(res is not None and toks and 432 not in toks, f"logit_bias_ban_{tag}", why or f"{len(toks)} tokens")


def test_bad_inputs(d, tmp):
    log = os.path.join(tmp, "bad.jsonl")
    cases = [
        ("agents_no_colon", ("--agents", "0.5"), "--agents"),
        ("agents_letters", ("--agents", "a:b"), "--agents"),
        ("agents_negative_k", ("--agents", "0.5:10,1:-1"), "entry 2"),
        ("agents_empty_entry", ("--agents", "0.5:10,,1:5"), "--agents"),
        ("agents_negative_t", ("--agents", "-1:5"), "--agents"),
        ("devices_empty", ("--devices", ""), "--devices"),
        ("devices_unknown", ("--devices", "gpu"), "gpu"),
        ("devices_empty_entry", ("--devices", "cpu,,cpu"), "offset 4"),
        ("devices_bad_index", ("--devices", "cuda:x"), "cuda:x"),
        ("devices_gpu_index", ("--devices", "cpu,99"), "cuda:99"),
        ("rollback_zero", ("--rollback", 0), "--rollback"),
        ("check_negative", ("--check-every", -1), "--check-every"),
        ("lookahead_negative", ("--lookahead", -2), "--lookahead"),
        ("max_parallel_negative", ("--max-parallel", -1), "--max-parallel"),
        ("n_negative", ("-n", -1), "-n"),
        ("top_p_zero", ("--top-p", 0), "--top-p"),
        ("critic_model_missing", ("--critic-model", os.path.join(tmp, "nope")), "nope"),
        ("unknown_option", ("--agent", "1:1"), "--agent"),
        ("ids_and_prompt", ("--ids", "1,2"), "--ids"),
    ]
    if cuda_devices() == 0:  # no usable GPU: cuda:0 is refused before anything runs
        cases.append(("devices_cuda", ("--devices", "cuda:0"), "cuda:0"))
    # a bad option or combination is a usage error (exit 2); a model or device that is
    # not there, a runtime error (exit 1)
    runtime = ("devices_gpu_index", "critic_model_missing", "devices_cuda")
    for name, extra, needle in cases:
        if os.path.exists(log):
            os.remove(log)
        r = vtest.varent("agents", "-m", d, "-p", PROMPT, "-n", 3, "--log", log, *map(str, extra))
        check(r.returncode == (1 if name in runtime else 2) and needle in r.stderr and not r.stdout and not os.path.exists(log),
              f"bad_{name}", f"rc {r.returncode}, stderr {r.stderr.strip()[:200]!r}, log left {os.path.exists(log)}")
    for opt in ("--log", "--log-text", "--dump-logits"):
        r = vtest.varent("agents", "-m", d, "-p", PROMPT, "-n", 3, opt, "/nonexistent-dir/x.out")
        check(r.returncode == 1 and "/nonexistent-dir/x.out" in r.stderr and opt in r.stderr and not r.stdout,
              f"bad_unwritable{opt.replace('-', '_')}", r.stderr.strip())
    # an unwritable second log leaves no first log behind
    r = vtest.varent("agents", "-m", d, "-p", PROMPT, "-n", 3, "--log", log, "--log-text", "/nonexistent-dir/x.txt")
    check(r.returncode == 1 and not os.path.exists(log), "bad_unwritable_text_log_removes_jsonl", r.stderr.strip())
    r = vtest.varent("agents", "-m", os.path.join(tmp, "nope"), "-p", PROMPT, "--log", log)
    check(r.returncode == 1 and "nope" in r.stderr and not os.path.exists(log), "bad_model_dir", r.stderr.strip())
    # no tokenizer: the critic cannot read the text
    rd = os.path.join(tmp, "llama3-tiny")
    if os.path.isdir(rd):
        r = vtest.varent("agents", "-m", rd, "--ids", "1,2,3", "-n", 3, "--log", log)
        check(r.returncode == 1 and "tokenizer" in r.stderr and not os.path.exists(log), "bad_critic_without_tokenizer",
              r.stderr.strip())


def test_interrupt(d, tmp):
    """Ctrl-C: the step under way finishes, the text so far is printed, the log ends with
    a done record that agrees with it, exit status 130."""
    import signal
    log = os.path.join(tmp, "int.jsonl")
    p = subprocess.Popen([vtest.VARENT, "agents", "-m", d, "-p", PROMPT, "-n", "400", "--seed", "1",
                          "--check-every", "1", "--log", log], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60  # the log is opened once the model loaded: Ctrl-C once a step is logged
    while time.time() < deadline and p.poll() is None and not (os.path.exists(log) and os.path.getsize(log) > 0):
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    if p.returncode == 0:
        vtest.skip("interrupt", "the run ended before Ctrl-C")
        return
    recs = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
    ok = p.returncode == 130 and recs and recs[-1]["event"] == "done"
    if check(ok, "interrupt_exit_130_and_done_record", f"rc {p.returncode}, {err.decode()[-200:]}"):
        ids = stories_prompt_ids(d)
        got = check_invariants("interrupt", recs, len(ids), 1, 5, interrupted=True)
        check(got is not None and out.decode("utf-8", "surrogateescape") == recs[-1]["text"] + "\n",
              "interrupt_prints_text_so_far", out[-100:])


def cuda_devices():
    """GPUs this build can use (0 without CUDA)."""
    out = vtest.varent("--version").stdout
    for line in out.splitlines():
        if line.startswith("cuda devices:"):
            return int(line.split(":")[1])
    return 0


def test_cuda(d, tmp):
    """On a CUDA machine: the same invariants and logits checks on cuda:0, and two
    replicas on it in lookahead mode (bf16 KV: texts may differ from the CPU's)."""
    if cuda_devices() == 0:
        vtest.skip("agents_cuda", "no CUDA device in this build or machine")
        return
    ids = stories_prompt_ids(d)
    for devs, extra in (("cuda:0", ()), ("cuda:0,cuda:0", ("--lookahead", 3))):
        name = "cuda_" + devs.replace(":", "").replace(",", "_")
        res, why = agents(d, tmp, name, "-n", 16, "--seed", 5, "--check-every", 4, "--rollback", 3, "--devices", devs,
                          *extra)
        if not check(res is not None, f"{name}_runs", why):
            continue
        recs = res[0]
        check_invariants(name, recs, len(ids), 4, 3)
        rows = res[3].reshape(-1, 512)
        check_entropies(name, recs, lambda r, b: rows[r["step"] - 1])
        walk, _ = replay(recs, len(ids), ids)
        worst = ""
        for r, before in walk:
            if r["event"] == "step" and r["step"] <= 6:
                lg = engine_logits(d, before, tmp)
                err = float(np.max(np.abs(rows[r["step"] - 1] - lg)) / np.max(np.abs(lg)))
                if err > 2e-2:  # bf16 KV cache on the GPU
                    worst = worst or f"step {r['step']}: {err:.3g}"
        check(not worst, f"{name}_logits_near_cpu_fresh_run", worst)


def main():
    if not (os.path.isfile(vtest.VARENT) and os.access(vtest.VARENT, os.X_OK)):
        check(False, "agents", f"varent binary not found at {vtest.VARENT}")
        return
    tmp = vtest.tmpdir("agents")
    d = vtest.stories_dir("f32")
    for t in (lambda: test_stories(d, tmp), lambda: test_critic_reference(d, tmp),
              lambda: test_crafted_critics(d, tmp), lambda: test_lookahead(d, tmp), lambda: test_random(tmp),
              lambda: test_chat_critic(tmp), lambda: test_logit_bias(d, tmp), lambda: test_bad_inputs(d, tmp),
              lambda: test_cuda(d, tmp),
              lambda: test_interrupt(d, tmp)):
        t0 = time.time()
        t()
        if os.environ.get("AGENTS_TEST_TIMES"):
            print(f"# {time.time() - t0:.1f} s", flush=True)
    if vtest.failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)


main()
vtest.done()
