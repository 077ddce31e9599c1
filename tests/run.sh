#!/usr/bin/env bash
# Runs every test program and totals their results.
# Protocol: each program prints "PASS name", "FAIL name: why" or "SKIP name: why" lines.
# A program that exits non-zero without printing a FAIL line counts as one failure.
# Programs: build/tests/test_* (C), tests/py/test_*.py, tests/sh/test_*.sh.
# The CUDA programs also run on the emulated device ($EMU_BUILD/tests, docs/cuda.md)
# under a forward and a seeded random schedule (EMU_SEED, default 1), the whole-model
# programs under the first only (EMU_FIRST_ONLY); none may skip.
# EMU_SCHEDULES overrides the list (make test-asan runs forward only: memory errors do
# not depend on the order, and the sanitizers make each run several times slower).
# EMU_WHOLE_MODEL_ONLY=1 (make test-asan) runs only the whole-model programs on the
# emulated device: the kernel harnesses' kernels and the emulator are built without
# sanitizers there, so ASan would watch only the harness, at CI's cost.
# Usage: tests/run.sh [--emu-only] [filter]   (only programs whose name contains filter)
set -u
cd "$(dirname "$0")/.."
export ROOT=$PWD
export BUILD=${BUILD:-build}
export PYTHON=${PYTHON:-python3}
export VARENT=${VARENT:-$ROOT/varent}
export TESTDATA=$ROOT/tests/data
export TESTTMP=$ROOT/tests/tmp
mkdir -p "$TESTTMP"
emu_only=0
if [ "${1:-}" = "--emu-only" ]; then emu_only=1; shift; fi
export EMU_BUILD=${EMU_BUILD:-$BUILD/emu}
filter=${1:-}
pass=0; fail=0; skip=0; failed=()

run_one() {  # name, command...
    local name=$1; shift
    local log="$TESTTMP/$name.log"
    local start=$SECONDS
    "$@" >"$log" 2>&1 </dev/null  # a test that wants stdin gives it; none waits on the terminal
    local rc=$?
    local p f s
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name: exited with status $rc" >>"$log"; fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    printf '%-28s %4d passed %3d failed %3d skipped  (%ds)\n' "$name" "$p" "$f" "$s" $((SECONDS - start))
    if [ "$f" -gt 0 ]; then
        failed+=("$name")
        grep -E '^FAIL ' "$log" | head -20 | sed 's/^/    /'
        tail -n 15 "$log" | grep -vE '^(PASS|FAIL|SKIP) ' | sed 's/^/    | /'
    fi
    grep -E '^SKIP ' "$log" | head -5 | sed 's/^/    /'
}

run_emu() {  # name, schedule, program: a skip on the emulated device is a failure
    local name=$1 sched=$2; shift 2
    VARENT_EMU_SCHEDULE=$sched "$@" | sed 's/^SKIP \(.*\)$/FAIL \1 (skipped on the emulated device)/'
    return "${PIPESTATUS[0]}"
}
# The whole-model programs run the kernels the kernel programs test under every schedule,
# so they take the first schedule only (the random one cost CI about 4 minutes).
EMU_FIRST_ONLY=" test_cuda_forward test_cuda_forward_batch test_cuda_sched test_cuda_lora test_cuda_hooks test_cuda_loop test_cuda_tune "
# The persistent kernel's grid-wide steps are tested only in test_cuda_persist: both
# schedules, and it counts as a whole-model program for EMU_WHOLE_MODEL_ONLY.
EMU_WHOLE_MODEL="$EMU_FIRST_ONLY test_cuda_persist "
for t in "$EMU_BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t"); [[ -z "$filter" || "$n" == *"$filter"* ]] || continue
    [[ "${EMU_WHOLE_MODEL_ONLY:-0}" = 1 && "$EMU_WHOLE_MODEL" != *" $n "* ]] && continue
    scheds=${EMU_SCHEDULES:-forward random:${EMU_SEED:-1}}
    [[ "$EMU_FIRST_ONLY" == *" $n "* ]] && scheds=${scheds%% *}
    for sched in $scheds; do
        run_one "emu-${sched%%:*}.$n" run_emu "$n" "$sched" "$t"
    done
done
[ "$emu_only" = 1 ] && { echo; echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]; exit; }

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t"); [[ -z "$filter" || "$n" == *"$filter"* ]] || continue
    run_one "$n" "$t"
done
for t in tests/py/test_*.py; do
    [ -f "$t" ] || continue
    n=$(basename "$t" .py); [[ -z "$filter" || "$n" == *"$filter"* ]] || continue
    run_one "$n" "$PYTHON" "$t"
done
for t in tests/sh/test_*.sh; do
    [ -f "$t" ] || continue
    n=$(basename "$t" .sh); [[ -z "$filter" || "$n" == *"$filter"* ]] || continue
    run_one "$n" bash "$t"
done

echo
[ ${#failed[@]} -gt 0 ] && echo "failed programs: ${failed[*]} (logs in tests/tmp/)"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
