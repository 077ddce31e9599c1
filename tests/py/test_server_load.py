"""`varent serve` under load: stories260K on loopback, 16 client connections for
VARENT_LOAD_SECONDS (default 20) seconds, a seeded mix of

  - completions and chat completions, plain and streamed (well-formed: must get 200);
  - malformed bodies (garbage bytes, truncated or deeply nested JSON, wrong types,
    over-limit values) and oversized bodies: must get 4xx;
  - slow clients (a body sent in pieces, a stream read slowly) and clients that
    disconnect mid-stream;
  - GETs of /health, /v1/models, /v1/profiles.

Asserts: no 5xx, no failed well-formed request, the server never exits, resident memory
after warm-up (the first quarter) stays within 10% of its level at the end of warm-up,
and at the end nothing is left in flight and SIGTERM exits 0. Prints requests/s and
latency percentiles and writes them to tests/tmp/server_load.json.
"""
import json
import os
import random
import signal
import socket
import threading
import time

import vtest
from vtest import check
from servertest import Server, recv_all

SECONDS = float(os.environ.get("VARENT_LOAD_SECONDS", "20"))
CONNECTIONS = int(os.environ.get("VARENT_LOAD_CONNECTIONS", "16"))
MAX_BODY = 65536
PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a cat",
           "Tom had a red ball. He"]

MALFORMED = [
    b"{", b"not json at all", b'{"prompt": 5}', b'{"prompt": "x", "max_tokens": -1}', b"[]", b"null",
    b'{"prompt": "x", "temperature": "warm"}', b'{"prompt": "x", "max_tokens": 1000}', b'{"prompt": "x", "n": 99}',
    b"[" * 3000 + b"]" * 3000, b'{"prompt": "x", "top_p": 1e999}', b'{"prompt": "x"} trailing',
    b'{"prompt": [1, 2, 100000]}', b'{"prompt": "x", "stop": [1]}', b'{"prompt": [[1], "x", 5]}',
    b'{"prompt": "\xff\xfe"', b'{"prompt": "x", "logprobs": 50}',
]


