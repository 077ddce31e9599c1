#!/usr/bin/env bash
# `make fuzz` on a fresh clone (issue 22, row 18): its seed step (`make fuzz-seeds`)
# caches the converted stories260K in tests/tmp, which a fresh clone does not have, and
# make_seeds.py failed on the missing directory. Runs that step, and only it (no clang,
# no fuzzing), with a temporary directory that does not exist yet (FUZZ_TMP, and
# TESTTMP pointing there as a fresh shell's default would), and checks it succeeds,
# creates the directory and writes every target's seeds. ~2 s.
set -u
cd "${ROOT:-$(dirname "$0")/../..}"
TMP=${TESTTMP:-tests/tmp}/fuzz-seeds-fresh
VARENT=${VARENT:-$PWD/varent}
rm -rf "$TMP"
mkdir -p "$TMP"
fresh=$PWD/$TMP/tmp
[[ $TMP == /* ]] && fresh=$TMP/tmp

# -o: take the binary as it is (never rebuild it from here).
out=$(TESTTMP="$fresh" make -s -o "$VARENT" fuzz-seeds BIN="$VARENT" BUILD="${BUILD:-build}" \
      FUZZ_TMP="$fresh" FUZZ_BUILD="$TMP/fuzz" PYTHON="${PYTHON:-python3}" 2>&1)
rc=$?
if [ $rc -eq 0 ]; then echo "PASS fuzz_seeds_fresh_tmp"; else echo "FAIL fuzz_seeds_fresh_tmp: rc $rc: ${out: -600}"; fi
if [ -d "$fresh" ]; then echo "PASS fuzz_seeds_creates_tmp"; else echo "FAIL fuzz_seeds_creates_tmp: $fresh is missing"; fi
missing=()
for t in tests/fuzz/fuzz_*.c; do
    t=${t##*/fuzz_}; t=${t%.c}
    ls "$TMP/fuzz/seeds/$t"/* >/dev/null 2>&1 || missing+=("$t")
done
if [ ${#missing[@]} -eq 0 ]; then echo "PASS fuzz_seeds_every_target"
else echo "FAIL fuzz_seeds_every_target: no seeds for ${missing[*]}"; fi
rm -rf "$TMP"
