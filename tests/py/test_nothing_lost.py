"""Nothing varent did not create is touched (docs/robustness.md, "Output files").

The matrix of issue 32: every writer (each output flag of each command) x every kind of
target (a new name, a file, a link, a dangling link, a FIFO with and without a reader, a
device node, a directory, a read-only file, /dev/stdout appended to or a pipe, a foreign
link in a sticky directory) x every mode (a wrong -m, a failure after the outputs were
opened, success, --force, Ctrl-C, SIGTERM). Each case runs in a directory of its own and
checks, besides the exit status and the message, that everything there is afterwards what
the table says: the same kind of file with the same bytes, or the output where it belongs,
and no temporary file left. Then the stale temporary files of a killed run, the server's
capture directory. The earlier round's cases (batches, --resume, the converters) are
test_lost_earlier.py."""
import concurrent.futures
import json
import os
import signal
import stat
import subprocess
import threading
import time

import vtest
from vtest import check, skip, stories_dir, tmpdir, varent

from lost_files import FifoReader, leftovers, read, snapshot, write
from lost_files import lines_file as lost_files_lines

work = tmpdir("lost")
os.chmod(work, 0o755)
model = stories_dir("f32")
BAD_M = os.path.join(work, "no-such-model")
IS_ROOT = os.geteuid() == 0
ONLY = os.environ.get("LOST_ONLY", "")  # run only the matrix cases whose name holds this (and nothing else)
NOBODY = 65534
OLD = b"old line\n"      # what a shell's `>>` target held before
PRECIOUS = b"precious results\n"
BEHIND = b"behind the link\n"
VICTIM = b"the victim\n"


# ---- fixtures ------------------------------------------------------------------------

def model_copy(name, edit=None):
    import shutil
    d = os.path.join(work, name)
    shutil.copytree(model, d)
    if edit:
        edit(d)
    return d


def endless(d):
    """No EOS and a long context (a run is still generating when a signal comes), and a
    chat template (for `chat`)."""
    vtest.make_endless(d)
    c = json.load(open(os.path.join(d, "tokenizer_config.json")))
    c["chat_template"] = open(os.path.join(vtest.TESTDATA, "chat-templates", "meta-llama-Llama-2-chat.jinja")).read()
    json.dump(c, open(os.path.join(d, "tokenizer_config.json"), "w"))


def prompts(n):
    return PROMPTS[n]


def lines_file(name, lines):
    return lost_files_lines(work, name, lines)


M_OK = model_copy("model-ok", endless)  # endless, but short runs stop at -n
M_NAN = model_copy("model-nan", lambda d: vtest.poison_tensor(d, "model.layers.1.mlp.down_proj.weight", float("nan")))
PROMPTS = {n: lines_file(f"prompts{n}.txt", [f"Once upon a time {i}" for i in range(n)]) for n in (1, 2, 3, 30, 400)}
TASKS = {n: lines_file(f"tasks{n}.jsonl", [json.dumps({"prompt": f"Once upon a time {i}", "answer": "x",
                                                       "match": "contains"}) for i in range(n)]) for n in (2, 300)}
CORPUS = lines_file("corpus.txt", ["Once upon a time there was a girl. She liked to play in the park."])
POS = lines_file("happy.txt", ["I am so happy today", "What a wonderful day", "I love it"])
NEG = lines_file("sad.txt", ["I am so sad today", "What a terrible day", "I hate it"])
PLOT_LOG = os.path.join(work, "plot-src.jsonl")
os.chmod(work, 0o777)  # a read-only case runs as nobody and reads the fixtures


# ---- the writers -----------------------------------------------------------------------

