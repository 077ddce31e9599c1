#!/usr/bin/env python3
"""tools/sass_report.py: what nvcc made of each CUDA kernel, read from the machine code
(SASS) without a GPU. Run through tools/sass-report.sh, which fetches cuobjdump.

Per kernel of the sm_90 code in each object:
  - registers per thread, local memory (spills), static shared memory (cuobjdump -res-usage);
  - the block size at its launch site in kernels/cuda/*.cu (a literal or a #define), and
    the theoretical occupancy on an H100 at that size (registers, warps, blocks, shared);
  - in every loop of the kernel (a backward branch), per address register, the 128-bit
    global loads (LDG.E.128; not cp.async's LDGSTS, which writes shared memory and no
    register, and whose loops are counted apart) issued before the first instruction
    that reads one of their registers: the loads a warp keeps in flight per iteration, in all and for the
    shallowest stream (address register). The summary column shows a kernel's best loop,
    the list under it every listed loop (listed_loops); --check asks 4 of each listed loop
    of the matvec and persistent decode kernels (STREAM_CHECKED). Issue 16
    wants at least 4 independent loads in flight per lane in the matvec loop, counted in
    all: matvec_vec4 keeps one load per weight row (each row its own address register),
    matvec_vec four chunks of one row (one register), and both count as 4.

  sass_report.py --cuobjdump PATH [--check] OBJ...
--check exits 1 when a kernel has local memory or LDL/STL inside an innermost loop or a
streaming one (the innermost loop around a 128-bit global load or a cp.async copy: the
tiled attention's key loop, which holds its per-head loops), or when a loop with fewer
than 4 loads in flight is in a matvec kernel (any loop, not only its best) or in the
persistent decode kernel (an innermost or streaming loop). Other LDL/STL (run once per
phase or unit, not per chunk or tile: the persistent kernel's few words of layer-loop
state) are listed as cold ("12c") and pass. Kernels other than the matvecs are read in
their innermost and streaming loops only. The parsers are plain functions, tested on planted SASS in
tests/py/test_sass_report.py.
"""
import argparse
import glob
import math
import os
import re
import subprocess
import sys

# H100 (sm_90) per-SM limits, from NVIDIA's occupancy tables.
SM_WARPS, SM_BLOCKS, SM_REGS, REG_UNIT = 64, 32, 65536, 256
SM_SMEM, BLOCK_SMEM_RESERVED, SMEM_UNIT = 233472, 1024, 128
MIN_IN_FLIGHT = 4
# The kernels whose every listed loop must keep MIN_IN_FLIGHT loads in flight: the graph
# path's matvecs and the persistent decode kernel (its matvec units and attention tiles).
STREAM_CHECKED = ("matvec", "persist_decode")

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
REG = re.compile(r"\bR(\d+)\b")


def parse_sass(text):
    """{function name: [(address, opcode, operands)]} from `cuobjdump -sass` output."""
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function\s*:\s*(\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INSN.search(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4).strip()))
    return funcs


