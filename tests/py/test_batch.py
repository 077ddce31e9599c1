"""Batch runs: `varent run --prompts FILE` and `--prompt-csv FILE` on stories260K.

  - N prompts give N JSONL lines, in order; blank lines and CRLF endings are handled;
  - each line's text equals a single `varent run -p PROMPT` with the same options and
    seed (standard and entropix samplers), its ids and mean metrics equal that run's
    --metrics-out, and its quadrant counts too;
  - CSV: quoted fields with commas, doubled quotes and newlines, parsed like Python's
    csv module; the prompt column found by name;
  - -o writes the same lines atomically; progress goes to stderr as lines;
  - bad inputs (missing file, CSV without a prompt column, empty prompts file, broken
    CSV quoting, a record with the wrong field count, a prompt longer than the context,
    -p with --prompts, --metrics-out in a batch, unwritable -o) fail with exit status 1,
    a message naming the problem and no output file.
"""
import csv
import io
import json
import os
import signal
import subprocess
import time

import vtest
from vtest import check, stories_dir, tmpdir, varent

N, SEED = 16, 5
KEYS = ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength")

work = tmpdir("batch")
model = stories_dir("f32")


def single(prompt, *extra):
    metrics = os.path.join(work, "single.jsonl")
    r = varent("run", "-m", model, "-p", prompt, "-n", N, "--seed", SEED, "--metrics-out", metrics, "--force", *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1], [json.loads(ln) for ln in open(metrics)]


def compare_to_single(name, results, prompts, *extra):
    bad = []
    for res, p in zip(results, prompts):
        text, lines = single(p, *extra)
        if res["prompt"] != p or res["text"] != text:
            bad.append(f"{p!r}: {res['text']!r} vs {text!r}")
            continue
        if res["ids"] != [ln["token"] for ln in lines] or res["tokens"] != len(lines):
            bad.append(f"{p!r}: ids differ")
        for k in KEYS:
            ref = sum(ln[k] for ln in lines) / len(lines)
            if abs(res["mean"][k] - ref) > 1e-9 * max(1.0, abs(ref)):
                bad.append(f"{p!r}: mean {k} {res['mean'][k]} vs {ref}")
        counts = {q: sum(ln["quadrant"] == q for ln in lines) for q in res["quadrants"]}
        if counts != res["quadrants"]:
            bad.append(f"{p!r}: quadrants {res['quadrants']} vs {counts}")
    check(len(results) == len(prompts) and not bad, name, "; ".join(bad[:3]) or f"{len(results)} results")


# One prompt per line, with a blank line and a CRLF ending.
prompts = ["Once upon a time", "Lily saw a big dog", "The sun was hot"]
lines_path = os.path.join(work, "prompts.txt")
with open(lines_path, "wb") as f:
    f.write(b"Once upon a time\n\n   \nLily saw a big dog\r\nThe sun was hot")
r = varent("run", "-m", model, "--prompts", lines_path, "-n", N, "--seed", SEED)
results = [json.loads(ln) for ln in r.stdout.splitlines()] if r.returncode == 0 else []
check(r.returncode == 0 and len(results) == 3, "batch_lines_n_results", r.stderr[-300:])
check([x["index"] for x in results] == [0, 1, 2] and [x["line"] for x in results] == [1, 4, 5], "batch_lines_index_and_line",
      str([(x["index"], x["line"]) for x in results]))
compare_to_single("batch_lines_equal_single_runs", results, prompts)
check(all(x["tok_per_s"] > 0 and x["seed"] == SEED and x["stop"] in ("eos", "length") for x in results),
      "batch_lines_speed_seed_stop")
prog = [ln for ln in r.stderr.splitlines() if ln.startswith("run: ")]
check(len(prog) >= 3 and "\r" not in r.stderr, "batch_progress_lines_on_stderr", r.stderr)

r = varent("run", "-m", model, "--prompts", lines_path, "-n", N, "--seed", SEED, "--sampler", "entropix", "-q")
ex = [json.loads(ln) for ln in r.stdout.splitlines()] if r.returncode == 0 else []
compare_to_single("batch_entropix_equal_single_runs", ex, prompts, "--sampler", "entropix")
check(r.returncode == 0 and not r.stderr, "batch_quiet", r.stderr)

out = os.path.join(work, "out.jsonl")
r = varent("run", "-m", model, "--prompts", lines_path, "-n", N, "--seed", SEED, "-o", out, "-q")
filed = [json.loads(ln) for ln in open(out)] if os.path.exists(out) else []
strip = lambda x: {k: v for k, v in x.items() if k != "tok_per_s"}  # noqa: E731
check(r.returncode == 0 and not r.stdout and [strip(x) for x in filed] == [strip(x) for x in results], "batch_out_file")
check(not [f for f in os.listdir(work) if ".tmp." in f], "batch_out_no_temp_left")

# CSV with quoting: commas, doubled quotes, an embedded newline, CRLF records.
csv_text = ('id,prompt,note\r\n'
            '1,"Once upon a time, there was",plain\r\n'
            '2,"She said ""hi"" to the cat","has ""quotes"""\r\n'
            '\r\n'
            '3,"Tom had a ball.\nHe",multi\r\n')