class Writer:
    """One output flag: kind "records" (refuses an existing file without --force), "capture"
    (the same, a document), or "document" (replaces a file on success). argv(path, m, long)
    with m the model (None: the wrong one); long: a run that lasts until a signal."""

    def __init__(self, name, kind, ext, argv, force=True, gen=False, signals=False, stdin=None, by_name=False):
        self.name, self.kind, self.ext, self.argv = name, kind, ext, argv
        self.force, self.gen, self.signals, self.stdin = force, gen, signals, stdin
        self.by_name = by_name  # picks the format by the name's extension: no /dev/stdout

    def args(self, path, m, long=False, force=False):
        return self.argv(path, m if m else BAD_M, long) + (["--force"] if force else [])


def gen_args(m, long, n=6):
    return ["-m", m, "-t", "1", "--seed", "1"] + (["--ctx", "65536", "-n", "60000"] if long else ["-n", str(n)])


def good(m, path):
    """For the writers without a model: a good input, or a missing one (the wrong -m)."""
    return path if m != BAD_M else os.path.join(work, "no-such-input")


WRITERS = [
    Writer("run_metrics", "records", ".jsonl", lambda p, m, lg: ["run", *gen_args(m, lg), "-p", "Once upon a time",
                                                                  "--metrics-out", p], gen=True, signals=True),
    Writer("run_batch", "records", ".jsonl", lambda p, m, lg: [
        "run", "-m", m, "-t", "1", "--seed", "1", "-n", "20" if lg else "4", "--prompts", PROMPTS[400 if lg else 2],
        "-q", "-o", p], gen=True, signals=True),
    Writer("agents_log", "records", ".jsonl", lambda p, m, lg: ["agents", *gen_args(m, lg), "-p", "Once upon a time",
                                                                 "--log", p], gen=True, signals=True),
    Writer("agents_log_text", "records", ".txt", lambda p, m, lg: ["agents", *gen_args(m, lg, 3), "-p", "Once",
                                                                     "--log-text", p], gen=True),
    Writer("agents_dump_logits", "records", ".bin", lambda p, m, lg: ["agents", *gen_args(m, lg, 3), "-p", "Once",
                                                                       "--dump-logits", p], gen=True),
    Writer("compare_out", "records", ".jsonl", lambda p, m, lg: [
        "compare", "-m", m, "-t", "1", "--seed", "1", "-n", "20" if lg else "4", "--prompts", PROMPTS[400 if lg else 1],
        "--samplers", "greedy", "-q", "-o", p], gen=True, signals=True),
    Writer("eval_out", "records", ".jsonl", lambda p, m, lg: [
        "eval", "-m", m, "-t", "1", "--seed", "1", "-n", "20" if lg else "4", "--tasks", TASKS[300 if lg else 2],
        "--samplers", "greedy", "-q", "-o", p], gen=True, signals=True),
    Writer("compare_metrics", "records", ".jsonl", lambda p, m, lg: [
        "compare", "-m", m, "-t", "1", "--seed", "1", "-n", "4", "--prompts", PROMPTS[1], "--samplers", "greedy", "-q",
        "--metrics-out", p], gen=True),
    Writer("eval_metrics", "records", ".jsonl", lambda p, m, lg: [
        "eval", "-m", m, "-t", "1", "--seed", "1", "-n", "4", "--tasks", TASKS[2], "--samplers", "greedy", "-q",
        "--metrics-out", p], gen=True),
    Writer("calibrate_out", "capture", ".json", lambda p, m, lg: [  # replaces a file only with --force
        "calibrate", "-m", m, "-t", "1", "-f", CORPUS, "--max-tokens", "20", "-q", "-o", p]),
    Writer("cvector_out", "document", ".gguf", lambda p, m, lg: [
        "cvector", "-m", m, "-t", "1", "--positive", POS, "--negative", NEG, "-o", p], force=False),
    Writer("eval_summary", "document", ".md", lambda p, m, lg: [
        "eval", "-m", m, "-t", "1", "-n", "4", "--tasks", TASKS[2], "--samplers", "greedy", "-q", "--summary", p],
           force=False),
    Writer("run_dump_acts", "capture", ".safetensors", lambda p, m, lg: [
        "run", *gen_args(m, lg, 4), "-p", "Once upon a time", "--dump-acts", p], gen=True, signals=True),
    Writer("chat_metrics", "records", ".jsonl", lambda p, m, lg: ["chat", "-m", m, "-t", "1", "-n", "4", "--temp", "0",
                                                                   "--metrics-out", p], stdin="Hello\n"),
    Writer("logits_out", "document", ".bin", lambda p, m, lg: ["logits", "-m", m, "-t", "1", "--ids", "1,403,407",
                                                                "--out", p], force=False),
    Writer("ppl_per_token", "document", ".jsonl", lambda p, m, lg: ["ppl", "-m", m, "-t", "1", "-f", CORPUS, "-q",
                                                                     "--per-token", p], force=False),
    Writer("plot_out", "document", ".svg", lambda p, m, lg: ["plot", good(m, PLOT_LOG), "-o", p], force=False,
           by_name=True),
    Writer("eval_write", "document", ".jsonl", lambda p, m, lg: ["eval", "--tasks", good(m, TASKS[2]), "--write", p],
           force=False),
]


