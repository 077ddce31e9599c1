#!/usr/bin/env bash
# Replays the fuzz targets' seed corpora (tests/fuzz/make_seeds.py) and every saved
# fuzz finding (tests/data/fuzz-regressions/TARGET/) through the targets built as plain
# programs ($BUILD/fuzz-replay/, no libFuzzer needed). Under `make test-asan` this runs
# them with AddressSanitizer and UBSan. A crash or a broken invariant fails the target.
set -u
cd "${ROOT:-$(dirname "$0")/../..}"
B=${BUILD:-build}/fuzz-replay
TMP=${TESTTMP:-tests/tmp}
if ! ls "$B"/fuzz_* >/dev/null 2>&1; then
    echo "SKIP fuzz_replay: no replay binaries in $B (make tests)"
    exit 0
fi
seeds=$TMP/fuzz-seeds
rm -rf "$seeds"
if ! out=$("${PYTHON:-python3}" tests/fuzz/make_seeds.py "$seeds" 2>&1); then
    echo "FAIL fuzz_replay_seeds: make_seeds.py failed: $out"
    exit 1
fi
export FUZZ_TOKENIZERS="$seeds/tokenizers/llama3=roundtrip,$seeds/tokenizers/qwen3"
[ -d "$seeds/tokenizers/stories260K" ] && FUZZ_TOKENIZERS+=",$seeds/tokenizers/stories260K"
for bin in "$B"/fuzz_*; do
    case $bin in *.d) continue ;; esac
    t=${bin##*/fuzz_}
    dirs=()
    [ -d "$seeds/$t" ] && dirs+=("$seeds/$t")
    [ -d "tests/data/fuzz-regressions/$t" ] && dirs+=("tests/data/fuzz-regressions/$t")
    if [ ${#dirs[@]} -eq 0 ]; then
        echo "SKIP fuzz_replay_$t: no seeds or regressions"
        continue
    fi
    log=$TMP/fuzz-replay-$t.log
    if REPLAY_VERBOSE=1 "$bin" "${dirs[@]}" >"$log" 2>&1; then
        echo "PASS fuzz_replay_$t ($(grep -o 'replayed [0-9]* inputs' "$log"))"
    else
        echo "FAIL fuzz_replay_$t: exit $? on $(grep '^replay ' "$log" | tail -1 | cut -c8-) (log: $log)"
        grep -E 'ERROR|SUMMARY|invariant|runtime error' "$log" | head -5
    fi
done
rm -rf "$seeds"
