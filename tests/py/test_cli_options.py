"""The command-line conventions of issue 23 (items 1, 2 and 5), each row as a user meets
it, on stories260K (and a copy given the Llama 2 chat template):
- the prompt from `-p -`, a piped stdin and `-f FILE` is the prompt of `-p TEXT`;
- a repeated option: the last wins; a missing value or one that is an option says so;
- numbers are strict and every bad value names its flag; usage errors exit 2, runtime
  errors 1, both with the prefix `varent CMD:`;
- options that only mean something in a chat prompt imply --chat;
- -m is the model everywhere (tokenizer commands too), -t the threads;
- llama.cpp's names; -r stop strings (checked against Python's str.find);
- one set of sampling defaults for run, chat and serve; the seed: random from the OS,
  -1 random, always in --stats and in every JSONL record."""
import json
import os
import re
import shutil

from vtest import TESTDATA, check, done, skip, stories_dir, tmpdir, varent

work = tmpdir("cli-opts")
base = stories_dir("f32")
PROMPT = "Once upon a time"
G = ["--temp", "0"]  # greedy: the text depends on nothing but the prompt


def run(*args, **kw):
    return varent("run", "-m", base, *map(str, args), **kw)


def out(r):
    return r.stdout if r.returncode == 0 else f"<rc {r.returncode}: {r.stderr.strip()[-200:]}>"


want = out(run("-p", PROMPT, "-n", 24, *G))
check(len(want.strip()) > 10, "reference_run", want)

# --- the prompt: -p -, piped stdin, -f FILE (issue 23 row 2) ---------------------------
check(out(run("-p", "-", "-n", 24, *G, stdin=PROMPT + "\n")) == want, "prompt_from_stdin_dash")
check(out(run("-n", 24, *G, stdin=PROMPT + "\n")) == want, "prompt_from_piped_stdin_without_p")
check(out(run("-n", 24, *G, stdin=PROMPT)) == want, "prompt_from_stdin_without_newline")
path = os.path.join(work, "prompt.txt")
with open(path, "w") as f:
    f.write(PROMPT + "\n")
check(out(run("-f", path, "-n", 24, *G)) == want, "prompt_from_file")
check(out(run("--file", path, "-n", 24, *G, stdin="ignored\n")) == want, "prompt_file_wins_over_stdin")
r = run("-p", PROMPT, "-f", path)
check(r.returncode == 2 and "-f" in r.stderr, "prompt_p_and_f_conflict", r.stderr)
r = run("-p", "-", "-n", 4, stdin="")
check(r.returncode == 1 and "stdin is empty" in r.stderr, "prompt_dash_empty_stdin", r.stderr)
r = run("-f", os.path.join(work, "nope.txt"))
check(r.returncode == 1 and "nope.txt" in r.stderr, "prompt_file_missing_named", r.stderr)
# empty stdin and no prompt: generation from BOS, as without stdin
check(out(run("-n", 8, *G, stdin="")) == out(run("--ids", "1", "-n", 8, *G)), "empty_stdin_is_no_prompt")

# --- repeated options: the last wins (row 7) --------------------------------------------
r = run("-p", PROMPT, "-n", 4, "-n", 8, "--ignore-eos", "--stats", *G)
check(r.returncode == 0 and "decode 8 tokens" in r.stderr, "repeated_n_last_wins", r.stderr)
check(out(run("-p", PROMPT, "-n", 24, "--temp", "0.5", "--temp", "0")) == want, "repeated_temp_last_wins")
check(out(run("-p", "other", "-p", PROMPT, "-n", 24, *G)) == want, "repeated_prompt_last_wins")

# --- missing values, values that are options (row 8) -----------------------------------
r = run("-p", "-n", "5")
check(r.returncode == 2 and "-p needs a value" in r.stderr and "'-n' is an option" in r.stderr, "value_is_an_option", r.stderr)
r = run("-p", "--temp")
check(r.returncode == 2 and "'--temp' is an option" in r.stderr, "value_is_a_long_option", r.stderr)
r = run("-p", PROMPT, "-n")
check(r.returncode == 2 and "-n needs a value" in r.stderr, "missing_value", r.stderr)
check(out(run("-p=" + PROMPT, "-n=24", "--temp=0")) == want, "name_equals_value_form")
check(out(run("--seed", "-1", "-p", PROMPT, "-n", 24, *G)) == want, "negative_number_is_a_value")