def valid(w, data):
    """Whether data is a whole output of writer w."""
    if not data:
        return False
    if w.ext == ".jsonl":
        try:
            return all(json.loads(x) is not None for x in data.decode().split("\n")[:-1]) and data.endswith(b"\n")
        except ValueError:
            return False
    if w.ext == ".bin":
        return len(data) % 2048 == 0  # 512 float32 logits per record
    if w.ext == ".safetensors":
        n = int.from_bytes(data[:8], "little")
        try:
            return len(data) >= 8 + n and "positions" in json.loads(data[8:8 + n])
        except ValueError:
            return False
    if w.ext == ".svg":
        return b"<svg" in data
    if w.ext == ".gguf":
        return data.startswith(b"GGUF")
    if w.ext == ".json":
        try:
            return isinstance(json.loads(data), dict)
        except ValueError:
            return False
    return len(data) > 10


# ---- the targets ----------------------------------------------------------------------

def tree(d):
    """Every entry under d (but the captured stdout) and what it is."""
    out = {}
    for root, dirs, files in os.walk(d):
        for f in dirs + files:
            p = os.path.join(root, f)
            if f != "stdout.log":
                out[os.path.relpath(p, d)] = snapshot(p)
    return out


TARGETS = ["new", "file", "link", "dangling", "fifo_reader", "fifo_noreader", "dev", "dir", "readonly",
           "stdout_append", "stdout_pipe", "sticky_link"]
# A wrong -m opens nothing: the targets whose opening could block or lose something
BAD_TARGETS = ["new", "file", "link", "dangling", "fifo_reader", "fifo_noreader", "dev", "stdout_append"]


def make_target(d, kind, ext):
    """The target of one case inside d: its path, and where its data should land."""
    out = os.path.join(d, "out" + ext)
    if kind == "file":
        write(out, PRECIOUS)
    elif kind == "link":
        write(os.path.join(d, "target" + ext), BEHIND)
        os.symlink("target" + ext, out)
        return out, os.path.join(d, "target" + ext)
    elif kind == "dangling":
        os.symlink("created" + ext, out)
        return out, os.path.join(d, "created" + ext)
    elif kind.startswith("fifo"):
        os.mkfifo(out)
    elif kind == "dev":
        try:
            os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
        except OSError:  # not root, or no CAP_MKNOD: the system's
            return "/dev/null", None
    elif kind == "dir":
        os.mkdir(out)
    elif kind == "readonly":  # in a directory anyone may write to: a rename could replace it
        write(out, PRECIOUS, 0o444)
        os.chmod(d, 0o777)
    elif kind.startswith("stdout"):
        write(os.path.join(d, "stdout.log"), OLD)
        return "/dev/stdout", None
    elif kind == "sticky_link":
        sticky = os.path.join(d, "sticky")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        write(os.path.join(d, "victim" + ext), VICTIM)
        out = os.path.join(sticky, "out" + ext)
        os.symlink("../victim" + ext, out)
        os.lchown(out, NOBODY, NOBODY)
    return out, out



