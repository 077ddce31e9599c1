"""Issue 33's newcomer review, each row and nit as a llama.cpp user meets it (the server's
rows are tested in test_server*.py; the penalties against numpy in test_penalties.py; the
pasted lines in test_chat_repl.py; the agents plot in test_plot.py).

Models: stories260K (no chat template), a copy given the Llama 2 chat template, the tiny
GGUF fixture and its HF directory (tests/data/gguf-tiny), and the slow random Llama of
tests/py/slowmodel.py where a command must still be running when a signal comes."""
import json
import os
import shutil
import signal
import subprocess
import time

from vtest import ROOT, TESTDATA, VARENT, check, done, expect_fail, skip, stories_dir, tmpdir, varent, with_chat_template

work = tmpdir("newcomer")
base = stories_dir("f32")
G = ["--temp", "0"]
tpl = with_chat_template(base, os.path.join(work, "chat-model"))
GGUF = os.path.join(TESTDATA, "gguf-tiny", "tiny.gguf")
HF = os.path.join(TESTDATA, "gguf-tiny", "hf")


def path(name):
    return os.path.join(work, name)


def tty(cmd, stdin="", timeout=120):
    """cmd under a pseudo-terminal (script(1)): (exit status, what the terminal showed)."""
    line = " ".join("'" + str(a).replace("'", "'\\''") + "'" for a in cmd)
    r = subprocess.run(["script", "-q", "-e", "-c", line, "/dev/null"], input=stdin, capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout


# --- row 2: the tokenizer commands read a GGUF's tokenizer and template ------------------
text = "the cat sat on the mat"
a, b = varent("tokenize", "-m", HF, text), varent("tokenize", "-m", GGUF, text)
check(a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("["),
      "tokenize_gguf_same_as_dir", f"{a.stdout!r} vs {b.stdout!r} {b.stderr[-300:]}")
ids = a.stdout.strip().strip("[]")
a, b = varent("detokenize", "-m", HF, ids), varent("detokenize", "-m", GGUF, ids)
check(b.returncode == 0 and a.stdout == b.stdout and text in b.stdout, "detokenize_gguf_same_as_dir",
      f"{a.stdout!r} vs {b.stdout!r} {b.stderr[-300:]}")
msgs = path("msgs.json")
json.dump([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], open(msgs, "w"))
a, b = varent("template", "-m", HF, "--messages", msgs), varent("template", "-m", GGUF, "--messages", msgs)
check(b.returncode == 0 and a.stdout == b.stdout and "Be brief." in b.stdout, "template_gguf_same_as_dir",
      f"{a.stdout!r} vs {b.stdout!r} {b.stderr[-300:]}")
check(not [f for f in os.listdir(os.environ.get("TMPDIR", "/tmp")) if f.startswith("varent-tokenizer-")
           and os.path.getmtime(os.path.join(os.environ.get("TMPDIR", "/tmp"), f)) > time.time() - 60],
      "tokenizer_commands_leave_no_temporary_directory")

# --- row 3: a run that fills the context says so ----------------------------------------
r = varent("run", "-m", base, "-c", 16, "-p", "The sky is", "-n", 64, *G)
check(r.returncode == 0 and "context full after" in r.stderr and "raise" in r.stderr, "context_full_note", r.stderr)
r = varent("run", "-m", base, "-c", 256, "-p", "The sky is", "-n", 8, *G)
check(r.returncode == 0 and "context full" not in r.stderr, "no_context_note_when_it_fits", r.stderr)

# --- row 4: a text prompt is a user turn when the model has a chat template --------------
P = "Tell me about a cat."
default = varent("run", "-m", tpl, "-p", P, "-n", 24, *G)
chat = varent("run", "-m", tpl, "--chat", "-p", P, "-n", 24, *G)
raw = varent("run", "-m", tpl, "--raw", "-p", P, "-n", 24, *G)
plain = varent("run", "-m", base, "-p", P, "-n", 24, *G)  # the same weights, no template
check(default.returncode == 0 and default.stdout == chat.stdout and "chat template" in default.stderr,
      "chat_by_default_with_a_template", f"{default.stdout!r} vs {chat.stdout!r} {default.stderr!r}")
check(raw.returncode == 0 and raw.stdout == plain.stdout and raw.stdout != chat.stdout and "chat template" not in raw.stderr,
      "raw_is_plain_text", f"{raw.stdout!r} vs {plain.stdout!r}")
r = varent("run", "-m", tpl, "-no-cnv", "-p", P, "-n", 24, *G)
check(r.stdout == raw.stdout, "no_cnv_is_raw", r.stdout)
check("chat template" not in plain.stderr, "no_note_without_a_template", plain.stderr)
r = varent("run", "-m", tpl, "--ids", "1,403,407", "-n", 8, *G)
check(r.returncode == 0 and "chat template" not in r.stderr, "ids_stay_raw", r.stderr)
expect_fail("raw_with_chat_is_usage_error", varent("run", "-m", tpl, "--raw", "--system", "x", "-p", P), "--raw", rc=2)
prompts = path("prompts.txt")
open(prompts, "w").write("Tell me about a cat.\nTell me about a dog.\n")
r = varent("run", "-m", tpl, "--prompts", prompts, "-n", 8, *G, "-q")
recs = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
check(len(recs) == 2 and all(x["chat"] and x["settings"]["chat"] == "auto" for x in recs)
      and recs[0]["text"] == varent("run", "-m", tpl, "--chat", "-p", "Tell me about a cat.", "-n", 8, *G).stdout[:-1],
      "batch_chat_by_default", r.stdout[:400] + r.stderr[-300:])

# --- row 5: --resume keeps the settings and the seed of the file -------------------------
five = path("five.txt")
open(five, "w").write("Once upon a time\nThe dog\nA cat sat\nThe sun\nOne day\n")
full = path("full.jsonl")
r = varent("run", "-m", base, "--prompts", five, "-n", 12, "-o", full, "-q")
recs = [json.loads(line) for line in open(full)] if r.returncode == 0 else []
seed = recs[0]["seed"] if recs else None
check(len(recs) == 5 and len({x["seed"] for x in recs}) == 1, "batch_five_records", r.stderr)
part = path("part.jsonl")
with open(part, "w") as f:
    f.writelines(open(full).readlines()[:2])
expect_fail("resume_refuses_other_n", varent("run", "-m", base, "--prompts", five, "-n", 13, "-o", part, "--resume"),
            "max_tokens: 12 in the file, 13 in this run", "--force")
expect_fail("resume_refuses_other_temperature", varent("run", "-m", base, "--prompts", five, "-n", 12, "--temp", 0.5,
                                                       "-o", part, "--resume"), "temperature")
expect_fail("resume_refuses_other_seed", varent("run", "-m", base, "--prompts", five, "-n", 12, "-s", 999, "-o", part,
                                                "--resume"), f"seed {seed}", "--seed 999")
check(len(open(part).readlines()) == 2, "refused_resume_leaves_the_file")
r = varent("run", "-m", base, "--prompts", five, "-n", 12, "-o", part, "--resume")
got = [json.loads(line) for line in open(part)]
check(r.returncode == 0 and f"seed {seed}" in r.stderr and len(got) == 5 and all(x["seed"] == seed for x in got)
      and [x["text"] for x in got] == [x["text"] for x in recs], "resume_takes_the_recorded_seed", r.stderr[-400:])
r = varent("run", "-m", base, "--prompts", five, "-n", 12, "-o", part, "--resume")
check(r.returncode == 0 and "nothing to do: 5 of 5" in r.stderr and "load" not in r.stderr, "resume_nothing_to_do",
      r.stderr)

# --- row 7: a chat message bigger than the context changes nothing -----------------------
save = path("conv.json")
big = "word " * 200
r = varent("chat", "-m", tpl, "--ctx", 64, "-n", 8, *G, stdin=f"Hi.\nHow are you?\n{big}\n/save {save}\n")
conv = json.load(open(save)) if os.path.exists(save) else []
check(r.returncode == 0 and "not sent" in r.stderr and "dropped" not in r.stderr and len(conv) == 4
      and [m["content"] for m in conv if m["role"] == "user"] == ["Hi.", "How are you?"], "chat_refused_message_changes_nothing",
      f"{conv} {r.stderr[-400:]}")

# --- row 9: llama.cpp's options ----------------------------------------------------------
want = varent("run", "-m", base, "-p", "Once upon a time", "-n", 16, *G).stdout
for name, extra in (("no_mmap", ["--no-mmap"]), ("fa", ["-fa"]), ("fa_on", ["-fa", "on"]), ("flash_attn", ["--flash-attn=auto"]),
                    ("jinja", ["--jinja"]), ("color", ["--color"]), ("log_disable", ["--log-disable"]),
                    ("no_warmup", ["--no-warmup"]), ("ngl_0", ["-ngl", "0"]), ("no_escape", ["--no-escape"])):
    r = varent("run", "-m", base, "-p", "Once upon a time", "-n", 16, *G, *extra)
    check(r.returncode == 0 and r.stdout == want, f"llamacpp_option_{name}", r.stderr[-300:])
r = varent("run", "-m", base, "-p", "Once upon a time", "-n", 16, *G, "-ngl", 99)
gpu = varent("--version").stdout
if "cuda devices: 0" in gpu or "cuda" not in gpu:
    check(r.returncode == 0 and r.stdout == want and "no CUDA device" in r.stderr, "ngl_without_gpu_runs_on_cpu", r.stderr)
else:
    check(r.returncode == 0 and "runs on the GPU" in r.stderr, "ngl_runs_on_gpu", r.stderr)
expect_fail("ngl_and_device_disagree", varent("run", "-m", base, "-p", "x", "-ngl", 99, "--device", "cpu"), "disagree", rc=2)
expect_fail("fa_bad_value", varent("run", "-m", base, "-p", "x", "--flash-attn=maybe"), "--flash-attn", rc=2)
# -e: \n and \t in -p are the characters, as llama.cpp reads them
a = varent("run", "-m", base, "-e", "-p", "Once upon\\na time", "-n", 8, *G, "--display-prompt")
b = varent("run", "-m", base, "-p", "Once upon\na time", "-n", 8, *G, "--display-prompt")
check(a.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("Once upon\na time"), "escape_e", f"{a.stdout!r}")
r = varent("bench", "-m", base, "-p", 16, "-n", 8, "-r", 1, "-ngl", 0, "-fa", 1, "--sampler", "none")
check(r.returncode == 0 and "prefill     16 tokens" in r.stdout and "decode      8 tokens" in r.stdout
      and "median of 1" in r.stdout, "bench_llama_bench_options", r.stdout[-300:] + r.stderr[-300:])

# --- nits ------------------------------------------------------------------------------
expect_fail("n_too_large_says_so", varent("run", "-m", base, "-n", "99999999999"), "too large", "2147483647", rc=2)
rc, screen = tty([VARENT, "chat", "-m", tpl, "-n", "-1", "--ctx", 64, *G], stdin="/quit\n")
check("until end of turn" in screen and "2147483647" not in screen, "chat_n_minus_1_banner", screen[-400:])
open(path("long.txt"), "w").write("word " * 200)
expect_fail("run_f_too_long_names_file", varent("run", "-m", base, "-f", path("long.txt"), "-c", 32), "-f ", "long.txt",
            "raise --ctx")
open(path("nul.txt"), "wb").write(b"Once\x00upon")
expect_fail("run_f_nul_names_file", varent("run", "-m", base, "-f", path("nul.txt")), "nul.txt", "NUL")
expect_fail("layer_range_without_vector", varent("run", "-m", base, "-p", "x", "--control-vector-layer-range", 1, 2),
            "no control vector", rc=2)
for args in (["run", "--version"], ["chat", "-m", "x", "--version"], ["--version"]):
    r = varent(*args)
    check(r.returncode == 0 and r.stdout.startswith("varent "), f"version_anywhere_{args[0]}", r.stderr)
r = varent("info", "-m", base, "--tp", 5)
check(r.returncode == 1 and r.stdout == "" and "--tp 5" in r.stderr, "info_tp_error_before_the_block", r.stdout[:200])
for name, args in (("device_gpu", ["run", "-m", base, "-p", "x", "--device", "gpu"]),
                   ("chat_template_bogus_run", ["run", "-m", base, "-p", "x", "--chat-template", "bogus"]),
                   ("chat_template_bogus_chat", ["chat", "-m", base, "--chat-template", "bogus"]),
                   ("detokenize_abc", ["detokenize", "-m", base, "abc"]),
                   ("empty_prompt", ["run", "-m", base, "-p", ""])):
    r = varent(*args)
    check(r.returncode == 2, f"usage_error_{name}", f"rc={r.returncode} {r.stderr[-200:]}")
r = varent("detokenize", "-m", base, stdin="abc")
check(r.returncode == 1, "detokenize_bad_stdin_is_runtime_error", f"rc={r.returncode}")
# -cnv -p TEXT: the first message of the chat
r = varent("run", "-m", tpl, "-cnv", "-p", P, "-n", 8, *G, stdin=f"/save {path('cnv.json')}\n")
conv = json.load(open(path("cnv.json"))) if os.path.exists(path("cnv.json")) else []
check(r.returncode == 0 and conv[:1] == [{"role": "user", "content": P}], "cnv_p_first_message", f"{conv} {r.stderr}")
# chat: --sampler, --profile, --stats
r = varent("chat", "-m", tpl, "-n", 8, "--sampler", "entropix", "--profile", "jax", "--stats", "-s", 3,
           stdin="Hi.\nTell me more.\n")
check(r.returncode == 0 and r.stderr.count("[prefill") == 2 and r.stderr.count("quadrants") == 2
      and "entropix sampler, jax profile" in r.stderr, "chat_sampler_profile_stats", r.stderr[-400:])
# compare: every prompt is checked before the first generation
bad = path("compare.txt")
open(bad, "w").write("Once upon a time\n" + "word " * 600 + "\n")
r = varent("compare", "-m", base, "--prompts", bad, "-n", 4, "-o", path("cmp.jsonl"), "-q")
check(r.returncode == 1 and "compare.txt:2" in r.stderr and not os.path.exists(path("cmp.jsonl")),
      "compare_checks_prompts_first", r.stderr[-300:])
# calibrate: --force to replace, one token count
prof = path("prof.json")
open(prof, "w").write("{}")
corpus = os.path.join(ROOT, "examples", "paragraph.txt")
expect_fail("calibrate_needs_force", varent("calibrate", "-m", base, "-f", corpus, "-o", prof), "--force")
check(open(prof).read() == "{}", "calibrate_left_the_file")
r = varent("calibrate", "-m", base, "-f", corpus, "-o", prof, "--force")
counts = [w for line in r.stderr.splitlines() if line.startswith("calibrate: measuring") for w in line.split() if w.isdigit()]
check(r.returncode == 0 and counts and f"{counts[0]} tokens from corpus" in r.stdout, "calibrate_one_token_count",
      r.stderr[-300:] + r.stdout[:300])
# eval: the progress counts each task's own trials (3 items x 2 arms per task)
r = varent("eval", "-m", base, "--tasks", "add2,recall", "--items", 3, "--samplers", "greedy,standard", "-n", 4)
tally = [line.split("ETA")[1].split(None, 1)[1] for line in r.stderr.splitlines() if line.startswith("eval:") and "right" in line]
check(r.returncode == 0 and tally[:1] and tally[0].startswith("add2: ") and tally[-1].startswith("recall: ")
      and tally[-1].endswith(" of 6 right") and all(t.endswith(("of 2 right", "of 4 right", "of 6 right")) for t in tally),
      "eval_progress_per_task", "\n".join(tally) + r.stderr[-300:])
# ppl: the progress counts tokens
r = varent("ppl", "-m", base, "-f", corpus, "--ctx", 64, "--stride", 32)
n_tok = int(r.stdout.split(" of ")[1].split()[0]) - 1 if r.returncode == 0 else -1
check(r.returncode == 0 and f"/{n_tok} " in r.stderr, "ppl_progress_in_tokens", r.stderr[-300:])
# a long prompt's prefill shows on the terminal, and the text is the same
long_prompt = path("long-prompt.txt")
open(long_prompt, "w").write(("the cat sat on the mat and the dog ran in the park " * 30)[:1000])
rc, screen = tty([VARENT, "run", "-m", base, "-f", long_prompt, "-n", 12, *G, "-b", 32])
plain = varent("run", "-m", base, "-f", long_prompt, "-n", 12, *G, "-b", 32)
check(rc == 0 and "prefill" in screen and plain.stdout.strip() in screen.replace("\r", ""), "prefill_progress_on_terminal",
      screen[-300:])


def caught_sigint(pid, limit=30):
    """Waits until the process catches SIGINT (bit 1 of SigCgt in /proc/PID/status): on a
    loaded machine exec and the dynamic loader can take longer than the test's 0.3 s."""
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            with open(f"/proc/{pid}/status") as f:
                cgt = next(line for line in f if line.startswith("SigCgt:"))
            if int(cgt.split()[1], 16) & (1 << (signal.SIGINT - 1)):
                return
        except (OSError, StopIteration):
            return
        time.sleep(0.02)


# SIGINT: one rule for every command, started with SIGINT ignored (a script's background job)
def stops_on_sigint(name, args, wait_for):
    p = subprocess.Popen(["bash", "-c", 'trap "" INT; exec "$@"', "bash", VARENT, *map(str, args)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0, seen = time.time(), ""
    os.set_blocking(p.stderr.fileno(), False)
    while time.time() - t0 < 60 and wait_for not in seen and p.poll() is None:
        try:
            seen += os.read(p.stderr.fileno(), 65536).decode(errors="replace")
        except BlockingIOError:
            pass
        time.sleep(0.05)
    caught_sigint(p.pid)  # a SIGINT before the handler is in is ignored, as the shell asked
    time.sleep(0.3)  # well inside the work
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "still running 30 s after SIGINT"
    check(rc in (130, -signal.SIGINT), f"sigint_stops_{name}", f"{rc} {seen[-200:]}")


try:
    import slowmodel
    slow = path("slow")
    slowmodel.write_slow_model(slow, base)
    text_file = path("ppl.txt")
    open(text_file, "w").write("the cat sat on the mat " * 300)
    stops_on_sigint("ppl", ["ppl", "-m", slow, "-f", text_file, "--ctx", 256, "--stride", 32, "-t", 1], "ppl:")
    # run prints nothing on a pipe while it works ("load" comes with --stats at the end):
    # the signal comes 0.3 s after the start, during the load or the decode (both count)
    stops_on_sigint("run", ["run", "-m", slow, "-p", "Once", "-n", 2000, "--ignore-eos", "-t", 1, "--stats"], "")
except ImportError as e:
    skip("sigint_stops_ppl", f"numpy: {e}")

# a GGUF is hashed and converted once when the ranks of mpirun resolve it together
mpirun = shutil.which("mpirun")
if not mpirun:
    skip("gguf_resolved_once_under_mpirun", "mpirun is not installed")
else:
    # Four fresh caches: whichever rank takes the cache's lock first, the entry is whole. (A
    # rank other than 0 writes nothing, so one that converted left an empty entry and
    # failed on its config.json, in about one launch of four.)
    bad = ""
    for k in range(4):
        copy_gguf = path(f"fresh{k}.gguf")
        shutil.copy(GGUF, copy_gguf)
        env = dict(os.environ, XDG_CACHE_HOME=path(f"cache{k}"))
        if "ASAN_OPTIONS" in env:
            env["ASAN_OPTIONS"] += ":detect_leaks=0"
        r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", VARENT, "run", "-m",
                            copy_gguf, "-p", "the cat", "-n", "4", *G], capture_output=True, text=True,
                           errors="replace", timeout=300, env=env)
        if r.returncode != 0 or r.stderr.count("hashing") > 1 or "cannot open" in r.stderr:
            bad = f"launch {k + 1}: rc {r.returncode}: {r.stderr[-500:]}"
            break
    check(not bad, "gguf_resolved_once_under_mpirun", bad)
done()
