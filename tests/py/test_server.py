"""`varent serve` end to end on stories260K, over real HTTP on a loopback port.

  - every route, plain and streamed: /health, /v1/models, /v1/profiles, /, completions,
    chat completions (n, stop, logprobs, usage, per-token metrics);
  - a non-streamed completion's text equals `varent run` with the same seed and
    parameters (standard and entropix), an independent path through the CLI;
  - per-token metrics and logprobs equal the numpy reference (ref_model, ref_metrics);
  - every error path gets the right 4xx and an OpenAI-style error body;
  - 8 concurrent clients on 2 slots each get exactly their sequential result;
  - a client that disconnects mid-stream (or while waiting) frees its slot, the server
    stays up and serves the next request;
  - SIGTERM lets in-flight requests finish, then exits 0; SIGINT exits 0.
"""
import json
import math
import os
import signal
import socket
import threading
import time

import numpy as np

import vtest
from vtest import check
import servertest
from servertest import Server, completion_text, stream_text
import ref_metrics
import ref_model

PROMPT = "Once upon a time, there was a little girl"
KEYS = ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength")


def close(a, b, rtol=1e-3, atol=1e-4):
    return abs(a - b) <= atol + rtol * abs(b)


def error_shape(body):
    e = body.get("error") if isinstance(body, dict) else None
    return isinstance(e, dict) and set(e) == {"message", "type", "param", "code"} and isinstance(e["message"], str) \
        and e["message"] != ""