# ---- one case ---------------------------------------------------------------------------

class Run:
    """A finished case: exit status, stdout (bytes), stderr (text), what a FIFO reader got."""
    rc, out, err, fifo = None, b"", "", b""


def start(w, argv, d, kind, as_nobody):
    kw = {"stderr": subprocess.PIPE, "stdin": subprocess.PIPE if w.stdin else subprocess.DEVNULL}
    if kind == "stdout_append":
        kw["stdout"] = open(os.path.join(d, "stdout.log"), "ab")
    else:
        kw["stdout"] = subprocess.PIPE
    if as_nobody:
        kw.update(user=NOBODY, group=NOBODY, extra_groups=[])
    p = subprocess.Popen([vtest.VARENT, *argv], **kw)
    if kind == "stdout_append":
        kw["stdout"].close()
    return p


def finish(p, w, timeout):
    r = Run()
    try:
        out, err = p.communicate(input=w.stdin.encode() if w.stdin else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += b"\n(HUNG: killed after %d s)" % timeout
    r.rc, r.out, r.err = p.returncode, out or b"", err.decode(errors="replace")
    return r


def run_plain(w, argv, d, kind, as_nobody=False):
    """A run to its end; a FIFO target with a reader, or without one (then the reader
    comes once the run says it waits for one)."""
    path = os.path.join(d, "out" + w.ext)
    reader = FifoReader(path) if kind == "fifo_reader" else None
    p = start(w, argv, d, kind, as_nobody)
    if kind == "fifo_noreader":
        return wait_for_reader(p, w, path)
    r = finish(p, w, 120)
    if reader:
        r.fifo = reader.join()
    return r


def wait_for_reader(p, w, path):
    """A FIFO without a reader: the run must say that it waits for one (and not block
    silently); then a reader comes and gets the data."""
    lines, noticed = [], threading.Event()

    def read_stderr():
        for line in p.stderr:
            lines.append(line)
            if b"waiting for a reader" in line:
                noticed.set()
        noticed.set()  # the run ended without the notice

    t = threading.Thread(target=read_stderr, daemon=True)
    t.start()
    if w.stdin:
        try:
            p.stdin.write(w.stdin.encode())
            p.stdin.close()
        except BrokenPipeError:  # the run ended before reading it all: its status and files say how
            pass
    r = Run()
    noticed.wait(timeout=60)
    r.fifo = FifoReader(path).join()
    try:
        r.out = p.stdout.read()
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    t.join(timeout=60)
    r.rc, r.err = p.returncode, b"".join(lines).decode(errors="replace")
    return r


def progressed(w, d, kind, path):
    """Whether a long run has written something (so that a signal lands mid-run)."""
    if kind == "stdout_append":
        return os.path.getsize(os.path.join(d, "stdout.log")) > len(OLD) + 200
    temps = leftovers(d)
    if w.kind == "capture":
        return bool(temps)  # its data is written at the end
    f = path if kind == "new" else os.path.join(d, temps[0]) if temps else None
    try:
        return f is not None and read(f).count(b"\n") >= 2
    except OSError:
        return False


def run_signal(w, argv, d, kind, sig, path):
    p = start(w, argv, d, kind, False)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and not progressed(w, d, kind, path):
        time.sleep(0.02)
    time.sleep(0.3 if w.kind == "capture" else 0.1)  # a capture's rows are spooled elsewhere: let some come
    p.send_signal(sig)
    return finish(p, w, 60)


def partial_of(path, ext):
    return path[: -len(ext)] + ".partial" + ext


def judge(w, kind, mode, d, path, dest, before, r):
    """(ok, why) for one case, by the table in docs/robustness.md."""
    after = tree(d)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    rel = os.path.relpath(dest, d) if dest and dest.startswith(d) else None
    log = read(os.path.join(d, "stdout.log")) if kind == "stdout_append" else OLD
    why = f"rc {r.rc}; changed {changed}; left {leftovers(d)}; stderr {r.err.strip()[-300:]!r}"
    base = not leftovers(d) and log.startswith(OLD) and "HUNG" not in r.err
    if mode in ("bad", "fails_after_open"):  # a wrong -m is reported before any output is opened
        return base and r.rc not in (0, None) and not changed and (mode != "bad" or "waiting" not in r.err), why
    refuse = refusal(w, kind, mode)
    if refuse:
        return base and r.rc == 1 and refuse in r.err and not changed, why
    if mode in ("sigint", "sigterm"):
        return base and judge_signal(w, kind, mode, d, path, dest, changed, r, log), why
    if r.rc != 0 or not base:
        return False, why
    if kind in ("new", "file", "link", "dangling", "sticky_link"):
        mode_kept = kind != "file" or after[rel][2] == before[rel][2]
        return changed == [rel] and mode_kept and valid(w, read(dest)), why
    if kind.startswith("fifo"):
        waited = kind == "fifo_reader" or "waiting for a reader" in r.err
        return not changed and waited and valid(w, r.fifo), why + f"; the reader got {len(r.fifo)} bytes"
    if kind == "dev":
        return not changed, why
    data = log[len(OLD):] if kind == "stdout_append" else r.out
    return len(data) > 0 and (w.ext != ".jsonl" or b'{"' in data), why + f"; {len(data)} bytes through stdout"


def refusal(w, kind, mode):
    """The message of a case that must be refused, or None."""
    if kind == "dir":
        return "Is a directory"
    if kind == "sticky_link":
        return "protected_symlinks"
    if kind == "readonly":
        return "Permission denied" if mode == "force" or w.kind == "document" else "already exists"
    if kind in ("file", "link") and mode == "ok" and w.kind != "document":
        return "already exists"
    return None


def judge_signal(w, kind, mode, d, path, dest, changed, r, log):
    want_rc = 130 if mode == "sigint" else -signal.SIGTERM
    if r.rc != want_rc:
        return False
    if kind == "stdout_append":
        return len(log) > len(OLD)
    rel = os.path.relpath(dest, d)
    if kind == "new":  # the run's own file: records keep their whole lines; a capture only after Ctrl-C
        if w.kind == "capture" and mode == "sigterm":
            return not changed
        return changed == [rel] and valid(w, read(dest))
    if mode == "sigterm":  # the temporary file goes, the file stays
        return not changed
    part = partial_of(dest, w.ext)  # Ctrl-C: the finished part beside the file, named on stderr
    return changed == [os.path.relpath(part, d)] and valid(w, read(part)) and part in r.err and "left as it was" in r.err


def run_case(w, kind, mode):
    name = f"lost_{w.name}_{mode}_{kind}"
    d = os.path.join(work, f"{w.name}-{mode}-{kind}")
    os.makedirs(d)
    path, dest = make_target(d, kind, w.ext)
    before = tree(d)
    m = {"bad": None, "fails_after_open": M_NAN}.get(mode, M_OK)
    force = w.force and mode in ("force", "fails_after_open", "sigint", "sigterm")
    argv = w.args(path, m, long=mode in ("sigint", "sigterm"), force=force)
    t0 = time.time()
    if mode in ("sigint", "sigterm"):
        r = run_signal(w, argv, d, kind, signal.SIGINT if mode == "sigint" else signal.SIGTERM, path)
    else:
        r = run_plain(w, argv, d, kind, as_nobody=kind == "readonly")
    ok, why = judge(w, kind, mode, d, path, dest, before, r)
    return name, ok, why, time.time() - t0


def nobody_can_run():
    """Whether varent runs as nobody here (the read-only and sticky cases need a second user)."""
    if not IS_ROOT:
        return False
    try:
        r = subprocess.run([vtest.VARENT, "logits", "-m", M_OK, "--ids", "1", "--out", "/dev/null"], user=NOBODY,
                           group=NOBODY, extra_groups=[], capture_output=True, timeout=60)
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def matrix():
    r = vtest.varent("run", "-m", M_OK, "-t", "1", "-p", "Once", "-n", "6", "--seed", "1", "--metrics-out", PLOT_LOG)
    if not check(r.returncode == 0, "lost_matrix_setup", r.stderr):
        return
    two_users = nobody_can_run()
    if not two_users:
        skip("lost_readonly_and_sticky", "not root, or nobody cannot run varent here: no second user")
    todo = []
    for w in WRITERS:
        for kind in TARGETS:
            if (kind in ("readonly", "sticky_link") and not two_users) or (w.by_name and kind.startswith("stdout")):
                continue
            modes = ["ok"] + (["bad"] if kind in BAD_TARGETS else [])
            if w.force and kind in ("file", "link", "readonly", "sticky_link"):
                modes.append("force")
            if w.gen and kind in ("new", "file", "link", "dangling", "fifo_reader", "dev", "stdout_append"):
                modes.append("fails_after_open")
            if w.signals and kind in ("new", "file", "link", "stdout_append"):
                modes += ["sigint", "sigterm"]
            todo += [(w, kind, m) for m in modes if ONLY in f"lost_{w.name}_{m}_{kind}"]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(lambda c: run_case(*c), todo))
    slow = max(results, key=lambda x: x[3])
    for name, ok, why, _ in results:
        check(ok, name, why)
    print(f"# {len(results)} cases in {time.time() - t0:.1f} s (slowest {slow[0]} {slow[3]:.1f} s)", flush=True)