# --- strict numbers, ranges, the flag named, exit 2 (row 9) -----------------------------
for flag, val in (("--ctx", "-4"), ("--ctx", "0"), ("-c", "0"), ("-t", "-1"), ("-t", "1000"), ("--batch", "-5"),
                  ("-b", "0"), ("-n", "5x"), ("-n", ""), ("-n", "-2"), ("--temp", "0.5x"), ("--temp", "nan"),
                  ("--top-k", "1.5"), ("--seed", "abc"), ("--seed", "-2"), ("--top-p", "0"), ("--min-p", "1")):
    r = run("-p", PROMPT, flag, val)
    check(r.returncode == 2 and r.stderr.startswith(f"varent run: {flag} ") and "--help" in r.stderr,
          f"bad_value_{flag.lstrip('-')}_{val or 'empty'}", f"rc={r.returncode} {r.stderr!r}")
r = varent("bench", "-m", base, "-n", "0")
check(r.returncode == 2 and "-n 0" in r.stderr, "bench_n_0_names_n", r.stderr)
r = varent("bench", "-m", base, "--prompt-len", "100000", "-n", "4", "--runs", "1")
check(r.returncode == 1 and "--prompt-len 100000" in r.stderr and "--ctx" not in r.stderr, "bench_prompt_len_blames_itself",
      r.stderr)

# --- exit codes and the prefix for every command (row 13) -------------------------------
cmds = {"run": [], "chat": [], "logits": [], "info": [], "bench": [], "convert": ["gguf"], "tokenize": [],
        "detokenize": [], "template": [], "serve": [], "ppl": [], "compare": [], "plot": [], "agents": []}
for cmd, sub in cmds.items():
    r = varent(cmd, *sub, "--bogus-flag")
    name = " ".join([cmd, *sub])
    check(r.returncode == 2 and r.stderr.startswith(f"varent {name}: "), f"usage_error_{cmd}", f"rc={r.returncode} {r.stderr!r}")
nodir = os.path.join(work, "no-such-model")
for cmd, args in (("run", ["-m", nodir, "-p", "x"]), ("info", ["-m", nodir]), ("tokenize", ["-m", nodir, "x"]),
                  ("detokenize", ["-m", nodir, "1"]), ("ppl", ["-m", nodir, "-f", path]), ("chat", ["-m", nodir]),
                  ("agents", ["-m", nodir, "-p", "x"]), ("convert", ["gguf", nodir + ".gguf", nodir])):
    r = varent(cmd, *args, stdin="")
    check(r.returncode == 1 and r.stderr.startswith(f"varent {cmd}") and "no-such-model" in r.stderr,
          f"runtime_error_{cmd}", f"rc={r.returncode} {r.stderr!r}")

# --- -m everywhere, -t threads (row 14) -------------------------------------------------
r = varent("tokenize", "-m", base, PROMPT)
ids = json.loads(r.stdout) if r.returncode == 0 else None
check(ids and len(ids) > 2, "tokenize_takes_m", r.stderr)
r = varent("detokenize", "-m", base, ",".join(map(str, ids or [])))
check(r.returncode == 0 and r.stdout.strip() == PROMPT, "detokenize_takes_m", r.stderr)
r = varent("tokenize", "-t", base, PROMPT)
check(r.returncode == 2 and "-m" in r.stderr and "--threads" in r.stderr, "tokenize_t_points_to_m", r.stderr)
r = run("-t", base, "-p", PROMPT)
check(r.returncode == 2 and "-t" in r.stderr and "not an integer" in r.stderr, "run_t_is_threads", r.stderr)
check(out(run("-t", 1, "-p", PROMPT, "-n", 24, *G)) == want, "run_t_1")

# --- options that need --chat imply it (row 10) -----------------------------------------
tpl = os.path.join(work, "chat-model")
shutil.copytree(base, tpl)
cfg_path = os.path.join(tpl, "tokenizer_config.json")
cfg = json.load(open(cfg_path))
cfg["chat_template"] = open(os.path.join(TESTDATA, "chat-templates", "meta-llama-Llama-2-chat.jinja")).read()
json.dump(cfg, open(cfg_path, "w"))


def trun(*args, **kw):
    return varent("run", "-m", tpl, *map(str, args), **kw)


chat_sys = out(trun("--chat", "--system", "Be brief.", "-p", "Tell me about a cat.", "-n", 24, *G))
plain = out(trun("--raw", "-p", "Tell me about a cat.", "-n", 24, *G))
check(chat_sys != plain, "chat_differs_from_plain", chat_sys)
check(out(trun("--system", "Be brief.", "-p", "Tell me about a cat.", "-n", 24, *G)) == chat_sys, "system_implies_chat")
check(out(trun("-sys", "Be brief.", "-p", "Tell me about a cat.", "-n", 24, *G)) == chat_sys, "alias_sys")
check(out(trun("--system-prompt", "Be brief.", "-p", "Tell me about a cat.", "-n", 24, *G)) == chat_sys, "alias_system_prompt")
chat_only = out(trun("--chat", "-p", "Tell me about a cat.", "-n", 24, *G))
check(out(trun("--chat-template", "llama2", "-p", "Tell me about a cat.", "-n", 24, *G)) == chat_only,
      "chat_template_implies_chat")
