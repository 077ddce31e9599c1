"""Nothing varent did not create is touched (docs/robustness.md, "Output files").

In a scratch directory of its own, with its own device nodes (mknod, as root), FIFOs,
symlinks and pre-existing files, every subcommand that writes a file is made to fail
or is interrupted, and the test checks that each of them is still what it was: the
same kind of file, the same bytes, the link still a link. Then the same outputs on
success: a device node and a FIFO are written in place, a symlink's target gets the
data, batch outputs keep their finished records after Ctrl-C and SIGTERM, and only
the temporary files are removed."""
import hashlib
import os
import signal
import stat
import subprocess
import threading
import time

import vtest
from vtest import check, skip, stories_dir, tmpdir, varent

import test_gguf as TG  # the GGUF builders (a tiny qwen3)
import gguf_np as G

work = tmpdir("lost")
model = stories_dir("f32")
BAD_M = os.path.join(work, "no-such-model")
IS_ROOT = os.geteuid() == 0


def snapshot(path):
    """What a path is: kind, and the bytes of a regular file or a link's text."""
    if not os.path.lexists(path):
        return ("missing",)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            return ("file", hashlib.sha256(f.read()).hexdigest())
    if stat.S_ISCHR(st.st_mode):
        return ("chr", os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISFIFO(st.st_mode):
        return ("fifo",)
    return ("other", st.st_mode)


def leftovers(d):
    return sorted(f for f in os.listdir(d) if ".tmp" in f)


def make_targets(d):
    """One of each kind of thing a user might name as an output, inside d."""
    os.makedirs(d, exist_ok=True)
    t = {}
    t["file"] = os.path.join(d, "existing.txt")
    with open(t["file"], "w") as f:
        f.write("precious results\n")
    t["fifo"] = os.path.join(d, "fifo")
    os.mkfifo(t["fifo"])
    target = os.path.join(d, "link-target.txt")
    with open(target, "w") as f:
        f.write("behind the link\n")
    t["link"] = os.path.join(d, "link")
    os.symlink("link-target.txt", t["link"])
    if IS_ROOT:
        t["dev"] = os.path.join(d, "null-node")
        os.mknod(t["dev"], 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    return t


class FifoReader:
    """Reads a FIFO in a thread, so that a writer's open() returns (as `cat fifo &`)."""

    def __init__(self, path):
        self.data = b""
        self.t = threading.Thread(target=self.run, args=(path,), daemon=True)
        self.t.start()

    def run(self, path):
        with open(path, "rb") as f:
            self.data = f.read()

    def join(self):
        self.t.join(timeout=60)
        return self.data


def release(path):
    """Unblocks a FifoReader that no writer opened (a run that failed first): open and
    close once. ENXIO: the reader is already gone."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# ---- failures leave every pre-existing thing as it was ------------------------------

def failing_outputs():
    """Each writing flag, with a wrong -m, on every kind of target."""
    cases = [
        ("run_metrics_out", lambda p: ["run", "-m", BAD_M, "-p", "x", "--metrics-out", p]),
        ("run_metrics_out_force", lambda p: ["run", "-m", BAD_M, "-p", "x", "--metrics-out", p, "--force"]),
        ("agents_log", lambda p: ["agents", "-m", BAD_M, "-p", "x", "--log", p]),
        ("agents_log_text", lambda p: ["agents", "-m", BAD_M, "-p", "x", "--log-text", p, "--force"]),
        ("agents_dump_logits", lambda p: ["agents", "-m", BAD_M, "-p", "x", "--dump-logits", p, "--force"]),
        ("logits_out", lambda p: ["logits", "-m", BAD_M, "--ids", "1,2", "--out", p]),
        ("batch_out", lambda p: ["run", "-m", BAD_M, "--prompts", prompts(3), "-o", p, "--force"]),
        ("compare_out", lambda p: ["compare", "-m", BAD_M, "--prompts", prompts(3), "-o", p, "--force"]),
    ]
    for name, argv in cases:
        d = os.path.join(work, "fail-" + name)
        t = make_targets(d)
        for kind, path in t.items():
            before = {k: snapshot(p) for k, p in t.items()}
            reader = FifoReader(path) if kind == "fifo" else None
            r = varent(*argv(path), timeout=60)
            if reader:
                release(path)
                reader.join()
            after = {k: snapshot(p) for k, p in t.items()}
            target_after = snapshot(os.path.join(d, "link-target.txt"))
            ok = r.returncode != 0 and before == after and not leftovers(d) \
                and target_after == ("file", hashlib.sha256(b"behind the link\n").hexdigest())
            check(ok, f"lost_{name}_fails_on_{kind}",
                  f"rc {r.returncode}; changed: {[k for k in t if before[k] != after[k]]}; "
                  f"left {leftovers(d)}; {r.stderr.strip()[-200:]}")


_prompts = {}


def prompts(n):
    if n not in _prompts:
        p = os.path.join(work, f"prompts{n}.txt")
        with open(p, "w") as f:
            f.write("".join(f"Once upon a time {i}\n" for i in range(n)))
        _prompts[n] = p
    return _prompts[n]


def existing_records_are_refused():
    """An existing regular file given to a records output without --force is refused."""
    d = os.path.join(work, "exists")
    t = make_targets(d)
    for name, argv in [
        ("metrics_out", ["run", "-m", model, "-p", "x", "-n", "2", "--metrics-out", t["file"]]),
        ("batch_out", ["run", "-m", model, "--prompts", prompts(2), "-n", "2", "-o", t["file"]]),
        ("compare_out", ["compare", "-m", model, "--prompts", prompts(2), "-n", "2", "-o", t["file"]]),
        ("agents_log", ["agents", "-m", model, "-p", "x", "-n", "2", "--log", t["file"]]),
    ]:
        before = snapshot(t["file"])
        r = varent(*argv, timeout=120)
        check(r.returncode == 1 and "already exists" in r.stderr and "--force" in r.stderr
              and snapshot(t["file"]) == before, f"lost_{name}_refuses_existing_file",
              f"rc {r.returncode} {r.stderr.strip()[-200:]}")


# ---- converters --------------------------------------------------------------------

def model_dir_snapshot(d):
    if not os.path.isdir(d):
        return None
    return {f: snapshot(os.path.join(d, f)) for f in sorted(os.listdir(d))}


def converters_keep_existing_dir():
    """A failed conversion into an existing model directory changes nothing in it."""
    import lzma
    src = os.path.join(vtest.TESTDATA, "stories260K")
    ckpt = os.path.join(work, "stories260K.bin")
    with lzma.open(os.path.join(src, "stories260K.bin.xz")) as f:
        data = f.read()
    trunc = os.path.join(work, "truncated.bin")
    with open(trunc, "wb") as f:
        f.write(data[: len(data) // 2])
    with open(ckpt, "wb") as f:
        f.write(data)
    out = os.path.join(work, "existing-model")
    r = varent("convert", "llama2c", ckpt, os.path.join(src, "tok512.bin"), out)
    if not check(r.returncode == 0, "lost_convert_setup", r.stderr):
        return
    before = model_dir_snapshot(out)
    r = varent("convert", "llama2c", trunc, os.path.join(src, "tok512.bin"), out)
    check(r.returncode == 1 and model_dir_snapshot(out) == before, "lost_convert_llama2c_truncated_keeps_dir",
          f"rc {r.returncode} {r.stderr.strip()}; now {model_dir_snapshot(out)}")
    r = varent("convert", "llama2c", ckpt, os.path.join(work, "no-such-tok.bin"), out)
    check(r.returncode == 1 and model_dir_snapshot(out) == before, "lost_convert_llama2c_bad_tokenizer_keeps_dir",
          f"rc {r.returncode} {r.stderr.strip()}; now {model_dir_snapshot(out)}")
    bad_gguf = os.path.join(work, "bad.gguf")
    with open(bad_gguf, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    r = varent("convert", "gguf", bad_gguf, out)
    check(r.returncode == 1 and model_dir_snapshot(out) == before, "lost_convert_gguf_bad_keeps_dir",
          f"rc {r.returncode} {r.stderr.strip()}")


def tiny_gguf():
    L, D, F, H, KV, hd, V = 1, 64, 96, 4, 2, 32, len(TG.TOKENS)
    hf = TG.hf_tensors(L, D, F, H, KV, hd, V, qk_norm=True)
    kv = TG.hparams_kv("qwen3", L, D, F, H, KV, head_dim=hd)
    kv.update(TG.tok_kv("qwen2"))
    recs, _ = TG.to_gguf(hf, {})
    path = os.path.join(work, "tiny.gguf")
    G.write_gguf(path, kv, recs)
    return path


def convert_sigterm_removes_temps(gguf):
    """SIGTERM while the converter waits on a FIFO output: its temporary files go, the
    FIFO and the files already in OUT stay."""
    out = os.path.join(work, "sigterm-model")
    os.makedirs(out)
    fifo = os.path.join(out, "tokenizer_config.json")  # the last file written
    os.mkfifo(fifo)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write("{}\n")
    before = model_dir_snapshot(out)
    p = subprocess.Popen([vtest.VARENT, "convert", "gguf", gguf, out], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while time.time() < deadline and len(leftovers(out)) < 3:
        time.sleep(0.02)
    temps = leftovers(out)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    check(len(temps) >= 3 and p.returncode == -signal.SIGTERM and not leftovers(out)
          and model_dir_snapshot(out) == before, "lost_convert_sigterm_removes_only_temps",
          f"temps while running {temps}; rc {p.returncode}; left {leftovers(out)}; now {model_dir_snapshot(out)}")


def convert_writes_fifo_in_place(gguf):
    out = os.path.join(work, "fifo-model")
    os.makedirs(out)
    fifo = os.path.join(out, "config.json")
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    r = varent("convert", "gguf", gguf, out, timeout=60)
    data = reader.join()
    check(r.returncode == 0 and stat.S_ISFIFO(os.lstat(fifo).st_mode) and b"Qwen3ForCausalLM" in data
          and not leftovers(out), "lost_convert_fifo_written_in_place", f"rc {r.returncode} {r.stderr.strip()}")


# ---- successful writes to special targets --------------------------------------------

def success_targets():
    d = os.path.join(work, "ok")
    t = make_targets(d)
    ref = varent("logits", "-m", model, "--ids", "1,2", "--out", os.path.join(d, "plain.f32"))
    if not check(ref.returncode == 0, "lost_logits_plain", ref.stderr):
        return
    with open(os.path.join(d, "plain.f32"), "rb") as f:
        want = f.read()
    # a symlink: the target gets the data, the link stays a link
    r = varent("logits", "-m", model, "--ids", "1,2", "--out", t["link"])
    with open(os.path.join(d, "link-target.txt"), "rb") as f:
        got = f.read()
    check(r.returncode == 0 and snapshot(t["link"]) == ("link", "link-target.txt") and got == want,
          "lost_logits_through_symlink", f"rc {r.returncode} {r.stderr.strip()} {snapshot(t['link'])}")
    # a FIFO: written in place
    reader = FifoReader(t["fifo"])
    r = varent("logits", "-m", model, "--ids", "1,2", "--out", t["fifo"])
    check(r.returncode == 0 and reader.join() == want and snapshot(t["fifo"]) == ("fifo",),
          "lost_logits_into_fifo", f"rc {r.returncode} {r.stderr.strip()}")
    # a device node: written in place, still the same node
    if IS_ROOT:
        r = varent("logits", "-m", model, "--ids", "1,2", "--out", t["dev"])
        check(r.returncode == 0 and snapshot(t["dev"]) == ("chr", 1, 3), "lost_logits_into_device_node",
              f"rc {r.returncode} {r.stderr.strip()} {snapshot(t['dev'])}")
        log = os.path.join(work, "plot-src.jsonl")
        node = os.path.join(d, "null-node.svg")  # plot picks the format by the name
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        rr = varent("run", "-m", model, "-p", "Once", "-n", "4", "--seed", "1", "--metrics-out", log)
        r = varent("plot", log, "-o", node)
        check(rr.returncode == 0 and r.returncode == 0 and snapshot(node) == ("chr", 1, 3),
              "lost_plot_into_device_node", f"rc {rr.returncode}/{r.returncode} {r.stderr.strip()}")
        r = varent("agents", "-m", model, "-p", "x", "-n", "3", "--seed", "1", "--log", t["dev"])
        check(r.returncode == 0 and snapshot(t["dev"]) == ("chr", 1, 3), "lost_agents_log_into_device_node",
              f"rc {r.returncode} {r.stderr.strip()}")
    # an existing regular file: replaced whole, and only on success
    before = snapshot(t["file"])
    r = varent("logits", "-m", model, "--ids", "1,2", "--out", t["file"])
    check(r.returncode == 0 and snapshot(t["file"]) == ("file", hashlib.sha256(want).hexdigest()) != before
          and not leftovers(d), "lost_logits_replaces_file_on_success", r.stderr)


# ---- batch outputs: records survive Ctrl-C and SIGTERM; --resume continues -----------

def read_records(path):
    import json
    with open(path) as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [json.loads(x) for x in lines]


def interrupt_batch(dest, sig, extra=()):
    """Starts a 30-prompt batch, signals it once two records are written (two prompts
    decode at a time: all 30 together would end at once)."""
    p = subprocess.Popen([vtest.VARENT, "run", "-m", model, "--prompts", prompts(30), "-n", "200", "--seed", "1",
                          "--parallel", "2", "-o", dest, "-q", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(dest) and open(dest).read().count("\n") >= 2:
            break
        time.sleep(0.02)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    return p.returncode, err


def batch_records():
    d = os.path.join(work, "batch")
    os.makedirs(d)
    dest = os.path.join(d, "out.jsonl")
    rc, err = interrupt_batch(dest, signal.SIGINT)
    recs = read_records(dest) if os.path.exists(dest) else []
    check(rc == 130 and 2 <= len(recs) < 30 and "--resume" in err and not leftovers(d),
          "lost_batch_sigint_keeps_records", f"rc {rc}, {len(recs)} records, left {leftovers(d)}, {err[-200:]!r}")
    n_int = len(recs)
    # a rerun without --resume or --force: refused, the file unchanged
    before = snapshot(dest)
    r = varent("run", "-m", model, "--prompts", prompts(30), "-n", "200", "--seed", "1", "-o", dest, "-q")
    check(r.returncode == 1 and "already exists" in r.stderr and snapshot(dest) == before,
          "lost_batch_rerun_refused", f"rc {r.returncode} {r.stderr.strip()}")
    # SIGTERM while resuming: the records written so far stay, nothing else is left
    rc, err = interrupt_batch(dest, signal.SIGTERM, ["--resume"])
    recs = read_records(dest)
    check(rc == -signal.SIGTERM and len(recs) >= n_int and not leftovers(d), "lost_batch_sigterm_keeps_records",
          f"rc {rc}, {len(recs)} records (had {n_int}), left {leftovers(d)}")
    # a partial last line, as SIGKILL mid-write leaves: --resume drops it and finishes
    with open(dest, "a") as f:
        f.write('{"index":29,"line":30,"prom')
    r = varent("run", "-m", model, "--prompts", prompts(30), "-n", "200", "--seed", "1", "-o", dest, "-q", "--resume",
               timeout=600)
    recs = read_records(dest) if r.returncode == 0 else []
    idx = sorted(x["index"] for x in recs)
    check(r.returncode == 0 and idx == list(range(30)), "lost_batch_resume_completes",
          f"rc {r.returncode} {r.stderr.strip()[-200:]} indices {idx}")
    # resumed records equal a fresh run's (same seed, same prompt): compare texts
    fresh = os.path.join(d, "fresh.jsonl")
    r = varent("run", "-m", model, "--prompts", prompts(30), "-n", "200", "--seed", "1", "-o", fresh, "-q", timeout=600)
    want = {x["index"]: x["text"] for x in read_records(fresh)} if r.returncode == 0 else {}
    got = {x["index"]: x["text"] for x in recs}
    check(r.returncode == 0 and got == want, "lost_batch_resume_equals_fresh_run",
          f"{sum(got.get(i) != want.get(i) for i in range(30))} texts differ")
    # --resume of another prompt file is refused, the file unchanged
    before = snapshot(dest)
    r = varent("run", "-m", model, "--prompts", prompts(3), "-n", "2", "-o", dest, "--resume")
    check(r.returncode == 1 and "not resuming" in r.stderr and snapshot(dest) == before,
          "lost_batch_resume_other_prompts_refused", r.stderr.strip())
    # --force with SIGTERM: the old file stays whole, the temporary file goes
    before = snapshot(dest)
    p = subprocess.Popen([vtest.VARENT, "run", "-m", model, "--prompts", prompts(400), "-n", "200", "--seed", "1",
                          "-o", dest, "-q", "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    seen = []
    while time.time() < deadline:  # two records in the temporary file
        seen = leftovers(d)
        if seen and open(os.path.join(d, seen[0])).read().count("\n") >= 2:
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    check(seen and p.returncode == -signal.SIGTERM and snapshot(dest) == before and not leftovers(d),
          "lost_batch_force_sigterm_keeps_old_file", f"seen {seen}, rc {p.returncode}, left {leftovers(d)}")


def main():
    if not os.path.exists(vtest.VARENT):
        skip("nothing_lost", f"no varent binary at {vtest.VARENT}")
        vtest.done()
    if not IS_ROOT:
        skip("lost_device_nodes", "not root: no mknod (FIFOs, symlinks and files are still tested)")
    failing_outputs()
    existing_records_are_refused()
    converters_keep_existing_dir()
    gguf = tiny_gguf()
    convert_sigterm_removes_temps(gguf)
    convert_writes_fifo_in_place(gguf)
    success_targets()
    batch_records()
    vtest.done()


if __name__ == "__main__":
    main()
