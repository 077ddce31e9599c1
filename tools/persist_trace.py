#!/usr/bin/env python3
"""tools/persist_trace.py TRACE.tsv: where a persistent decode step's time goes, from the
phase trace (VARENT_CUDA_PERSIST_TRACE; docs/cuda.md "The phase trace").

Each row is one block's stamps of one phase, thread 0's view: entry, the end of its
first counter wait (-1: none) and exit (warp 0's units done), in ns after the step's
first entry. Per phase (a layer's qkv, attention, o, gate_up, down; the embed, the
lm_head): its span (the last exit less the first entry over the blocks), the blocks'
median wait (wait less entry: the producers' tail and the counter's latency) and median
work (exit less wait). Per kind over the layers: the phases, the median span, the sum of
spans and its share of the step (the first entry to the last exit), the median wait and
work. Exit 1 on a file that is not a trace.
"""
import statistics
import sys

KINDS = ["embed", "qkv", "attention", "o", "gate_up", "down", "lm_head"]


def fail(msg):
    print(f"persist_trace: {msg}", file=sys.stderr)
    sys.exit(1)


def read(path):
    """The header's grid and layers, and {phase: (kind, layer, [(entry, wait, exit)])}."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    head = "# varent persist-trace 1: grid "
    if len(lines) < 2 or not lines[0].startswith(head):
        fail(f"{path}: not a persistent kernel trace (no '{head}...' line)")
    try:
        parts = lines[0][len(head):].replace(",", "").split()
        grid, layers = int(parts[0]), int(parts[2])
    except (IndexError, ValueError):
        fail(f"{path}:1: bad header: {lines[0]}")
    phases = {}
    for n, line in enumerate(lines[2:], start=3):
        f = line.split("\t")
        if len(f) != 7 or f[2] not in KINDS:
            fail(f"{path}:{n}: not a trace row (phase, layer, kind, block, entry, wait, exit): {line}")
        try:
            ph, layer, e, w, x = int(f[0]), int(f[1]), int(f[4]), int(f[5]), int(f[6])
        except ValueError:
            fail(f"{path}:{n}: a field is not a number: {line}")
        phases.setdefault(ph, (f[2], layer, []))[2].append((e, w, x))
    if not phases:
        fail(f"{path}: no rows")
    return grid, layers, phases


def report(path):
    grid, layers, phases = read(path)
    rows = [r for _, _, rs in phases.values() for r in rs]
    step = max(x for _, _, x in rows) - min(e for e, _, _ in rows)
    by_kind = {}
    for kind, _, rs in phases.values():
        span = max(x for _, _, x in rs) - min(e for e, _, _ in rs)
        waited = [(w - e, x - w) for e, w, x in rs if w >= 0]
        k = by_kind.setdefault(kind, {"span": [], "wait": [], "work": []})
        k["span"].append(span)
        if waited:
            k["wait"].append(statistics.median(a for a, _ in waited))
            k["work"].append(statistics.median(b for _, b in waited))
    print(f"persist trace {path}: grid {grid}, {layers} layers, step {step / 1e3:.1f} us "
          f"(the first entry to the last exit)")
    print(f"{'kind':<10} {'phases':>6} {'span us':>9} {'sum us':>9} {'share':>6} {'wait us':>8} {'work us':>8}")
    for kind in KINDS:
        if kind not in by_kind:
            continue
        k = by_kind[kind]
        total = sum(k["span"])
        med = lambda v: f"{statistics.median(v) / 1e3:.2f}" if v else "-"
        share = f"{100 * total / step:.1f}%" if step > 0 else "-"
        print(f"{kind:<10} {len(k['span']):>6} {med(k['span']):>9} {total / 1e3:>9.2f} {share:>6} "
              f"{med(k['wait']):>8} {med(k['work']):>8}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        sys.exit(2)
    report(sys.argv[1])