check(out(trun("--no-think", "-p", "Tell me about a cat.", "-n", 24, *G)) == chat_only, "no_think_implies_chat")
r = trun("--system", "x", "--ids", "1,2")
check(r.returncode == 2 and "--ids" in r.stderr, "chat_with_ids_is_usage_error", r.stderr)

# --- llama.cpp aliases (item 2) ---------------------------------------------------------
check(out(run("--prompt", PROMPT, "--n-predict", 24, "--temperature", "0")) == want, "alias_n_predict_temperature")
check(out(run("-p", PROMPT, "-n", 24, *G, "-c", 64, "-b", 2)) == want, "alias_c_b")
check(out(run("-p", PROMPT, "-n", 24, *G, "--ctx-size", 64, "--batch-size", 3)) == want, "alias_ctx_size_batch_size")
r = run("--ids", ",".join(["5"] * 40), "-c", 16)
check(r.returncode == 1 and "context holds 16" in r.stderr or "16" in r.stderr, "alias_c_sets_ctx", r.stderr)
s5 = out(run("-p", PROMPT, "-n", 24, "--seed", 5, "--temp", 1))
check(out(run("-p", PROMPT, "-n", 24, "-s", 5, "--temp", 1)) == s5, "alias_s_is_seed")
check(out(run("-p", PROMPT, "-n", 24, *G, "--no-display-prompt")) == want, "no_display_prompt_is_the_default")
r = run("-p", PROMPT, "-n", 24, *G, "--display-prompt")
check(r.returncode == 0 and r.stdout.startswith(PROMPT) and r.stdout[len(PROMPT):].strip() == want.strip(),
      "display_prompt", r.stdout)
r = run("-p", PROMPT, "-n", 24, *G, "-v")
check(r.returncode == 0 and r.stdout == want and "varent run: model" in r.stderr and "seed" in r.stderr, "alias_v", r.stderr)
r = run("-p", PROMPT, "-n", 100, "--ignore-eos", "--stats", "--ctx", 512, "--seed", 1, "--temp", 1)
check(r.returncode == 0 and "decode 100 tokens" in r.stderr, "ignore_eos_runs_to_n", r.stderr)
# -cnv / -i: the interactive chat with the same options
msgs = "Tell me about a dog.\n"
chat = varent("chat", "-m", tpl, "-n", 24, *G, stdin=msgs)
check(chat.returncode == 0 and len(chat.stdout.strip()) > 10, "chat_reference", chat.stderr)
for flag in ("-cnv", "-i", "--conversation", "--interactive"):
    r = trun(flag, "-n", 24, *G, stdin=msgs)
    check(r.returncode == 0 and r.stdout == chat.stdout, f"run_{flag.lstrip('-')}_is_chat", f"{r.stdout!r} {r.stderr!r}")
# -cnv -p TEXT: TEXT is the first message, as llama-cli takes it (issue 33)
r = trun("-cnv", "-p", msgs.strip(), "-n", 24, *G, stdin="")
check(r.returncode == 0 and r.stdout == chat.stdout, "cnv_p_is_the_first_message", f"{r.stdout!r} {r.stderr!r}")
r = trun("-cnv", "--ids", "1,2")
check(r.returncode == 2 and "--ids" in r.stderr, "cnv_with_ids_is_usage_error", r.stderr)

# --- -r stop strings, as the server's: the text ends before the first one ----------------
long_want = out(run("-p", PROMPT, "-n", 64, *G))
text = long_want.rstrip("\n")
for stop in (text[20:24], text[30:33], " ", text[-3:], "\u00e9nonexistent"):
    cut = text.find(stop)
    ref = (text[:cut] if cut >= 0 else text) + "\n"
    r = run("-p", PROMPT, "-n", 64, *G, "-r", stop)
    check(r.returncode == 0 and r.stdout == ref, f"stop_string_{stop.strip() or 'space'}", f"{r.stdout!r} want {ref!r}")
a, b = text[40:44], text[12:15]
cut = min(i for i in (text.find(a), text.find(b)) if i >= 0)
r = run("-p", PROMPT, "-n", 64, *G, "--reverse-prompt", a, "--stop", b)
check(r.returncode == 0 and r.stdout == text[:cut] + "\n", "stop_strings_earliest_wins", f"{r.stdout!r}")
r = run("-p", PROMPT, "-r", "")
check(r.returncode == 2 and "-r" in r.stderr, "stop_string_empty", r.stderr)