# ---- the standard streams by other names (issue 32 row 1) -----------------------------

def std_streams():
    """/dev/stderr appended to, /proc/self/fd/1 and /dev/fd/1, a link to /dev/stdout: each
    written through the descriptor, the earlier contents kept."""
    d = os.path.join(work, "streams")
    os.makedirs(d)
    log = os.path.join(d, "err.log")
    write(log, OLD)
    with open(log, "ab") as f:
        r = subprocess.run([vtest.VARENT, "run", "-m", M_OK, "-t", "1", "-p", "Once", "-n", "4", "--seed", "1",
                            "--metrics-out", "/dev/stderr", "--force"], stdout=subprocess.DEVNULL, stderr=f, timeout=120)
    data = read(log)
    check(r.returncode == 0 and data.startswith(OLD) and b'"entropy"' in data and not leftovers(d),
          "lost_std_metrics_out_dev_stderr_appended", f"rc {r.returncode}: {data[:200]!r}")
    ref = os.path.join(d, "ref.bin")
    r = varent("logits", "-m", M_OK, "-t", "1", "--ids", "1,403,407", "--out", ref)
    want = read(ref) if r.returncode == 0 else b"?"
    os.symlink("/dev/stdout", os.path.join(d, "to-stdout"))
    for name, path in (("proc_self_fd_1", "/proc/self/fd/1"), ("dev_fd_1", "/dev/fd/1"),
                       ("link_to_dev_stdout", os.path.join(d, "to-stdout"))):
        out = os.path.join(d, name + ".bin")
        write(out, OLD)
        with open(out, "ab") as f:
            r = subprocess.run([vtest.VARENT, "logits", "-m", M_OK, "-t", "1", "--ids", "1,403,407", "--out", path],
                               stdout=f, stderr=subprocess.PIPE, timeout=120)
        data = read(out)
        check(r.returncode == 0 and data[:len(OLD)] == OLD and len(data) == len(OLD) + 2048
              and data[len(OLD):] == want and not leftovers(d),
              f"lost_std_logits_{name}_appended", f"rc {r.returncode} {len(data)} bytes {r.stderr.decode()[-200:]}")