def first_piece_has_space(model, token):
    """Whether a token's vocab piece starts with the metaspace (read from tokenizer.json)."""
    with open(os.path.join(model, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    return next((p for p, i in vocab.items() if i == token), "").startswith("\u2581")


def same_as_run(model, got, want, first_token):
    """`varent run` starts its output fresh, so a leading metaspace is stripped there; a
    completion continues its prompt and keeps it (" named" after "... a cat")."""
    if want is None or got is None:
        return False
    return got == (" " + want if first_piece_has_space(model, first_token) else want)


def run_cli(model, n, seed, *extra):
    r = vtest.varent("run", "-m", model, "-p", PROMPT, "-n", n, "--seed", seed, "-t", 1, *extra, timeout=60)
    return r.stdout[:-1] if r.returncode == 0 and r.stdout.endswith("\n") else None


def test_get_routes(srv, model):
    st, h = srv.json("GET", "/health")
    check(st == 200 and h["status"] == "ok" and h["slots"] == 2 and h["slots_busy"] == 0, "health", f"{st} {h}")
    st, m = srv.json("GET", "/v1/models")
    name = os.path.basename(model)
    check(st == 200 and m["object"] == "list" and len(m["data"]) == 1 and m["data"][0]["id"] == name
          and m["data"][0]["object"] == "model", "models_list", f"{st} {m}")
    st, m = srv.json("GET", "/v1/models/" + name)
    check(st == 200 and m["id"] == name, "models_get", f"{st} {m}")
    st, m = srv.json("GET", "/v1/models/nope")
    check(st == 404 and error_shape(m) and m["error"]["code"] == "model_not_found", "models_get_unknown", f"{st} {m}")
    st, p = srv.json("GET", "/v1/profiles")
    prof = {x["name"]: x for x in p.get("data", [])}
    seed = prof.get("seed", {}).get("quadrants", {})
    check(st == 200 and set(prof) == {"seed", "jax", "frog"} and seed["LELV"]["entropy"] == {"min": None, "max": 0.1}
          and seed["HEHV"]["varentropy"] == {"min": 5, "max": None} and prof["seed"]["order"][:2] == ["LELV", "LEHV"],
          "profiles", f"{st} {str(p)[:300]}")
    st, h, page = srv.request("GET", "/")
    html = page.decode("utf-8", "replace")
    external = [u for u in ("src=\"http", "href=\"http", "@import", "url(http", "src='http") if u in html]
    check(st == 200 and h["content-type"].startswith("text/html") and "id=\"prompt\"" in html
          and not external, "index_page_offline", f"{st} external refs {external}")


def test_completion_matches_cli(srv, model):
    for sampler, extra, params in (
            ("standard", ("--temp", 0.8, "--top-k", 40, "--top-p", 0.95),
             {"temperature": 0.8, "top_k": 40, "top_p": 0.95}),
            ("standard-minp", ("--temp", 1.2, "--min-p", 0.05), {"temperature": 1.2, "min_p": 0.05}),
            ("greedy", ("--temp", 0), {"temperature": 0}),
            ("entropix", ("--sampler", "entropix", "--profile", "seed"), {"sampler": "entropix", "profile": "seed"}),
            ("entropix-jax", ("--sampler", "entropix", "--profile", "jax"), {"sampler": "entropix", "profile": "jax"})):
        want = run_cli(model, 60, 7, *extra)
        st, r = srv.post("/v1/completions", dict(prompt=PROMPT, max_tokens=60, seed=7, metrics=True, **params))
        got = completion_text(r) if st == 200 else None
        first = r["choices"][0]["metrics"][0]["token"] if st == 200 else -1
        check(same_as_run(model, got, want, first), f"completion_equals_varent_run_{sampler}",
              f"server {got!r} vs run {want!r}")


def test_completion_shape(srv):
    st, r = srv.post("/v1/completions", {"model": srv.model, "prompt": PROMPT, "max_tokens": 12, "seed": 3, "metrics": True})
    c = r.get("choices", [{}])[0]
    u = r.get("usage", {})
    ok = st == 200 and r["object"] == "text_completion" and r["id"].startswith("cmpl-") and r["model"] == srv.model \
        and isinstance(r["created"], int) and c["index"] == 0 and c["finish_reason"] in ("length", "stop") \
        and c["logprobs"] is None and len(c["metrics"]) == u["completion_tokens"] \
        and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    check(ok, "completion_shape", json.dumps(r)[:400])
    ids = json.loads(vtest.varent("tokenize", "-m", srv.model_dir, PROMPT).stdout)
    check(st == 200 and u["prompt_tokens"] == len(ids) + 1, "usage_prompt_tokens_bos_plus_tokenize",
          f"{u} vs {len(ids)} ids + BOS")
    check(st == 200 and (u["completion_tokens"] == 12 or c["finish_reason"] == "stop"), "completion_max_tokens",
          str(u))
    check(st == 200 and r.get("seed") == 3, "completion_reports_given_seed", str(r.get("seed")))


def test_default_seed(srv):
    # Without a seed each request draws one from the OS (not the clock: two requests in the
    # same second used to share one), reports it, and that seed reproduces the text.
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0}
    got = [srv.post("/v1/completions", body) for _ in range(3)]
    seeds = [r.get("seed") for st, r in got if st == 200]
    check(len(seeds) == 3 and all(isinstance(x, int) and 0 <= x < 2 ** 53 for x in seeds) and len(set(seeds)) == 3,
          "default_seed_fresh_per_request", f"{seeds}")
    if seeds:
        st, again = srv.post("/v1/completions", dict(body, seed=seeds[0]))
        check(st == 200 and completion_text(again) == completion_text(got[0][1]), "default_seed_reproduces",
              f"{completion_text(again)!r} vs {completion_text(got[0][1])!r}")


def test_metrics_and_logprobs_vs_reference(srv, model):
    ids = [1, 403, 407, 261, 378, 284, 315]  # BOS + token ids of a story opening
    st, r = srv.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "seed": 11, "logprobs": 3,
                                         "temperature": 0.9, "metrics": True})
    if not check(st == 200, "ids_prompt", str(r)[:300]):
        return
    c = r["choices"][0]
    ms, lp = c["metrics"], c["logprobs"]
    gen = [m["token"] for m in ms]
    seq = ids + gen
    model = ref_model.Model(model)
    logits = ref_model.forward(model, seq)
    ref_lp = ref_metrics.log_softmax(logits)
    bad = []
    for i, m in enumerate(ms):
        pos = len(ids) + i
        if m["pos"] != pos:
            bad.append(f"token {i}: pos {m['pos']} != {pos}")
            continue
        ref = ref_metrics.metrics_for(model, seq[:pos])
        for k in KEYS:
            if not close(m[k], ref[k]):
                bad.append(f"pos {pos} {k} {m[k]} vs {ref[k]}")
        row = ref_lp[pos - 1]
        if not close(lp["token_logprobs"][i], row[m["token"]], 1e-4, 1e-4):
            bad.append(f"pos {pos} logprob {lp['token_logprobs'][i]} vs {row[m['token']]}")
        top = sorted(range(len(row)), key=lambda t: -row[t])[:3]
        got_top = list(lp["top_logprobs"][i].values())
        if len(got_top) != 3 or any(not close(g, row[t], 1e-4, 1e-4) for g, t in zip(got_top, top)):
            bad.append(f"pos {pos} top logprobs {got_top} vs {[row[t] for t in top]}")
    check(not bad and len(ms) == 8, "metrics_logprobs_equal_reference", "; ".join(bad[:4]))
    # quadrant: the seed profile's boxes recomputed here (order LELV, LEHV, HELV, HEHV)
    def quad(m):
        H, V = m["entropy"], m["varentropy"]
        if H < 0.1 and V < 0.1:
            return "LELV"
        if H < 5 and V > 5:
            return "LEHV"
        if H > 3 and V < 0.1:
            return "HELV"
        if H > 5 and V > 5:
            return "HEHV"
        return "ADAPTIVE"
    check(all(m["quadrant"] == quad(m) for m in ms), "metrics_quadrant_by_seed_profile",
          str([(m["quadrant"], quad(m)) for m in ms]))
    joined = "".join(lp["tokens"])
    offsets_ok = all(lp["text_offset"][i] == len("".join(lp["tokens"][:i]).encode()) for i in range(len(ms)))
    check(joined == c["text"] and offsets_ok, "logprobs_tokens_join_to_text", f"{joined!r} vs {c['text']!r}")


