"""test_progress: long commands on a terminal and piped (issue 23 item 6). On a pty (python's
pty module) the bar carries an ETA and is redrawn at least every 2 s even while one unit
of work takes longer; batch records written to the terminal's stdout never share a line
with the bar. Piped, progress is plain lines with an ETA. Batch `run -o` keeps its finished
records on Ctrl-C and `--resume` runs only the missing indices."""
import json
import lzma
import os
import pty
import re
import select
import signal
import subprocess
import time

from slowmodel import write_slow_model
from vtest import VARENT, check, done, stories_dir, tmpdir, varent

work = tmpdir("progress")
slow = os.path.join(work, "slow")
write_slow_model(slow, stories_dir("f32"))
prompts = os.path.join(work, "prompts.txt")
open(prompts, "w").write("".join(f"Once upon a time {i}\n" for i in range(4)))
text = os.path.join(work, "text.txt")
open(text, "w").write("The cat sat on the mat and the dog ran in the park. " * 60)


def on_pty(args, timeout=240):
    """Runs varent with stdout and stderr on one pty; [(time, bytes)] chunks and the status."""
    master, slave = pty.openpty()
    p = subprocess.Popen([VARENT, *map(str, args)], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks, t0 = [], time.time()
    while time.time() - t0 < timeout:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                b = os.read(master, 65536)
            except OSError:
                break
            if not b:
                break
            chunks.append((time.time() - t0, b))
        elif p.poll() is not None:
            break
    p.wait(timeout=10)
    os.close(master)
    return chunks, p.returncode


def redraw_gaps(chunks, start_pat, end_pat):
    """Seconds between bar redraws (\\r) while the task runs."""
    times, seen = [], False
    for t, b in chunks:
        seen = seen or start_pat in b
        if seen and b"\r" in b:
            times.append(t)
        if seen and end_pat in b:
            break
    return [b - a for a, b in zip(times, times[1:])], times


# Batch records on the terminal's stdout: each starts a line of its own.
chunks, rc = on_pty(["run", "-m", slow, "--prompts", prompts, "-n", 48, "--temp", "0"])
out = b"".join(b for _, b in chunks)
starts = [m.start() for m in re.finditer(rb'\{"index"', out)]
glued = [out[max(0, s - 30):s] for s in starts if not (out[:s].endswith(b"\n") or out[:s].endswith(b"\x1b[K"))]
check(rc == 0 and len(starts) == 4 and not glued, "pty_records_never_share_the_bar_line", f"rc={rc} {glued[:2]}")
check(b"ETA" in out, "pty_bar_has_eta", repr(out[-300:]))

# ppl on a terminal: redrawn at least every 2 s (the ticker), with an ETA.
chunks, rc = on_pty(["ppl", "-m", slow, "-f", text, "--ctx", 256, "--stride", 128])
gaps, times = redraw_gaps(chunks, b"ppl [", b"ppl: done")
out = b"".join(b for _, b in chunks)
check(rc == 0 and len(times) >= 2 and max(gaps) < 2.0 and re.search(rb"ppl \[.*ETA \d", out),
      "pty_ppl_redrawn_every_2s_with_eta", f"rc={rc} redraws={len(times)} max gap={max(gaps) if gaps else None}")

# bench on a terminal: a bar from the first second, the results on lines of their own.
chunks, rc = on_pty(["bench", "-m", slow, "-n", 32, "--prompt-len", 32, "--runs", 2, "--sampler", "standard"])
out = b"".join(b for _, b in chunks)
first_bar = next((t for t, b in chunks if b"bench [" in b), None)
results_glued = [out[max(0, m.start() - 30):m.start()] for m in re.finditer(rb"(prefill|decode|sampler) ", out)
                 if not (out[:m.start()].endswith(b"\n") or out[:m.start()].endswith(b"\x1b[K"))]
check(rc == 0 and first_bar is not None and first_bar < 3 and b"ETA" in out and not results_glued,
      "pty_bench_progress", f"rc={rc} first bar at {first_bar} {out[-400:]!r}")

# Piped: plain lines (no \r) with an ETA, for ppl and convert.
r = varent("ppl", "-m", slow, "-f", text, "--ctx", 256, "--stride", 128)
lines = [l for l in r.stderr.splitlines() if l.startswith("ppl:")]
check(r.returncode == 0 and "\r" not in r.stderr and any("ETA" in l for l in lines) and "PPL =" in r.stdout,
      "piped_ppl_lines_with_eta", r.stderr[-500:])
gguf = os.path.join(os.environ.get("TESTDATA", "tests/data"), "gguf-tiny", "tiny.gguf")
r = varent("convert", "gguf", gguf, os.path.join(work, "conv"))
check(r.returncode == 0 and "convert: done" in r.stderr and "\r" not in r.stderr, "piped_convert_progress", r.stderr)
# llama2c: the stories260K checkpoint, unpacked here
l2c = os.path.join(work, "stories260K.bin")
with lzma.open(os.path.join(os.environ.get("TESTDATA", "tests/data"), "stories260K", "stories260K.bin.xz")) as f:
    open(l2c, "wb").write(f.read())
tok = os.path.join(os.environ.get("TESTDATA", "tests/data"), "stories260K", "tok512.bin")
r = varent("convert", "llama2c", l2c, tok, os.path.join(work, "conv2"))
check(r.returncode == 0 and "convert: done" in r.stderr and "\r" not in r.stderr, "piped_convert_llama2c_progress",
      r.stderr)

# run -o: Ctrl-C keeps the finished records; --resume runs only the missing indices.
# --parallel 1: one prompt after another, so a record is finished while others are not
# (decoded together, the 4 equal-length greedy runs end at the same step).
outp = os.path.join(work, "out.jsonl")
p = subprocess.Popen([VARENT, "run", "-m", slow, "--prompts", prompts, "-n", "400", "--temp", "0", "-q", "-o", outp,
                      "--parallel", "1"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
t0 = time.time()
while time.time() - t0 < 120 and not (os.path.exists(outp) and open(outp).read().count("\n") >= 1):
    time.sleep(0.05)
p.send_signal(signal.SIGINT)
_, err = p.communicate(timeout=120)
kept = [json.loads(l) for l in open(outp)] if os.path.exists(outp) else []
check(p.returncode == 130 and 1 <= len(kept) < 4 and "--resume" in err, "run_o_ctrl_c_keeps_records",
      f"rc={p.returncode} kept={len(kept)} {err[-300:]}")
r = varent("run", "-m", slow, "--prompts", prompts, "-n", 400, "--temp", "0", "-q", "-o", outp, "--resume")
recs = [json.loads(l) for l in open(outp)]
check(r.returncode == 0 and sorted(x["index"] for x in recs) == [0, 1, 2, 3] and recs[:len(kept)] == kept,
      "run_o_resume_skips_done_indices", f"{[x['index'] for x in recs]} {r.stderr[-300:]}")
done()
