"""The whole CLI on the emulated CUDA device (build/emu/varent, docs/cuda.md): `--device
cuda` runs the real kernel sources, the device forward, graphs and the device sampler on
the CPU. Checked against the CPU backend and the published texts:
  - logits --device cuda equal --device cpu within the bf16 KV cache's tolerance on every
    tiny preset (Llama 3 with llama3 RoPE scaling, untied MHA, Qwen2, Qwen3, and head_dim
    64 / 128 ones for the tiled decode attention kernel), prefill
    (all ids at once) and decode (--chunk 1: one graph-captured step per token);
  - greedy stories260K on --device cuda gives llama2.c's published text;
  - agents --devices 0,1 (two emulated GPUs, a replica each) write a log byte-identical
    to --devices 0 (batch rows are bit-identical to single rows), and choose the same
    agents, tokens, critic verdicts and rollbacks as --devices cpu,cpu with the same
    seed (the proposals of hot agents may differ: their draws see logits that differ in
    the bf16 KV cache's last bits);
  - LEHV branches (--branch) decode on the device (session_forward_batch ->
    cuda_forward_batch) and the run logs BRANCH steps;
  - serve --device cuda answers a chat request;
  - --decode-kernel persistent gives the graph path's greedy text, with its weight ring
    and without (VARENT_CUDA_PERSIST_RING=0), with its inputs staged in shared memory and
    without (VARENT_CUDA_PERSIST_STAGE=0), and --stats reports each;
  - the scheduler on the device: batch records, compare rows and eval trials with
    --parallel 3 equal --parallel 1's, and a --parallel 3 server answers 3 requests at once as it does one at a time;
  - non-finite logits on the device (NaN weights, an overflowing norm) are an error
    naming the position, as on the CPU, for the draw and for copied logits;
  - `bench --device cuda` counts what a decode step costs the host: the kernels it
    launches (counted by hand from model/cuda/step.c's cuda_step_decode: embed and
    lm_head, then per layer qkv (attn_norm folded in), attention (RoPE and the KV store
    in its prologue, the split blocks combine themselves), wo (+ residual), gate|up
    (ffn_norm folded in, SwiGLU in its epilogue), down (+ residual) = 5 for every
    architecture, issue 16's target: a qkv bias is added in the qkv matvec's store,
    Qwen3's q/k norms run in the attention's RoPE), the graph's
    nodes (those launches and the step block's
    copy) and the host waits per token: one, the draw's (a step that brings nothing
    back does not wait). The greedy draw is armed into the step (the lm_head's argmax
    epilogue and a finishing launch, its copy back); VARENT_CUDA_GREEDY_EPILOGUE=0
    puts cuda_sample's three launches there instead, VARENT_CUDA_ARM=0 none.
  - `bench --device cuda` stops its prefill clock when the device has run the prefill:
    12 prompt tokens in chunks of 4 cost 3 host waits (each chunk waits for the one
    before, the last for the whole), armed or not (VARENT_CUDA_ARM=0), with or without
    graphs. A prefill left queued is timed as the host's queueing of its last chunk:
    the H200 window of 2026-11-28 compared such a figure (its baseline's) with a waited
    one and read a 0.57x "regression".
"""
import json
import os
import re

import numpy as np

import vtest
from vtest import check, skip, stories_dir
import gen_random_checkpoint as gen

EMU = os.path.join(os.environ.get("EMU_BUILD", os.path.join(vtest.ROOT, "build", "emu")), "varent")
TOL = 3e-2  # max|diff| / max|ref|: the device keeps K and V in bf16
PRESETS = (("llama3-tiny", "bf16", 11), ("llama-mha-untied", "f32", 12),
           ("qwen2-tiny", "bf16", 13), ("qwen3-tiny", "bf16", 14),
           # head_dim 64 and 128: the tiled decode attention kernel (Qwen3: with q/k norms fused)
           ("llama-hd64-tiny", "bf16", 15), ("qwen3-hd128-tiny", "bf16", 16))


def run(binary, *args, timeout=300):
    import subprocess
    if vtest.UNDER_ASAN:  # make test-asan: the emulated device runs several times slower
        timeout *= 3
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def logits(binary, d, ids, out, *extra):
    if os.path.exists(out):
        os.remove(out)
    r = run(binary, "logits", "-m", d, "--ids", ",".join(map(str, ids)), "--out", out, *extra)
    return (np.fromfile(out, dtype="<f4"), "") if r.returncode == 0 else (None, r.stderr.strip()[-300:])


