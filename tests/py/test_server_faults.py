"""Issue 22, "the server" rows (docs/robustness.md): malformed HTTP framing, bad numeric
flags, Host/Origin/Content-Type checks on loopback, idle connections, half-closed
requests and shutdown past --drain-timeout. Each row is a check that failed before the
fix: a hang, a wrong status or a silently truncated flag."""
import os
import socket
import subprocess
import sys
import time

from vtest import check, done, stories_dir, varent

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servertest import Server, recv_all  # noqa: E402

base = stories_dir("f32")
BODY = b'{"prompt":"Once","max_tokens":2,"seed":1}'


def raw(port, data, timeout=4):
    """(status or None, seconds): sends raw bytes and reads the answer until close or timeout."""
    t0 = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = recv_all(s)
    finally:
        s.close()
    status = None
    if out.startswith(b"HTTP/1."):
        try:
            status = int(out.split(b" ", 2)[1])
        except ValueError:
            pass
    return status, time.time() - t0


def post_raw(headers, body=BODY, version="HTTP/1.1"):
    headers = [*headers, ("Connection", "close")]
    head = f"POST /v1/completions {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode() + b"\r\n" + body


def row16(srv):
    """Unsupported transfer codings, a duplicate Content-Length, HTTP/1.1 without Host."""
    n = str(len(BODY))
    cases = [  # name, request bytes, status
        ("transfer_encoding_gzip_is_501",
         post_raw([("Host", "localhost"), ("Content-Type", "application/json"), ("Transfer-Encoding", "gzip")]), 501),
        ("transfer_encoding_gzip_chunked_is_501",
         post_raw([("Host", "localhost"), ("Content-Type", "application/json"),
                   ("Transfer-Encoding", "gzip, chunked")]), 501),
        ("duplicate_content_length_is_400",
         post_raw([("Host", "localhost"), ("Content-Type", "application/json"), ("Content-Length", n),
                   ("Content-Length", n)]), 400),
        ("http11_without_host_is_400",
         post_raw([("Content-Type", "application/json"), ("Content-Length", n)]), 400),
        ("http11_get_without_host_is_400", b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        ("http10_without_host_is_fine", b"GET /health HTTP/1.0\r\n\r\n", 200),
        ("chunked_still_works",
         post_raw([("Host", "localhost"), ("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")],
                  b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)), 200),
    ]
    for name, data, want in cases:
        st, secs = raw(srv.port, data)
        check(st == want and secs < 3, f"row16_{name}", f"status {st} (want {want}) after {secs:.1f} s")


def row16_flags():
    """Ports and counts are ranged integers: nothing is truncated or wrapped."""
    cases = [  # flag, value, what the message names
        ("--port", "4294985386", "--port"),
        ("--port", "65536", "--port"),
        ("--port", "-1", "--port"),
        ("--parallel", "4294967297", "--parallel"),
        ("-t", "4294967300", "-t"),
        ("--max-queue", "4294967296", "--max-queue"),
        ("--max-connections", "4294967297", "--max-connections"),
        ("--max-connections", "0", "--max-connections"),
        ("--timeout", "4294967297", "--timeout"),
        ("--timeout", "-1", "--timeout"),
        ("--max-tokens-limit", "4294967297", "--max-tokens-limit"),
        ("--token-delay-ms", "4294967297", "--token-delay-ms"),
        ("--drain-timeout", "1e30", "--drain-timeout"),
        ("--drain-timeout", "nan", "--drain-timeout"),
        ("--ctx", "4294967552", "--ctx"),
    ]
    for flag, value, needle in cases:
        name = f"row16_flag_{flag.lstrip('-').replace('-', '_')}_{value.replace('-', 'neg')}_is_an_error"
        port = [] if flag == "--port" else ["--port", "0"]
        try:  # the old code truncated the value and started listening
            r = varent("serve", "-m", base, *port, flag, value, timeout=5)
        except subprocess.TimeoutExpired:
            check(False, name, "still running after 5 s: the value was accepted")
            continue
        check(r.returncode == 1 and needle in r.stderr and value in r.stderr, name,
              f"rc={r.returncode} stderr={r.stderr[-300:]!r}")


srv = Server(base, "--parallel", "1")
try:
    row16(srv)
    check(srv.proc.poll() is None, "row16_server_stays_up", srv.text()[-400:])
finally:
    srv.stop()
row16_flags()

done()