def send_raw(port, head, body, pieces=1, delay=0.0, read_limit=None, timeout=30):
    """HTTP/1.1 request on a raw socket, the body in `pieces` with `delay` between them.
    Returns (status or None, bytes read)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(head + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n")
        step = max(1, len(body) // pieces)
        for i in range(0, len(body), step):
            s.sendall(body[i:i + step])
            if delay:
                time.sleep(delay)
        data = recv_all(s, read_limit)
        status = int(data[9:12]) if data.startswith(b"HTTP/1.") and len(data) >= 12 else None
        return status, data
    finally:
        s.close()


def post_head(path):
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n").encode()


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.rows = []  # (kind, status, seconds, ok)
        self.problems = []

    def add(self, kind, status, secs, ok, why=""):
        with self.lock:
            self.rows.append((kind, status, secs, ok))
            if not ok and len(self.problems) < 20:
                self.problems.append(f"{kind}: status {status} {why}")


def one_request(port, rng, stats):
    r = rng.random()
    t0 = time.time()
    prompt = rng.choice(PROMPTS)
    body = {"prompt": prompt, "max_tokens": rng.randint(1, 32), "seed": rng.randint(0, 1 << 30),
            "sampler": rng.choice(["standard", "entropix"])}
    if rng.random() < 0.3:
        body["logprobs"] = rng.randint(0, 5)
    if r < 0.35:
        kind = "completion"
        st, data = send_raw(port, post_head("/v1/completions"), json.dumps(body).encode())
        ok = st == 200 and b'"finish_reason"' in data
    elif r < 0.50:
        kind = "stream"
        body["stream"] = True
        st, data = send_raw(port, post_head("/v1/completions"), json.dumps(body).encode())
        ok = st == 200 and b"data: [DONE]\n\n" in data  # (chunked: the terminator follows)
    elif r < 0.58:
        kind = "chat"
        chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": body["max_tokens"],
                "stream": rng.random() < 0.5}
        st, data = send_raw(port, post_head("/v1/chat/completions"), json.dumps(chat).encode())
        ok = st == 200
    elif r < 0.68:
        kind = "malformed"
        bad = rng.choice(MALFORMED) if rng.random() < 0.7 else bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
        st, data = send_raw(port, post_head(rng.choice(["/v1/completions", "/v1/chat/completions"])), bad)
        ok = st is not None and 400 <= st < 500
    elif r < 0.73:
        kind = "oversized"
        big = json.dumps({"prompt": "a" * rng.randint(MAX_BODY + 1, 3 * MAX_BODY)}).encode()
        st, data = send_raw(port, post_head("/v1/completions"), big)
        ok = st == 413
    elif r < 0.80:
        kind = "disconnect"
        body.update(stream=True, max_tokens=32)
        st, data = send_raw(port, post_head("/v1/completions"), json.dumps(body).encode(),
                            read_limit=rng.randint(1, 1500))
        ok = st is None or st == 200  # we hung up; nothing to check but the server
    elif r < 0.87:
        kind = "slow_sender"
        st, data = send_raw(port, post_head("/v1/completions"), json.dumps(body).encode(), pieces=5, delay=0.1)
        ok = st == 200
    elif r < 0.92:
        kind = "slow_reader"
        body.update(stream=True, max_tokens=24)
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        data = json.dumps(body).encode()
        s.sendall(post_head("/v1/completions") + b"Content-Length: " + str(len(data)).encode() +
                  b"\r\nConnection: close\r\n\r\n" + data)
        got = b""
        while True:
            chunk = s.recv(200)
            if not chunk:
                break
            got += chunk
            time.sleep(0.02)
        s.close()
        st = int(got[9:12]) if got.startswith(b"HTTP/1.") else None
        ok = st == 200 and b"data: [DONE]" in got
    else:
        kind = "get"
        path = rng.choice(["/health", "/v1/models", "/v1/profiles", "/"])
        st, data = send_raw(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode(), b"")
        ok = st == 200
    secs = time.time() - t0
    stats.add(kind, st, secs, ok, repr(data[:160]) if not ok else "")


def pct(xs, p):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    model = vtest.stories_dir()
    srv = Server(model, "--parallel", 2, "-t", 1, "--max-body", MAX_BODY, "--max-tokens-limit", 64,
                 "--timeout", 20, name="serve-load")
    stats, stop_at = Stats(), time.time() + SECONDS
    rss, errors = [], []

    def client(i):
        rng = random.Random(1000 + i)
        while time.time() < stop_at:
            try:
                one_request(srv.port, rng, stats)
            except Exception as e:  # noqa: BLE001 - a refused or reset well-formed request is a failure
                stats.add("exception", None, 0, False, repr(e))

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CONNECTIONS)]
    for t in threads:
        t.start()
    while time.time() < stop_at:
        if srv.proc.poll() is not None:
            break
        rss.append((time.time() - t0, srv.rss_kb()))
        time.sleep(0.5)
    for t in threads:
        t.join(60)
    elapsed = time.time() - t0
    alive = srv.proc.poll() is None
    check(alive, "load_server_stays_up", f"exited with {srv.proc.returncode}: {srv.text()[-300:]}")
    rows = stats.rows
    five = [r for r in rows if r[1] is not None and r[1] >= 500]
    check(not five, "load_no_5xx", f"{len(five)} responses >= 500: {five[:5]}")
    bad = [r for r in rows if not r[3]]
    check(not bad, "load_every_request_answered_right", f"{len(bad)} of {len(rows)}: {stats.problems[:5]}")
    kinds = {}
    for r in rows:
        kinds[r[0]] = kinds.get(r[0], 0) + 1
    check(all(kinds.get(k, 0) > 0 for k in ("completion", "stream", "malformed", "oversized", "disconnect",
                                           "slow_sender", "slow_reader")), "load_mix_covered", str(kinds))
    warm = [kb for t, kb in rss if t <= SECONDS / 4]
    after = [kb for t, kb in rss if t > SECONDS / 4]
    base = warm[-1] if warm else 0
    peak = max(after) if after else 0
    check(base > 0 and peak <= base * 1.10, "load_rss_flat_after_warmup",
          f"RSS {base} kB at the end of warm-up, peak {peak} kB after (limit +10%)")
    h = None
    if alive:
        for _ in range(50):
            h = srv.health()
            if h["inflight"] == 0 and h["slots_busy"] == 0:
                break
            time.sleep(0.1)
    check(h is not None and h["inflight"] == 0 and h["queued"] == 0, "load_nothing_left_in_flight", str(h))
    code = srv.stop(signal.SIGTERM)
    check(code == 0, "load_sigterm_exit_0", f"exit {code}")
    done = [r for r in rows if r[0] in ("completion", "stream", "chat") and r[3]]
    lat = [r[2] for r in done]
    report = {"seconds": round(elapsed, 1), "connections": CONNECTIONS, "requests": len(rows),
              "requests_per_s": round(len(rows) / elapsed, 2),
              "completions_per_s": round(len(done) / elapsed, 2), "kinds": kinds,
              "completion_latency_s": {"p50": round(pct(lat, 50), 3), "p90": round(pct(lat, 90), 3),
                                       "p99": round(pct(lat, 99), 3)},
              "rss_kb": {"end_of_warmup": base, "peak_after": peak, "end": rss[-1][1] if rss else 0}}
    with open(os.path.join(vtest.TESTTMP, "server_load.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("load: " + json.dumps(report), flush=True)
    vtest.done()


if __name__ == "__main__":
    main()