def test_logits(tmp):
    out_cpu, out_dev = os.path.join(tmp, "cpu.f32"), os.path.join(tmp, "dev.f32")
    for preset, dtype, seed in PRESETS:
        d = os.path.join(tmp, preset)
        gen.generate(preset, d, seed=seed, dtype=dtype)
        ids = list(np.random.default_rng(seed).integers(0, 200, 17))
        for label, extra in (("prefill", ()), ("decode", ("--chunk", "1"))):
            want, why = logits(vtest.VARENT, d, ids, out_cpu, *extra)
            got, why2 = logits(EMU, d, ids, out_dev, "--device", "cuda", *extra)
            name = f"emu_logits_{preset}_{label}"
            if want is None or got is None:
                check(False, name, why or why2)
                continue
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            check(np.isfinite(got).all() and err <= TOL, name, f"max|diff|/max|ref| = {err:.3g}")


def test_stories(model):
    want = open(os.path.join(vtest.TESTDATA, "stories260K", "greedy.txt")).read()
    r = run(EMU, "run", "-m", model, "--temp", "0", "-n", "256", "--device", "cuda")
    got = r.stdout
    check(r.returncode == 0 and got.rstrip("\n") == want.rstrip("\n"), "emu_stories260K_greedy_published_text",
          f"rc {r.returncode} {r.stderr.strip()[-200:]}; got {got[:120]!r}")


def agents_log(binary, model, tmp, name, devices):
    log = os.path.join(tmp, name + ".jsonl")
    r = run(binary, "agents", "-m", model, "-p", "Once upon a time", "-n", "8", "--seed", "5", "--devices", devices,
            "--check-every", "4", "--rollback", "2", "--log", log, "--force")
    if r.returncode != 0:
        return None, r.stderr.strip()[-300:]
    return [json.loads(x) for x in open(log)], ""


def shape(recs):
    """What the agents decided, without the floating-point entropies."""
    out = []
    for r in recs:
        if r["event"] == "step":
            out.append(("step", r["chosen_agent"], r["token"]))
        elif r["event"] == "done":
            out.append(("done", r["tokens"], r["rollbacks"], r["text"]))
        else:
            out.append((r["event"], r.get("verdict"), r.get("tokens_removed")))
    return out


def test_agents(model, tmp):
    cpu, why = agents_log(vtest.VARENT, model, tmp, "cpu", "cpu,cpu")
    dev, why2 = agents_log(EMU, model, tmp, "dev", "0,1")
    one, why3 = agents_log(EMU, model, tmp, "one", "0")
    if cpu is None or dev is None or one is None:
        check(False, "emu_agents_two_devices", why or why2 or why3)
        return
    timeless = [[{k: v for k, v in r.items() if k != "tok_per_s"} for r in x] for x in (dev, one)]
    check(timeless[0] == timeless[1], "emu_agents_devices_0_1_equal_device_0",
          f"{sum(a != b for a, b in zip(*timeless))} of {len(dev)} records differ")
    same = shape(cpu) == shape(dev)
    # the metrics move by a few percent with the bf16 KV cache (docs/cuda.md)
    bad = [(a["proposals"][a["chosen_agent"]]["entropy"], b["proposals"][b["chosen_agent"]]["entropy"])
           for a, b in zip(cpu, dev) if a["event"] == "step"]
    bad = [(x, y) for x, y in bad if abs(x - y) > 1e-3 + 0.1 * abs(x)] if same else []
    check(same and not bad, "emu_agents_two_devices_match_cpu_cpu",
          f"same decisions {same}; winning entropies beyond 10%: {bad[:3]}")


def test_branches(model, tmp):
    m = os.path.join(tmp, "branch.jsonl")
    r = run(EMU, "run", "-m", model, "-p", "Once upon a time", "-n", "48", "--seed", "3", "--device", "cuda",
            "--sampler", "entropix", "--branch", "3:8", "--set", "order=LEHV", "--set", "LEHV.entropy.max=inf", "--set", "LEHV.varentropy.min=-1", "--metrics-out", m, "--force")
    quads = [json.loads(x).get("quadrant") for x in open(m)] if r.returncode == 0 else []
    check(r.returncode == 0 and "BRANCH" in quads, "emu_lehv_branches_on_device",
          f"rc {r.returncode} {r.stderr.strip()[-300:]}; quadrants {sorted(set(map(str, quads)))}")


