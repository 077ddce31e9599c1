#!/usr/bin/env bash
# tools/sass-report.sh [OBJ...]: registers, spills, shared memory, occupancy at the launch
# block size and 128-bit loads in flight per loop, for every kernel of the nvcc build
# (default: build/kernels/cuda/*.cu.o), read from the sm_90 SASS (tools/sass_report.py).
# No GPU needed. cuobjdump is not in the CUDA toolkit installed here, so this installs
# NVIDIA's PyPI package for it into a git-ignored venv (SASS_VENV, default
# build/sass-venv) on first use. --check (first argument) exits 1 on spills or a matvec
# loop with fewer than 4 loads in flight.
set -euo pipefail
cd "$(dirname "$0")/.."
check=()
if [ "${1:-}" = --check ]; then check=(--check); shift; fi
venv=${SASS_VENV:-build/sass-venv}
find_tool() { find "$venv" -name cuobjdump -type f -perm -u+x 2>/dev/null | head -1; }
tool=$(find_tool)
if [ -z "$tool" ]; then
    echo "sass-report: installing nvidia-cuda-cuobjdump into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q nvidia-cuda-cuobjdump
    tool=$(find_tool)
    [ -n "$tool" ] || { echo "sass-report: no cuobjdump in $venv after the install" >&2; exit 1; }
fi
objs=("$@")
if [ ${#objs[@]} -eq 0 ]; then
    objs=(build/kernels/cuda/*.cu.o)
    [ -e "${objs[0]}" ] || { echo "sass-report: no build/kernels/cuda/*.cu.o (run make with nvcc on PATH)" >&2; exit 1; }
fi
exec python3 tools/sass_report.py --cuobjdump "$tool" "${check[@]}" "${objs[@]}"
