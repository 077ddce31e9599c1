#!/usr/bin/env bash
# make bench-cpu: decode speed on a random Llama (dim 512, 8 layers, 8 heads, hidden
# 1376, vocab 32000), fp32 and bf16 weights, 256 tokens, median of 3 runs.
# Peer: Karpathy's llama2.c run.c on the same weights, when LLAMA2C_DIR points at a
# directory holding its built `run` (gcc -Ofast -fopenmp -march=native run.c -lm) and
# its tokenizer.bin. llama2.c is never part of this repo.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
VARENT=${VARENT:-./varent}
out=weights/bench512
runs=${RUNS:-3}
for dt in f32 bf16; do
    [ -f "$out-$dt/model.safetensors" ] || $PYTHON tools/gen_random_checkpoint.py --preset bench512 --dtype $dt --seed 1 "$out-$dt" >/dev/null
done

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "== varent (decode 256 tokens after a 1-token prompt, median of $runs)"
for dt in f32 bf16; do
    $VARENT bench -m "$out-$dt" -n 256 --prompt-len 1 --runs "$runs" | sed "s/^/[$dt] /"
done

if [ -n "${LLAMA2C_DIR:-}" ] && [ -x "$LLAMA2C_DIR/run" ]; then
    [ -f "$out-f32/llama2c.bin" ] || $PYTHON tools/hf_to_llama2c.py "$out-f32" "$out-f32/llama2c.bin" >/dev/null
    echo "== llama2.c run.c (fp32, same weights, 256 steps, median of $runs)"
    for i in $(seq "$runs"); do
        "$LLAMA2C_DIR/run" "$out-f32/llama2c.bin" -z "$LLAMA2C_DIR/tokenizer.bin" -t 0 -n 256 2>&1 >/dev/null |
            sed -n 's/achieved tok\/s: //p'
    done | median | sed 's/^/llama2.c decode tok\/s: /'
else
    echo "(set LLAMA2C_DIR to a built llama2.c checkout to compare with run.c)"
fi