def test_streaming(srv):
    body = {"prompt": PROMPT, "max_tokens": 40, "seed": 5, "sampler": "entropix", "metrics": True}
    st, plain = srv.post("/v1/completions", body)
    st2, ctype, ev, done = srv.stream("/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
    text = stream_text(ev)
    metrics = [m for e in ev for c in e["choices"] for m in c.get("metrics", [])]
    finals = [c["finish_reason"] for e in ev for c in e["choices"] if c["finish_reason"]]
    usage = [e["usage"] for e in ev if "usage" in e]
    check(st2 == 200 and ctype.startswith("text/event-stream") and done, "stream_sse_framing", f"{st2} {ctype} {done}")
    check(text == completion_text(plain) and metrics == plain["choices"][0]["metrics"], "stream_equals_plain",
          f"{text!r} vs {completion_text(plain)!r}")
    check(finals == [plain["choices"][0]["finish_reason"]] and len(usage) == 1 and usage[0] == plain["usage"] and
          all(e["object"] == "text_completion" for e in ev), "stream_finish_and_usage", f"{finals} {usage}")
    check(all(len(c.get("metrics", [])) <= 1 for e in ev for c in e["choices"]), "stream_one_token_per_chunk",
          "a chunk carried several tokens without a stop string")


def test_chat(srv):
    body = {"messages": [{"role": "system", "content": "Tell a story."},
                         {"role": "user", "content": [{"type": "text", "text": "Once upon a time"}]}],
            "max_tokens": 30, "seed": 9, "metrics": True}
    st, r = srv.post("/v1/chat/completions", body)
    c = r.get("choices", [{}])[0]
    ok = st == 200 and r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-") and \
        c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str) and len(c["metrics"]) > 0
    check(ok, "chat_shape", json.dumps(r)[:300])
    st2, ctype, ev, done = srv.stream("/v1/chat/completions", dict(body, stream=True))
    text = stream_text(ev, chat=True)
    first = ev[0]["choices"][0]["delta"] if ev else {}
    check(st2 == 200 and done and first.get("role") == "assistant" and text == c["message"]["content"] and
          all(e["object"] == "chat.completion.chunk" for e in ev), "chat_stream_equals_plain",
          f"{text!r} vs {c['message']['content']!r}")
    # the newline fallback (stories260K has no chat template): same as a completion of the joined text
    st3, plain = srv.post("/v1/completions", {"prompt": "Tell a story.\nOnce upon a time", "max_tokens": 30, "seed": 9})
    # (the chat reply starts fresh like `varent run`; the completion keeps its leading space)
    check(st3 == 200 and completion_text(plain) in (c["message"]["content"], " " + c["message"]["content"]),
          "chat_fallback_joins_messages", f"{completion_text(plain)!r} vs {c['message']['content']!r}")
    st, r = srv.post("/v1/chat/completions", dict(body, logprobs=True, top_logprobs=2, max_tokens=6))
    content = r["choices"][0]["logprobs"]["content"] if st == 200 else []
    ok = len(content) == 6 and all(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] and
                                  len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content)
    check(ok and "".join(e["token"] for e in content) == r["choices"][0]["message"]["content"], "chat_logprobs_shape",
          json.dumps(content)[:300])