def test_serve(model):
    import servertest
    saved = vtest.VARENT
    vtest.VARENT = EMU
    try:
        srv = servertest.Server(model, "--device", "cuda", "--ctx", "256", name="emu-serve")
    finally:
        vtest.VARENT = saved
    try:
        body = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 12, "seed": 9, "metrics": True}
        st, r = srv.post("/v1/chat/completions", body)
        c = (r.get("choices") or [{}])[0]
        check(st == 200 and isinstance(c.get("message", {}).get("content"), str) and len(c.get("metrics", [])) > 0,
              "emu_serve_chat", f"status {st}: {json.dumps(r)[:300]}")
    finally:
        srv.stop()


def step_line(d, *env):
    import subprocess
    e = dict(os.environ)
    e.update(env)
    args = ["bench", "-m", d, "--device", "cuda", "-n", 4, "--prompt-len", 5, "--runs", 1, "--sampler", "none"]
    r = subprocess.run([EMU, *map(str, args)], capture_output=True, text=True, timeout=300, env=e)
    for line in r.stdout.splitlines():
        m = re.match(r"decode step (\d+) kernel launches .*, (\d+) graph nodes, ([\d.]+) host syncs per token", line)
        if m:
            return int(m.group(1)), int(m.group(2)), float(m.group(3)), line
    return None, None, None, (r.stdout + r.stderr).strip()[-300:]


def test_step_counts(tmp):
    # (preset, launches per layer)
    for preset, per_layer in (("llama3-tiny", 5), ("qwen2-tiny", 5), ("qwen3-tiny", 5)):
        d = os.path.join(tmp, preset)
        layers = json.load(open(os.path.join(d, "config.json")))["num_hidden_layers"]
        want = 2 + per_layer * layers
        launches, nodes, syncs, line = step_line(d)
        name = f"emu_bench_step_{preset}"
        if launches is None:
            check(False, name, line)
            continue
        # bench arms each greedy step as `varent run` does: the lm_head's argmax epilogue
        # and one finishing launch; its graph has the step block's copy and the draw's copy back
        check(launches == want + 1 and nodes == launches + 2 and syncs == 1.0, name,
              f"{line!r}: want {want + 1} launches, {want + 3} graph nodes, 1.00 host syncs per token")
        launches, nodes, syncs, line = step_line(d, ("VARENT_CUDA_GREEDY_EPILOGUE", "0"))
        check(launches == want + 3 and nodes == want + 7 and syncs == 1.0, f"{name}_cuda_sample_draw",
              f"{line!r}: want {want + 3} launches, {want + 7} graph nodes (cuda_sample's draw in the graph)")
        launches, nodes, syncs, line = step_line(d, ("VARENT_CUDA_ARM", "0"))
        check(launches == want and nodes == launches + 1 and syncs == 1.0, f"{name}_unarmed",
              f"{line!r}: want {want} launches, {want + 1} graph nodes, 1.00 host syncs per token")
        launches, nodes, syncs, line = step_line(d, ("VARENT_CUDA_GRAPHS", "0"))
        check(launches == want and nodes == 0 and syncs == 1.0, f"{name}_no_graph",
              f"{line!r}: want {want} launches, 0 graph nodes")
    test_bench_persistent(os.path.join(tmp, "llama3-tiny"))
    test_sampler_syncs(os.path.join(tmp, "llama3-tiny"))
    test_prefill_waits(os.path.join(tmp, "llama3-tiny"))


