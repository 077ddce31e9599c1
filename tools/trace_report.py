#!/usr/bin/env python3
"""trace_report.py: one decode step, node by node, from a trace of tools/trace/cupti_trace.c.

    tools/trace_report.py TRACE --kind greedy --tsv decode-trace.tsv [--append]

The step analysed is the graph launched last in the traced run (`varent bench` runs its
greedy loop first and then the --sampler loops, so a run with `--sampler none` ends on
the greedy step and one with `--sampler standard` on the sampled step). Every launch of
that graph is a step; the first is dropped when there are three or more (it follows the
capture). For each node of the graph, in order, the TSV gets a row

    step kind, node index, kernel, duration us, gap before us

(medians over the steps; the gap before node 0 runs from the end of the device's
previous piece of work). Standard output gets the step's span against its busy time,
the time from one step's last node to the next step's first, and what ran there: the
device's work outside the graph and the host's runtime API calls between two launches,
per step. Exit status 1 when the trace holds no graph launch.

    tools/trace_report.py TRACE --prefill

instead reports the prompt's last prefill: the device's work outside any graph from the
first embedding kernel (a forward's first launch) of the last stretch between graph nodes
that has one, to the next graph node or the trace's end (the prefill's chunks, its draw
and their copies; with `varent bench --runs 2` the second run's, past the first run's
cold start). It prints the span against the busy time and each kernel's launches, total
time and share of the busy time, the largest first. Exit status 1 when the trace holds no embedding kernel.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys

HEADER = "step_kind\tnode\tkernel\tdur_us\tgap_us\n"


class Rec:
    __slots__ = ("kind", "start", "end", "corr", "graph", "node", "stream", "name")

    def __init__(self, f):
        self.kind = f[0]
        self.start, self.end = int(f[1]), int(f[2])
        self.corr, self.graph, self.node, self.stream = int(f[3]), int(f[4]), int(f[5]), int(f[6])
        self.name = f[7]


def parse(path):
    recs, dropped = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            fields = line.split("\t")
            if fields[0] == "D" and len(fields) == 2:
                dropped += int(fields[1])
                continue
            if len(fields) != 8 or fields[0] not in "KMSA":
                sys.exit(f"trace_report: {path}:{n}: not a trace record: {line[:80]!r}")
            recs.append(Rec(fields))
    return recs, dropped


def api_name(name):
    """cudaGraphLaunch_v10000 -> cudaGraphLaunch (CUPTI's callback names carry a version)."""
    return re.sub(r"_v\d+$", "", name)


def short_names(names):
    """Demangled (c++filt, when installed) and cut to the function and its template arguments."""
    mangled = sorted({n for n in names if n.startswith("_Z")})
    plain = {}
    if mangled and shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.split("\n")
        plain = dict(zip(mangled, out))
    result = {}
    for n in names:
        s = plain.get(n, n)
        s = re.sub(r"^void ", "", s)
        depth = 0
        for i, ch in enumerate(s):  # cut the parameter list at template depth 0
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "(" and depth == 0 and i > 0:
                s = s[:i]
                break
        result[n] = s.replace("\t", " ")
    return result


def median(v):
    return statistics.median(v) if v else float("nan")


def steps_of(recs):
    """(graph id, [(launch api record, [node records by start])]) of the graph launched last."""
    launches = sorted((r for r in recs if r.kind == "A" and api_name(r.name) == "cudaGraphLaunch"),
                      key=lambda r: r.start)
    by_corr = {}
    for r in recs:
        if r.kind != "A" and r.graph:
            by_corr.setdefault(r.corr, []).append(r)
    steps = [(a, sorted(by_corr.get(a.corr, []), key=lambda r: r.start)) for a in launches]
    steps = [(a, nodes) for a, nodes in steps if nodes]
    if not steps:
        return 0, []
    graph = steps[-1][1][0].graph
    mine = [(a, nodes) for a, nodes in steps if nodes[0].graph == graph]
    if len(mine) >= 3:
        mine = mine[1:]
    return graph, mine


def node_rows(kind, steps, device):
    """Per node: name, median duration and gap (us)."""
    counts = statistics.multimode(len(nodes) for _, nodes in steps)
    n_nodes = counts[0]
    steps = [s for s in steps if len(s[1]) == n_nodes]
    names = short_names({r.name for _, nodes in steps for r in nodes})
    rows = []
    for i in range(n_nodes):
        durs = [(nodes[i].end - nodes[i].start) / 1e3 for _, nodes in steps]
        gaps = []
        for _, nodes in steps:
            if i > 0:
                gaps.append((nodes[i].start - nodes[i - 1].end) / 1e3)
                continue
            prev = [r.end for r in device if r.end <= nodes[0].start and r is not nodes[0]]
            if prev:
                gaps.append((nodes[0].start - max(prev)) / 1e3)
        rows.append((kind, i, names[steps[0][1][i].name], median(durs), median(gaps)))
    return rows, steps


def between(steps, recs, device, graph):
    """Per gap between two consecutive steps: its length, the device's other work in it and
    the host's API calls from one launch to the next."""
    lengths, dev_work, host_calls = [], {}, {}
    names = short_names({r.name for r in device})
    for (a0, n0), (a1, n1) in zip(steps, steps[1:]):
        t0, t1 = n0[-1].end, n1[0].start
        lengths.append((t1 - t0) / 1e3)
        for r in device:
            if r.graph != graph and r.start >= t0 and r.end <= t1:
                dev_work.setdefault(names[r.name], []).append((r.end - r.start) / 1e3)
        for r in recs:
            if r.kind == "A" and a0.start < r.start < a1.start and r is not a0:
                host_calls.setdefault(api_name(r.name), []).append((r.end - r.start) / 1e3)
    return lengths, dev_work, host_calls


def report(path, kind, tsv, append):
    recs, dropped = parse(path)
    device = sorted((r for r in recs if r.kind != "A"), key=lambda r: r.start)
    graph, steps = steps_of(recs)
    if not steps:
        print(f"trace_report: {path}: no graph launch with device work in the trace ({len(recs)} records)",
              file=sys.stderr)
        return 1
    rows, steps = node_rows(kind, steps, device)
    new = not append or not os.path.exists(tsv) or os.path.getsize(tsv) == 0
    with open(tsv, "a" if append else "w", encoding="utf-8") as f:
        if new:
            f.write(HEADER)
        for k, i, name, dur, gap in rows:
            f.write(f"{k}\t{i}\t{name}\t{dur:.2f}\t{gap:.2f}\n")
    spans = [(max(r.end for r in n) - n[0].start) / 1e3 for _, n in steps]
    busy = [union_us(n) for _, n in steps]  # with PDL a node starts before the one ahead ends
    overlap = [sum(r.end - r.start for r in n) / 1e3 - union_us(n) for _, n in steps]
    per_token = [(b[0].start - a[0].start) / 1e3 for a, b in zip(steps, steps[1:])]
    lengths, dev_work, host_calls = between(steps, recs, device, graph)
    n_gaps = max(1, len(lengths))
    print(f"trace {kind}: {len(steps)} steps of graph {graph}, {len(rows)} nodes each "
          f"({dropped} records dropped)")
    print(f"  step span {median(spans):.1f} us, busy {median(busy):.1f} us "
          f"({100 * median(busy) / median(spans):.0f}%), idle inside {median(spans) - median(busy):.1f} us"
          + (f"; nodes overlapped {median(overlap):.1f} us (programmatic dependent launch)" if median(overlap) > 0 else ""))
    print(f"  launch to launch {median(per_token):.1f} us ({1e6 / median(per_token):.0f} tok/s traced); "
          f"between steps {median(lengths):.1f} us")
    for name, v in sorted(dev_work.items(), key=lambda kv: -sum(kv[1])):
        print(f"  between steps, device: {name}: {len(v) / n_gaps:.2f} per step, {median(v):.2f} us each")
    for name, v in sorted(host_calls.items(), key=lambda kv: -sum(kv[1])):
        print(f"  between launches, host: {name}: {len(v) / n_gaps:.2f} per step, {sum(v) / n_gaps:.1f} us per step")
    slow = sorted(rows, key=lambda r: -r[3])[:5]
    print("  slowest nodes: " + "; ".join(f"#{i} {name} {dur:.1f} us" for _, i, name, dur, _ in slow))
    return 0


def prefill_report(path):
    recs, dropped = parse(path)
    device = sorted((r for r in recs if r.kind != "A"), key=lambda r: r.start)
    stretches, cur = [], []  # the device's work outside graphs, cut at each graph node
    for r in device:
        if r.graph:
            if cur:
                stretches.append(cur)
            cur = []
        else:
            cur.append(r)
    if cur:
        stretches.append(cur)
    work = []
    for st in reversed(stretches):
        i = next((i for i, r in enumerate(st) if r.kind == "K" and "embed_kernel" in r.name), None)
        if i is not None:
            work = st[i:]
            break
    if not work:
        print(f"trace_report: {path}: no embedding kernel outside a graph: no prefill in the trace", file=sys.stderr)
        return 1
    first = work[0]
    names = short_names({r.name for r in work})
    span = (max(r.end for r in work) - first.start) / 1e3
    busy = union_us(work)
    print(f"prefill: {len(work)} kernels and copies, the last prefill up to its decode graph "
          f"({dropped} records dropped)")
    print(f"  span {span:.1f} us, busy {busy:.1f} us ({100 * busy / span if span > 0 else 0:.0f}%), "
          f"idle inside {span - busy:.1f} us")
    per = {}
    for r in work:
        per.setdefault(names[r.name], []).append((r.end - r.start) / 1e3)
    for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        print(f"  prefill by kernel: {name}: {len(v)} x, {sum(v):.1f} us "
              f"({100 * sum(v) / busy if busy > 0 else 0:.0f}% of busy), median {median(v):.2f} us")
    return 0


def union_us(nodes):
    """The time (us) covered by at least one of the nodes' intervals."""
    total, end = 0, None
    for r in sorted(nodes, key=lambda r: r.start):
        if end is None or r.start >= end:
            total += r.end - r.start
            end = r.end
        elif r.end > end:
            total += r.end - end
            end = r.end
    return total / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--kind", help="the step kind's name in the TSV (greedy, armed-temp1, ...)")
    ap.add_argument("--tsv", help="the per-node table to write")
    ap.add_argument("--append", action="store_true", help="append to the table (its header once)")
    ap.add_argument("--prefill", action="store_true", help="report the prompt's prefill by kernel instead")
    a = ap.parse_args()
    if a.prefill:
        sys.exit(prefill_report(a.trace))
    if not a.kind or not a.tsv:
        ap.error("--kind and --tsv are required (or --prefill)")
    sys.exit(report(a.trace, a.kind, a.tsv, a.append))


if __name__ == "__main__":
    main()
