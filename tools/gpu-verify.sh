#!/usr/bin/env bash
# tools/gpu-verify.sh STAGE: the checks of docs/cuda.md "Verifying on a GPU", in stages
# that each fit a 10-minute call, on a GPU machine that may have neither the build
# dependencies nor a network: it runs the binaries of .gpu/bundle.tar.xz (written by
# tools/gpu-bundle.sh on a machine that has them), or of .gpu/build when already
# unpacked. Each stage prints a summary and writes its whole log to $OUT/STAGE.log
# (OUT defaults to /tmp/gpu-verify).
#   check     the CUDA test programs (kernels, sampler, batched ops, forward, batched
#             forward), the HF transformers comparison on --device cuda, and greedy
#             stories260K text on CUDA against the CPU
#   suite     the whole test suite with this CUDA build (tests/run.sh)
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck / initcheck
#   bench     kernel benches, the sampler bench, tools/bench-cuda.sh (SmolLM2-135M and
#             Llama-3.2-1B shapes; MODELS= for others) with the HF eager baseline
# Env: OUT, PYTHON (python3: the GPU image's python has numpy, torch, transformers),
#      T_LIMIT (seconds per program, 300).
set -u
cd "$(dirname "$0")/.."
stage=${1:-check}
OUT=${OUT:-/tmp/gpu-verify}
PYTHON=${PYTHON:-python3}
T_LIMIT=${T_LIMIT:-300}
mkdir -p "$OUT"
log=$OUT/$stage.log
if [ ! -x .gpu/build/varent ]; then
    [ -f .gpu/bundle.tar.xz ] || { echo "gpu-verify: no .gpu/build and no .gpu/bundle.tar.xz (run tools/gpu-bundle.sh)" >&2; exit 1; }
    tar -xJf .gpu/bundle.tar.xz -C .gpu
fi
export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NCCL is not in the bundle (218 MB): the GPU image has it in PyTorch's nvidia-nccl package.
nccl_lib=$(${PYTHON:-python3} -c 'import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$nccl_lib
B=.gpu/build
export VARENT=$PWD/$B/varent PYTHON BUILD=$B
: >"$log"

# run NAME COMMAND...: output to the log, one summary line (PASS/FAIL/SKIP counts, rc).
run() {
    local name=$1; shift
    local start=$SECONDS tmp
    tmp=$(mktemp)
    timeout "$T_LIMIT" "$@" >"$tmp" 2>&1
    local rc=$?
    { echo "==== $name (rc $rc, $((SECONDS - start))s): $*"; cat "$tmp"; } >>"$log"
    printf '%-34s rc %3d  %4d PASS %3d FAIL %3d SKIP  %4ds\n' "$name" "$rc" "$(grep -c '^PASS ' "$tmp")" \
        "$(grep -c '^FAIL ' "$tmp")" "$(grep -c '^SKIP ' "$tmp")" $((SECONDS - start))
    grep -E '^(FAIL|SKIP) |^note: |ERROR SUMMARY|worst' "$tmp" | head -12 | sed 's/^/    /'
    rm -f "$tmp"
}

# Greedy stories260K text on CUDA equals the CPU's (the issue's end-to-end check). Run
# through `bash -c` (run's timeout execs a program), hence the export.
greedy_stories() {
    local d=$OUT/stories260K
    "$PYTHON" -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        tests/data/stories260K/stories260K.bin.xz /tmp/stories260K.bin || return 1
    "$VARENT" convert llama2c /tmp/stories260K.bin tests/data/stories260K/tok512.bin "$d" --dtype f32 >/dev/null || return 1
    local cpu gpu
    cpu=$("$VARENT" run -m "$d" -p "Once upon a time" -n 64 --temp 0 --device cpu 2>/dev/null)
    gpu=$("$VARENT" run -m "$d" -p "Once upon a time" -n 64 --temp 0 --device cuda 2>"$OUT/greedy.err")
    echo "cpu: $cpu"
    echo "gpu: $gpu"
    if [ -n "$cpu" ] && [ "$cpu" = "$gpu" ]; then echo "PASS greedy stories260K cuda == cpu"; else echo "FAIL greedy stories260K: texts differ ($(tail -1 "$OUT/greedy.err"))"; fi
}
export -f greedy_stories
export OUT

echo "== gpu-verify $stage, $(date -u +%Y-%m-%dT%H:%MZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
"$VARENT" --version 2>&1 | head -2
case $stage in
check)
    for t in cuda_kernels sample cuda_batch cuda_forward cuda_forward_batch; do run "test_$t" "$B/tests/test_$t"; done
    run hf_compare env VARENT_HF_PYTHON="$PYTHON" "$PYTHON" tests/py/test_hf_compare.py
    run greedy_stories bash -c greedy_stories
    ;;
suite)
    T_LIMIT=${SUITE_LIMIT:-540} run suite bash tests/run.sh
    tail -3 "$log"
    ;;
sanitize)
    cs=compute-sanitizer
    command -v $cs >/dev/null || cs=/usr/local/cuda/bin/compute-sanitizer
    for t in cuda_kernels cuda_batch sample cuda_forward cuda_forward_batch; do
        # API errors are the tests' own (test_cuda_forward asks for too much memory on purpose
        # and checks the message); kernel faults are still reported.
        run "memcheck $t" $cs --tool memcheck --report-api-errors no --error-exitcode 9 "$B/tests/test_$t"
    done
    for t in cuda_kernels cuda_batch sample; do run "racecheck $t" $cs --tool racecheck --error-exitcode 9 "$B/tests/test_$t"; done
    run "synccheck cuda_kernels" $cs --tool synccheck --error-exitcode 9 "$B/tests/test_cuda_kernels"
    run "initcheck cuda_forward" $cs --tool initcheck --error-exitcode 9 "$B/tests/test_cuda_forward"
    ;;
bench)
    run "cuda_kernels --bench" "$B/tests/test_cuda_kernels" --bench
    run "sample --bench" "$B/tests/test_sample" --bench
    grep -E 'GB/s|us|tok/s' "$log" | head -40
    T_LIMIT=${BENCH_LIMIT:-420} run bench-cuda env MODELS="${MODELS:-smollm2-135m llama-3.2-1b}" RUNS="${RUNS:-3}" \
        VARENT_HF_PYTHON="$PYTHON" WEIGHTS=/tmp/weights tools/bench-cuda.sh
    sed -n '/== /,$p' "$log" | tail -30
    ;;
*)
    echo "gpu-verify: unknown stage '$stage' (check, suite, sanitize or bench)" >&2
    exit 2
    ;;
esac
echo "== log: $log"