# ---- the temporary file of a killed run ------------------------------------------------

def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def stale_temps():
    """A run killed by SIGKILL leaves NAME.tmp.PID; the next run that writes NAME removes
    it (and says so) when its process no longer runs, and leaves any other one alone."""
    d = os.path.join(work, "stale")
    os.makedirs(d)
    out = os.path.join(d, "out.bin")
    p = subprocess.Popen([vtest.VARENT, "run", "-m", M_OK, "-t", "1", "--ctx", "65536", "-n", "60000", "-p", "Once",
                          "--dump-acts", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not leftovers(d):
        time.sleep(0.02)
    killed = leftovers(d)
    p.kill()
    p.wait()
    alive = os.path.join(d, f"out.bin.tmp.{os.getpid()}")  # this test's own PID: a live writer's
    write(alive, b"live\n")
    other = os.path.join(d, "other.bin.tmp.%d" % dead_pid())  # another target's
    write(other, b"other\n")
    r = varent("logits", "-m", M_OK, "-t", "1", "--ids", "1,2", "--out", out)
    left = leftovers(d)
    check(len(killed) == 1 and r.returncode == 0 and killed[0] not in left and killed[0] in r.stderr
          and "killed before it finished" in r.stderr and sorted(left) == sorted([os.path.basename(alive),
                                                                                  os.path.basename(other)]),
          "lost_stale_temp_removed_with_notice", f"killed {killed}; rc {r.returncode}; left {left}; {r.stderr[-300:]!r}")
    if IS_ROOT:  # one owned by someone else: not this user's to remove
        foreign = os.path.join(d, "out.bin.tmp.%d" % dead_pid())
        write(foreign, b"theirs\n")
        os.chown(foreign, NOBODY, NOBODY)
        r = varent("logits", "-m", M_OK, "-t", "1", "--ids", "1,2", "--out", out)
        check(r.returncode == 0 and os.path.exists(foreign) and read(foreign) == b"theirs\n",
              "lost_stale_temp_of_another_user_kept", r.stderr[-300:])


# ---- the server's capture directory (issue 32 row 2) -----------------------------------

def server_captures():
    """Two servers on one capture directory, started in the same second: their files never
    share a name; a link planted there is never followed."""
    from servertest import Server
    caps = os.path.join(work, "caps")
    os.makedirs(caps)
    write(os.path.join(work, "caps-victim"), VICTIM)
    for i in range(4):  # links under the names the old servers chose (cmpl-<second><counter>)
        os.symlink("../caps-victim", os.path.join(caps, f"cmpl-{int(time.time()) + i:x}000000.safetensors"))
    srv = [Server(M_OK, "-t", "1", "--dump-acts", caps, name=f"lost-serve{k}") for k in range(2)]
    try:
        got = [s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3}) for s in srv]
    finally:
        for s in srv:
            s.stop()
    names = [b.get("choices", [{}])[0].get("capture", {}).get("acts") for _, b in got]
    files = [os.path.join(caps, n) for n in names if n]
    ids = [b.get("id", "") for _, b in got]
    check(all(st == 200 for st, _ in got) and len(set(names)) == 2 and all(
          n and n.startswith(i + "-") and n.endswith(".safetensors") for n, i in zip(names, ids))
          and all(os.path.isfile(f) and not os.path.islink(f) and valid(next(w for w in WRITERS if w.name == "run_dump_acts"), read(f)) for f in files)
          and read(os.path.join(work, "caps-victim")) == VICTIM and not leftovers(caps),
          "lost_serve_captures_never_collide", f"{got!r:.400}; names {names}")


def main():
    if not os.path.exists(vtest.VARENT):
        skip("nothing_lost", f"no varent binary at {vtest.VARENT}")
        vtest.done()
    if not IS_ROOT:
        skip("lost_device_nodes", "not root: no mknod (/dev/null stands in; FIFOs, links and files are still tested)")
    t0 = time.time()
    matrix()
    if ONLY:
        vtest.done()
    std_streams()
    stale_temps()
    server_captures()
    print(f"# test_nothing_lost: {time.time() - t0:.1f} s", flush=True)
    vtest.done()


if __name__ == "__main__":
    main()