# --- one set of sampling defaults (item 5) ---------------------------------------------
explicit = ["--temp", "0.7", "--top-k", "0", "--top-p", "0.9", "--min-p", "0"]
d9 = out(run("-p", PROMPT, "-n", 40, "--seed", 9))
check(d9 == out(run("-p", PROMPT, "-n", 40, "--seed", 9, *explicit)), "run_defaults_are_the_documented_set")
check(d9 != out(run("-p", PROMPT, "-n", 40, "--seed", 9, "--temp", 1, "--top-p", 1)), "run_defaults_are_not_temp_1")
c1 = varent("chat", "-m", tpl, "-n", 40, "--seed", 9, stdin=msgs)
c2 = varent("chat", "-m", tpl, "-n", 40, "--seed", 9, *explicit, stdin=msgs)
check(c1.returncode == 0 and c1.stdout == c2.stdout, "chat_defaults_are_the_documented_set", c1.stderr)
for cmd in ("run", "chat"):
    h = varent(cmd, "--help").stdout
    check("--temp, --temperature T" in h and "(default: 0.7)" in h and "(default: 0.9)" in h, f"{cmd}_help_shows_defaults")
h = varent("serve", "--help").stdout
check("temperature 0.7, top_k 0 (off), top_p 0.9, min_p 0 (off)" in h, "serve_help_shows_request_defaults", h[:600])
try:
    from servertest import Server
    srv = Server(base, "-t", 1, name="serve-defaults")
    try:
        st, body = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "seed": 9})
        got = body["choices"][0]["text"] if st == 200 else None
        check(got is not None and got.strip() == d9.strip(), "serve_defaults_are_run_defaults", f"{got!r} vs {d9!r}")
    finally:
        srv.kill()
except (ImportError, RuntimeError) as e:
    skip("serve_defaults_are_run_defaults", str(e))

# --- seeds: random from the OS unless given; printed; in every JSONL record ---------------
seeds, texts = [], []
for _ in range(3):
    r = run("-p", PROMPT, "-n", 30, "--stats", "--temp", 1)
    m = re.search(r"seed (\d+)", r.stderr)
    seeds.append(m and int(m.group(1)))
    texts.append(r.stdout)
check(all(seeds) and len(set(seeds)) == 3, "default_seed_is_random", str(seeds))
check(all(s < 2 ** 53 for s in seeds if s), "random_seed_fits_json", str(seeds))
r = run("-p", PROMPT, "-n", 30, "--stats", "--temp", 1, "--seed", seeds[0])
check(r.stdout == texts[0], "printed_seed_reproduces", f"{r.stdout!r} vs {texts[0]!r}")
r = run("-p", PROMPT, "-n", 30, "--stats", "--temp", 1, "--seed", -1)
m = re.search(r"seed (\d+)", r.stderr)
check(m and int(m.group(1)) not in seeds, "seed_minus_1_is_random", r.stderr)
r = run("-p", PROMPT, "-n", 4, "--stats", "--seed", 18446744073709551615)
check(r.returncode == 0 and "seed 18446744073709551615" in r.stderr, "seed_full_uint64", r.stderr)
metrics = os.path.join(work, "m.jsonl")
r = run("-p", PROMPT, "-n", 8, "--stats", "--metrics-out", metrics)
m = re.search(r"seed (\d+)", r.stderr)
recs = [json.loads(x) for x in open(metrics)] if os.path.exists(metrics) else []
check(m and recs and all(x.get("seed") == int(m.group(1)) for x in recs), "metrics_records_carry_seed", r.stderr)
plist = os.path.join(work, "prompts.txt")
with open(plist, "w") as f:
    f.write("Once upon a time\nThe little dog\n")
res = os.path.join(work, "batch.jsonl")
r = run("--prompts", plist, "-o", res, "-n", 6, "--stats", "-q")
m = re.search(r"seed (\d+)", r.stderr)
recs = [json.loads(x) for x in open(res)] if os.path.exists(res) else []
check(m and len(recs) == 2 and all(x["seed"] == int(m.group(1)) for x in recs), "batch_records_carry_seed", r.stderr)
alog = os.path.join(work, "agents.jsonl")
r = varent("agents", "-m", base, "-p", PROMPT, "-n", 6, "--log", alog, "--stats", "--check-every", 2)
m = re.search(r"seed (\d+)", r.stderr)
recs = [json.loads(x) for x in open(alog)] if os.path.exists(alog) else []
steps = [x for x in recs if x.get("event") in ("step", "critic", "rollback")]
check(m and steps and all(x.get("seed") == int(m.group(1)) for x in steps), "agents_records_carry_seed", r.stderr[-300:])
done()
