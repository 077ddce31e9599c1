#!/usr/bin/env bash
# tools/persist-stress.sh [MODEL_DIR]: the persistent decode kernel's stress test for a
# GPU window (docs/cuda.md "The persistent decode kernel"): what the emulated device
# cannot check, the memory ordering between blocks, on the real thing.
#   1. the persistent kernel against the graph path over STEPS (4096) greedy decode
#      steps on MODEL_DIR (default: a random Llama-3.2-1B checkpoint, written once under
#      WORK): the logits bit for bit at every step, the same tokens;
#   2. compute-sanitizer --tool racecheck and --tool synccheck on SAN_STEPS (16) steps
#      of the same comparison on SAN_MODEL (default: a random SmolLM2-135M checkpoint).
# One command, PASS/FAIL lines, and a last line "PASS persist-stress" or "FAIL
# persist-stress: ..."; exit 0 or 1. GRID sets the persistent kernel's blocks (0: as
# many as the device holds). Needs the nvcc build (make) and, for 2, compute-sanitizer.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-4096}
SAN_STEPS=${SAN_STEPS:-16}
GRID=${GRID:-0}
WORK=${WORK:-build/persist-stress}
PYTHON=${PYTHON:-python3}
bin=build/tests/test_cuda_persist
failed=()

note() { echo "$@"; }
fail() { failed+=("$1"); note "FAIL $1${2:+: $2}"; }

# checkpoint PRESET: a random bf16 checkpoint of tools/gen_random_checkpoint.py's preset,
# written once; prints its directory.
checkpoint() {
    local dir="$WORK/$1-bf16"
    if [ ! -e "$dir/config.json" ]; then
        mkdir -p "$WORK"
        "$PYTHON" tools/gen_random_checkpoint.py --preset "$1" "$dir" --seed 7 --dtype bf16 >/dev/null || return 1
    fi
    echo "$dir"
}

if [ ! -x "$bin" ]; then
    make -j"$(nproc)" all "$bin" >/dev/null || { echo "FAIL persist-stress: could not build $bin"; exit 1; }
fi
model=${1:-}
if [ -z "$model" ]; then
    model=$(checkpoint llama-3.2-1b) || { echo "FAIL persist-stress: could not write the Llama-3.2-1B checkpoint"; exit 1; }
fi
san_model=${SAN_MODEL:-}
if [ -z "$san_model" ]; then
    san_model=$(checkpoint smollm2-135m) || { echo "FAIL persist-stress: could not write the SmolLM2-135M checkpoint"; exit 1; }
fi

# 1. persistent against graph, STEPS steps
out=$("$bin" --stress "$STEPS" "$model" "$GRID" 2>&1)
rc=$?
note "$out" | grep -E '^(PASS|FAIL) ' || true
[ $rc -eq 0 ] || fail "persist_stress ($STEPS steps)" "exit $rc"

# 2. compute-sanitizer on a short run
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$san" ]; then
    fail "sanitizer" "compute-sanitizer not found (PATH or /usr/local/cuda/bin)"
else
    for tool in racecheck synccheck; do
        log="$WORK/$tool.log"
        mkdir -p "$WORK"
        "$san" --tool "$tool" --error-exitcode 3 "$bin" --stress "$SAN_STEPS" "$san_model" "$GRID" >"$log" 2>&1
        rc=$?
        summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
        if [ $rc -eq 0 ] && grep -q '^PASS persist_stress' "$log"; then
            note "PASS sanitizer_$tool: $SAN_STEPS steps on $san_model (${summary:-no summary})"
        else
            fail "sanitizer_$tool" "exit $rc, ${summary:-see $log} (log: $log)"
        fi
    done
fi

if [ ${#failed[@]} -eq 0 ]; then
    echo "PASS persist-stress"
    exit 0
fi
echo "FAIL persist-stress: ${failed[*]}"
exit 1
