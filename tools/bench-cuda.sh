#!/usr/bin/env bash
# tools/bench-cuda.sh: decode and prefill speed of the CUDA backend on random-weight
# checkpoints with the real shapes of SmolLM2-135M, Qwen3-0.6B, Llama-3.2-1B and
# Llama-3.1-8B (bf16, written by tools/gen_random_checkpoint.py, no hub download),
# through `varent bench --device cuda`: medians over RUNS runs of a PROMPT-token prefill
# and N greedy decode steps. Needs a GPU; run it from a CUDA build:
#   make && tools/bench-cuda.sh
#   MODELS="llama-3.2-1b qwen3-0.6b" RUNS=5 tools/bench-cuda.sh
# Env: VARENT (./varent), PYTHON, MODELS, RUNS (5), N (256), PROMPT (512),
#      DEVICE (cuda), WEIGHTS (weights), NOGRAPH=1 also runs with the decode CUDA graph
#      off (VARENT_CUDA_GRAPHS=0) to show the launch overhead it saves.
# The checkpoints take 0.3 / 1.2 / 2.5 / 16 GB of disk and are kept for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
VARENT=${VARENT:-./varent}
MODELS=${MODELS:-smollm2-135m qwen3-0.6b llama-3.2-1b llama-3.1-8b}
RUNS=${RUNS:-5}
N=${N:-256}
PROMPT=${PROMPT:-512}
DEVICE=${DEVICE:-cuda}
WEIGHTS=${WEIGHTS:-weights}

[ -x "$VARENT" ] || { echo "bench-cuda: $VARENT not found (build with make first)" >&2; exit 1; }
echo "== $(date -u +%Y-%m-%dT%H:%MZ) varent bench --device $DEVICE, $PROMPT-token prefill, $N decode steps, median of $RUNS"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader

for m in $MODELS; do
    dir=$WEIGHTS/$m-bf16
    if [ ! -f "$dir/config.json" ]; then
        echo "-- writing $dir"
        $PYTHON tools/gen_random_checkpoint.py --preset "$m" --dtype bf16 --seed 1 "$dir" >/dev/null
    fi
    echo "== $m"
    "$VARENT" bench -m "$dir" --device "$DEVICE" -n "$N" --prompt-len "$PROMPT" --runs "$RUNS" --sampler none |
        sed "s/^/[$m] /"
    if [ "${NOGRAPH:-0}" = 1 ]; then
        VARENT_CUDA_GRAPHS=0 "$VARENT" bench -m "$dir" --device "$DEVICE" -n "$N" --prompt-len "$PROMPT" \
            --runs "$RUNS" --sampler none | grep -E '^(prefill|decode)' | sed "s/^/[$m, no graph] /"
    fi
done