csv_path = os.path.join(work, "prompts.csv")
with open(csv_path, "w", newline="") as f:
    f.write(csv_text)
want = [row["prompt"] for row in csv.DictReader(io.StringIO(csv_text, newline=""))]
r = varent("run", "-m", model, "--prompt-csv", csv_path, "-n", N, "--seed", SEED, "-q")
cres = [json.loads(ln) for ln in r.stdout.splitlines()] if r.returncode == 0 else []
check([x["prompt"] for x in cres] == want, "batch_csv_quoting_parsed", f"{[x['prompt'] for x in cres]} vs {want} {r.stderr}")
check([x["line"] for x in cres] == [2, 3, 5], "batch_csv_record_lines", str([x["line"] for x in cres]))
compare_to_single("batch_csv_equal_single_runs", cres, want)


def bad(name, args, want_msg, rc=1):
    """rc: 1 for a bad file, 2 for options that do not go together (a usage error)."""
    dest = os.path.join(work, f"bad-{name}.jsonl")
    rr = varent("run", "-m", model, "-n", 4, "-o", dest, *args)
    left = [f for f in os.listdir(work) if f.startswith(f"bad-{name}")]
    check(rr.returncode == rc and want_msg in rr.stderr and not left and not rr.stdout, name,
          f"rc {rr.returncode} {rr.stderr!r} left {left}")


def write(name, text):
    p = os.path.join(work, name)
    with open(p, "w", newline="") as f:
        f.write(text)
    return p


bad("batch_missing_file", ["--prompts", os.path.join(work, "nope.txt")], "nope.txt")
bad("batch_empty_file", ["--prompts", write("empty.txt", "")], "no prompts")
bad("batch_blank_file", ["--prompts", write("blank.txt", "\n  \n\r\n")], "no prompts")
bad("batch_csv_no_prompt_column", ["--prompt-csv", write("nocol.csv", "id,text\n1,hello\n")], "no column named prompt")
bad("batch_csv_empty", ["--prompt-csv", write("empty.csv", "")], "empty CSV")
bad("batch_csv_header_only", ["--prompt-csv", write("hdr.csv", "prompt\n")], "no prompts")
bad("batch_csv_unterminated_quote", ["--prompt-csv", write("q.csv", 'prompt\n"never closed\n')], "q.csv:2: unterminated")
bad("batch_csv_field_count", ["--prompt-csv", write("fc.csv", "id,prompt\n1,a\n2,b,c\n")], "fc.csv:3: the record has 3 fields")
bad("batch_csv_junk_after_quote", ["--prompt-csv", write("j.csv", 'prompt\n"a"b\n')], "after a closing quote")
bad("batch_csv_empty_prompt", ["--prompt-csv", write("ep.csv", "id,prompt\n1,\n")], "ep.csv:2: empty prompt")
bad("batch_prompt_too_long", ["--prompts", write("long.txt", "short\n" + "a b c d e f g h i j k l\n"), "--ctx", "8"],
    "long.txt:2: the prompt is")
bad("batch_with_p", ["--prompts", lines_path, "-p", "hi"], "drop -p", rc=2)
bad("batch_both_sources", ["--prompts", lines_path, "--prompt-csv", csv_path], "not both", rc=2)
bad("batch_metrics_out", ["--prompts", lines_path, "--metrics-out", os.path.join(work, "bad-m.jsonl")], "--metrics-out", rc=2)
rr = varent("run", "-m", model, "--prompts", lines_path, "-o", os.path.join(work, "no", "dir", "x.jsonl"))
check(rr.returncode == 1 and "cannot create" in rr.stderr and not rr.stdout, "batch_unwritable_out", rr.stderr)
# Ctrl-C during a batch with -o: exit 130, the finished records kept whole (each one
# flushed as it finished), no temporary file left (tests/py/test_nothing_lost.py has
# SIGTERM, --resume and --force).
many = write("many.txt", "Once upon a time\n" * 400)
dest = os.path.join(work, "interrupted.jsonl")
p = subprocess.Popen([vtest.VARENT, "run", "-m", model, "--prompts", many, "-n", "400", "--seed", "1", "-o", dest],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
first = p.stderr.readline()  # "load: done ..." once the model is in
time.sleep(0.3)
p.send_signal(signal.SIGINT)
_, err = p.communicate(timeout=60)
kept = [json.loads(ln) for ln in open(dest)] if os.path.exists(dest) else []
check(p.returncode == 130 and "interrupted after" in err and f"after {len(kept)} of 400" in err
      and [x["index"] for x in kept] == list(range(len(kept)))
      and not [f for f in os.listdir(work) if f.startswith("interrupted") and ".tmp" in f],
      "batch_interrupt_keeps_finished_records", f"rc {p.returncode} {first!r} {err[-200:]!r}")
rr = varent("run", "-m", model, "-p", "hi", "-o", os.path.join(work, "bad-single.jsonl"))
check(rr.returncode == 2 and "batch" in rr.stderr, "run_out_needs_batch", rr.stderr)

vtest.done()
