#!/usr/bin/env bash
# tools/bench-cuda.sh: decode and prefill speed of the CUDA backend on random-weight
# checkpoints with the real shapes of SmolLM2-135M, Qwen3-0.6B, Llama-3.2-1B and
# Llama-3.1-8B (bf16, written by tools/gen_random_checkpoint.py, no hub download),
# through `varent bench --device cuda`: medians over RUNS runs of a PROMPT-token prefill
# and N greedy decode steps. Then, on the same checkpoint, Hugging Face transformers
# (eager attention, bf16, greedy generate; tools/bench-hf.py) with the same prompt length
# and steps, and the varent / HF ratio (the issue's goal: decode >= 15x HF eager on an
# H100). Needs a GPU; run it from a CUDA build:
#   make && tools/bench-cuda.sh
#   MODELS="llama-3.2-1b qwen3-0.6b" RUNS=5 tools/bench-cuda.sh
# Env: VARENT (./varent), PYTHON, MODELS, RUNS (5), N (256), PROMPT (512),
#      DEVICE (cuda), WEIGHTS (weights), NOGRAPH=1 also runs with the decode CUDA graph
#      off (VARENT_CUDA_GRAPHS=0) to show the launch overhead it saves;
#      HF=0 skips the transformers baseline, HF_RUNS (3) its timed runs, VARENT_HF_PYTHON
#      the python that has torch + transformers (default: python3, then PYTHON). Without
#      one, the baseline prints SKIP and the rest runs as before.
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
HF=${HF:-1}
HF_RUNS=${HF_RUNS:-3}

[ -x "$VARENT" ] || { echo "bench-cuda: $VARENT not found (build with make first)" >&2; exit 1; }
echo "== $(date -u +%Y-%m-%dT%H:%MZ) varent bench --device $DEVICE, $PROMPT-token prefill, $N decode steps, median of $RUNS"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader

# The python for the HF baseline: the first candidate that imports torch and transformers.
HF_PY=
if [ "$HF" != 0 ]; then
    for py in ${VARENT_HF_PYTHON:-python3 $PYTHON}; do
        if "$py" -c 'import torch, transformers' >/dev/null 2>&1; then HF_PY=$py; break; fi
    done
    if [ -n "$HF_PY" ]; then
        echo "== HF baseline: $("$HF_PY" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")') ($HF_PY), eager attention, bf16 on cuda (f32 on cpu), median of $HF_RUNS"
    else
        echo "SKIP HF transformers baseline: no python with torch and transformers (tried ${VARENT_HF_PYTHON:-python3 $PYTHON}; set VARENT_HF_PYTHON)"
    fi
fi

field() {  # field LINE_PREFIX N TEXT: the Nth word of the line starting with LINE_PREFIX
    awk -v p="$1" -v n="$2" '$1 == p { print $n; exit }' <<<"$3"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.1fx", a / b; else printf "-" }'; }

summary=() failed=0
for m in $MODELS; do
    dir=$WEIGHTS/$m-bf16
    if [ ! -f "$dir/config.json" ]; then
        echo "-- writing $dir"
        $PYTHON tools/gen_random_checkpoint.py --preset "$m" --dtype bf16 --seed 1 "$dir" >/dev/null
    fi
    echo "== $m"
    if ! out=$("$VARENT" bench -m "$dir" --device "$DEVICE" -n "$N" --prompt-len "$PROMPT" --runs "$RUNS" --sampler none); then
        echo "[$m] FAIL: varent bench exited non-zero"; failed=1; continue
    fi
    sed "s/^/[$m] /" <<<"$out"
    if [ "${NOGRAPH:-0}" = 1 ]; then
        VARENT_CUDA_GRAPHS=0 "$VARENT" bench -m "$dir" --device "$DEVICE" -n "$N" --prompt-len "$PROMPT" \
            --runs "$RUNS" --sampler none | grep -E '^(prefill|decode)' | sed "s/^/[$m, no graph] /"
    fi
    vd=$(field decode 4 "$out") vp=$(field prefill 4 "$out") hd=- hp=-
    if [ -n "$HF_PY" ]; then
        log=$(mktemp)
        if hout=$("$HF_PY" tools/bench-hf.py -m "$dir" --device "$DEVICE" -n "$N" --prompt-len "$PROMPT" \
                  --runs "$HF_RUNS" 2>"$log"); then
            sed "s/^/[$m, HF eager] /" <<<"$hout"
            hd=$(field decode 4 "$hout") hp=$(field prefill 4 "$hout")
        else
            echo "[$m, HF eager] FAIL: bench-hf.py exited non-zero:"; tail -n 5 "$log" | sed 's/^/    /'; failed=1
        fi
        rm -f "$log"
    fi
    summary+=("$(printf '%-14s %10s %10s %8s %11s %10s %8s' "$m" "$vd" "$hd" "$(ratio "$vd" "$hd")" "$vp" "$hp" \
                 "$(ratio "$vp" "$hp")")")
done

echo "== summary, tok/s (varent --device $DEVICE vs HF transformers eager; goal: decode >= 15x)"
printf '%-14s %10s %10s %8s %11s %10s %8s\n' model "decode" "HF decode" ratio prefill "HF prefill" ratio
for line in "${summary[@]}"; do echo "$line"; done
exit "$failed"
