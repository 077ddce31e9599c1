#!/usr/bin/env bash
# tools/gpu-window.sh [--emulated]: a whole GPU window in one command (docs/cuda.md, "A GPU
# window"). Every stage runs under its share of one global DEADLINE, so a hang costs its
# share and no more, and writes `stage NAME: done|timed out|skipped (why)` and its key
# figures to $OUT/summary.txt as it goes: a window cut off early still returns what it
# measured. The stages, in order:
#   facts     the machine: nvidia-smi (name, clocks at rest and under load, power cap,
#             ECC, driver), varent bench --probe (SMs, L2, the probe kernel's read
#             bandwidth, the device copy)
#   guard     the CUDA test programs, each time-boxed, and compute-sanitizer memcheck
#   stress    the persistent decode kernel against the graph path over STRESS_STEPS (4096)
#             greedy steps on STRESS_MODEL (llama-3.2-1b), the logits bit for bit, then
#             compute-sanitizer racecheck and synccheck on SAN_STEPS (16) steps of
#             SAN_MODEL (llama-hd64-tiny): tools/persist-stress.sh, a part at a time, each
#             time-boxed; emulated: 8 steps of a tiny preset on 8 blocks, no sanitizer
#   ab        the current build against the baseline build of the bundle, interleaved
#             (ABAB...), medians: varent bench decode tok/s per model; then the current
#             build alone at --ctx 4096 and with --sampler standard,entropix, on the graph
#             path and the persistent kernel (CTX_KERNELS)
#   trace     one decode step node by node (tools/trace/cupti_trace.c through
#             CUDA_INJECTION64_PATH, tools/trace_report.py): a greedy step and an armed
#             --sampler standard --temp 1 step -> $OUT/decode-trace.tsv; traced against
#             untraced tok/s; then the persistent kernel's phase trace (one step, every
#             phase of every block: tools/persist_trace.py); then a PROMPT-token prefill
#             kernel by kernel (trace_report.py --prefill)
#   ncu       Nsight Compute sections (speed of light, memory workload, occupancy, warp
#             state) for the kernels of one decode layer, when ncu exists
#   kbench    the kernel benches (test_cuda_kernels --bench: the fused decode kernels at
#             the graph's shapes over weights that rotate through 4x the L2;
#             test_cuda_prefill --bench: the prefill attention's two kernels; test_sample
#             --bench: the sampler at vocab 49K and 128K, near-flat logits); emulated:
#             the graph and prefill benches at a tiny shape, to run their code
#   llamacpp  llama.cpp's llama-bench (CUDA build carried in the bundle) pp512/tg128 on
#             the same shapes, beside varent bench
#   streams   issue 35's GPU row: STREAMS_MODEL (llama-3.2-1b) decoding STREAMS (32)
#             prompts together on the scheduler (varent run --prompts --parallel 32,
#             greedy, so every row is drawn on the device) against the same prompts one
#             by one (--parallel 1), interleaved: aggregate tok/s and the ratio (the
#             goal: 15x), with the scheduler's batch widths and device draws
#   big       Llama-3.1-8B shapes, if time is left, on each decode kernel (BIG_KERNELS): decode
#             tok/s and its share of the probed read bandwidth (the goal: 0.85)
# A GPU machine runs the bundle of tools/gpu-bundle.sh (.gpu/bundle.tar.xz: the current
# build, the baseline build, the tracer and libcupti, llama.cpp when it fit). --emulated
# runs the same stages against the emulated device (build/emu, tiny presets); the stages
# that need hardware say they were skipped. $OUT ends with at most four files (what the
# device tool brings back): summary.txt, decode-trace.tsv, ab.tsv and logs.tar.gz (every
# raw log, repacked after each stage).
# Env: OUT (/tmp/gpu-window), DEADLINE (480 s; 300 emulated), STAGES (all, in order),
#      MODELS (smollm2-135m qwen3-0.6b llama-3.2-1b, issue 34's goal table; the last one is
#      traced; emulated llama3-tiny), ROUNDS (3 A/B rounds), AB_RUNS (3 bench runs each: the
#      first prefill is cold, so a median of 1 is not a prefill figure; emulated 1),
#      N (256 decode steps), PROMPT (512), CUR_VARENT and CUR_TESTS (the current binary and
#      test programs; not VARENT, which make test sets to its own build), BASE_VARENT (the
#      baseline binary; default the bundle's), GUARD_TESTS (the guard's programs), WEIGHTS (/tmp/weights), PYTHON,
#      PLANT_HANG=STAGE (the stage sleeps first: the deadline's own test), AB_VARIANTS
#      ("LABEL ENV=V... --flag V...;...": the current build again with each, per model;
#      on hardware the persistent kernel and its switches (docs/cuda.md), and the graph
#      path's deep matvec, unless set), STREAMS_MODEL,
#      STREAMS, STREAMS_N, STREAMS_ONE, STREAMS_CTX (the streams stage), STRESS_MODEL,
#      STRESS_STEPS, STRESS_GRID (the persistent kernel's blocks; 0: all the device
#      holds, the default on hardware), SAN_MODEL, SAN_STEPS (the stress stage).
set -u
cd "$(dirname "$0")/.."
export ROOT=$PWD

emulated=0
if [ "${1:-}" = --emulated ]; then
    emulated=1
    shift
fi
if [ "${1:-}" = --stage ]; then  # internal: one stage, under the driver's timeout
    stage_only=$2
