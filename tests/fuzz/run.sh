#!/usr/bin/env bash
# Runs the libFuzzer targets one after another (make fuzz FUZZ_SECONDS=N [FUZZ_TARGETS="gguf chat"]).
# Each target runs N seconds on its seed corpus (FUZZ_BUILD/seeds/T) plus the corpus it
# grew before (FUZZ_BUILD/corpus/T); crashes land in FUZZ_BUILD/artifacts/T/. Prints
# one line per target: executions, coverage (cov: edges, ft: features), corpus size.
# Exits non-zero when any target found a crash, leak, timeout or out-of-memory.
set -u
cd "$(dirname "$0")/../.."
B=${FUZZ_BUILD:?}; secs=${FUZZ_SECONDS:-60}; targets=${FUZZ_TARGETS:?}
export FUZZ_TOKENIZERS="$B/seeds/tokenizers/llama3=roundtrip,$B/seeds/tokenizers/qwen3"
[ -d "$B/seeds/tokenizers/stories260K" ] && FUZZ_TOKENIZERS+=",$B/seeds/tokenizers/stories260K"
declare -A maxlen=([safetensors]=16384 [config]=4096 [tokenizer_load]=65536 [encode]=4096 [gguf]=16384 [chat]=16384
                   [server_request]=8192 [llama2c_vocab]=16384)
bad=0
for t in $targets; do
    mkdir -p "$B/corpus/$t" "$B/artifacts/$t" "$B/logs"
    log="$B/logs/$t.log"
    dict=tests/fuzz/$t.dict
    "$B/fuzz_$t" "$B/corpus/$t" "$B/seeds/$t" -max_total_time="$secs" -max_len="${maxlen[$t]:-8192}" \
        -timeout=20 -rss_limit_mb=2048 -close_fd_mask=1 -print_final_stats=1 \
        -artifact_prefix="$B/artifacts/$t/" $( [ -f "$dict" ] && echo "-dict=$dict" ) >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*'); ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*')
    corp=$(echo "$last" | grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' | cut -d' ' -f2)
    printf 'fuzz %-15s %4ss  execs %10s  cov %5s  ft %6s  corpus %-12s rc %d\n' "$t" "$secs" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$rc"
    if [ "$rc" -ne 0 ]; then
        bad=1
        grep -E 'ERROR|SUMMARY|invariant|Test unit written' "$log" | head -5 | sed 's/^/    /'
    fi
done
exit $bad