def test_n_and_stop(srv):
    st, r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "seed": 21, "n": 3, "metrics": True})
    st0, r0 = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "seed": 21})
    st1, r1 = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "seed": 22})
    ch = r.get("choices", [])
    check(st == 200 and [c["index"] for c in ch] == [0, 1, 2] and ch[0]["text"] == completion_text(r0) and
          ch[1]["text"] == completion_text(r1) and r["usage"]["completion_tokens"] == sum(len(c["metrics"]) for c in ch),
          "n_choices_use_seed_plus_index", json.dumps(r)[:300])
    st, ctype, ev, done = srv.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "seed": 21, "n": 3,
                                                         "stream": True})
    check(done and [stream_text(ev, index=i) for i in range(3)] == [c["text"] for c in ch], "n_choices_streamed",
          "streamed choices differ from plain")
    full = completion_text(r0)
    word = full.split()[3] if len(full.split()) > 3 else "the"
    stop_at = full.find(word)
    for stream in (False, True):
        body = {"prompt": PROMPT, "max_tokens": 20, "seed": 21, "stop": ["zzzq", word], "stream": stream}
        if stream:
            st, _, ev, _ = srv.stream("/v1/completions", body)
            text = stream_text(ev)
            fin = [c["finish_reason"] for e in ev for c in e["choices"] if c["finish_reason"]]
        else:
            st, r = srv.post("/v1/completions", body)
            text, fin = completion_text(r), [r["choices"][0]["finish_reason"]]
        check(st == 200 and text == full[:stop_at] and fin == ["stop"], f"stop_string_{'stream' if stream else 'plain'}",
              f"{text!r} vs {full[:stop_at]!r} {fin}")


def test_batch_prompts(srv):
    """A list of prompts: one choice per prompt and n, prompt by prompt (index p * n + i),
    each what its prompt gives alone with the same seed; streamed the same."""
    ids = json.loads(vtest.varent("tokenize", "-m", srv.model_dir, "The dog ran").stdout)
    prompts = [PROMPT, "Tom had a red ball", [1] + ids]
    body = {"max_tokens": 10, "seed": 4, "n": 2, "logprobs": 1, "metrics": True}
    st, r = srv.post("/v1/completions", dict(body, prompt=prompts))
    alone = [srv.post("/v1/completions", dict(body, prompt=p))[1] for p in prompts]
    ch = r.get("choices", []) if st == 200 else []
    want = [c for a in alone for c in a.get("choices", [])]
    same = [c["index"] for c in ch] == list(range(6)) and \
        all(c["text"] == w["text"] and c["logprobs"] == w["logprobs"] and c["metrics"] == w["metrics"]
            for c, w in zip(ch, want))
    check(st == 200 and len(ch) == 6 and same, "batch_choices_in_order_as_alone", json.dumps(r)[:300])
    u = r.get("usage", {})
    check(st == 200 and u["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone) and
          u["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone) ==
          sum(len(c["metrics"]) for c in ch), "batch_usage_sums_prompts", f"{u} vs {[a['usage'] for a in alone]}")
    st, _, ev, done = srv.stream("/v1/completions", dict(body, prompt=prompts, stream=True))
    check(st == 200 and done and [stream_text(ev, index=i) for i in range(6)] == [c["text"] for c in ch],
          "batch_streamed", "streamed choices differ from plain")
    st, r = srv.post("/v1/completions", {"prompt": [[1, 5], [1, 99999]], "max_tokens": 1})
    check(st == 400 and "prompt[1]" in r["error"]["message"], "batch_error_names_prompt", str(r)[:200])
    # many stop strings (lm-eval sends its task's list whole): any number is fine
    st0, r0 = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "seed": 21})
    full = completion_text(r0) if st0 == 200 else ""
    word = full.split()[2] if len(full.split()) > 2 else "the"
    stops = [f"zzq{i}" for i in range(40)] + [word]
    st, r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "seed": 21, "stop": stops})
    check(st == 200 and completion_text(r) == full[:full.find(word)] and r["choices"][0]["finish_reason"] == "stop",
          "stop_41_strings", f"{st} {str(r)[:200]} vs {full[:full.find(word)]!r}")


def test_metrics_opt_in(srv):
    """Per-token metrics come when asked ("metrics": true), or by default under --metrics."""
    body = {"prompt": PROMPT, "max_tokens": 64, "seed": 2, "temperature": 0}
    st, _, plain = srv.request("POST", "/v1/completions", body)
    st2, _, full = srv.request("POST", "/v1/completions", dict(body, metrics=True))
    a, b = json.loads(plain), json.loads(full)
    check(st == st2 == 200 and "metrics" not in a["choices"][0] and len(b["choices"][0]["metrics"]) ==
          b["usage"]["completion_tokens"] and a["choices"][0]["text"] == b["choices"][0]["text"],
          "metrics_only_when_asked", f"{len(plain)} bytes plain, {len(full)} with metrics")
    print(f"# 64 tokens: {len(plain)} bytes without metrics, {len(full)} with")


