"""servertest: start `varent serve` on a loopback port and talk HTTP to it, for the
server tests (test_server.py, test_server_load.py, test_browser.py). Standard library only."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time

import vtest


class Server:
    """`varent serve -m MODEL --port 0 ARGS...`; the port comes from its 'listening on' line."""

    def __init__(self, model_dir, *args, name="serve"):
        self.log_path = os.path.join(vtest.tmpdir(name), "server.log")
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen([vtest.VARENT, "serve", "-m", model_dir, "--port", "0", *map(str, args)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", self.text())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if self.port is None:
            self.kill()
            raise RuntimeError(f"varent serve did not start: {self.text()[-500:]}")

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers dict with lower-case keys, body bytes)."""
        c = self.conn(timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            h = {"Content-Type": "application/json"} if body is not None else {}
            h.update(headers or {})
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def json(self, method, path, body=None, **kw):
        status, headers, data = self.request(method, path, body, **kw)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, {"_raw": data.decode("utf-8", "replace")}

    def post(self, path, body, **kw):
        return self.json("POST", path, body, **kw)

    def stream(self, path, body, timeout=60):
        """(status, content-type, [parsed data events], saw [DONE])."""
        status, headers, data = self.request("POST", path, body, timeout=timeout)
        events, done = [], False
        for block in data.decode("utf-8").split("\n\n"):
            for line in block.split("\n"):
                if line.startswith("data: "):
                    if line[6:] == "[DONE]":
                        done = True
                    else:
                        events.append(json.loads(line[6:]))
        return status, headers.get("content-type", ""), events, done

    def health(self):
        return self.json("GET", "/health")[1]

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends sig and returns the exit status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        self.log.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def raw_request(port, data, read=True, timeout=10):
    """Sends raw bytes on a fresh socket; returns what came back (b'' if nothing)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        return recv_all(s)
    finally:
        s.close()


def recv_all(s, limit=None):
    """Bytes from socket s until the peer closes, resets or times out (or limit)."""
    out = b""
    while limit is None or len(out) < limit:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        out += chunk
    return out


def completion_text(resp):
    return "".join(c["text"] for c in resp["choices"])


def stream_text(events, chat=False, index=0):
    out = []
    for e in events:
        for c in e.get("choices", []):
            if c["index"] != index:
                continue
            out.append((c.get("delta") or {}).get("content") or "" if chat else c["text"])
    return "".join(out)
