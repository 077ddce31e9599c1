#!/usr/bin/env bash
# tools/sass-report.sh [OBJ...]: registers, spills, shared memory, occupancy at the launch
# block size and 128-bit loads in flight per loop, for every kernel of the nvcc build
# (default: build/kernels/cuda/*.cu.o), read from the sm_90 SASS (tools/sass_report.py).
# No GPU needed. cuobjdump is not in the CUDA toolkit installed here, so this installs
# NVIDIA's PyPI package for it into a git-ignored venv (SASS_VENV, default
# build/sass-venv) on first use, with nvdisasm, which its -sass runs. --check (first argument) exits 1 on spills or on any loop
# of a matvec kernel (every loop, not only its best) with fewer than 4 loads in flight.
set -euo pipefail
cd "$(dirname "$0")/.."
check=()
if [ "${1:-}" = --check ]; then check=(--check); shift; fi
venv=${SASS_VENV:-build/sass-venv}
# find_tool NAME: the executable NAME in the venv, or nothing.
find_tool() { { find "$venv" -name "$1" -type f -perm -u+x 2>/dev/null || true; } | head -1; }
tool=$(find_tool cuobjdump)
disasm=$(find_tool nvdisasm)
if [ -z "$tool" ] || [ -z "$disasm" ]; then
    # cuobjdump -sass runs nvdisasm (from CUDA 13.x on it is a separate program)
    echo "sass-report: installing nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm into $venv" >&2
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    tool=$(find_tool cuobjdump)
    disasm=$(find_tool nvdisasm)
    [ -n "$tool" ] && [ -n "$disasm" ] || { echo "sass-report: no cuobjdump or nvdisasm in $venv after the install" >&2; exit 1; }
fi
export PATH="$(dirname "$disasm"):$PATH"
objs=("$@")
if [ ${#objs[@]} -eq 0 ]; then
    objs=(build/kernels/cuda/*.cu.o)
    [ -e "${objs[0]}" ] || { echo "sass-report: no build/kernels/cuda/*.cu.o (run make with nvcc on PATH)" >&2; exit 1; }
fi
exec python3 tools/sass_report.py --cuobjdump "$tool" "${check[@]}" "${objs[@]}"