def test_metrics_flag(slow):
    st, r = slow.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "seed": 1})
    st2, r2 = slow.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "seed": 1, "metrics": False})
    check(st == st2 == 200 and len(r["choices"][0].get("metrics", [])) == 3 and "metrics" not in r2["choices"][0],
          "metrics_flag_default_on", f"{str(r)[:200]} {str(r2)[:200]}")


def test_model_names(model):
    """Any "model" runs the model by default (llama-server's rule), --strict-model keeps the
    404; the id is -m's file or directory name (a GGUF's file name, not its cache's hash),
    --alias sets it; GET /v1/models lists it."""
    body = {"prompt": PROMPT, "max_tokens": 2, "seed": 1}
    srv = Server(model, "-t", 1, name="serve-names")
    try:
        st, r = srv.post("/v1/completions", dict(body, model="gpt-4o-mini"))
        st2, r2 = srv.post("/v1/chat/completions", {"model": "anything", "messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 2})
        check(st == 200 and st2 == 200 and r["model"] == r2["model"] == os.path.basename(model), "any_model_name_accepted",
              f"{st} {str(r)[:200]} {st2}")
        st, m = srv.json("GET", "/v1/models/gpt-4o-mini")
        check(st == 404 and m["error"]["code"] == "model_not_found", "models_get_still_names_only_the_id", f"{st} {m}")
    finally:
        srv.stop()
    srv = Server(model, "-t", 1, "--alias", "my-model", "--strict-model", name="serve-names-strict")
    try:
        st, m = srv.json("GET", "/v1/models")
        ids = [x["id"] for x in m.get("data", [])]
        st1, r1 = srv.post("/v1/completions", dict(body, model="my-model"))
        st2, r2 = srv.post("/v1/completions", dict(body, model="gpt-4"))
        check(st == 200 and ids == ["my-model"] and st1 == 200 and r1["model"] == "my-model", "alias_sets_the_id",
              f"{ids} {st1} {str(r1)[:200]}")
        check(st2 == 404 and error_shape(r2) and r2["error"]["code"] == "model_not_found" and
              r2["error"]["param"] == "model" and "--strict-model" in r2["error"]["message"], "strict_model_404",
              f"{st2} {r2}")
    finally:
        srv.stop()
    gguf = os.path.join(vtest.TESTDATA, "gguf-tiny", "tiny.gguf")
    os.environ["XDG_CACHE_HOME"] = vtest.tmpdir("serve-names-cache")  # the conversion's cache, not the user's
    srv = Server(gguf, "-t", 1, name="serve-names-gguf")
    try:
        st, m = srv.json("GET", "/v1/models")
        st1, r1 = srv.post("/v1/completions", dict(body, model="gpt-4o-mini"))
        check(st == 200 and [x["id"] for x in m["data"]] == ["tiny.gguf"] and st1 == 200 and r1["model"] == "tiny.gguf",
              "gguf_named_by_its_file", f"{m} {st1} {str(r1)[:200]}")
    finally:
        srv.stop()
    r = vtest.varent("serve", "-m", model, "--alias", "", timeout=30)
    check(r.returncode == 2 and "--alias" in r.stderr, "cli_error_empty_alias", r.stderr[-200:])


def test_errors(srv):
    cases = [
        ("malformed_json", "/v1/completions", b'{"prompt": "x",', 400, "invalid_json", None),
        ("trailing_garbage", "/v1/completions", b'{"prompt": "x"} x', 400, "invalid_json", None),
        ("nul_in_body", "/v1/completions", b'{"prompt": "x\x00"}', 400, "invalid_json", None),
        ("not_an_object", "/v1/completions", [1, 2], 400, "invalid_json", None),
        ("empty_body", "/v1/completions", b"", 400, "invalid_json", None),
        ("missing_prompt", "/v1/completions", {"max_tokens": 3}, 400, "missing_required_parameter", "prompt"),
        ("missing_messages", "/v1/chat/completions", {"prompt": "x"}, 400, "missing_required_parameter", "messages"),
        ("type_max_tokens", "/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400, "invalid_type", "max_tokens"),
        ("type_max_tokens_float", "/v1/completions", {"prompt": "x", "max_tokens": 2.5}, 400, "invalid_type",
         "max_tokens"),
        ("type_temperature", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "invalid_type",
         "temperature"),
        ("type_stream", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "invalid_type", "stream"),
        ("type_stop", "/v1/completions", {"prompt": "x", "stop": 5}, 400, "invalid_type", "stop"),
        ("type_prompt", "/v1/completions", {"prompt": {"a": 1}}, 400, "invalid_type", "prompt"),
        ("type_messages", "/v1/chat/completions", {"messages": "hi"}, 400, "invalid_type", "messages"),
        ("type_model", "/v1/completions", {"prompt": "x", "model": 3}, 400, "invalid_type", "model"),
        ("bad_role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value",
         "messages"),
        ("no_messages", "/v1/chat/completions", {"messages": []}, 400, "invalid_value", "messages"),
        ("top_p_zero", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, "invalid_value", "top_p"),
        ("temperature_negative", "/v1/completions", {"prompt": "x", "temperature": -1}, 400, "invalid_value",
         "temperature"),
        ("n_zero", "/v1/completions", {"prompt": "x", "n": 0}, 400, "invalid_value", "n"),
        ("max_tokens_zero", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
        ("stop_strings_too_long", "/v1/completions", {"prompt": "x", "stop": ["a" * 3000, "b" * 1097]}, 400,
         "invalid_value", "stop"),
        ("empty_stop", "/v1/completions", {"prompt": "x", "stop": [""]}, 400, "invalid_value", "stop"),
        ("bad_sampler", "/v1/completions", {"prompt": "x", "sampler": "magic"}, 400, "invalid_value", "sampler"),
        ("bad_profile", "/v1/completions", {"prompt": "x", "profile": "nope"}, 400, "invalid_value", "profile"),
        ("logprobs_too_many", "/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "invalid_value", "logprobs"),
        ("top_logprobs_without_logprobs", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "invalid_value", "top_logprobs"),
        ("prompt_nested_too_deep", "/v1/completions", {"prompt": [[[1]]]}, 400, "invalid_type", "prompt"),
        ("prompt_list_with_number", "/v1/completions", {"prompt": ["a", 5]}, 400, "invalid_type", "prompt"),
        ("prompt_list_empty_ids", "/v1/completions", {"prompt": [[1, 5], []]}, 400, "invalid_value", "prompt"),
        ("prompt_empty_list", "/v1/completions", {"prompt": []}, 400, "invalid_value", "prompt"),
        ("prompts_times_n_over_4096", "/v1/completions", {"prompt": ["a"] * 300, "n": 16}, 400, "invalid_value", "n"),
        ("batch_token_id_out_of_vocab", "/v1/completions", {"prompt": [[1, 5], [1, 99999]]}, 400, "invalid_value",
         "prompt"),
        ("token_id_out_of_vocab", "/v1/completions", {"prompt": [1, 99999]}, 400, "invalid_value", "prompt"),
        ("negative_token_id", "/v1/completions", {"prompt": [1, -3]}, 400, "invalid_type", "prompt"),
        ("max_tokens_over_limit", "/v1/completions", {"prompt": "x", "max_tokens": 201}, 400, "invalid_value",
         "max_tokens"),
        ("prompt_longer_than_context", "/v1/completions", {"prompt": "Once upon a time " * 100}, 400,
         "context_length_exceeded", "prompt"),
        ("chat_longer_than_context", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "the cat sat " * 200}]}, 400, "context_length_exceeded", "messages"),
    ]
    for name, path, body, status, code, param in cases:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        st, _, data = srv.request("POST", path, body)
        try:
            r = json.loads(data)
        except ValueError:
            r = {}
        e = r.get("error", {}) if isinstance(r, dict) else {}
        check(st == status and error_shape(r) and e["code"] == code and e["param"] == param and
              e["type"] == "invalid_request_error", "error_" + name, f"{st} {data[:300]!r}")
    # bodies over --max-body: read and refused, or refused from the header alone
    st, _, data = srv.request("POST", "/v1/completions", b'{"prompt":"' + b"a" * 70000 + b'"}')
    check(st == 413 and error_shape(json.loads(data)), "error_body_too_large", f"{st} {data[:200]!r}")
    raw = servertest.raw_request(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                                           b"\r\nContent-Length: 1000000000\r\n\r\n{\"prompt\":")
    check(raw.startswith(b"HTTP/1.1 413"), "error_declared_length_too_large", repr(raw[:100]))
    st, _, data = srv.request("GET", "/nope")
    check(st == 404 and error_shape(json.loads(data)), "error_unknown_route", f"{st}")
    st, _, data = srv.request("GET", "/v1/completions")
    check(st == 405 and error_shape(json.loads(data)), "error_wrong_method", f"{st}")
    st, _, data = srv.request("DELETE", "/health")
    check(st == 405 and error_shape(json.loads(data)), "error_wrong_method_delete", f"{st}")
    raw = servertest.raw_request(srv.port, b"NOT HTTP AT ALL\r\n\r\n")
    check(raw == b"" or raw.startswith(b"HTTP/1.1 4"), "error_garbage_request_line", repr(raw[:80]))
    st, h = srv.json("GET", "/health")
    check(st == 200 and h["inflight"] == 0, "errors_leave_server_up", str(h))


def test_concurrent(srv):
    """8 clients at once on 2 slots: each gets exactly what it gets alone."""
    bodies = [{"prompt": PROMPT, "max_tokens": 40, "seed": 100 + i, "stream": i % 2 == 1,
               "sampler": "entropix" if i % 3 == 0 else "standard", "logprobs": 2 if i % 4 == 0 else None}
              for i in range(8)]
    alone = []
    for b in bodies:
        st, r = srv.post("/v1/completions", dict(b, stream=False))
        alone.append(completion_text(r) if st == 200 else None)
    results = [None] * 8

    def client(i):
        try:
            b = bodies[i]
            if b["stream"]:
                st, _, ev, done = srv.stream("/v1/completions", b)
                results[i] = stream_text(ev) if st == 200 and done else f"status {st}"
            else:
                st, r = srv.post("/v1/completions", b)
                results[i] = completion_text(r) if st == 200 else f"status {st}"
        except Exception as e:  # noqa: BLE001 - reported as a failure below
            results[i] = f"exception {e}"

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    bad = [i for i in range(8) if results[i] != alone[i] or alone[i] is None]
    check(not bad, "concurrent_8_clients_match_sequential", f"clients {bad}: {[results[i] for i in bad][:2]}")
    # the slot lets go of a job just after its client has the answer: allow a moment
    h, _ = wait_health(srv, lambda h: h["inflight"] == 0 and h["slots_busy"] == 0 and h["queued"] == 0, 2)
    check(h["inflight"] == 0 and h["slots_busy"] == 0 and h["queued"] == 0, "concurrent_all_finished",
          f"{h} after {time.time() - t0:.1f}s")


def open_stream(port, body):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def wait_health(srv, pred, timeout=5):
    t0 = time.time()
    while time.time() - t0 < timeout:
        h = srv.health()
        if pred(h):
            return h, time.time() - t0
        time.sleep(0.05)
    return srv.health(), None


def test_disconnect(slow):
    """Slow server: 1 slot, 20 ms per token. 300 tokens would take 6 s."""
    h0 = slow.health()
    s = open_stream(slow.port, {"prompt": PROMPT, "max_tokens": 300, "seed": 1, "stream": True, "temperature": 1.5})
    got = b""
    while got.count(b"data: ") < 3:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    busy = slow.health()["slots_busy"]
    s.close()
    h, took = wait_health(slow, lambda h: h["slots_busy"] == 0 and h["inflight"] == 0)
    check(busy == 1 and took is not None and took < 2 and h["cancelled"] == h0["cancelled"] + 1,
          "disconnect_mid_stream_frees_slot", f"busy {busy}, freed after {took}, {h}")
    t0 = time.time()
    st, r = slow.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "seed": 1})
    check(st == 200 and r["usage"]["completion_tokens"] == 5 and time.time() - t0 < 3, "disconnect_next_request_served",
          f"{st} {time.time() - t0:.2f}s")
    # a non-streamed request whose client goes away while it is generating
    s = open_stream(slow.port, {"prompt": PROMPT, "max_tokens": 300, "seed": 2})
    h, took = wait_health(slow, lambda h: h["slots_busy"] == 1)
    s.close()
    h, took = wait_health(slow, lambda h: h["slots_busy"] == 0 and h["inflight"] == 0)
    check(took is not None and took < 2 and h["cancelled"] == h0["cancelled"] + 2, "disconnect_while_waiting_frees_slot",
          f"freed after {took}, {h}")
    # a queued request whose client leaves before its turn
    s1 = open_stream(slow.port, {"prompt": PROMPT, "max_tokens": 40, "seed": 3})
    wait_health(slow, lambda h: h["slots_busy"] == 1)
    s2 = open_stream(slow.port, {"prompt": PROMPT, "max_tokens": 300, "seed": 4, "stream": True})
    wait_health(slow, lambda h: h["queued"] == 1)
    s2.close()
    h, took = wait_health(slow, lambda h: h["inflight"] == 0, timeout=6)
    s1.close()
    check(took is not None and h["cancelled"] == h0["cancelled"] + 3, "disconnect_while_queued", f"{h}")
    check(slow.proc.poll() is None, "disconnect_server_stays_up", "the server exited")