def test_bench_persistent(d):
    """bench --decode-kernel persistent says how many steps ran persistent and how many fell
    back (the GPU window's A/B variants and its 8B row read it): one launch a greedy step,
    every decode step of its run persistent, none on the graph path."""
    import subprocess
    e = {k: v for k, v in os.environ.items() if not k.startswith("VARENT_CUDA_PERSIST_")}
    e["VARENT_CUDA_PERSIST_GRID"] = "4"
    args = ["bench", "-m", d, "--device", "cuda", "-n", 4, "--prompt-len", 5, "--runs", 1, "--sampler", "none",
            "--decode-kernel", "persistent"]
    r = subprocess.run([EMU, *map(str, args)], capture_output=True, text=True, timeout=300, env=e)
    m = re.search(r"^decode kernel: persistent, (\d+) steps \(weight ring \d+ KiB a block, inputs staged up to \d+ "
                  r"floats\); (\d+) on the graph path instead \(all runs\)$", r.stdout, re.M)
    step = re.search(r"^decode step (\d+) kernel launches", r.stdout, re.M)
    ok = r.returncode == 0 and m is not None and int(m.group(1)) >= 3 and m.group(2) == "0" and step is not None \
        and step.group(1) == "1"
    check(ok, "emu_bench_persistent_says_its_steps", (r.stdout + r.stderr).strip()[-600:])


PREFILL_LINE = re.compile(r"prefill\s+(\d+) tokens: [\d.]+ tok/s \(median of \d+(?:; to the device's finish, "
                          r"(\d+) host syncs|(; the device not waited for))")


def test_prefill_waits(d):
    import subprocess
    args = ["bench", "-m", d, "--device", "cuda", "-b", 4, "--prompt-len", 12, "-n", 2, "--runs", 1, "--sampler",
            "none"]
    for env in ((), (("VARENT_CUDA_ARM", "0"),), (("VARENT_CUDA_GRAPHS", "0"),), (("VARENT_BENCH_PREFILL_WAIT", "0"),)):
        e = dict(os.environ)
        e.update(env)
        r = subprocess.run([EMU, *map(str, args)], capture_output=True, text=True, timeout=300, env=e)
        m = next(filter(None, map(PREFILL_LINE.match, r.stdout.splitlines())), None)
        name = "emu_bench_prefill_" + ("_".join(f"{k}_{v}" for k, v in env).lower() or "waited")
        why = f"{env}: " + (m.group(0) if m else (r.stdout + r.stderr).strip()[-300:])
        if env and env[0][0] == "VARENT_BENCH_PREFILL_WAIT":
            check(r.returncode == 0 and m is not None and m.group(3) is not None, name, why)
        else:
            check(r.returncode == 0 and m is not None and m.group(2) == "3", name, f"want 3 host syncs; {why}")


SAMPLER_LINE = re.compile(r"sampler\s+(\S+)\s.*, ([\d.]+) host syncs per token, decode step (\d+) kernel launches, "
                          r"(\d+) graph nodes, (\d+) graph captures")


def sampler_lines(d, *env, lookahead=0):
    """{sampler: (syncs per token, launches, graph nodes, captures)} of a 16-token bench
    (lookahead 0: generate()'s per-token loop)."""
    import subprocess
    e = dict(os.environ)
    e.update(env)
    args = ["bench", "-m", d, "--device", "cuda", "-n", 16, "--prompt-len", 5, "--runs", 1, "--sampler",
            "standard,entropix", "--lookahead", lookahead]
    r = subprocess.run([EMU, *map(str, args)], capture_output=True, text=True, timeout=600, env=e)
    got = {m.group(1): (float(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)))
           for m in map(SAMPLER_LINE.search, r.stdout.splitlines()) if m}
    return got, (r.stdout + r.stderr).strip()[-300:]


