#!/usr/bin/env python3
"""Checks that dependencies in the source tree flow one way (docs/architecture.md).

Every `#include "..."` of a project header in host/, model/, kernels/ and tokenizer/
must go to the file's own folder or to a folder its folder may use (ALLOWED below).
Inside model/cuda/ (the device forward) it checks the same per file: each file sits in
a tier (CUDA_TIERS below) and may include only the headers of lower tiers (and its own),
so the core knows nothing of the parts built on it. It also checks the naming rules of host/: every file sits in a role folder, its name
does not repeat the folder (host/serve/request.c, not host/serve/serve_request.c), and
every header opens with its one-line "// name.h: what this is" comment.

Usage: tools/check-layout.py [ROOT]   (exit 0: clean; 1: each violation on a line)
"""
import os
import re
import sys

# folder -> the folders it may include from (besides itself). The order, top down:
# cli -> serve, agents, report -> decode -> runtime -> model -> kernels, with formats,
# tokenizer and util below everything that uses them.
BASE = ["kernels", "tokenizer", "host/formats", "host/util"]
ALLOWED = {
    "host/cli": ["host/eval", "host/serve", "host/agents", "host/report", "host/decode", "host/runtime", "model"] + BASE,
    # eval runs every way of decoding (stock, entropix, branching, the agents) on tasks,
    # so it sits above agents; nothing but the CLI uses it.
    "host/eval": ["host/agents", "host/decode", "host/runtime", "model"] + BASE,
    "host/serve": ["host/decode", "host/runtime", "model"] + BASE,
    "host/agents": ["host/decode", "host/runtime", "model"] + BASE,
    "host/report": ["host/decode", "host/runtime", "model"] + BASE,
    "host/decode": ["host/runtime", "model"] + BASE,
    "host/runtime": ["model"] + BASE,
    "model": BASE,
    # the device forward: the CPU model knows nothing of it, and host/ reaches it only
    # through model/forward_cuda.h
    "model/cuda": ["model"] + BASE,
    "host/formats": ["kernels", "tokenizer", "host/util"],
    "tokenizer": ["host/util"],
    "kernels": ["host/util"],
    "host/util": [],
}
# model/cuda/ by file, bottom up: a file may include model/cuda/ headers of lower tiers
# only. The core (buffers, step block, statistics) knows nothing of the weight upload,
# tensor parallelism, LoRA, the hooks or the armed draws; they use it; internal.h
# composes them, step.c runs the layers with them, forward.c is the public API.
CUDA_TIERS = [
    ["core"],
    ["upload", "tp", "lora"],
    ["hooks", "arm"],
    ["internal"],
    ["step", "persist", "persist_trace", "loop", "tune"],
    ["forward", "absent"],
]
CUDA_TIER = {name: i for i, names in enumerate(CUDA_TIERS) for name in names}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path):
    """The layer a repository-relative path belongs to, or None when it is outside."""
    parts = path.split("/")
    if parts[0] == "host":
        return "/".join(parts[:2]) if len(parts) > 2 else "host"
    if parts[:2] == ["model", "cuda"] and len(parts) > 2:
        return "model/cuda"
    return parts[0] if parts[0] in ALLOWED else None


def cuda_tier(path):
    """The tier of a model/cuda/ file (by its name without extension), or None."""
    return CUDA_TIER.get(os.path.splitext(os.path.basename(path))[0])


def sources(root):
    for top in ("host", "model", "kernels", "tokenizer"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if n.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, n), root)


def check_includes(root, rel, layer, problems):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            to = folder_of(target)
            if layer == "model/cuda" and to == "model/cuda":
                check_cuda_include(rel, lineno, target, problems)
                continue
            if to is None or to == layer:
                continue  # a sibling header ("common.cuh") or a generated/outside file
            if to not in ALLOWED:
                problems.append(f"{rel}:{lineno}: includes {target} from {to}/, which is not a role folder")
            elif to not in ALLOWED[layer]:
                problems.append(f"{rel}:{lineno}: {layer}/ may not include {target} ({to}/ is not below {layer}/)")


def check_cuda_include(rel, lineno, target, problems):
    """One model/cuda/ file including another's header: only downward, by tier."""
    mine, theirs = cuda_tier(rel), cuda_tier(target)
    same = os.path.splitext(os.path.basename(rel))[0] == os.path.splitext(os.path.basename(target))[0]
    if theirs is None:
        problems.append(f"{rel}:{lineno}: includes {target}, which is not in tools/check-layout.py's CUDA_TIERS")
    elif not same and theirs >= mine:
        problems.append(f"{rel}:{lineno}: {os.path.basename(rel)} (tier {mine}) may not include {target} (tier "
                        f"{theirs}): model/cuda/ includes only downward ({' < '.join('/'.join(t) for t in CUDA_TIERS)})")


def check_names(root, rel, layer, problems):
    base = os.path.basename(rel)
    if layer == "host":
        problems.append(f"{rel}: host/ holds only role folders ({', '.join(sorted(k[5:] for k in ALLOWED if k.startswith('host/')))})")
        return
    short = layer.split("/")[-1]
    if layer.startswith("host/") and base.startswith(short + "_"):
        problems.append(f"{rel}: the name repeats its folder ({short}/)")
    if rel.endswith(".h") and layer.startswith("host/"):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            first = f.readline()
        if not first.startswith(f"// {base}: "):
            problems.append(f"{rel}:1: a header opens with '// {base}: what this is'")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = []
    for rel in sources(root):
        layer = folder_of(rel)
        if layer != "host" and layer not in ALLOWED:
            problems.append(f"{rel}: folder {layer}/ is not in tools/check-layout.py's table")
            continue
        if layer == "model/cuda" and cuda_tier(rel) is None:
            problems.append(f"{rel}: model/cuda/ file not in tools/check-layout.py's CUDA_TIERS")
            continue
        check_names(root, rel, layer, problems)
        if layer != "host":
            check_includes(root, rel, layer, problems)
    for p in problems:
        print(p)
    if problems:
        print(f"check-layout: {len(problems)} problem(s); the allowed directions are in docs/architecture.md")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