def test_drain(slow):
    """SIGTERM while a request runs: it completes in full, then the server exits 0."""
    result = {}

    def client():
        result["r"] = slow.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "seed": 8, "temperature": 0})

    t = threading.Thread(target=client)
    t.start()
    wait_health(slow, lambda h: h["slots_busy"] == 1)
    slow.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    refused = False
    try:
        socket.create_connection(("127.0.0.1", slow.port), timeout=2).close()
    except OSError:
        refused = True
    t.join(30)
    code = slow.stop(timeout=30)
    st, r = result.get("r", (None, {}))
    check(st == 200 and r["usage"]["completion_tokens"] == 40 and r["choices"][0]["finish_reason"] == "length",
          "sigterm_drains_inflight_request", f"{st} {str(r)[:200]}")
    check(refused, "sigterm_stops_accepting", "a new connection was accepted after SIGTERM")
    check(code == 0 and "stopped" in slow.text(), "sigterm_exit_0", f"exit {code}: {slow.text()[-300:]}")


def test_cli_errors(model):
    """Bad options and models fail before listening, with a message and exit 1."""
    no_tok = vtest.tmpdir("serve-notok")
    for f in os.listdir(model):
        if f != "tokenizer.json":
            os.symlink(os.path.join(model, f), os.path.join(no_tok, f))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    cases = [
        ("missing_model", [], "missing -m"),
        ("no_such_dir", ["-m", os.path.join(no_tok, "nope")], "nope"),
        ("no_tokenizer", ["-m", no_tok], "tokenizer.json"),
        ("bad_port", ["-m", model, "--port", "70000"], "--port"),
        ("bad_parallel", ["-m", model, "--parallel", "0"], "--parallel"),
        ("bad_sampler", ["-m", model, "--sampler", "magic"], "--sampler"),
        ("bad_profile", ["-m", model, "--profile", "nope"], "--profile"),
        ("bad_max_tokens_limit", ["-m", model, "--max-tokens-limit", "0"], "--max-tokens-limit"),
        ("bad_chat_template", ["-m", model, "--chat-template", "nope"], "nope"),
        ("unknown_option", ["-m", model, "--frobnicate"], "--frobnicate"),
        ("port_in_use", ["-m", model, "--port", busy.getsockname()[1]], "cannot listen"),
        ("bad_host", ["-m", model, "--host", "no.such.host.invalid"], "--host"),
    ]
    # a bad option is a usage error (exit 2); a model, port or host that does not work, 1
    usage = ("missing_model", "bad_port", "bad_parallel", "bad_sampler", "bad_profile", "bad_max_tokens_limit",
             "unknown_option")
    for name, args, want in cases:
        r = vtest.varent("serve", *args, timeout=30)
        check(r.returncode == (2 if name in usage else 1) and want in r.stderr and "listening" not in r.stderr, "cli_error_" + name,
              f"exit {r.returncode}: {r.stderr.strip()[-200:]}")
    busy.close()


def main():
    model = vtest.stories_dir()
    test_cli_errors(model)
    test_model_names(model)
    srv = Server(model, "--parallel", 2, "-t", 1, "--ctx", 256, "--max-tokens-limit", 200, "--max-body", 65536)
    srv.model, srv.model_dir = os.path.basename(model), model
    try:
        test_get_routes(srv, model)
        test_completion_matches_cli(srv, model)
        test_completion_shape(srv)
        test_default_seed(srv)
        test_metrics_and_logprobs_vs_reference(srv, model)
        test_streaming(srv)
        test_chat(srv)
        test_n_and_stop(srv)
        test_batch_prompts(srv)
        test_metrics_opt_in(srv)
        test_errors(srv)
        test_concurrent(srv)
    finally:
        code = srv.stop(signal.SIGINT)
    check(code == 0, "sigint_exit_0", f"exit {code}: {srv.text()[-300:]}")
    slow = Server(model, "--parallel", 1, "-t", 1, "--token-delay-ms", 20, "--metrics", name="serve-slow")
    try:
        test_metrics_flag(slow)
        test_disconnect(slow)
        test_drain(slow)
    finally:
        slow.kill()
    vtest.done()


if __name__ == "__main__":
    main()