def parse_res_usage(text):
    """{function name: {REG, STACK, SHARED, LOCAL}} from `cuobjdump -res-usage`."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.search(r"Function\s+(\S+?):?\s*$", line.strip())
        if m:
            name = m.group(1).rstrip(":")
            continue
        if name and "REG:" in line:
            out[name] = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", line)}
            name = None
    return out


def regs_of(operand_text):
    """Register numbers named in an operand string; R9.64-style pairs are not expanded
    (an address pair's first register is enough to see a use)."""
    return {int(r) for r in REG.findall(operand_text)}


def written_regs(opcode, operands):
    """Registers an LDG writes: the first operand, 1/2/4 consecutive by width."""
    first = operands.split(",")[0]
    m = REG.search(first)
    if not m:
        return set()
    base = int(m.group(1))
    width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
    return set(range(base, base + width))


def source_regs(opcode, operands):
    """Registers an instruction reads: all operands for stores and atomics, the rest after
    the destination otherwise."""
    parts = [p.strip() for p in operands.split(",")]
    if opcode.startswith(("ST", "RED", "ATOM", "BRA", "EXIT", "BAR")):
        return regs_of(operands)
    return regs_of(",".join(parts[1:]))


def loops(insns):
    """(start index, end index) of every backward branch's body."""
    index = {a: i for i, (a, _, _) in enumerate(insns)}
    out = []
    for i, (addr, op, ops) in enumerate(insns):
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", ops)
            if m and int(m.group(1), 16) <= addr and int(m.group(1), 16) in index:
                out.append((index[int(m.group(1), 16)], i))
    return out


def is_async_copy(op):
    """cp.async (LDGSTS): global to shared memory with no destination register. It is not
    a load in flight in the sense above (nothing waits on a register; its first operand is
    the shared address), but a loop that issues it streams."""
    return op.startswith("LDGSTS")


def is_wide_load(op):
    return op.startswith("LDG") and ".128" in op and not is_async_copy(op)


def load_base(operands):
    """The address register of a load: R34 in 'R16, desc[UR4][R34.64+0x200]'."""
    m = re.search(r"\[(R\d+)(?:\.64)?(?:\s*[+-][^\]]*)?\]\s*$", operands)
    return m.group(1) if m else None


def loads_in_flight(insns, start, end, base):
    """128-bit global loads from address register `base` (None: any) issued in insns[start..end]
    before the first instruction that reads a register one of them writes."""
    pending, n = set(), 0
    for _, op, ops in insns[start:end + 1]:
        if pending & source_regs(op, ops):
            break
        if is_wide_load(op) and base in (None, load_base(ops)):
            n += 1
            pending |= written_regs(op, ops)
    return n


def steady_in_flight(insns, start, end, base):
    """loads_in_flight of a loop in its steady state: the loads outstanding at the first
    instruction that reads one of them, counted in the first pass over the body and
    again in the second, where the loads a pipelined loop issues at its bottom for the
    next iteration (nvcc rotates them there) are in flight across the back edge. A
    load whose registers a later load rewrites is dead and no longer counted."""
    body = insns[start:end + 1]
    best = 0
    pending = []  # registers of each outstanding load
    for pass_ in range(2):
        for _, op, ops in body:
            reads = source_regs(op, ops)
            if any(r & reads for r in pending):
                best = max(best, len(pending))
                if pass_ == 1:
                    return best
                pending = [r for r in pending if not r & reads]
            if is_wide_load(op) and base in (None, load_base(ops)):
                w = written_regs(op, ops)
                pending = [r for r in pending if not r & w] + [w]
    return best


def every_in_flight(insns, spans=None):
    """[(all, fewest)] of every loop with a 128-bit global load, in code order: a kernel's
    best loop can hide a shallow one (a short row's tail, a second phase). spans: the
    loops to read (default every loop)."""
    out = []
    for s, e in loops(insns) if spans is None else spans:
        bases = {load_base(ops) for _, op, ops in insns[s:e + 1] if is_wide_load(op)} - {None}
        if bases:
            out.append((steady_in_flight(insns, s, e, None), min(steady_in_flight(insns, s, e, b) for b in bases)))
    return out


def max_in_flight(insns, spans=None):
    """(all, fewest) for the kernel's best loop: the 128-bit global loads in flight
    counting every address register, and for the register (stream) with the fewest.
    `fewest` is conservative: it asks every stream, weights and activations alike, to
    be deep, and where each row has its own weight register (matvec_vec4, 4 rows per
    warp) it counts one row's. None when no loop has such a load."""
    best = None
    for s, e in loops(insns) if spans is None else spans:
        bases = {load_base(ops) for _, op, ops in insns[s:e + 1] if is_wide_load(op)} - {None}
        if bases:
            every = steady_in_flight(insns, s, e, None)
            fewest = min(steady_in_flight(insns, s, e, b) for b in bases)
            best = (every, fewest) if best is None else max(best, (every, fewest))
    return best


def async_copy_loops(insns, spans=None):
    """How many loops (default every loop) issue cp.async: listed apart from the loads in
    flight, which they do not have."""
    return sum(1 for s, e in (loops(insns) if spans is None else spans)
               if any(is_async_copy(insns[i][1]) for i in range(s, e + 1)))


def spill_insns(insns):
    return sum(1 for _, op, _ in insns if op.startswith(("STL", "LDL")))


def innermost(spans):
    """The loops of loops() that hold no other loop: where a kernel spends its time."""
    return [(s, e) for s, e in spans if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in spans)]