def test_sampler_syncs(d):
    """A token costs one host round trip under either sampler: the step's graph holds its
    draws (model/cuda/arm.c), entropix's decided on the device after the
    statistics. 16 tokens and the prompt's step: at most 17 waits (entropix without
    arming: 2.00). The armed graph is the plain step's plus the draws: the block's copy
    up, 3 sampler kernels, the configurations and draws copied back (+6 nodes, +3
    launches), and entropix's decision kernel (+7, +4); it is captured once per run, not
    per token."""
    plain, plain_nodes, _, _ = step_line(d, ("VARENT_CUDA_ARM", "0"))  # the greedy step, its draw not armed
    got, why = sampler_lines(d)
    off, why2 = sampler_lines(d, ("VARENT_CUDA_ARM", "0"))
    for name in ("standard", "entropix"):
        check(name in got and got[name][0] <= 17 / 16 + 1e-9, f"emu_bench_{name}_one_sync_per_token", f"{got}: {why}")
    if "standard" in got and plain is not None:
        _, launches, nodes, _ = got["standard"]
        check(launches == plain + 3 and nodes == plain_nodes + 6, "emu_bench_standard_draw_in_graph",
              f"armed step {launches} launches {nodes} nodes; plain step {plain} launches {plain_nodes} nodes")
    if "entropix" in got and "entropix" in off:
        _, launches, nodes, captures = got["entropix"]
        _, off_launches, off_nodes, _ = off["entropix"]
        check(launches == off_launches + 4 and nodes == off_nodes + 7, "emu_bench_entropix_draw_in_graph",
              f"armed step {launches} launches {nodes} nodes; unarmed {off_launches} launches {off_nodes} nodes")
        check(captures == 1, "emu_bench_entropix_armed_graph_captured_once", f"{captures} captures in 16 tokens")
        check(off["entropix"][0] > 17 / 16, "emu_bench_entropix_unarmed_two_syncs", f"{off}: {why2}")
    else:
        check(False, "emu_bench_entropix_draw_in_graph", f"{got} {off}: {why} {why2}")
    # the device decode loop (the default --lookahead 8): the prompt's wait, then one per 4
    # of the 15 tokens after the first: 5 waits in 16 tokens (printed 0.31); entropix stays
    # per token
    loop, why3 = sampler_lines(d, lookahead=8)
    check("standard" in loop and abs(loop["standard"][0] - 5 / 16) < 0.006 and "entropix" in loop and
          loop["entropix"][0] <= 17 / 16 + 1e-9, "emu_bench_device_loop_syncs", f"{loop}: {why3}")


def test_armed_draws(model):
    """Draws made inside the step's graph (armed) are the draws made after it, to the
    bit: the same text with arming on and off (VARENT_CUDA_ARM=0), and most draws armed
    (the per-token loop: --lookahead 0); and the device decode loop's text is the same."""
    import subprocess
    sets = (("temp1", ["--temp", "1.0"]), ("temp07_top_p09", ["--temp", "0.7", "--top-p", "0.9"]),
            ("entropix", ["--sampler", "entropix"]))
    if vtest.UNDER_ASAN:
        # make test-asan: one sampler takes the armed, unarmed and device-loop paths; make
        # test runs the other two (about 30 s of CI's emulated time each under ASan)
        for name, _ in sets[:1] + sets[2:]:
            skip(f"emu_armed_draws_equal_unarmed_{name}", "under ASan (make test runs it)")
        sets = sets[1:2]
    for name, flags in sets:
        out = {}
        for arm in ("1", "0", "loop"):
            e = dict(os.environ, VARENT_CUDA_ARM="1" if arm == "loop" else arm)
            args = ["run", "-m", model, "-p", "Once upon a time", "-n", 40, "--seed", 11, "--device", "cuda",
                    "--stats", "--ignore-eos", "--lookahead", 8 if arm == "loop" else 0, *flags]
            r = subprocess.run([EMU, *map(str, args)], capture_output=True, text=True, timeout=300, env=e)
            m = re.search(r"device draws: (\d+) armed", r.stderr)
            out[arm] = (r.returncode, r.stdout, int(m.group(1)) if m else -1, r.stderr.strip()[-300:])
        on, off, loop = out["1"], out["0"], out["loop"]
        ok = on[0] == 0 and off[0] == 0 and on[1] == off[1] and on[2] >= 20 and off[2] == 0
        check(ok, f"emu_armed_draws_equal_unarmed_{name}",
              f"rc {on[0]}/{off[0]}, same text {on[1] == off[1]}, armed draws {on[2]}/{off[2]}: {on[3]} {off[3]}")
        on_device = name != "entropix"  # entropix decides on the host: the per-token loop, with the reason
        said = "decode loop: on the device" if on_device else "decode loop: per token on the host: the entropix"
        check(loop[0] == 0 and loop[1] == on[1] and said in loop[3], f"emu_device_loop_text_equal_{name}",
              f"rc {loop[0]}, same text {loop[1] == on[1]}: {loop[3]}")


