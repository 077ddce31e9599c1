"""The server on the scheduler (host/serve/engine.c), on stories260K.

  - batching changes no byte: 12 requests (completions and chat, standard, greedy and
    entropix, n = 2 choices, logprobs with alternatives, stop strings, echo, logit bias)
    sent all at once to a --parallel 6 server give the same choices (text, logprobs,
    metrics, finish reasons) and usage as each sent alone to a --parallel 1 server;
    streamed ones the same text;
  - /metrics is Prometheus text with the running and queued sequences, the KV pool, the
    prefix cache and the tokens; a repeated prompt shows up as reused positions;
  - a full queue answers 503 with Retry-After, and the server goes on;
  - 64 concurrent streams against a small pool (--kv-pool-tokens) and a short queue:
    every request ends with 200 or 503, none hangs, the server stays up and idle after.
"""
import json
import re
import threading

import servertest
import vtest
from vtest import check, stories_dir

model = stories_dir("f32")


def requests():
    out = []
    prompts = ["Once upon a time", "Lily saw a big dog", "The sun was hot and", "Tom had a red ball"]
    for i in range(12):
        body = {"prompt": prompts[i % 4], "max_tokens": 12 + i, "seed": 100 + i, "temperature": 0.8}
        if i % 3 == 1:
            body["sampler"] = "entropix"
        if i % 4 == 2:
            body["temperature"] = 0
        if i % 5 == 0:
            body.update(n=2, logprobs=3)
        if i == 3:
            body["stop"] = [" the", "."]
        if i == 4:
            body.update(echo=True, logprobs=2)
        if i == 6:
            body["logit_bias"] = {"5": 2.0, "9": -1.5}
        path = "/v1/completions"
        if i in (7, 9):
            path = "/v1/chat/completions"
            body = {"messages": [{"role": "user", "content": prompts[i % 4]}], "max_tokens": 10, "seed": 5 + i,
                    "logprobs": i == 9, "top_logprobs": 2 if i == 9 else 0}
        out.append((path, body))
    return out


def strip(resp):
    """The parts of a response that batching must not change."""
    return {"choices": resp.get("choices"), "usage": resp.get("usage"), "seed": resp.get("seed")}


def run_all(srv, reqs, together):
    got = [None] * len(reqs)

    def one(i):
        got[i] = srv.post(reqs[i][0], reqs[i][1], timeout=300)
    if together:
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        for i in range(len(reqs)):
            one(i)
    return got


def metrics(srv):
    status, headers, data = srv.request("GET", "/metrics")
    vals = {}
    for ln in data.decode().splitlines():
        m = re.match(r"^varent_(\w+) (\S+)$", ln)
        if m:
            vals[m.group(1)] = float(m.group(2))
    return status, headers.get("content-type", ""), vals


reqs = requests()
one = servertest.Server(model, "--parallel", 1, "-t", 1, name="batch-one")
want = run_all(one, reqs, False)
one.stop()
many = servertest.Server(model, "--parallel", 6, name="batch-many")
got = run_all(many, reqs, True)
bad = [i for i in range(len(reqs)) if got[i][0] != 200 or want[i][0] != 200 or strip(got[i][1]) != strip(want[i][1])]
check(not bad, "batched_responses_equal_one_by_one",
      f"requests {bad}: {str(got[bad[0]])[:300]} vs {str(want[bad[0]])[:300]}" if bad else "")

# streamed: the same texts, every choice (n = 2 interleaves its choices' events)
body = dict(reqs[0][1], stream=True)
outs = [None] * 4


def streamed(i):
    outs[i] = many.stream("/v1/completions", body, timeout=300)


ts = [threading.Thread(target=streamed, args=(i,)) for i in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
texts = [[servertest.stream_text(o[2], index=k) for k in range(2)] for o in outs]
check(all(o[0] == 200 and o[3] for o in outs) and all(t == [c["text"] for c in want[0][1]["choices"]] for t in texts),
      "batched_streams_equal_one_by_one", str(texts[0])[:200])

status, ctype, m = metrics(many)
check(status == 200 and ctype.startswith("text/plain") and m.get("sequences_running") == 0 and
      m.get("sequences_queued") == 0 and m.get("kv_pool_blocks", 0) > 0 and m.get("generation_tokens_total", 0) > 100,
      "metrics_prometheus_text", str(m)[:400])
check(m.get("prefix_cache_hit_tokens_total", 0) > 0 and 0 < m.get("prefix_cache_hit_rate", 0) <= 1,
      "metrics_prefix_reuse", str(m)[:400])
status, _, data = many.request("GET", "/metrics")
text = data.decode()
check("# TYPE varent_tokens_per_second gauge" in text and "# HELP varent_kv_pool_usage_ratio" in text,
      "metrics_help_and_type", text[:300])
many.stop()

# a full queue: 503 with Retry-After, then the server goes on
busy = servertest.Server(model, "--parallel", 1, "--max-queue", 0, "--token-delay-ms", 30, "-t", 1, name="batch-busy")
res = [None] * 6


def slow(i):
    res[i] = busy.request("POST", "/v1/completions", {"prompt": "Once", "max_tokens": 20, "seed": i}, timeout=120)


ts = [threading.Thread(target=slow, args=(i,)) for i in range(6)]
for t in ts:
    t.start()
for t in ts:
    t.join()
codes = [r[0] for r in res]
full = [r for r in res if r[0] == 503]
check(200 in codes and full and all(r[1].get("retry-after") == "1" and b"queue_full" in r[2] for r in full),
      "full_queue_503_retry_after", str(codes))
status, r = busy.post("/v1/completions", {"prompt": "Once", "max_tokens": 3})
check(status == 200, "serves_after_503", str(r)[:200])
busy.stop()

# 64 streams against a small pool and a short queue
load = servertest.Server(model, "--parallel", 8, "--kv-pool-tokens", 512, "--max-queue", 24, name="batch-load")
res = [None] * 64


def stream_one(i):
    try:
        res[i] = load.stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24 + i % 16, "seed": i,
                                                   "stream": True},
                             timeout=600)
    except Exception as e:  # noqa: BLE001 (a hung or broken stream is the failure reported)
        res[i] = (repr(e), "", [], False)


ts = [threading.Thread(target=stream_one, args=(i,)) for i in range(64)]
for t in ts:
    t.start()
for t in ts:
    t.join(700)
codes = [r[0] if r else None for r in res]
ok = all(c in (200, 503) for c in codes) and all(r[3] for r in res if r and r[0] == 200)
check(ok and codes.count(200) >= 8, "64_streams_end_200_or_503", str(codes))
h = load.health()
status, _, m = metrics(load)
check(h.get("status") == "ok" and m.get("sequences_running") == 0 and m.get("kv_pool_blocks_used", 1) <=
      m.get("kv_pool_blocks", 0), "64_streams_server_up_and_idle", f"{h} {m}"[:400])
check(load.stop() == 0, "64_streams_clean_exit")

vtest.done()
