#!/usr/bin/env python3
"""Turns a .cu file into host C++ for the emulated device (docs/cuda.md).

Only mechanical rewrites; every kernel body is compiled as written:
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> emu_launch("kernel", kernel, dim3(grid), dim3(block), smem, stream, args)
  cudaLaunchKernelEx(config, kernel, args) -> emu_launch_ex("kernel", config, kernel, args)
  __shared__ T name[dims];      -> EMU_SHARED(T, name, [dims]);
  extern __shared__ T name[];   -> T *name = reinterpret_cast<T *>(emu::shared_dynamic());
Line numbers are kept (a #line names the .cu file), so compiler messages, assertion
failures and the emulator's own reports point into the real source.

Usage: rewrite.py IN.cu OUT.cpp
"""
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


def matching(text, i, open_ch, close_ch):
    """Index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j + 1
    raise SystemExit(f"rewrite.py: unbalanced {open_ch} at offset {i}")


def split_top(text):
    """Splits on commas outside (), [], {} and template <>."""
    parts, depth, start = [], 0, 0
    for j, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def kernel_start(text, end):
    """Start of the kernel expression that ends at end (name, maybe <template args>)."""
    j = end
    while j > 0 and text[j - 1].isspace():
        j -= 1
    if text[j - 1] == ">":  # template arguments: walk back to the matching <
        depth = 0
        k = j - 1
        while k >= 0:
            if text[k] == ">":
                depth += 1
            elif text[k] == "<":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        j = k
        while j > 0 and text[j - 1].isspace():
            j -= 1
    k = j
    while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_:"):
        k -= 1
    if not IDENT.match(text[k:j].split("::")[-1] or "?"):
        raise SystemExit(f"rewrite.py: no kernel name before <<< at offset {end}")
    return k


def rewrite_launches(text):
    out, pos = [], 0
    while True:
        i = text.find("<<<", pos)
        if i < 0:
            out.append(text[pos:])
            return "".join(out)
        k = kernel_start(text, i)
        kernel = text[k:i].strip()
        close = text.find(">>>", i)
        cfg = split_top(text[i + 3:close])
        if not 2 <= len(cfg) <= 4:
            raise SystemExit(f"rewrite.py: launch of {kernel} has {len(cfg)} configuration values")
        while len(cfg) < 4:
            cfg.append("0")
        p = close + 3
        while text[p].isspace():
            p += 1
        if text[p] != "(":
            raise SystemExit(f"rewrite.py: launch of {kernel} has no argument list")
        q = matching(text, p, "(", ")")
        args = text[p + 1:q - 1]
        name = " ".join(kernel.split())
        call = (f'emu_launch("{name}", {kernel}, dim3({cfg[0]}), dim3({cfg[1]}), (size_t)({cfg[2]}), '
                f'(cudaStream_t)({cfg[3]})' + (", " + args if args.strip() else "") + ")")
        # keep the line count: the launch's own newlines stay inside the call
        extra = text[k:q].count("\n") - call.count("\n")
        out.append(text[pos:k] + call + "\n" * max(extra, 0))
        pos = q


LAUNCH_EX = re.compile(r"\bcudaLaunchKernelEx\s*\(")


def rewrite_launch_ex(text):
    """cudaLaunchKernelEx(config, kernel, args) -> emu_launch_ex("kernel", config, kernel, args)."""
    out, pos = [], 0
    for m in LAUNCH_EX.finditer(text):
        if m.start() < pos:
            continue
        p = m.end() - 1
        q = matching(text, p, "(", ")")
        args = split_top(text[p + 1:q - 1])
        if len(args) < 2:
            raise SystemExit(f"rewrite.py: cudaLaunchKernelEx at offset {m.start()} has no kernel argument")
        name = " ".join(args[1].split())
        out.append(text[pos:m.start()] + f'emu_launch_ex("{name}", ')
        pos = p + 1
    out.append(text[pos:])
    return "".join(out)


SHARED_DYN = re.compile(r"extern\s+__shared__\s+([^;\[]*?)\s*\b(\w+)\s*\[\s*\]\s*;")
SHARED = re.compile(r"__shared__\s+([^;]*?)\s*\b(\w+)\s*((?:\[[^\]]*\]\s*)*);")


def rewrite_shared(text):
    text = SHARED_DYN.sub(lambda m: f"{m.group(1)} *{m.group(2)} = reinterpret_cast<{m.group(1)} *>"
                                    f"(emu::shared_dynamic());", text)
    return SHARED.sub(lambda m: f"EMU_SHARED({m.group(1)}, {m.group(2)}, {m.group(3).strip()});", text)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    text = open(src, encoding="utf-8").read()
    body = rewrite_shared(rewrite_launch_ex(rewrite_launches(text)))
    if body.count("\n") != text.count("\n"):
        raise SystemExit(f"rewrite.py: {src}: the line count changed ({text.count(chr(10))} -> {body.count(chr(10))})")
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'#line 1 "{src}"\n' + body)


if __name__ == "__main__":
    main()