def test_persistent(model, tmp):
    """--decode-kernel persistent from the CLI: greedy stories260K gives the graph path's
    text, --stats reports the steps, the weight ring (as large as fits, or none with
    VARENT_CUDA_PERSIST_RING=0, the same text) and the staged inputs (none with
    VARENT_CUDA_PERSIST_STAGE=0, the same text; the ring for a warp's first unit only with
    VARENT_CUDA_PERSIST_AHEAD=0, the same text); the 4-blocks-an-SM instance with a pause
    between counter polls gives it too; --decode-kernel auto gives it and --stats says
    which kernel it chose, from what medians; an unknown decode kernel is an error;
    VARENT_CUDA_PERSIST_TRACE gives the same text and
    writes the last step's phase trace (every phase of the 4 blocks); a bad
    VARENT_CUDA_PERSIST_RING, _BLOCKS, _GRID, _STAGE or _AHEAD is an error naming it, and
    a trace path that cannot be written an error naming the path, before any text."""
    import subprocess
    base = ["run", "-m", model, "-p", "Once upon a time", "-n", 24, "--temp", 0, "--device", "cuda", "--stats",
            "--ignore-eos"]
    trace = os.path.join(tmp, "persist-trace.tsv")
    if os.path.exists(trace):
        os.remove(trace)
    out = {}
    runs = (("graph", {}, "graph"), ("ring", {}, "persistent"), ("noring", {"RING": "0"}, "persistent"),
            ("blocks4", {"BLOCKS": "4", "SLEEP": "50"}, "persistent"), ("bad", {"RING": "12kb"}, "persistent"),
            ("bad_blocks", {"BLOCKS": "5"}, "persistent"), ("bad_grid", {"GRID": "+4"}, "persistent"),
            ("nostage", {"STAGE": "0"}, "persistent"), ("bad_stage", {"STAGE": "2"}, "persistent"),
            ("noahead", {"AHEAD": "0"}, "persistent"), ("bad_ahead", {"AHEAD": "x"}, "persistent"),
            ("trace", {"TRACE": trace}, "persistent"), ("auto", {}, "auto"), ("bad_kernel", {}, "fast"),
            ("bad_trace", {"TRACE": os.path.join(tmp, "no-such-dir", "t.tsv")}, "persistent"))
    for name, env, kernel in runs:
        e = {k: v for k, v in os.environ.items() if not k.startswith("VARENT_CUDA_PERSIST_")}
        e["VARENT_CUDA_PERSIST_GRID"] = "4"  # (bad_grid sets its own)
        e.update({"VARENT_CUDA_PERSIST_" + k: v for k, v in env.items()})
        r = subprocess.run([EMU, *map(str, base), "--decode-kernel", kernel], capture_output=True, text=True,
                           timeout=300 * (3 if vtest.UNDER_ASAN else 1), env=e)
        m = re.search(r"decode kernel: persistent, (\d+) steps \(weight ring (\d+) KiB a block, inputs staged up to "
                      r"(\d+) floats\); (\d+) on the graph", r.stderr)
        stats = tuple(int(x) for x in m.groups()) if m else None
        out[name] = (r.returncode, r.stdout, stats, r.stderr.strip()[-700:])
    g, on = out["graph"], out["ring"]
    ok = g[0] == 0 and on[0] == 0 and on[1] == g[1] and on[2] is not None and on[2][0] >= 20 and on[2][1] > 0 \
        and on[2][2] >= 172 and on[2][3] == 0
    check(ok, "emu_persistent_text_equal_graph_with_ring_and_staging", f"rc {g[0]}/{on[0]}, same text {on[1] == g[1]}, "
          f"(steps, ring KiB, staged floats, fallbacks) {on[2]}: {on[3]}")
    # (run, check, what its --stats line must also say: (steps, ring KiB, staged floats, fallbacks))
    for key, name, stats in (("nostage", "emu_persistent_text_equal_graph_without_staging", lambda s: s[2] == 0),
                             ("noahead", "emu_persistent_text_equal_graph_ring_not_ahead", lambda s: s[2] > 0),
                             ("noring", "emu_persistent_text_equal_graph_without_ring", lambda s: s[1] == 0),
                             ("blocks4", "emu_persistent_4_blocks_with_sleep_text_equal_graph", lambda s: s[1] > 0),
                             ("trace", "emu_persistent_traced_text_equal_graph", lambda s: s[3] == 0)):
        r = out[key]
        ok = r[0] == 0 and r[1] == g[1] and r[2] is not None and r[2][0] >= 20 and stats(r[2])
        check(ok, name, f"rc {r[0]}, same text {r[1] == g[1]}, {r[2]}: {r[3]}")
    # auto: the graph path's text, and --stats says which kernel it chose over how many timed
    # steps (stories260K's 24 tokens: the choice comes at the 8th one-row step)
    r = out["auto"]
    m = re.search(r"decode kernel: auto, chose the (graph path|persistent kernel) \(median step ([0-9.]+) ms on the "
                  r"graph path, ([0-9.]+) ms on the persistent kernel, 3 timed steps each\); (\d+) steps ran "
                  r"persistent, 0 fell back", r[3])
    ok = r[0] == 0 and r[1] == g[1] and m is not None and float(m.group(2)) > 0 and float(m.group(3)) > 0 and \
        int(m.group(4)) >= 4 and "decode kernel: persistent," not in r[3]
    check(ok, "emu_decode_kernel_auto_text_equal_graph_and_says_its_choice", f"rc {r[0]}, same text {r[1] == g[1]}: "
          f"{r[3]}")
    r = out["bad_kernel"]
    check(r[0] != 0 and "--decode-kernel fast: graph, persistent or auto" in r[3] and not r[1],
          "emu_decode_kernel_bad_value_is_an_error", f"rc {r[0]}: {r[3]}")
    # a bad value: an error naming the variable, and no text (GRID: digits only, a sign is
    # refused as a space would be)
    for key, name, says in (("bad", "ring", "VARENT_CUDA_PERSIST_RING=12kb: KiB of shared memory a block"),
                            ("bad_blocks", "blocks", "VARENT_CUDA_PERSIST_BLOCKS=5: blocks an SM, 3 to 4"),
                            ("bad_grid", "grid", "VARENT_CUDA_PERSIST_GRID=+4: blocks (0: as many as fit)"),
                            ("bad_stage", "stage",
                             "VARENT_CUDA_PERSIST_STAGE=2: stage inputs in shared memory (0: no, 1: yes), 0 to 1"),
                            ("bad_ahead", "ahead",
                             "VARENT_CUDA_PERSIST_AHEAD=x: fill the ring a unit ahead (0: no, 1: yes), 0 to 1")):
        r = out[key]
        check(r[0] != 0 and says in r[3] and not r[1], f"emu_persistent_bad_{name}_is_an_error", f"rc {r[0]}: {r[3]}")
    # the trace: a header for stories260K's 5 layers on 4 blocks, and a row per phase and block
    rows = open(trace).read().splitlines() if os.path.exists(trace) else []
    want = 4 * (5 * 5 + 2)
    ok = rows[:1] == ["# varent persist-trace 1: grid 4, layers 5, phases 27"] and len(rows) == 2 + want
    check(ok, "emu_persistent_trace_written", f"{len(rows)} lines (want {2 + want}): {rows[:2]}")
    r = out["bad_trace"]
    says = "persistent kernel trace: cannot write " + os.path.join(tmp, "no-such-dir", "t.tsv")
    check(r[0] != 0 and says in r[3] and not r[1], "emu_persistent_bad_trace_is_an_error", f"rc {r[0]}: {r[3]}")


