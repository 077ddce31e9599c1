#!/usr/bin/env bash
# valgrind memcheck of a short `varent run` on stories260K and of `varent tokenize`:
# 0 bytes definitely lost and no invalid reads or writes. valgrind cannot execute
# AVX-512, so this test builds its own CPU binary for x86-64-v3 (AVX2/FMA) in
# $TESTTMP/build-valgrind. SKIP when valgrind is missing.
set -u
cd "${ROOT:-$(dirname "$0")/../..}"
TMP=${TESTTMP:-tests/tmp}
PY=${PYTHON:-python3}
if ! command -v valgrind >/dev/null; then
    echo "SKIP valgrind: valgrind is not installed (tools/install-deps.sh installs it)"
    exit 0
fi
arch="-march=native"
if [ "$(uname -m)" = x86_64 ]; then
    arch="-march=x86-64-v2"
    grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && arch="-march=x86-64-v3"
fi
vb=$TMP/build-valgrind
build() {  # arch flags; a clean sub-make, without the sanitizer flags MAKEFLAGS carries under `make test-asan`
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -j2 CUDA=0 SAN= OPT=-O2 ARCH="$1" \
        BUILD="$vb-$2" BIN="$vb-$2/varent" "$vb-$2/varent" 2>&1
}
tag=${arch#-march=}
if ! out=$(build "$arch" "$tag"); then
    if [ "$tag" = x86-64-v3 ] && out2=$(build -march=x86-64-v2 x86-64-v2); then
        echo "SKIP valgrind_avx2_build: the $arch build failed, memchecking the portable (x86-64-v2) kernels: $(echo "$out" | grep -m1 error)"
        tag=x86-64-v2
    else
        echo "FAIL valgrind_build: $out ${out2:-}" | head -20
        exit 1
    fi
fi
vb=$vb-$tag
model=$("$PY" -c 'import sys; sys.path.insert(0, "tests/py"); import vtest; print(vtest.stories_dir("f32"))') || {
    echo "FAIL valgrind_model: could not prepare stories260K"; exit 1; }

memcheck() {  # name, varent args...
    local name=$1; shift
    local log=$TMP/valgrind-$name.log
    # OMP_WAIT_POLICY set: varent would otherwise re-exec itself (host/cli/main.c), outside valgrind.
    OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2 valgrind --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
        --error-exitcode=99 --log-file="$log" "$vb/varent" "$@" >"$TMP/valgrind-$name.out" 2>&1
    local rc=$?
    local lost errors
    lost=$(grep -o 'definitely lost: [0-9,]* bytes' "$log" | grep -o '[0-9,]*' | tr -d , | head -1)
    grep -q 'All heap blocks were freed' "$log" && lost=0
    errors=$(grep -o 'ERROR SUMMARY: [0-9]*' "$log" | grep -o '[0-9]*$')
    local invalid
    invalid=$(grep -c 'Invalid read\|Invalid write\|uninitialised' "$log")
    if [ "$rc" -eq 0 ] && [ "${lost:-x}" = 0 ] && [ "${errors:-x}" = 0 ] && [ -s "$TMP/valgrind-$name.out" ]; then
        echo "PASS valgrind_$name (definitely lost ${lost} bytes, ${errors} errors)"
    else
        echo "FAIL valgrind_$name: rc $rc, definitely lost ${lost:-?} bytes, ${errors:-?} errors, $invalid invalid accesses (log: $log)"
        grep -A6 'Invalid\|definitely lost in' "$log" | head -30
    fi
}
memcheck run run -m "$model" -n 24 --temp 0 -p "Once upon a time"
memcheck run_metrics run -m "$model" -n 12 --seed 1 --sampler entropix --metrics-out "$TMP/valgrind-metrics.jsonl"
memcheck tokenize tokenize -m "$model" "Once upon a time, there was a little girl named Lily. 日本"
rm -f "$TMP/valgrind-metrics.jsonl"