else
    stage_only=
    [ $# -eq 0 ] || { echo "usage: tools/gpu-window.sh [--emulated]" >&2; exit 2; }
fi

export OUT=${OUT:-/tmp/gpu-window}
export WORK=${WORK:-$OUT.work}
export PYTHON=${PYTHON:-python3}
export EMULATED=$emulated
if [ $emulated = 1 ]; then
    export DEADLINE=${DEADLINE:-300} ROUNDS=${ROUNDS:-2} N=${N:-4} PROMPT=${PROMPT:-4}
    # the persistent kernel's blocks are fibers there: the device's whole grid runs out of
    # memory for their stacks
    export VARENT_CUDA_PERSIST_GRID=${VARENT_CUDA_PERSIST_GRID:-4}
    export MODELS=${MODELS:-llama3-tiny} BIG_MODEL=${BIG_MODEL:-qwen3-tiny}
    export EMU_BUILD=${EMU_BUILD:-build/emu}
    export CUR_VARENT=${CUR_VARENT:-$ROOT/$EMU_BUILD/varent} CUR_TESTS=${CUR_TESTS:-$ROOT/$EMU_BUILD/tests}
    export TRACE_LIB=${TRACE_LIB:-$ROOT/$EMU_BUILD/tools/libvarent_trace.so}
    export BASE_VARENT=${BASE_VARENT:-}
    export GUARD_TESTS=${GUARD_TESTS:-test_cudaemu_checks}  # fast; make test runs every CUDA program there
    export WEIGHTS=${WEIGHTS:-$WORK/weights}
    # 9 rows: past the 8 exact row counts, so a padded row bucket (16) runs
    export STREAMS_MODEL=${STREAMS_MODEL:-stories260K} STREAMS=${STREAMS:-9} STREAMS_N=${STREAMS_N:-4} STREAMS_ONE=${STREAMS_ONE:-2}
    # a grid of 8 blocks: the device's whole (396 blocks of 128 fibers) nears the host's
    # limit on memory mappings (a fiber's stack is two)
    export STRESS_MODEL=${STRESS_MODEL:-llama3-tiny} STRESS_STEPS=${STRESS_STEPS:-8} STRESS_GRID=${STRESS_GRID:-8}
else
    export DEADLINE=${DEADLINE:-480} ROUNDS=${ROUNDS:-3} N=${N:-256} PROMPT=${PROMPT:-512}
    export MODELS=${MODELS:-smollm2-135m qwen3-0.6b llama-3.2-1b} BIG_MODEL=${BIG_MODEL:-llama-3.1-8b}
    export AB_RUNS=${AB_RUNS:-3}
    if [ -z "$stage_only" ] && [ ! -x .gpu/build/varent ]; then
        [ -f .gpu/bundle.tar.xz ] || { echo "gpu-window: no .gpu/build and no .gpu/bundle.tar.xz (run tools/gpu-bundle.sh)" >&2; exit 1; }
        tar -xJf .gpu/bundle.tar.xz -C .gpu || exit 1
    fi
    export LD_LIBRARY_PATH=$ROOT/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # NCCL is not in the bundle (218 MB): the GPU image has it in PyTorch's nvidia-nccl package.
    nccl_lib=$(${PYTHON:-python3} -c 'import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$nccl_lib" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$nccl_lib
    export CUR_VARENT=${CUR_VARENT:-$ROOT/.gpu/build/varent} CUR_TESTS=${CUR_TESTS:-$ROOT/.gpu/build/tests}
    export TRACE_LIB=${TRACE_LIB:-$ROOT/.gpu/lib/libvarent_trace.so}
    export BASE_VARENT=${BASE_VARENT:-$ROOT/.gpu/base/varent}
    # test_sample last: on a GPU it walks vocabularies up to 151936 x 16 draws and the second
    # window's guard share ran out inside it, before test_cuda_forward had run.
    # test_gpu_watchdog before test_cuda_persist: a deadlocked persistent kernel then traps
    # within seconds (its counter waits' timeout) rather than holding a stage to its limit
    # test_cuda_prefill: the tiled prefill attention bit for bit against the other kernel,
    # as nvcc compiled both (the emulated device's compiler is not nvcc)
    export GUARD_TESTS=${GUARD_TESTS:-test_cuda_kernels test_cuda_prefill test_cuda_batch test_cuda_forward test_gpu_watchdog test_cuda_persist test_sample}
    export WEIGHTS=${WEIGHTS:-/tmp/weights}
    # issue 34's persistent decode kernel against the graph path on every window, and each
    # of its switches against it: the inputs not staged (every warp waits and reads x
    # through L2), the ring filled for a warp's first unit only, the weight ring off, 4 blocks an SM (128 registers, with spills) instead
    # of 3, a 100 ns pause between counter polls (set AB_VARIANTS= to run none)
    pk_ab="persistent --decode-kernel persistent"
    pk_ab+=";persistent-nostage VARENT_CUDA_PERSIST_STAGE=0 --decode-kernel persistent"
    pk_ab+=";persistent-noahead VARENT_CUDA_PERSIST_AHEAD=0 --decode-kernel persistent"
    pk_ab+=";persistent-noring VARENT_CUDA_PERSIST_RING=0 --decode-kernel persistent"
    pk_ab+=";persistent-4blocks VARENT_CUDA_PERSIST_BLOCKS=4 --decode-kernel persistent"
    pk_ab+=";persistent-sleep VARENT_CUDA_PERSIST_SLEEP=100 --decode-kernel persistent"
    # the graph path's one-row matvecs of 2048+ inputs with 8 chunks a lane in flight (off
    # by default until this times it)
    pk_ab+=";deep-matvec VARENT_CUDA_MV_DEEP=1"
    pk_ab+=";persistent-deep VARENT_CUDA_MV_DEEP=1 --decode-kernel persistent"
    # the run-time choice between the two (its bench output says which it took; it should
    # match the faster of the graph path and `persistent` above)
    pk_ab+=";auto --decode-kernel auto"
    # the prefill attention of one block per (query, head), against the tiled one (the
    # variant's prefill tok/s against the current build's)
    pk_ab+=";prefill-simple VARENT_CUDA_PREFILL_TILED=0"
    export AB_VARIANTS=${AB_VARIANTS-$pk_ab}
    export STREAMS_MODEL=${STREAMS_MODEL:-llama-3.2-1b} STREAMS=${STREAMS:-32} STREAMS_N=${STREAMS_N:-128} STREAMS_ONE=${STREAMS_ONE:-4}
    export STRESS_MODEL=${STRESS_MODEL:-llama-3.2-1b} STRESS_STEPS=${STRESS_STEPS:-4096} STRESS_GRID=${STRESS_GRID:-0}
    # the sanitizers on a tiny preset with head_dim 64 (the tiled attention of the
    # goal table's models, in a model small enough to instrument within the share)
    export SAN_MODEL=${SAN_MODEL:-llama-hd64-tiny} SAN_STEPS=${SAN_STEPS:-16}
fi
export STREAMS_CTX=${STREAMS_CTX:-512}
export PLANT_HANG=${PLANT_HANG:-}
# Many streams on the scheduler (issue 35): one `run --prompts` of P prompts of STREAMS_N
# tokens each, --parallel ROWS; its `batch:` line (--stats) gives the tokens and seconds.
streams_run() {  # OUTFILE ROWS PROMPTS_FILE MODEL_DIR
    "$CUR_VARENT" run --device cuda -m "$4" --prompts "$3" --parallel "$2" -n "$STREAMS_N" --temp 0 \
        --ignore-eos --raw --ctx "$STREAMS_CTX" --stats >/dev/null 2>"$1"
    local rc=$?
    [ $rc -eq 0 ] || note "FAILED (rc $rc): run --prompts --parallel $2: $(tail -1 "$1")"
    return $rc
}
# "batch: 4 prompts, 64 tokens in 0.15 s | seed ...": tokens over seconds
streams_tps() { awk '$1 == "batch:" { for (i = 2; i < NF; i++) { if ($i == "tokens") t = $(i - 1); if ($i == "in") s = $(i + 1) } } END { if (s > 0) printf "%.1f", t / s; else print "-" }' "$1"; }
# Text prompts need a tokenizer, which the random checkpoints lack: the preset's weights
# beside tests/data's Llama 3 tokenizer (its vocabulary is llama-3.2-1b's); emulated,
# stories260K converted from tests/data (a vocabulary of 512, for a model that small).
streams_model_dir() {
    local d=$WEIGHTS/$STREAMS_MODEL-text src f
    if [ "$STREAMS_MODEL" = stories260K ]; then
        [ -f "$d/tokenizer.json" ] && { echo "$d"; return 0; }
        xz -dc tests/data/stories260K/stories260K.bin.xz >"$WORK/stories260K.bin" || return 1
        "$CUR_VARENT" convert llama2c "$WORK/stories260K.bin" tests/data/stories260K/tok512.bin "$d" --dtype bf16 \
            >>"$WORK/models.log" 2>&1 || return 1
        echo "$d"
        return 0
    fi
    src=$(model_dir "$STREAMS_MODEL") || return 1
    mkdir -p "$d"
    for f in "$src"/*; do ln -sf "$f" "$d/"; done
    [ -f "$d/tokenizer.json" ] || xz -dc tests/data/tokenizers/llama3/tokenizer.json.xz >"$d/tokenizer.json" || return 1
    cp tests/data/tokenizers/llama3/tokenizer_config.json "$d/" || return 1
    echo "$d"
}
stage_streams() {
    local m=$STREAMS_MODEL rows=$STREAMS d r i p1=$WORK/streams-one.txt pn=$WORK/streams-many.txt
    d=$(streams_model_dir) || { note "$m: could not write the checkpoint with a tokenizer (models.log)"; return 1; }
    : >"$pn"
    for i in $(seq 1 "$rows"); do echo "Stream $i: once upon a time, in a land of $i rivers," >>"$pn"; done
    head -n "$STREAMS_ONE" "$pn" >"$p1"  # one stream's rate needs only a few of them
    : >"$WORK/streams.tsv"  # this window's rounds only (WORK may hold an earlier window's)
    for r in $(seq 1 "$ROUNDS"); do  # ABAB...: drift hits both alike
        streams_run "$WORK/streams-1-$r.txt" 1 "$p1" "$d" || return 1
        streams_run "$WORK/streams-$rows-$r.txt" "$rows" "$pn" "$d" || return 1
        printf '%s\t%s\t%s\t%s\n' "$r" "$(streams_tps "$WORK/streams-1-$r.txt")" \
            "$(streams_tps "$WORK/streams-$rows-$r.txt")" "$(grep -h '^scheduler:' "$WORK/streams-$rows-$r.txt" | head -1)" \
            >>"$WORK/streams.tsv"
    done
    local one many
    one=$(cut -f2 "$WORK/streams.tsv" | median)
    many=$(cut -f3 "$WORK/streams.tsv" | median)
    note "$m: $STREAMS_N tokens a stream, greedy: 1 stream $one tok/s, $rows streams $many tok/s aggregate: $(ratio "$many" "$one")x (medians of $ROUNDS, interleaved; issue 35's goal 15x)"
    note "$(grep -h '^scheduler:' "$WORK/streams-$rows-1.txt" | head -1)"  # batch widths, rows drawn on the device
}

ALL_STAGES="facts guard stress ab trace ncu kbench llamacpp streams big"
STAGES=${STAGES:-$ALL_STAGES}

# Each stage's share of the deadline (per mille of it when every stage runs).
share_of() {  # per mille; SHARE_<stage>=N overrides one (a window that needs more A/B time)
    local v="SHARE_$1"
    [ -n "${!v:-}" ] && { echo "${!v}"; return; }
    case $1 in
    facts) echo 60 ;; guard) echo 160 ;; stress) echo 120 ;; ab) echo 250 ;; trace) echo 140 ;; ncu) echo 100 ;;
    kbench) echo 90 ;; llamacpp) echo 120 ;; streams) echo 80 ;; big) echo 50 ;; *) echo 0 ;;
    esac
}

# ---- helpers for the stages ---------------------------------------------------------------
# Which commit a binary was built from: the bundle's COMMIT file, else this tree's HEAD.
build_id() {
    local f
    f=$(dirname "$1")/COMMIT
    if [ -f "$f" ]; then
        cat "$f"
    elif git rev-parse --short HEAD >/dev/null 2>&1; then
        echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' +uncommitted changes') (this tree)"
    else
        echo "$1"
    fi
}
note() { echo "  $*" >>"$WORK/$STAGE.summary"; }   # a line under the stage's line in the summary
skip() { echo "skipped ($*)" >"$WORK/$STAGE.status"; exit 0; }
have() { command -v "$1" >/dev/null 2>&1; }
field() { awk -v p="$1" -v n="$2" '$1 == p { print $n; exit }' "$3"; }  # field PREFIX N FILE
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else printf "-" }'; }

# The random checkpoint of a preset (tools/gen_random_checkpoint.py), written once; its
# config.json is written last, so its presence means the directory is complete. The
# driver writes them in the background from the start (the GPU stages run meanwhile):
# wait for that writer while it runs, else write the checkpoint here.
gen_model() {
    "$PYTHON" tools/gen_random_checkpoint.py --preset "$1" --dtype bf16 --seed 1 "$WEIGHTS/$1-bf16" >>"$WORK/models.log" 2>&1
}
model_dir() {
    local d=$WEIGHTS/$1-bf16
    while [ ! -f "$d/config.json" ] && [ -f "$WORK/models.pid" ] && kill -0 "$(cat "$WORK/models.pid")" 2>/dev/null; do
        sleep 1
    done
    [ -f "$d/config.json" ] || gen_model "$1" || return 1
    echo "$d"
}
# The background writer: the models in the order the stages need them, the llama.cpp
# GGUFs when the bundle has llama-bench, then the big model.
prepare_models() {
    local m
    for m in $MODELS; do [ -f "$WEIGHTS/$m-bf16/config.json" ] || gen_model "$m"; done
    if [ -x "$ROOT/.gpu/llamacpp/llama-bench" ] && [ "$EMULATED" = 0 ]; then
        for m in $MODELS; do
            [ -f "$WEIGHTS/$m.gguf" ] || "$PYTHON" tools/random_gguf.py --preset "$m" --seed 1 "$WEIGHTS/$m.gguf" >>"$WORK/models.log" 2>&1
        done
    fi
    [ -f "$WEIGHTS/$BIG_MODEL-bf16/config.json" ] || gen_model "$BIG_MODEL"
}

# varent bench on the device; the output file gets its lines, the summary its error.
bench() {  # OUTFILE BINARY ARGS...
    local out=$1 bin=$2
    shift 2
    "$bin" bench --device cuda "$@" >"$out" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || note "FAILED (rc $rc): $(basename "$bin") bench $*: $(grep -v '^(varent' "$out" | tail -1)"
    return $rc
}

# ---- the stages -------------------------------------------------------------------------
stage_facts() {
    local missing
    missing=$(ldd "$CUR_VARENT" 2>&1 | awk '/not found/ { print $1 }' | tr '\n' ' ')
    [ -z "$missing" ] || note "varent's libraries not found: $missing(LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    if have nvidia-smi; then
        nvidia-smi >"$WORK/facts-nvidia-smi.txt" 2>&1
        nvidia-smi -q -d CLOCK,POWER,ECC,PERFORMANCE >>"$WORK/facts-nvidia-smi.txt" 2>&1
        local q=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,ecc.mode.current,temperature.gpu
        note "at rest: $(nvidia-smi --query-gpu=$q --format=csv,noheader 2>&1 | head -1)"
        nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 \
            >"$WORK/facts-under-load.csv" 2>&1 &
        local smi=$!
    else
        note "nvidia-smi: not found (clocks, power cap and ECC from the driver are not recorded)"
    fi
    local mb=1024
    [ "$EMULATED" = 1 ] && mb=16
    bench "$WORK/facts-probe.txt" "$CUR_VARENT" --probe --probe-mb "$mb"
    local rc=$?
    [ -n "${smi:-}" ] && kill "$smi" 2>/dev/null
    sed 's/^/  /' "$WORK/facts-probe.txt" >>"$WORK/$STAGE.summary"
    if [ -s "$WORK/facts-under-load.csv" ]; then
        note "under load (the probe): SM clock max $(awk -F', ' 'NR > 1 { print $2 + 0 }' "$WORK/facts-under-load.csv" | sort -g | tail -1) MHz, power draw max $(awk -F', ' 'NR > 1 { print $4 + 0 }' "$WORK/facts-under-load.csv" | sort -g | tail -1) W"
    fi
    return $rc
}

stage_guard() {
    local t rc=0
    for t in $GUARD_TESTS; do
        local start=$SECONDS log=$WORK/guard-$t.log
        [ -x "$CUR_TESTS/$t" ] || { note "$t: not in this build"; continue; }
        VARENT_EMU_SCHEDULE=forward timeout -k 5 "${T_LIMIT:-120}" "$CUR_TESTS/$t" >"$log" 2>&1
        local r=$?
        note "$(printf '%-22s rc %3d  %4d PASS %3d FAIL %3d SKIP  %4ds' "$t" "$r" "$(grep -c '^PASS ' "$log")" \
            "$(grep -c '^FAIL ' "$log")" "$(grep -c '^SKIP ' "$log")" $((SECONDS - start)))"
        grep -E '^FAIL ' "$log" | head -5 | sed 's/^/    /' >>"$WORK/$STAGE.summary"
        [ $r -eq 0 ] || rc=1
    done
    local cs=compute-sanitizer
    have $cs || cs=/usr/local/cuda/bin/compute-sanitizer
    if [ "$EMULATED" = 1 ]; then
        note "compute-sanitizer: skipped (the emulated device has its own checks)"
    elif [ -x "$(command -v $cs)" ]; then
        timeout -k 5 "${T_LIMIT:-120}" $cs --tool memcheck --report-api-errors no --error-exitcode 9 \
            "$CUR_TESTS/test_cuda_kernels" >"$WORK/guard-memcheck.log" 2>&1
        note "memcheck test_cuda_kernels: rc $? ($(grep -h 'ERROR SUMMARY' "$WORK/guard-memcheck.log" | tail -1))"
    else
        note "compute-sanitizer: not found"
    fi
    return $rc
}

# The persistent kernel against the graph path, then under compute-sanitizer
# (tools/persist-stress.sh): a part at a time, the stress test 60% of the share and each
# sanitizer 20%, so a slow sanitizer costs its part and the lines before it stay.
stage_stress() {
    local model san="" parts="stress" part lim t out rc=0
    model=$(model_dir "$STRESS_MODEL") || { note "could not write the $STRESS_MODEL checkpoint"; return 1; }
    if [ "$EMULATED" = 1 ]; then
        note "compute-sanitizer: skipped (the emulated device has its own checks)"
    else
        san=$(model_dir "$SAN_MODEL") || { note "could not write the $SAN_MODEL checkpoint"; return 1; }
        parts="stress racecheck synccheck"
    fi
    for part in $parts; do
        lim=$((SHARE / 5))
        [ "$part" = stress ] && lim=$((SHARE * 3 / 5))
        t=$SECONDS
        out=$(PARTS=$part PART_LIMIT=$lim BIN=$CUR_TESTS/test_cuda_persist STEPS=$STRESS_STEPS GRID=$STRESS_GRID SAN_STEPS=${SAN_STEPS:-16} \
            SAN_MODEL=$san WORK=$WORK/stress PYTHON=$PYTHON tools/persist-stress.sh "$model" 2>&1)
        [ $? -eq 0 ] || rc=1
        echo "$out" >"$WORK/stress-$part.log"
        while read -r line; do note "$line ($((SECONDS - t)) s of $lim)"; done < <(grep -E '^(PASS|FAIL) ' <<<"$out" | grep -v ' persist-stress')
        grep -q -E '^(PASS|FAIL) ' <<<"$out" || note "$part: no result line ($(tail -1 <<<"$out"))"
    done
    return $rc
}

# decode tok/s of one bench output
decode_tps() { field decode 4 "$1"; }

# A bench before the persist merge (ffa2994: the 2026-11-28 windows' baseline) stops its
# prefill clock without waiting for the device: its figure leaves out the device's run
# of the last chunk, which its first decode step then waits for. Against such a baseline
# the current build's waited prefill is no A/B: it is timed again the baseline's way
# (VARENT_BENCH_PREFILL_WAIT=0), and that ratio is the prefill's A/B; that run's decode
# carries the same tail as the baseline's, so its decode ratio is like for like too.
ab_prefill_alike() {  # MODEL DIR BASELINE_PREFILL BASELINE_DECODE
    local m=$1 d=$2 b0=$3 bd=$4 o=$WORK/ab-$1-current-unwaited.txt
    grep -q "^prefill .*to the device's finish" "$WORK/ab-$m-current-1.txt" || return 0
    ! grep -q "^prefill .*to the device's finish" "$WORK/ab-$m-base-1.txt" || return 0
    (
        export VARENT_BENCH_PREFILL_WAIT=0
        bench "$o" "$CUR_VARENT" -m "$d" -n "$N" --prompt-len "$PROMPT" --runs "${AB_RUNS:-1}" --sampler none
    )
    note "$m: the baseline's prefill is not waited for (the device's last chunk left out), the current's is: not an A/B; the current timed the baseline's way (VARENT_BENCH_PREFILL_WAIT=0): prefill $(field prefill 4 "$o") tok/s, baseline $b0 tok/s: $(ratio "$(field prefill 4 "$o")" "$b0")x; decode (the prefill's last chunk on its clock, as the baseline's) $(decode_tps "$o") tok/s, baseline $bd tok/s: $(ratio "$(decode_tps "$o")" "$bd")x"
}

stage_ab() {
    [ -n "$BASE_VARENT" ] && [ -x "$BASE_VARENT" ] || skip "no baseline build: set BASE_VARENT or bundle one with tools/gpu-bundle.sh"
    local cur_id base_id
    cur_id=$(build_id "$CUR_VARENT")
    base_id=$(build_id "$BASE_VARENT")
    note "current: $cur_id; baseline: $base_id"
    local m d r b
    [ -s "$OUT/ab.tsv" ] || printf 'model\tbuild\tround\tdecode_tok_s\tprefill_tok_s\n' >"$OUT/ab.tsv"
    for m in $MODELS; do
        d=$(model_dir "$m") || { note "$m: could not write the checkpoint (models.log)"; continue; }
        for r in $(seq 1 "$ROUNDS"); do
            for b in current base; do  # ABAB...: drift hits both alike
                local bin=$CUR_VARENT
                [ $b = base ] && bin=$BASE_VARENT
                local o=$WORK/ab-$m-$b-$r.txt
                bench "$o" "$bin" -m "$d" -n "$N" --prompt-len "$PROMPT" --runs "${AB_RUNS:-1}" --sampler none
                printf '%s\t%s\t%s\t%s\t%s\n' "$m" "$b" "$r" "$(decode_tps "$o")" "$(field prefill 4 "$o")" >>"$OUT/ab.tsv"
            done
        done
        local c0 b0
        c0=$(awk -v m="$m" '$1 == m && $2 == "current" { print $4 }' "$OUT/ab.tsv" | median)
        b0=$(awk -v m="$m" '$1 == m && $2 == "base" { print $4 }' "$OUT/ab.tsv" | median)
        note "$m: decode current $c0 tok/s, baseline $b0 tok/s: $(ratio "$c0" "$b0")x (medians of $ROUNDS, interleaved)"
        local bd=$b0
        c0=$(awk -v m="$m" '$1 == m && $2 == "current" { print $5 }' "$OUT/ab.tsv" | median)
        b0=$(awk -v m="$m" '$1 == m && $2 == "base" { print $5 }' "$OUT/ab.tsv" | median)
        note "$m: prefill current $c0 tok/s, baseline $b0 tok/s: $(ratio "$c0" "$b0")x (each a median of ${AB_RUNS:-1} runs)"
        ab_prefill_alike "$m" "$d" "$b0" "$bd"
        note "$m: current $(grep -h '^decode step' "$WORK/ab-$m-current-1.txt")"
    done
    # Variants of the current build (AB_VARIANTS: "LABEL ENV=V... --flag V...;..."), each
    # against the current build's median: a switch the change put behind a flag or env var.
    local v label words e a p0
    if [ -n "${AB_VARIANTS:-}" ]; then
        for m in $MODELS; do
            d=$(model_dir "$m") || continue
            c0=$(awk -v m="$m" '$1 == m && $2 == "current" { print $4 }' "$OUT/ab.tsv" | median)
            p0=$(awk -v m="$m" '$1 == m && $2 == "current" { print $5 }' "$OUT/ab.tsv" | median)
            while IFS= read -r v; do
                read -r label words <<<"$v"
                [ -n "$label" ] || continue
                e=()
                a=()
                for w in $words; do
                    case $w in *=*) [ ${#a[@]} -eq 0 ] && { e+=("$w"); continue; } ;; esac
                    a+=("$w")
                done
                (
                    [ ${#e[@]} -eq 0 ] || export "${e[@]}"
                    bench "$WORK/ab-$m-variant-$label.txt" "$CUR_VARENT" -m "$d" -n "$N" --prompt-len "$PROMPT" \
                        --runs "${AB_RUNS:-1}" --sampler none "${a[@]}"
                )
                note "$m: variant $label ($words): decode $(decode_tps "$WORK/ab-$m-variant-$label.txt") tok/s (current $c0), prefill $(field prefill 4 "$WORK/ab-$m-variant-$label.txt") tok/s (current $p0); $(grep -h '^decode step' "$WORK/ab-$m-variant-$label.txt" | cut -c13-80)"
            done <<<"$(echo "$AB_VARIANTS" | tr ';' '\n')"
        done
    fi
    # The current build alone: the CLI's default context, and the samplers' decode loops,
    # on each decode kernel (CTX_KERNELS; the goal table's rows are at 512 and 4096 keys,
    # greedy and stochastic, for the persistent kernel too).
    for m in $MODELS; do
        d=$(model_dir "$m") || continue
        local ctx=4096
        [ "$EMULATED" = 1 ] && ctx=64
        for k in ${CTX_KERNELS-graph persistent}; do
            local sfx=""
            [ "$k" = graph ] || sfx="-$k"
            bench "$WORK/ab-$m-ctx$ctx$sfx.txt" "$CUR_VARENT" -m "$d" -n "$N" --prompt-len 16 --ctx $ctx --runs 1 \
                --sampler none --decode-kernel "$k"
            note "$m at --ctx $ctx (16-token prompt), $k: decode $(decode_tps "$WORK/ab-$m-ctx$ctx$sfx.txt") tok/s"
            bench "$WORK/ab-$m-samplers$sfx.txt" "$CUR_VARENT" -m "$d" -n "$N" --prompt-len "$PROMPT" --runs 1 \
                --sampler standard,entropix --temp 1 --decode-kernel "$k"
            grep -h '^sampler' "$WORK/ab-$m-samplers$sfx.txt" | cut -c1-160 | sed "s/^/  $m ($k): /" \
                >>"$WORK/$STAGE.summary"
        done
    done
}

# One traced bench run and the report of its last graph (the step kind).
trace_one() {  # KIND MODEL_DIR BENCH_ARGS...
    local kind=$1 d=$2
    shift 2
    CUDA_INJECTION64_PATH=$TRACE_LIB VARENT_TRACE_OUT=$WORK/trace-$kind.raw \
        bench "$WORK/trace-$kind-bench.txt" "$CUR_VARENT" -m "$d" --runs 1 "$@" || return 1
    bench "$WORK/trace-$kind-untraced.txt" "$CUR_VARENT" -m "$d" --runs 1 "$@" || return 1
    "$PYTHON" tools/trace_report.py "$WORK/trace-$kind.raw" --kind "$kind" --tsv "$OUT/decode-trace.tsv" --append \
        >"$WORK/trace-$kind.txt" 2>&1 || return 1
    sed 's/^/  /' "$WORK/trace-$kind.txt" >>"$WORK/$STAGE.summary"
    local nodes
    if [ "$kind" = greedy ]; then
        nodes=$(grep -h '^decode step' "$WORK/trace-$kind-bench.txt" | awk '{ for (i = 1; i < NF; i++) if ($(i + 1) == "graph") print $i }')
        note "$kind: varent bench's graph nodes: $nodes; decode traced $(decode_tps "$WORK/trace-$kind-bench.txt") tok/s, untraced $(decode_tps "$WORK/trace-$kind-untraced.txt") tok/s"
    else
        nodes=$(grep -h '^sampler *standard' "$WORK/trace-$kind-bench.txt" | sed -n 's/.* \([0-9]*\) graph nodes.*/\1/p')
        note "$kind: varent bench's graph nodes: $nodes; sampler ms/token traced $(awk '$1 == "sampler" && $2 == "standard" { print $3 }' "$WORK/trace-$kind-bench.txt"), untraced $(awk '$1 == "sampler" && $2 == "standard" { print $3 }' "$WORK/trace-$kind-untraced.txt")"
    fi
}

stage_trace() {
    [ -f "$TRACE_LIB" ] || skip "no tracer library at $TRACE_LIB"
    local m
    m=$(echo "$MODELS" | awk '{ print $NF }')
    local d
    d=$(model_dir "$m") || return 1
    local n=64 p=16
    [ "$EMULATED" = 1 ] && n=5 p=4
    rm -f "$OUT/decode-trace.tsv"
    note "model $m, $n decode steps after a $p-token prompt"
    trace_one greedy "$d" -n $n --prompt-len $p --sampler none || return 1
    trace_one armed-temp1 "$d" -n $n --prompt-len $p --sampler standard --temp 1 || return 1
    persist_trace "$d" "$n" "$p"
    trace_prefill "$d"
}

# The prefill of a PROMPT-token prompt kernel by kernel (the second of two runs: the first
# is cold), so a window says where a prefill goes as it says where a decode step goes.
trace_prefill() {  # MODEL_DIR
    CUDA_INJECTION64_PATH=$TRACE_LIB VARENT_TRACE_OUT=$WORK/trace-prefill.raw \
        bench "$WORK/trace-prefill-bench.txt" "$CUR_VARENT" -m "$1" --runs 2 -n 2 --prompt-len "$PROMPT" \
        --sampler none || return 1
    "$PYTHON" tools/trace_report.py "$WORK/trace-prefill.raw" --prefill >"$WORK/trace-prefill.txt" 2>&1 ||
        { note "prefill trace: $(cat "$WORK/trace-prefill.txt")"; return 1; }
    note "prefill trace of $PROMPT tokens; varent bench (traced): $(grep -h '^prefill' "$WORK/trace-prefill-bench.txt" | cut -c13-)"
    sed 's/^/  /' "$WORK/trace-prefill.txt" >>"$WORK/$STAGE.summary"
}

# The persistent kernel is one node of the trace above: its own phase trace
# (VARENT_CUDA_PERSIST_TRACE, the last step's stamps of every phase of every block) says
# where its step goes, phase by phase (tools/persist_trace.py).
persist_trace() {  # MODEL_DIR STEPS PROMPT
    local t=$WORK/persist-trace.tsv o=$WORK/persist-trace-bench.txt
    local grid=0
    [ "$EMULATED" = 1 ] && grid=4  # (the emulated device's fibers: few blocks)
    VARENT_CUDA_PERSIST_GRID=$grid VARENT_CUDA_PERSIST_TRACE=$t bench "$o" "$CUR_VARENT" -m "$1" -n "$2" \
        --prompt-len "$3" --sampler none --decode-kernel persistent || return 1
    "$PYTHON" tools/persist_trace.py "$t" >"$WORK/persist-trace.txt" 2>&1 || { note "persist trace: $(cat "$WORK/persist-trace.txt")"; return 1; }
    sed 's/^/  /' "$WORK/persist-trace.txt" >>"$WORK/$STAGE.summary"
}

stage_ncu() {
    [ "$EMULATED" = 1 ] && skip "needs hardware counters: not on the emulated device"
    local ncu=ncu
    have ncu || ncu=/usr/local/cuda/bin/ncu
    [ -x "$(command -v $ncu)" ] || skip "ncu not found"
    local m d
    m=$(echo "$MODELS" | awk '{ print $NF }')
    d=$(model_dir "$m") || return 1
    # 12 kernels from the middle of the third decode step: two whole layers at least.
    local skip_n=0
    if [ -f "$WORK/trace-greedy.raw" ]; then
        skip_n=$("$PYTHON" - "$WORK/trace-greedy.raw" <<'EOF'
import sys
k = [l.split("\t") for l in open(sys.argv[1]) if l.startswith("K\t")]
k.sort(key=lambda f: int(f[1]))
graph = [f for f in k if f[4] != "0"]
steps = sorted({int(f[3]) for f in graph})
if len(steps) < 3:
    print(0)
else:
    first = min(i for i, f in enumerate(k) if int(f[3]) == steps[2])
    per = sum(1 for f in graph if int(f[3]) == steps[2])
    print(first + per // 2)
EOF
)
    fi
    timeout -k 5 $(( ${SHARE:-60} - 5 )) $ncu --clock-control none --launch-skip "$skip_n" --launch-count 12 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        "$CUR_VARENT" bench -m "$d" --device cuda -n 16 --prompt-len 16 --runs 1 --sampler none >"$WORK/ncu.txt" 2>&1
    note "ncu: $(grep -c '^  [a-z_].*(.*)x(.*)' "$WORK/ncu.txt") kernels profiled (launch-skip $skip_n); sections in ncu.txt"
    grep -E '^  [a-zA-Z_].*\(|Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy' "$WORK/ncu.txt" | head -60 \
        | sed 's/^/  /' >>"$WORK/$STAGE.summary"
}

stage_kbench() {
    if [ "$EMULATED" = 1 ]; then  # the bench code at a tiny shape: it runs; its timings mean nothing
        "$CUR_TESTS/test_cuda_kernels" --bench-quick >"$WORK/kbench-kernels.txt" 2>&1 || return 1
        "$CUR_TESTS/test_cuda_prefill" --bench-quick >"$WORK/kbench-prefill.txt" 2>&1 || return 1
        note "emulated: the graph and prefill benches ran at a tiny shape (their times are the CPU's, not a GPU's)"
        grep -c '^BENCH decode graph' "$WORK/kbench-kernels.txt" | sed 's/^/  graph bench lines: /' >>"$WORK/$STAGE.summary"
        grep -h '^BENCH' "$WORK/kbench-prefill.txt" | sed 's/^BENCH /  /' >>"$WORK/$STAGE.summary"
        return 0
    fi
    timeout -k 5 $(( ${SHARE:-60} * 5 / 9 )) "$CUR_TESTS/test_cuda_kernels" --bench >"$WORK/kbench-kernels.txt" 2>&1
    # the prefill attention's two kernels at the goal tables' prefill shapes (seconds)
    timeout -k 5 $(( ${SHARE:-60} / 9 )) "$CUR_TESTS/test_cuda_prefill" --bench >"$WORK/kbench-prefill.txt" 2>&1
    timeout -k 5 $(( ${SHARE:-60} / 3 )) "$CUR_TESTS/test_sample" --bench >"$WORK/kbench-sample.txt" 2>&1
    grep -h '^BENCH' "$WORK/kbench-kernels.txt" "$WORK/kbench-prefill.txt" "$WORK/kbench-sample.txt" |
        sed 's/^BENCH /  /' >>"$WORK/$STAGE.summary"
}

# llama-bench from the bundle's llama.cpp sources (tools/gpu-bundle.sh), into .gpu/llamacpp.
build_llamacpp() {
    local src=.gpu/llamacpp-src/tree b=.gpu/llamacpp-src/build jobs=$(( $(nproc) > 4 ? $(nproc) - 2 : 1 ))
    local t0=$SECONDS
    rm -rf "$src" && mkdir -p "$src" && tar -xJf .gpu/llamacpp-src/llamacpp-src.tar.xz -C "$src" || return 1
    command -v cmake >/dev/null || { echo "no cmake on this machine"; return 1; }
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$src" -B "$b" "${gen[@]}" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release || return 1
    cmake --build "$b" --target llama-bench -j"$jobs" || return 1
    mkdir -p .gpu/llamacpp
    cp "$b/bin/llama-bench" .gpu/llamacpp/ || return 1
    echo "$(cat .gpu/llamacpp-src/VERSION); built in $((SECONDS - t0)) s" >.gpu/llamacpp/VERSION
    echo "llama-bench built in $((SECONDS - t0)) s"
}

stage_llamacpp() {
    [ "$EMULATED" = 1 ] && skip "llama.cpp runs on hardware only"
    local lb=$ROOT/.gpu/llamacpp/llama-bench
    local bp=$WORK/llamacpp-build.pid
    if [ ! -x "$lb" ] && [ -f "$bp" ]; then  # built here, beside the earlier stages: wait for it within this share
        local w0=$SECONDS
        note "waiting for the llama.cpp build started with the window (its progress: llamacpp-build.log)"
        while [ ! -x "$lb" ] && kill -0 "$(cat "$bp")" 2>/dev/null; do sleep 2; done
        [ -x "$lb" ] || skip "the llama.cpp build failed (llamacpp-build.log: $(grep -m1 -iE 'error|no cmake' "$WORK/llamacpp-build.log" | cut -c1-160))"
        note "llama.cpp: $(cat "$ROOT/.gpu/llamacpp/VERSION"); this stage waited $((SECONDS - w0)) s for it"
    fi
    [ -x "$lb" ] || skip "no llama.cpp build in the bundle ($(cat "$ROOT/.gpu/llamacpp.why" 2>/dev/null || echo 'tools/gpu-bundle.sh LLAMACPP=1'))"
    local m d g
    for m in $MODELS; do
        d=$(model_dir "$m") || continue
        g=$WEIGHTS/$m.gguf
        while [ ! -f "$g" ] && [ -f "$WORK/models.pid" ] && kill -0 "$(cat "$WORK/models.pid")" 2>/dev/null; do sleep 1; done
        [ -f "$g" ] || "$PYTHON" tools/random_gguf.py --preset "$m" --seed 1 "$g" >>"$WORK/models.log" 2>&1 || continue
        LD_LIBRARY_PATH=$ROOT/.gpu/llamacpp:$LD_LIBRARY_PATH "$lb" -m "$g" -ngl 99 -p 512 -n 128 -r 3 -o md \
            >"$WORK/llamacpp-$m.md" 2>"$WORK/llamacpp-$m.err"
        bench "$WORK/llamacpp-varent-$m.txt" "$CUR_VARENT" -m "$d" -n 128 --prompt-len 512 --runs 3 --sampler none
        note "$m: llama.cpp $(grep -E 'tg128' "$WORK/llamacpp-$m.md" | awk -F'|' '{ print $(NF-1) }' | tr -s ' ') tok/s tg128, $(grep -E 'pp512' "$WORK/llamacpp-$m.md" | awk -F'|' '{ print $(NF-1) }' | tr -s ' ') tok/s pp512; varent decode $(decode_tps "$WORK/llamacpp-varent-$m.txt") tok/s, prefill $(field prefill 4 "$WORK/llamacpp-varent-$m.txt") tok/s"
    done
}

# The probe kernel's read bandwidth in GB/s from the facts stage ("-" when it did not run).
probe_read_gbs() {
    local v
    v=$(sed -n 's/^read .*: \([0-9.e+]*\) GB\/s.*/\1/p' "$WORK/facts-probe.txt" 2>/dev/null | head -1)
    echo "${v:--}"
}

# Issue 34's Llama-3.1-8B row (>= 85% of the probed read bandwidth) on each decode kernel
# (BIG_KERNELS), the graph path first: the default's figure comes back if the time runs out.
stage_big() {
    local d k rc=0 probe
    d=$(model_dir "$BIG_MODEL") || return 1
    probe=$(probe_read_gbs)
    for k in ${BIG_KERNELS-graph persistent}; do
        local o=$WORK/big-$k.txt
        bench "$o" "$CUR_VARENT" -m "$d" -n "$N" --prompt-len "$PROMPT" --runs 1 --sampler none --decode-kernel "$k" ||
            rc=1
        # (decode covers bench's step line and the persistent kernel's steps and fallbacks)
        grep -hE '^(prefill|decode|bandwidth)' "$o" | sed "s/^/  $BIG_MODEL ($k): /" >>"$WORK/$STAGE.summary"
        local gbs
        gbs=$(sed -n 's/^bandwidth *\([0-9.]*\) GB\/s achieved.*/\1/p' "$o" | head -1)
        note "$BIG_MODEL ($k): $(ratio "$gbs" "$probe") of the probe kernel's read bandwidth ($gbs of $probe GB/s; the goal: 0.85)"
    done
    return $rc
}

# ---- one stage (the driver runs each as its own process under timeout) -------------------
if [ -n "$stage_only" ]; then
    export STAGE=$stage_only
    [ "$PLANT_HANG" = "$STAGE" ] && sleep 100000
    "stage_$STAGE" >>"$WORK/$STAGE.log" 2>&1
    rc=$?
    [ -s "$WORK/$STAGE.status" ] || { [ $rc -eq 0 ] && echo "done" || echo "done (rc $rc: see $STAGE.log)"; } >"$WORK/$STAGE.status"
    exit 0
fi

# ---- the driver ----------------------------------------------------------------------------
mkdir -p "$OUT" "$WORK"
rm -f "$OUT/summary.txt" "$OUT/decode-trace.tsv" "$OUT/ab.tsv" "$OUT/logs.tar.gz" "$WORK"/*.status "$WORK"/*.summary
start=$SECONDS
mode=hardware
[ $emulated = 1 ] && mode="emulated device"
{
    echo "gpu-window $(date -u +%Y-%m-%dT%H:%MZ) ($mode), deadline ${DEADLINE} s"
    echo "varent: $("$CUR_VARENT" --version 2>&1 | head -1), $(build_id "$CUR_VARENT")"
} >"$OUT/summary.txt"
mkdir -p "$WEIGHTS"
setsid nice -n 10 bash -c "$(declare -f gen_model prepare_models); prepare_models" >>"$WORK/models.log" 2>&1 &
echo $! >"$WORK/models.pid"
# llama.cpp's sources in the bundle and no llama-bench: the machine builds it (16 cores,
# nvcc, cmake) while the first stages run, at a low priority, leaving two cores free.
if [ $emulated = 0 ] && [ ! -x .gpu/llamacpp/llama-bench ] && [ -f .gpu/llamacpp-src/llamacpp-src.tar.xz ] &&
    case " $STAGES " in *" llamacpp "*) true ;; *) false ;; esac; then
    setsid nice -n 15 bash -c "$(declare -f build_llamacpp); build_llamacpp" >"$WORK/llamacpp-build.log" 2>&1 &
    echo $! >"$WORK/llamacpp-build.pid"
    echo "  llama.cpp: built here from the bundle's sources, beside the stages (nice 15, $(( $(nproc) > 4 ? $(nproc) - 2 : 1 )) jobs)" \
        >>"$OUT/summary.txt"
fi
pack() { tar -czf "$OUT/logs.tar.gz.tmp" -C "$WORK" --exclude weights . 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"; }

for s in $ALL_STAGES; do
    case " $STAGES " in *" $s "*) ;; *) continue ;; esac
    # The time left, shared among this stage and the ones after it in proportion to their
    # shares: what a stage leaves unused goes to the later ones, and a hang costs its share.
    left=$((DEADLINE - (SECONDS - start)))
    rest=0
    after=0
    for t in $ALL_STAGES; do
        [ "$t" = "$s" ] && after=1
        case " $STAGES " in *" $t "*) [ $after = 1 ] && rest=$((rest + $(share_of "$t"))) ;; esac
    done
    share=$((left * $(share_of "$s") / rest))
    if [ "$share" -lt 3 ]; then
        echo "stage $s: skipped (the deadline of $DEADLINE s was reached)" >>"$OUT/summary.txt"
        continue
    fi
    t0=$SECONDS
    SHARE=$share timeout -k 5 "$share" "$0" $([ $emulated = 1 ] && echo --emulated) --stage "$s"
    rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "stage $s: timed out (after $((SECONDS - t0)) s, its share of the deadline)" >>"$OUT/summary.txt"
    else
        echo "stage $s: $(cat "$WORK/$s.status" 2>/dev/null || echo "done (rc $rc)") ($((SECONDS - t0)) s)" >>"$OUT/summary.txt"
    fi
    [ -f "$WORK/$s.summary" ] && cat "$WORK/$s.summary" >>"$OUT/summary.txt"
    pack
done
kill -- -"$(cat "$WORK/models.pid")" 2>/dev/null  # its own process group (setsid): the writer and its python
rm -f "$WORK/models.pid"
if [ -f "$WORK/llamacpp-build.pid" ]; then
    kill -- -"$(cat "$WORK/llamacpp-build.pid")" 2>/dev/null
    rm -f "$WORK/llamacpp-build.pid"
fi
echo "gpu-window: $((SECONDS - start)) s; logs in $OUT/logs.tar.gz" >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