def test_nonfinite(model, tmp):
    import shutil
    for name, tensor, value in (("nan", "model.layers.1.mlp.down_proj.weight", float("nan")),
                                ("huge", "model.norm.weight", 3e38)):
        d = os.path.join(tmp, "poisoned-" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(model, d)
        vtest.poison_tensor(d, tensor, value)
        for sname, flags in (("default", []), ("greedy", ["--temp", "0"]), ("min_p", ["--min-p", "0.1"])):
            r = run(EMU, "run", "-m", d, "-p", "Once upon a time", "-n", 4, "--seed", 7, "--device", "cuda", *flags)
            ok = r.returncode == 1 and "non-finite logits at position" in r.stderr and "CUDA device" in r.stderr
            check(ok, f"emu_nonfinite_{name}_{sname}", f"rc {r.returncode}: {r.stderr.strip()[-300:]}")
        out = os.path.join(tmp, f"poisoned-{name}.f32")
        r = run(EMU, "logits", "-m", d, "--ids", "1,403,407", "--out", out, "--device", "cuda")
        ok = r.returncode == 1 and "non-finite logits at position 2" in r.stderr and not os.path.exists(out)
        check(ok, f"emu_nonfinite_{name}_logits", f"rc {r.returncode}: {r.stderr.strip()[-300:]}")


def test_parallel(model, tmp):
    """The scheduler on the device: a batch run's records, compare's rows and eval's trials with
    3 sequences at a time equal one at a time; a --parallel 3 server answers 3 requests sent at once as each alone."""
    import threading
    import servertest
    path = os.path.join(tmp, "prompts.txt")
    with open(path, "w") as f:
        f.write("Once upon a time\nLily saw a big dog\nThe sun was hot\nOnce upon a time\n")
    recs = []
    for p in ("1", "3"):
        r = run(EMU, "run", "-m", model, "--prompts", path, "-n", "10", "--seed", "4", "--device", "cuda", "--ctx", "128",
                "--sampler", "entropix", "--parallel", p, "-q")
        recs.append([{k: v for k, v in json.loads(x).items() if k != "tok_per_s"} for x in r.stdout.splitlines()]
                    if r.returncode == 0 else r.stderr.strip()[-300:])
    check(isinstance(recs[0], list) and len(recs[0]) == 4 and recs[0] == recs[1], "emu_batch_parallel_same_records",
          str(recs)[:400])
    rows = []
    for p in ("1", "3"):
        r = run(EMU, "compare", "-m", model, "--prompts", path, "-n", "8", "--seed", "4", "--device", "cuda", "--ctx",
                "128", "--samplers", "standard,entropix", "--format", "jsonl", "--parallel", p, "-q")
        rows.append([{k: v for k, v in json.loads(x).items() if k != "tok_per_s"} for x in r.stdout.splitlines()]
                    if r.returncode == 0 else r.stderr.strip()[-300:])
    check(isinstance(rows[0], list) and len(rows[0]) == 8 and rows[0] == rows[1], "emu_compare_parallel_same_rows",
          str(rows)[:400])
    trials = []
    for p in ("1", "3"):
        out = os.path.join(tmp, f"eval{p}.jsonl")
        r = run(EMU, "eval", "-m", model, "--tasks", "add2", "--items", "2", "--repeats", "2", "--samplers",
                "greedy,standard", "-n", "6", "--device", "cuda", "--ctx", "128", "-o", out, "--parallel", p, "-q")
        trials.append([{k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in open(out)]
                      if r.returncode == 0 else r.stderr.strip()[-300:])
    check(isinstance(trials[0], list) and len(trials[0]) == 8 and trials[0] == trials[1], "emu_eval_parallel_same_trials",
          str(trials)[:400])
    bodies = [{"prompt": t, "max_tokens": 8, "seed": 7 + i, "logprobs": 2} for i, t in
              enumerate(("Once upon a time", "Lily saw", "The sun was hot"))]
    got = {}
    saved = vtest.VARENT
    vtest.VARENT = EMU
    try:
        for par in (1, 3):
            srv = servertest.Server(model, "--device", "cuda", "--ctx", "128", "--parallel", par, name=f"emu-par{par}")
            res = [None] * 3

            def one(i):
                res[i] = srv.post("/v1/completions", bodies[i], timeout=600)
            ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
            for t in ts:
                t.start()
                if par == 1:
                    t.join()
            for t in ts:
                t.join()
            srv.stop()
            got[par] = [(st, r.get("choices")) for st, r in res]
    finally:
        vtest.VARENT = saved
    check(all(st == 200 for st, _ in got[1]) and got[1] == got[3], "emu_serve_parallel_same_responses",
          str(got)[:400])


def main():
    if not os.access(EMU, os.X_OK):
        check(False, "emu_cli", f"no emulated build at {EMU} (make emu)")
        vtest.done()
    tmp = vtest.tmpdir("emu-cli")
    model = stories_dir("f32")
    test_logits(tmp)
    test_step_counts(tmp)
    test_stories(model)
    test_armed_draws(model)
    test_persistent(model, tmp)
    if vtest.UNDER_ASAN:
        # make test-asan: the emulated device under ASan took over 10 minutes for one of the
        # agents' runs on the 2-core machine; make test runs these two without ASan
        skip("emu_agents_two_devices", "under ASan (make test runs it)")
        skip("emu_parallel", "under ASan (make test runs it)")
    else:
        test_agents(model, tmp)
    test_branches(model, tmp)
    test_serve(model)
    if not vtest.UNDER_ASAN:
        test_parallel(model, tmp)
    test_nonfinite(model, tmp)
    vtest.done()


if __name__ == "__main__":
    main()
