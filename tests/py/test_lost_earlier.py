"""Nothing lost, the earlier round's cases (docs/robustness.md): a failed conversion into
an existing model directory changes nothing there, SIGTERM during a conversion removes only
its temporary files, a FIFO output is written in place; a batch's records survive Ctrl-C and
SIGTERM, --resume continues after a partial last line and equals a fresh run, and --force
with SIGTERM keeps the old file whole. The matrix of issue 32 is test_nothing_lost.py."""
import os
import signal
import stat
import subprocess
import time

import vtest
from vtest import check, skip, stories_dir, tmpdir, varent

import gguf_np as G
import test_gguf as TG  # the GGUF builders (a tiny qwen3)
from lost_files import FifoReader, leftovers, lines_file, snapshot

work = tmpdir("lost-earlier")
model = stories_dir("f32")
PROMPTS = {n: lines_file(work, f"prompts{n}.txt", [f"Once upon a time {i}" for i in range(n)]) for n in (3, 30, 400)}


def prompts(n):
    return PROMPTS[n]


# ---- the earlier round's cases: converters --------------------------------------------------------------------

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
        skip("lost_earlier", f"no varent binary at {vtest.VARENT}")
        vtest.done()
    converters_keep_existing_dir()
    gguf = tiny_gguf()
    convert_sigterm_removes_temps(gguf)
    convert_writes_fifo_in_place(gguf)
    batch_records()
    vtest.done()


if __name__ == "__main__":
    main()
