#!/usr/bin/env bash
# tools/gpu-verify.sh's mechanics, without a GPU: in a scratch tree holding only the
# script, it refuses to run without a bundle, unpacks a bundle on first use, counts
# PASS / FAIL / SKIP lines and exit codes of the programs it runs (fakes here that print
# known lines), and refuses an unknown stage. tools/gpu-bundle.sh is only syntax-checked:
# it rebuilds everything.
set -u
cd "${ROOT:-$(dirname "$0")/../..}"
TMP=${TESTTMP:-tests/tmp}/gpu-tools
rm -rf "$TMP"
mkdir -p "$TMP/tree/tools" "$TMP/pack/build/tests" "$TMP/pack/lib"
cp tools/gpu-verify.sh "$TMP/tree/tools/"

ok() {  # name, condition result ($?), detail
    if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fi
}

bash -n tools/gpu-bundle.sh && bash -n tools/gpu-verify.sh
ok gpu_tools_syntax $? "bash -n failed"

out=$(cd "$TMP/tree" && OUT="$TMP/out" tools/gpu-verify.sh check 2>&1)
rc=$?
[ $rc -eq 1 ] && [[ $out == *"run tools/gpu-bundle.sh"* ]]
ok gpu_verify_needs_bundle $? "rc $rc: $out"

# A bundle of fakes: varent prints a version; the kernel test passes twice and skips
# once, the sampler test fails once and exits 1, the others pass once.
printf '#!/bin/sh\necho "varent fake"\n' >"$TMP/pack/build/varent"
printf '#!/bin/sh\necho "PASS a"; echo "PASS b"; echo "SKIP c: why"\n' >"$TMP/pack/build/tests/test_cuda_kernels"
printf '#!/bin/sh\necho "PASS a"; echo "FAIL b: broken"; exit 1\n' >"$TMP/pack/build/tests/test_sample"
for t in cuda_batch cuda_forward cuda_forward_batch; do printf '#!/bin/sh\necho "PASS x"\n' >"$TMP/pack/build/tests/test_$t"; done
chmod +x "$TMP/pack/build/varent" "$TMP/pack/build/tests/"*
mkdir -p "$TMP/tree/.gpu"
tar -cJf "$TMP/tree/.gpu/bundle.tar.xz" -C "$TMP/pack" build lib
out=$(cd "$TMP/tree" && OUT="$TMP/out" PYTHON=false tools/gpu-verify.sh check 2>&1)
[ -x "$TMP/tree/.gpu/build/varent" ]
ok gpu_verify_unpacks_bundle $? "no .gpu/build/varent after the first run: $out"
echo "$out" | grep -Eq '^test_cuda_kernels +rc +0 +2 PASS +0 FAIL +1 SKIP'
ok gpu_verify_counts_pass_skip $? "$out"
echo "$out" | grep -Eq '^test_sample +rc +1 +1 PASS +1 FAIL +0 SKIP' && echo "$out" | grep -q 'FAIL b: broken'
ok gpu_verify_reports_failures $? "$out"
grep -q '==== test_sample (rc 1' "$TMP/out/check.log"
ok gpu_verify_writes_log $? "$(head -c 400 "$TMP/out/check.log")"

out=$(cd "$TMP/tree" && OUT="$TMP/out" tools/gpu-verify.sh nonsense 2>&1)
rc=$?
[ $rc -eq 2 ] && [[ $out == *"unknown stage 'nonsense'"* ]]
ok gpu_verify_unknown_stage $? "rc $rc: $out"
rm -rf "$TMP"
