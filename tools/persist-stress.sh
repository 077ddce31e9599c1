#!/usr/bin/env bash
# tools/persist-stress.sh [MODEL_DIR]: the persistent decode kernel's stress test for a
# GPU window (docs/cuda.md "The persistent decode kernel"): what the emulated device
# cannot check, the memory ordering between blocks, on the real thing.
#   stress     the persistent kernel against the graph path over STEPS (4096) greedy
#              decode steps on MODEL_DIR (default: a random Llama-3.2-1B checkpoint,
#              written once under WORK): the logits bit for bit at every step, the same
#              tokens;
#   racecheck, synccheck
#              compute-sanitizer --tool racecheck and --tool synccheck on SAN_STEPS (16)
#              steps of the same comparison on SAN_MODEL (default: a random SmolLM2-135M
#              checkpoint).
# One command, PASS/FAIL lines, and a last line "PASS persist-stress" or "FAIL
# persist-stress: ..."; exit 0 or 1. PARTS picks the parts (default all three, in that
# order; tools/gpu-window.sh's stress stage runs one at a time), PART_LIMIT time-boxes
# each (seconds; 0: none). GRID sets the persistent kernel's blocks (0: as many as the
# device holds). BIN is the test program (default build/tests/test_cuda_persist, built
# with make when missing). Needs the nvcc build and, for the sanitizer parts,
# compute-sanitizer.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-4096}
SAN_STEPS=${SAN_STEPS:-16}
GRID=${GRID:-0}
WORK=${WORK:-build/persist-stress}
PYTHON=${PYTHON:-python3}
PARTS=${PARTS:-stress racecheck synccheck}
PART_LIMIT=${PART_LIMIT:-0}
bin=${BIN:-build/tests/test_cuda_persist}
failed=()

note() { echo "$@"; }
fail() { failed+=("$1"); note "FAIL $1${2:+: $2}"; }
# limited CMD...: CMD under PART_LIMIT (exit 124 when it ran out)
limited() {
    if [ "$PART_LIMIT" -gt 0 ]; then timeout -k 5 "$PART_LIMIT" "$@"; else "$@"; fi
}

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

for part in $PARTS; do
    case $part in stress | racecheck | synccheck) ;; *) echo "FAIL persist-stress: unknown part '$part' in PARTS (stress, racecheck, synccheck)"; exit 1 ;; esac
done
if [ ! -x "$bin" ]; then
    [ -z "${BIN:-}" ] || { echo "FAIL persist-stress: BIN=$bin is not an executable"; exit 1; }
    make -j"$(nproc)" all "$bin" >/dev/null || { echo "FAIL persist-stress: could not build $bin"; exit 1; }
fi

# stress: persistent against graph, STEPS steps
run_stress() {
    local model=${1:-} out rc
    if [ -z "$model" ]; then
        model=$(checkpoint llama-3.2-1b) || { fail "persist_stress" "could not write the Llama-3.2-1B checkpoint"; return; }
    fi
    out=$(limited "$bin" --stress "$STEPS" "$model" "$GRID" 2>&1)
    rc=$?
    note "$out" | grep -E '^(PASS|FAIL) ' || true
    if [ $rc -eq 124 ]; then
        fail "persist_stress ($STEPS steps)" "timed out after $PART_LIMIT s"
    elif [ $rc -ne 0 ]; then
        fail "persist_stress ($STEPS steps)" "exit $rc"
    fi
}

# racecheck, synccheck: compute-sanitizer's TOOL on a short run
run_sanitizer() {
    local tool=$1 san san_model=${SAN_MODEL:-} log rc summary
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    [ -x "$san" ] || { fail "sanitizer_$tool" "compute-sanitizer not found (PATH or /usr/local/cuda/bin)"; return; }
    if [ -z "$san_model" ]; then
        san_model=$(checkpoint smollm2-135m) || { fail "sanitizer_$tool" "could not write the SmolLM2-135M checkpoint"; return; }
    fi
    log="$WORK/$tool.log"
    mkdir -p "$WORK"
    limited "$san" --tool "$tool" --error-exitcode 3 "$bin" --stress "$SAN_STEPS" "$san_model" "$GRID" >"$log" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
    if [ $rc -eq 0 ] && grep -q '^PASS persist_stress' "$log"; then
        note "PASS sanitizer_$tool: $SAN_STEPS steps on $san_model (${summary:-no summary})"
    elif [ $rc -eq 124 ]; then
        fail "sanitizer_$tool" "timed out after $PART_LIMIT s (log: $log)"
    else
        fail "sanitizer_$tool" "exit $rc, ${summary:-see $log} (log: $log)"
    fi
}

for part in $PARTS; do
    case $part in
    stress) run_stress "${1:-}" ;;
    *) run_sanitizer "$part" ;;
    esac
done

if [ ${#failed[@]} -eq 0 ]; then
    echo "PASS persist-stress"
    exit 0
fi
echo "FAIL persist-stress: ${failed[*]}"
exit 1
