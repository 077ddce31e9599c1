#!/usr/bin/env python3
"""bench-sched.py: `varent eval` and `varent compare` one prompt at a time (--parallel 1,
what they did before the scheduler) against the scheduler's default, end to end, with the
records checked byte for byte (issue 35's "eval and compare" row).

    eval      --tasks TASK --items N --samplers ARMS (4 arms: greedy, standard,
              entropix:seed, entropix:jax) --chat
    compare   --prompts (N prompts, numbered lines of examples/prompts.txt) under the
              default four samplers, -n 64, --seed 7, --chat

Every run writes -o; the records of the two ways must be equal once the timing fields
(eval's wall_s, compare's tok_per_s and the like) are dropped, or the script fails.
Wall times are medians over --reps interleaved repetitions (the order alternates).

Usage: tools/bench-sched.py [--model weights/SmolLM2-135M-Instruct] [--items 200]
           [--prompts 50] [--threads 2] [--reps 1] [--only eval,compare] [--out FILE.md]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TIMING = {"wall_s", "tok_per_s", "tok_s", "prefill_s", "decode_s", "elapsed_s", "time_s"}


def die(msg):
    print(f"bench-sched: {msg}", file=sys.stderr)
    sys.exit(1)


def records(path):
    """The -o file's records without their timing fields, in file order."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except ValueError as e:
                die(f"{path}:{n}: not JSON ({e})")
            out.append({k: v for k, v in r.items() if k not in TIMING})
    return out


def prompts_file(work, n):
    """n numbered prompts from examples/prompts.txt (the numbers keep them distinct)."""
    with open(os.path.join(ROOT, "examples", "prompts.txt")) as f:
        base = [line.strip() for line in f if line.strip()]
    path = os.path.join(work, f"prompts-{n}.txt")
    with open(path, "w") as f:
        for i in range(n):
            f.write(f"({i + 1}) {base[i % len(base)]}\n")
    return path


def command(args, what, parallel, out):
    v = [args.varent]
    if what == "eval":
        v += ["eval", "-m", args.model, "--tasks", args.task, "--items", str(args.items), "--chat",
              "--samplers", "greedy,standard,entropix:seed,entropix:jax"]
    else:
        v += ["compare", "-m", args.model, "--prompts", args.prompts_path, "--chat", "-n", "64", "--seed", "7"]
    v += ["-t", str(args.threads), "-q", "--force", "-o", out]
    if parallel:
        v += ["--parallel", str(parallel)]
    return v


def run_one(args, what, parallel, rep):
    tag = f"{what}-p{parallel or 'default'}"
    out = os.path.join(args.work, f"{tag}.jsonl")
    t0 = time.monotonic()
    p = subprocess.run(command(args, what, parallel, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        die(f"{' '.join(command(args, what, parallel, out))} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    print(f"# rep {rep + 1}, {what}, --parallel {parallel or 'default'}: {wall:.1f} s", file=sys.stderr, flush=True)
    return wall, records(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct"))
    ap.add_argument("--task", default="add2")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--only", default="eval,compare")
    ap.add_argument("--varent", default=os.path.join(ROOT, "varent"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-sched"))
    ap.add_argument("--out", help="also write the report (markdown) here")
    args = ap.parse_args()
    whats = [w for w in args.only.split(",") if w]
    if not whats or any(w not in ("eval", "compare") for w in whats):
        die("--only takes eval and/or compare")
    for path, what in ((args.model, "--model"), (args.varent, "--varent")):
        if not os.path.exists(path):
            die(f"{what} {path} does not exist (make run fetches SmolLM2 into weights/; make builds varent)")
    os.makedirs(args.work, exist_ok=True)
    args.prompts_path = prompts_file(args.work, args.prompts)
    load_before = os.getloadavg()[0]
    rows = []
    for what in whats:
        walls = {1: [], 0: []}
        recs = {}
        for rep in range(args.reps):
            for parallel in ((0, 1) if rep % 2 == 0 else (1, 0)):
                wall, r = run_one(args, what, parallel, rep)
                walls[parallel].append(wall)
                if parallel in recs and recs[parallel] != r:
                    die(f"{what} --parallel {parallel or 'default'}: the records changed between repetitions")
                recs[parallel] = r
        if recs[0] != recs[1]:
            diff = next(i for i, (a, b) in enumerate(zip(recs[0], recs[1])) if a != b) if len(recs[0]) == len(recs[1]) \
                else f"{len(recs[0])} against {len(recs[1])} records"
            die(f"{what}: the scheduler's records differ from one-by-one ones (first difference: record {diff})")
        one, sched = statistics.median(walls[1]), statistics.median(walls[0])
        size = f"{args.items} items x 4 arms" if what == "eval" else f"{args.prompts} prompts x 4 samplers, -n 64"
        rows.append(f"| {what} | {size} | {len(recs[0])} | {one:.1f} | {sched:.1f} | {one / sched:.2f}x | yes |")
    text = (f"Date {datetime.date.today()}; {os.cpu_count()} CPUs; -t {args.threads}; model "
            f"{os.path.basename(os.path.normpath(args.model))}; {args.reps} interleaved repetition(s), medians; "
            f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after.\n\n"
            "| command | size | records | --parallel 1 (s) | scheduler, default --parallel (s) | speed-up | records identical |\n"
            "|---|---|---:|---:|---:|---:|---|\n" + "\n".join(rows) + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