def streaming(insns, spans):
    """The innermost loop around each 128-bit global load: a loop that streams a tile or a
    chunk each iteration, though it may hold other loops (the tiled attention's key loop
    holds its per-head loops). The loops around it (units, layers) are not streaming."""
    def wide(s, e):
        return any(is_wide_load(insns[i][1]) or is_async_copy(insns[i][1]) for i in range(s, e + 1))
    out = []
    for s, e in spans:
        inner = [(s2, e2) for s2, e2 in spans if (s2, e2) != (s, e) and s <= s2 and e2 <= e]
        if wide(s, e) and not any(wide(s2, e2) for s2, e2 in inner):
            out.append((s, e))
    return out


def listed_loops(base, insns):
    """The loops the report lists and --check reads: every loop of a matvec kernel (base:
    its name); the innermost and streaming loops of the rest (a tiled attention's key
    loop holds its head loops), whose outer loops (the persistent kernel's layers) are
    the whole body."""
    every = loops(insns)
    if base.startswith("matvec"):
        return every
    return sorted(set(innermost(every)) | set(streaming(insns, every)))


def hot_spill_insns(insns):
    """LDL/STL inside an innermost loop or a streaming one (once per iteration, per chunk
    or tile). The rest run once per phase or unit of a kernel (the persistent kernel's
    few words of layer-loop state, where registers peak)."""
    spans = loops(insns)
    hot = set()
    for s, e in innermost(spans) + streaming(insns, spans):
        hot.update(i for i in range(s, e + 1) if insns[i][1].startswith(("STL", "LDL")))
    return len(hot)


def occupancy(regs, threads, smem):
    """Theoretical occupancy (active warps / 64) of an sm_90 SM, and what limits it."""
    if not threads or threads < 1:
        return None, "?"
    warps = math.ceil(threads / 32)
    limits = {"warps": SM_WARPS // warps, "blocks": SM_BLOCKS}
    per_warp = math.ceil(max(regs, 1) * 32 / REG_UNIT) * REG_UNIT
    limits["registers"] = (SM_REGS // per_warp) // warps
    # cuobjdump's SHARED already holds the 1 KiB the system reserves per block on sm_90.
    block_smem = math.ceil(max(smem, BLOCK_SMEM_RESERVED) / SMEM_UNIT) * SMEM_UNIT
    limits["shared"] = SM_SMEM // block_smem
    why = min(limits, key=lambda k: limits[k])
    return min(limits[why] * warps, SM_WARPS) / SM_WARPS, why


def split_args(text):
    """Top-level comma-separated parts of text (commas inside parentheses stay)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        cur += ch
    return parts + [cur.strip()]


def eval_block(expr, consts, text):
    """The value of a launch's block expression, or None: integer constants (#define,
    enum) and one level of a local `name = expr` assignment in the same file."""
    if re.fullmatch(r"[A-Za-z_]\w*", expr) and expr not in consts:
        m = re.search(r"\b" + expr + r"\s*=\s*([^,;]+)", text)
        if not m:
            return None
        expr = m.group(1)
    expr = re.sub(r"[A-Za-z_]\w*", lambda m: str(consts.get(m.group(0), "?")), expr)
    if not re.fullmatch(r"[\d\s+*/()-]+", expr):
        return None
    return int(eval(expr.replace("/", "//")))  # digits and operators only


def launch_blocks(src_dir):
    """{kernel base name: threads per block} from the launch sites in src_dir/*.cu; None
    where the block size is computed at run time."""
    consts, sites, bounds = {}, [], []
    for path in sorted(glob.glob(os.path.join(src_dir, "*.cu")) + glob.glob(os.path.join(src_dir, "*.cuh"))):
        text = open(path, encoding="utf-8").read()
        for name, value in re.findall(r"#define\s+(\w+)\s+\(?(\d+)\)?(?:\s|$)", text, re.M):
            consts[name] = int(value)
        for name, value in re.findall(r"\b([A-Z_][A-Z0-9_]*)\s*=\s*(\d+)\s*[,}]", text):
            consts.setdefault(name, int(value))
        for m in re.finditer(r"(\w+)(?:<[^<>]*>)?<<<(.*?)>>>", text, re.S):
            sites.append((m.group(1), split_args(m.group(2)), text))
        # LAUNCH_PDL(ctx, kernel, grid, block, smem, args...) (common.cuh)
        for m in re.finditer(r"\bLAUNCH_PDL\s*\(", text):
            close = closing(text, m.end() - 1, "(", ")")
            args = split_args(text[m.end():close]) if close > 0 else []
            if len(args) >= 4:
                kname = re.match(r"\(?\s*(\w+)", args[1])
                if kname:
                    sites.append((kname.group(1), [args[2], args[3]], text))
        # a kernel without a <<<>>> site (cudaLaunchKernelEx): its __launch_bounds__' block size
        for m in re.finditer(r"__launch_bounds__\s*\(\s*(\w+)[^)]*\)\s*(\w+)\s*\(", text):
            bounds.append((m.group(2), m.group(1), text))
    out = {}
    for name, args, text in sites:
        if len(args) >= 2:
            out.setdefault(name, eval_block(args[1], consts, text))
    for name, value, text in bounds:
        if out.get(name) is None:
            out[name] = eval_block(value, consts, text)
    return out


TRIG = re.compile(r"\b(?:sincosf?|sinf?|cosf?|tanf?)\s*\(")


FUNC_HEAD = re.compile(r"__(?:global|device)__[^;{()]*?\b(\w+)\s*\(")


def closing(text, i, open_ch, close_ch):
    """Index of the bracket that closes the one at text[i] (-1 if none)."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j
    return -1


def function_bodies(src_dir):
    """{name: (is_kernel, body)} of the __global__ and __device__ functions defined in
    src_dir's .cu and .cuh files (bodies of overloads joined)."""
    out = {}
    paths = sorted(glob.glob(os.path.join(src_dir, "*.cu")) + glob.glob(os.path.join(src_dir, "*.cuh")))
    for path in paths:
        text = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", open(path, encoding="utf-8").read())
        for m in FUNC_HEAD.finditer(text):
            close = closing(text, m.end() - 1, "(", ")")
            brace, semi = text.find("{", close), text.find(";", close)
            if close < 0 or brace < 0 or 0 <= semi < brace:
                continue  # a declaration
            end = closing(text, brace, "{", "}")
            kernel, body = out.get(m.group(1), (False, ""))
            out[m.group(1)] = (kernel or m.group(0).startswith("__global__"),
                               body + text[brace:end if end >= 0 else len(text)])
    return out


def trig_kernels(src_dir):
    """Kernel base names whose body calls sin, cos, sincos or tan, directly or through the
    __device__ functions it calls (src_dir's .cu and .cuh files). Their precise versions
    reduce arguments past about 1e5 with a small local array (Payne-Hanek), which is
    LDL/STL in the SASS but not a register spill."""
    funcs = function_bodies(src_dir)
    trig = {n for n, (_, body) in funcs.items() if TRIG.search(body)}
    grown = True
    while grown:
        grown = False
        for n, (_, body) in funcs.items():
            if n not in trig and any(re.search(r"\b%s\s*[<(]" % t, body) for t in trig):
                trig.add(n)
                grown = True
    return {n for n in trig if funcs[n][0]}


def demangle(names):
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return dict(zip(names, r.stdout.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def base_name(pretty):
    """'void matvec_vec_kernel<0, 1>(mv_rows, ...)' -> 'matvec_vec_kernel'."""
    return re.sub(r"[<(].*", "", pretty).split("::")[-1].split()[-1]


def report(cuobjdump, objs, src_dir):
    blocks, trig = launch_blocks(src_dir), trig_kernels(src_dir)
    rows = []
    for obj in objs:
        sass = subprocess.run([cuobjdump, "-sass", "-arch", "sm_90", obj], capture_output=True, text=True, check=True)
        res = subprocess.run([cuobjdump, "-res-usage", "-arch", "sm_90", obj], capture_output=True, text=True,
                             check=True)
        funcs, usage = parse_sass(sass.stdout), parse_res_usage(res.stdout)
        pretty = demangle(sorted(funcs))
        for name in sorted(funcs):
            u = usage.get(name, {})
            base = base_name(pretty[name])
            threads = blocks.get(base)
            occ, why = occupancy(u.get("REG", 0), threads, u.get("SHARED", 0))
            f = funcs[name]
            spans = listed_loops(base, f)
            rows.append(dict(obj=os.path.basename(obj), kernel=pretty[name], base=base, regs=u.get("REG"),
                             local=u.get("LOCAL", 0), stack=u.get("STACK", 0), spills=spill_insns(f),
                             hot_spills=hot_spill_insns(f), trig=base in trig, smem=u.get("SHARED"),
                             threads=threads, occ=occ, limit=why, in_flight=max_in_flight(f, spans),
                             loops=every_in_flight(f, spans), async_loops=async_copy_loops(f, spans)))
    return rows


def print_rows(rows):
    print(f"{'kernel':<44} {'regs':>4} {'spill':>5} {'smem':>6} {'block':>5} {'occupancy':>14} "
          f"{'LDG.128 in flight (all/fewest)':>30}")
    for r in rows:
        occ = "-" if r["occ"] is None else f"{100 * r['occ']:.0f}% ({r['limit']})"
        spill = r["local"] or r["spills"]
        if spill and is_trig_stack(r):
            spill = "trig"
        elif r["spills"] and not r["local"] and not r.get("hot_spills", r["spills"]):
            spill = "%dc" % r["spills"]  # cold: none in a loop
        fl = "-" if r["in_flight"] is None else "%d / %d" % r["in_flight"]
        name = r["kernel"] if len(r["kernel"]) <= 44 else r["kernel"][:41] + "..."
        print(f"{name:<44} {r['regs'] or 0:>4} {spill:>5} {r['smem'] or 0:>6} {r['threads'] or '?':>5} {occ:>14} {fl:>30}")
    print("\nevery loop with a 128-bit global load, in code order (all / fewest in flight;"
          " loops of cp.async copies, which hold no registers, counted apart):")
    for r in rows:
        if r.get("loops") or r.get("async_loops"):
            name = r["kernel"] if len(r["kernel"]) <= 44 else r["kernel"][:41] + "..."
            cp = f" (+{r['async_loops']} cp.async)" if r.get("async_loops") else ""
            print(f"{name:<44} " + ", ".join("%d/%d" % l for l in r.get("loops", [])) + cp)


# The stack of sincosf's Payne-Hanek range reduction: 7 words, padded (ptxas on sm_90).
TRIG_STACK_MAX = 32


def is_trig_stack(r):
    """Local memory that is only a trig function's range-reduction array: no LOCAL bytes
    of the kernel's own, a stack no larger than that array, and its source calls sin/cos.
    A larger stack is register spills beside it (the persistent kernel's 256-288 bytes
    once passed as trig)."""
    return bool(r.get("trig")) and not r["local"] and r.get("stack", 0) <= TRIG_STACK_MAX


def problems(rows):
    """What --check fails on: local memory or LDL/STL inside an innermost loop (a row
    without hot_spills counts every LDL/STL as hot), and loops with few loads in flight
    in the decode kernels that stream weights (STREAM_CHECKED)."""
    out = []
    for r in rows:
        hot = r.get("hot_spills", r["spills"])
        if (r["local"] or hot) and not is_trig_stack(r):
            out.append(f"{r['kernel']}: spills ({r['local']} bytes local, {r.get('stack', 0)} bytes of stack, "
                       f"{r['spills']} LDL/STL, {hot} of them in a loop)")
        if not r["base"].startswith(STREAM_CHECKED):
            continue
        # every loop, not only the best one: a deep main loop can hide a shallow second
        # loop (a short row's path, a tail) that the short rows of a small model run
        every = r.get("loops") or ([r["in_flight"]] if r["in_flight"] is not None else [])
        for k, (n, _) in enumerate(every):
            if n < MIN_IN_FLIGHT:
                out.append(f"{r['kernel']}: loop {k + 1} of {len(every)} has {n} 128-bit loads in flight "
                           f"(want >= {MIN_IN_FLIGHT})")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cuobjdump", default="cuobjdump")
    ap.add_argument("--src", default="kernels/cuda", help="where the launch sites are (default kernels/cuda)")
    ap.add_argument("--check", action="store_true", help="exit 1 on spills or a matvec loop with < 4 loads in flight")
    ap.add_argument("objs", nargs="+")
    a = ap.parse_args()
    rows = report(a.cuobjdump, a.objs, a.src)
    print_rows(rows)
    bad = problems(rows)
    for p in bad:
        print("note:", p)
    return 1 if a.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
