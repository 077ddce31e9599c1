#!/usr/bin/env bash
# tools/gpu-window.sh on the emulated device (docs/cuda.md, "A GPU window"): the whole
# window end to end with a short deadline and a planted hang in its first stage. Checks
# that every stage is reported in order, the hang is cut at its share and the later
# stages still run, the A/B stage compares two builds, and decode-trace.tsv holds one
# row per graph node of each traced step (the counts varent bench printed). Then the
# trace report on a hand-made trace whose durations and gaps are known, and the tracer
# library refusing to run without VARENT_TRACE_OUT.
set -u
cd "${ROOT:-$(dirname "$0")/../..}"
ROOT=$PWD
EMU=${EMU_BUILD:-${BUILD:-build}/emu}
PY=${PYTHON:-python3}
TMP=${TESTTMP:-tests/tmp}/gpu-window
TMP=$(mkdir -p "$TMP" && cd "$TMP" && pwd)
rm -rf "${TMP:?}"/*

ok() {  # name, condition result ($?), detail
    if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fi
}

# ---- the report on a planted trace -------------------------------------------------------
# Two steps of graph 7 (three nodes: k1 2 us, a 1 us gap, m 3 us, a 2 us gap, k2 4 us), an
# argmax kernel and a host sync between them, one step of graph 5 before (ignored).
cat >"$TMP/planted.raw" <<'EOF'
# varent-trace 1
A	100000	101000	1	0	0	9	cudaGraphLaunch_v10000
K	102000	110000	1	5	21474836480	3	other_graph_kernel
A	200000	201000	2	0	0	9	cudaGraphLaunch_v10000
K	202000	204000	2	7	30064771072	3	_Z2k1v
M	205000	208000	2	7	30064771073	3	memcpy-HtoD-64
K	210000	214000	2	7	30064771074	3	_Z2k2v
A	220000	221000	3	0	0	9	cudaLaunchKernel_v7000
K	222000	223500	3	0	0	3	argmax_kernel
A	224000	230000	4	0	0	9	cudaStreamSynchronize_v3020
A	231000	232000	5	0	0	9	cudaGraphLaunch_v10000
K	240000	242000	5	7	30064771072	3	_Z2k1v
M	243000	246000	5	7	30064771073	3	memcpy-HtoD-64
K	248000	252000	5	7	30064771074	3	_Z2k2v
EOF
"$PY" tools/trace_report.py "$TMP/planted.raw" --kind planted --tsv "$TMP/planted.tsv" >"$TMP/planted.txt" 2>&1
rc=$?
want=$'step_kind\tnode\tkernel\tdur_us\tgap_us\nplanted\t0\tk1\t2.00\t44.25\nplanted\t1\tmemcpy-HtoD-64\t3.00\t1.00\nplanted\t2\tk2\t4.00\t2.00'
# node 0's gap: 92 us after graph 5's kernel in step 1 (202 - 110), 16.5 us after the argmax
# in step 2 (240 - 223.5): median 54.25; c++filt turns _Z2k1v into k1() -> k1.
want=${want/44.25/54.25}
got=$(cat "$TMP/planted.tsv" 2>/dev/null)
[ $rc -eq 0 ] && [ "$got" = "$want" ]
ok trace_report_planted_rows $? "rc $rc; got: $got"
grep -q 'between steps, device: argmax_kernel: 1.00 per step, 1.50 us each' "$TMP/planted.txt" &&
    grep -q 'between launches, host: cudaStreamSynchronize: 1.00 per step, 6.0 us per step' "$TMP/planted.txt" &&
    grep -q 'step span 12.0 us, busy 9.0 us' "$TMP/planted.txt"
ok trace_report_planted_summary $? "$(cat "$TMP/planted.txt")"
printf '# varent-trace 1\nA\t1\t2\t1\t0\t0\t9\tcudaMalloc\n' >"$TMP/empty.raw"
"$PY" tools/trace_report.py "$TMP/empty.raw" --kind x --tsv "$TMP/empty.tsv" >/dev/null 2>"$TMP/empty.err"
rc=$?
[ $rc -eq 1 ] && grep -q 'no graph launch' "$TMP/empty.err"
ok trace_report_no_graph $? "rc $rc: $(cat "$TMP/empty.err")"

# Overlapping nodes (programmatic dependent launch: k2 starts 2 us before k1 ends): the
# busy time is the union of the intervals, and the overlap is reported, not counted twice.
cat >"$TMP/overlap.raw" <<'EOF'
# varent-trace 1
A	100000	101000	1	0	0	9	cudaGraphLaunch_v10000
K	102000	108000	1	9	38654705664	3	_Z2k1v
K	106000	112000	1	9	38654705665	3	_Z2k2v
A	120000	121000	2	0	0	9	cudaGraphLaunch_v10000
K	122000	128000	2	9	38654705664	3	_Z2k1v
K	126000	132000	2	9	38654705665	3	_Z2k2v
EOF
"$PY" tools/trace_report.py "$TMP/overlap.raw" --kind overlap --tsv "$TMP/overlap.tsv" >"$TMP/overlap.txt" 2>&1
grep -q 'step span 10.0 us, busy 10.0 us (100%), idle inside 0.0 us; nodes overlapped 2.0 us' "$TMP/overlap.txt"
ok trace_report_overlapping_nodes $? "$(cat "$TMP/overlap.txt")"

# The prefill report (--prefill) on a planted trace of two runs: the second run's prefill,
# two chunks (two embedding kernels), a gap of 1.5 us inside, up to its graph's first node.
cat >"$TMP/prefill.raw" <<'EOF'
# varent-trace 1
K	1000	2000	1	0	0	3	embed_kernel
K	2000	5000	2	0	0	3	cublasGemmEx
A	5500	5600	3	0	0	9	cudaGraphLaunch_v10000
K	6000	7000	3	7	30064771072	3	_Z2k1v
K	10000	11000	4	0	0	3	embed_kernel
K	11500	14500	5	0	0	3	cublasGemmEx
K	14500	16500	6	0	0	3	attn_prefill_kernel
K	17000	17500	7	0	0	3	embed_kernel
K	17500	19500	8	0	0	3	cublasGemmEx
M	20000	20500	9	0	0	3	memcpy-DtoH-24
A	20600	20700	10	0	0	9	cudaGraphLaunch_v10000
K	21000	22000	10	7	30064771072	3	_Z2k1v
EOF
out=$("$PY" tools/trace_report.py "$TMP/prefill.raw" --prefill 2>&1)
rc=$?
[ $rc -eq 0 ] && [[ $out == *"prefill: 6 kernels and copies"* ]] &&
    [[ $out == *"span 10.5 us, busy 9.0 us (86%), idle inside 1.5 us"* ]] &&
    [[ $out == *$'\n  prefill by kernel: cublasGemmEx: 2 x, 5.0 us (56% of busy), median 2.50 us\n  prefill by kernel: attn_prefill_kernel: 1 x, 2.0 us'* ]] &&
    [[ $out == *"embed_kernel: 2 x, 1.5 us (17% of busy), median 0.75 us"* ]]
ok trace_report_prefill_planted $? "rc $rc: $out"
out=$("$PY" tools/trace_report.py "$TMP/planted.raw" --prefill 2>&1)
rc=$?
[ $rc -eq 1 ] && [[ $out == *"no embedding kernel outside a graph"* ]]
ok trace_report_prefill_none $? "rc $rc: $out"

# ---- the persistent kernel's phase trace (tools/persist_trace.py) on a planted one ------------------
# grid 2, one layer; qkv: blocks (1000, 3000, 5000) and (900, 2000, 6000): span 5.1 us,
# waits 2.0 and 1.1 (median 1.55), work 2.0 and 4.0 (3.0); the step 0 to 20 us.
printf '# varent persist-trace 1: grid 2, layers 1, phases 7\nphase\tlayer\tkind\tblock\tentry_ns\twait_ns\texit_ns\n' >"$TMP/ptrace.tsv"
printf '%s\n' "0 -1 embed 0 0 -1 1000" "0 -1 embed 1 100 -1 900" "1 0 qkv 0 1000 3000 5000" "1 0 qkv 1 900 2000 6000" \
    "2 0 attention 0 5000 6000 7000" "2 0 attention 1 6000 -1 6500" "3 0 o 0 7000 8000 9000" "3 0 o 1 6500 8000 9500" \
    "4 0 gate_up 0 9000 10000 12000" "4 0 gate_up 1 9500 10000 11000" "5 0 down 0 12000 13000 14000" \
    "5 0 down 1 11000 13000 15000" "6 -1 lm_head 0 14000 16000 20000" "6 -1 lm_head 1 15000 16000 18000" |
    tr ' ' '\t' >>"$TMP/ptrace.tsv"
out=$("$PY" tools/persist_trace.py "$TMP/ptrace.tsv" 2>&1)
rc=$?
norm=$(tr -s ' ' <<<"$out")
[ $rc -eq 0 ] && [[ $norm == *"grid 2, 1 layers, step 20.0 us"* ]] && [[ $norm == *$'\nqkv 1 5.10 5.10 25.5% 1.55 3.00'* ]] &&
    [[ $norm == *$'\nattention 1 2.00 2.00 10.0% 1.00 1.00'* ]] && [[ $norm == *$'\nembed 1 1.00 1.00 5.0% - -'* ]] &&
    [[ $norm == *$'\nlm_head 1 6.00 6.00 30.0% 1.50 3.00'* ]]
ok persist_trace_report_planted $? "rc $rc: $out"
printf '# varent persist-trace 1: grid 2, layers 1, phases 7\nphase\tlayer\tkind\tblock\tentry_ns\twait_ns\texit_ns\n1\t0\tqkv\t0\t5\tx\t9\n' >"$TMP/ptrace-bad.tsv"
out=$("$PY" tools/persist_trace.py "$TMP/ptrace-bad.tsv" 2>&1)
rc=$?
[ $rc -eq 1 ] && [[ $out == *"ptrace-bad.tsv:3: a field is not a number"* ]]
ok persist_trace_report_bad_row $? "rc $rc: $out"

# ---- the tracer library ----------------------------------------------------------------------
if [ ! -x "$EMU/varent" ] || [ ! -f "$EMU/tools/libvarent_trace.so" ] || [ ! -x "$EMU/tests/test_cudaemu_checks" ]; then
    echo "FAIL gpu_window_builds: $EMU/varent, $EMU/tools/libvarent_trace.so or $EMU/tests/test_cudaemu_checks missing (make emu)"
    exit 1
fi
out=$(CUDA_INJECTION64_PATH=$ROOT/$EMU/tools/libvarent_trace.so "$EMU/varent" bench --device cuda --probe --probe-mb 1 2>&1)
rc=$?
[ $rc -eq 0 ] && [[ $out == *"VARENT_TRACE_OUT is not set"* ]] && [[ $out == *"sums checked"* ]]
ok tracer_without_output_says_so $? "rc $rc: $out"
out=$(CUDA_INJECTION64_PATH=$TMP/nonexistent.so "$EMU/varent" bench --device cuda --probe --probe-mb 1 2>&1)
rc=$?
[ $rc -ne 0 ] && [[ $out == *"CUDA_INJECTION64_PATH=$TMP/nonexistent.so"* ]]
ok tracer_missing_library_is_an_error $? "rc $rc: $out"

# ---- tools/persist-stress.sh's bad inputs -------------------------------------------------------
out=$(PARTS="stress bogus" BIN=$ROOT/$EMU/tests/test_cuda_persist bash tools/persist-stress.sh 2>&1)
rc=$?
[ $rc -eq 1 ] && [[ $out == *"unknown part 'bogus' in PARTS (stress, racecheck, synccheck)"* ]]
ok persist_stress_unknown_part $? "rc $rc: $out"
out=$(PARTS=stress BIN=$TMP/no-such-test bash tools/persist-stress.sh 2>&1)
rc=$?
[ $rc -eq 1 ] && [[ $out == *"BIN=$TMP/no-such-test is not an executable"* ]]
ok persist_stress_missing_program $? "rc $rc: $out"

# ---- the window ---------------------------------------------------------------------------------
# make test-asan: the window is shell orchestration of varent bench and the tests on the
# emulated device, which test_emu_cli and the emulated programs already run under ASan;
# it took 118 s of CI's 90 minutes there, so only make test runs it.
if [ -n "${ASAN_OPTIONS:-}" ]; then
    echo "SKIP gpu_window_run: make test runs the window (under ASan it repeats what test_emu_cli covers)"
    exit 0
fi
# The baseline: the same emulated build with its decode graphs off (a wrapper), so the
# two builds differ in what they launch, and its prefill timed as a bench before the
# persist merge timed it (not waited for), so the window must time the current build
# that way too before it compares prefills.
mkdir -p "$TMP/base"
printf '#!/bin/sh\nVARENT_CUDA_GRAPHS=0 VARENT_BENCH_PREFILL_WAIT=0 exec %s "$@"\n' "$ROOT/$EMU/varent" >"$TMP/base/varent"
chmod +x "$TMP/base/varent"
echo "the current emulated build without CUDA graphs, its prefill not waited for" >"$TMP/base/COMMIT"
deadline=${WINDOW_DEADLINE:-300}
start=$SECONDS
OUT=$TMP/out WORK=$TMP/work DEADLINE=$deadline PLANT_HANG=facts BASE_VARENT=$TMP/base/varent AB_VARIANTS='graphs-off VARENT_CUDA_GRAPHS=0' \
    EMU_BUILD=$EMU PYTHON=$PY tools/gpu-window.sh --emulated >"$TMP/window.log" 2>&1
rc=$?
took=$((SECONDS - start))
S=$TMP/out/summary.txt
[ $rc -eq 0 ] && [ -s "$S" ]
ok gpu_window_runs $? "rc $rc: $(tail -5 "$TMP/window.log")"
[ "$took" -le $((deadline + 30)) ]
ok gpu_window_within_deadline $? "took $took s for a deadline of $deadline s"

stages=$(sed -n 's/^stage \([a-z]*\):.*/\1/p' "$S" | tr '\n' ' ')
[ "$stages" = "facts guard stress ab trace ncu kbench llamacpp streams big " ]
ok gpu_window_every_stage_reported $? "stages in the summary: $stages"
grep -Eq '^stage facts: timed out \(after ([0-9]+) s' "$S"
ok gpu_window_hang_cut_at_its_share $? "$(grep '^stage facts' "$S")"
cut_after=$(sed -n 's/^stage facts: timed out (after \([0-9]*\) s.*/\1/p' "$S")
[ -n "$cut_after" ] && [ "$cut_after" -le $((deadline * 60 / 1000 + 6)) ]
ok gpu_window_hang_costs_only_its_share $? "facts ran $cut_after s; its share is $((deadline * 60 / 1000)) s"
for s in guard stress ab trace kbench streams; do
    grep -q "^stage $s: done (" "$S"
    ok "gpu_window_later_stage_runs_$s" $? "$(grep "^stage $s" "$S")"
done
# every bench of the ab stage ran, the persistent kernel's at --ctx and with the samplers too
! grep -q "FAILED" "$S" && grep -q "at --ctx 64 (16-token prompt), persistent: decode [0-9.]* tok/s" "$S" &&
    grep -q "llama3-tiny (persistent): sampler" "$S"
ok gpu_window_ab_every_bench_ran $? "$(grep -E "FAILED|ctx 64|\(persistent\)" "$S" | cut -c1-200)"
for s in ncu llamacpp; do
    grep -q "^stage $s: skipped (" "$S"
    ok "gpu_window_hardware_stage_skipped_$s" $? "$(grep "^stage $s" "$S")"
done

# The persistent kernel's stress test (tools/persist-stress.sh): its PASS line, the
# steps it compared, and the sanitizer parts said to be skipped on the emulated device.
grep -Eq '^  PASS persist_stress: .*llama3-tiny-bf16, 8 of 8 greedy steps, logits differing from the graph path at 0 steps.* 8 persistent steps' "$S" &&
    grep -A3 '^stage stress' "$S" | grep -q 'compute-sanitizer: skipped'
ok gpu_window_stress_persistent_against_graph $? "$(grep -A3 '^stage stress' "$S")"

# The trace stage's persistent phase trace: the report of one traced step of llama3-tiny.
grep -A3 '^stage trace' "$S" >/dev/null && grep -Eq '^  persist trace .*persist-trace.tsv: grid 4, 2 layers, step [0-9.]+ us' "$S" &&
    grep -Eq '^  qkv +2 +[0-9.]+ ' "$S" && grep -Eq '^  lm_head +1 +[0-9.]+ ' "$S"
ok gpu_window_persist_phase_trace $? "$(grep -A10 '^  persist trace' "$S")"

# The trace stage's prefill: the PROMPT-token prefill (4 tokens emulated) kernel by kernel.
grep -Eq '^  prefill trace of 4 tokens; varent bench \(traced\): +4 tokens: ' "$S" &&
    grep -Eq '^  prefill: [0-9]+ kernels and copies' "$S" &&
    grep -Eq '^    prefill by kernel: attn_prefill_kernel: 2 x, ' "$S"
ok gpu_window_prefill_trace $? "$(grep -i 'prefill' "$S" | head -8)"

# The kbench stage's prefill attention bench: both kernels at the tiny shape.
grep -Eq '^  prefill attention tiny +hd=64 heads=4/2 T=8 keys=20: simple +[0-9.]+ us, tiled +[0-9.]+ us' "$S"
ok gpu_window_kbench_prefill_attention $? "$(grep -A5 '^stage kbench' "$S")"

# The A/B: both builds in every round, interleaved, and their ratio.
n_cur=$(awk '$2 == "current" && $4 + 0 > 0' "$TMP/out/ab.tsv" 2>/dev/null | wc -l)
n_base=$(awk '$2 == "base" && $4 + 0 > 0' "$TMP/out/ab.tsv" 2>/dev/null | wc -l)
order=$(awk 'NR > 1 { printf "%s ", $2 }' "$TMP/out/ab.tsv" 2>/dev/null)
[ "$n_cur" -ge 2 ] && [ "$n_cur" = "$n_base" ] && [[ $order == "current base current base"* ]] &&
    grep -Eq 'decode current [0-9.]+ tok/s, baseline [0-9.]+ tok/s: [0-9.]+x' "$S"
ok gpu_window_ab_compares_two_builds $? "current $n_cur, base $n_base, order: $order; $(grep -A3 '^stage ab' "$S")"
grep -q 'variant graphs-off (VARENT_CUDA_GRAPHS=0): decode [0-9.]* tok/s (current [0-9.]*), prefill [0-9.]* tok/s.* 0 graph nodes' "$S"
ok gpu_window_ab_variant_takes_its_env $? "$(grep 'variant' "$S")"
grep -Eq "the current timed the baseline's way \(VARENT_BENCH_PREFILL_WAIT=0\): prefill [0-9.]+ tok/s, baseline [0-9.]+ tok/s: [0-9.]+x" "$S"
ok gpu_window_ab_prefill_timed_alike $? "$(grep -i 'prefill' "$S")"

# The big stage (issue 34's 8B row): each decode kernel's decode and its share of the probed
# read bandwidth ("-": the planted hang left the facts stage without a probe), and the
# persistent run's steps with none on the graph path.
if grep -q '^stage big: done (' "$S"; then
    grep -Eq '^  qwen3-tiny \(graph\): decode +4 tokens: [0-9.]+ tok/s' "$S" &&
        grep -Eq '^  qwen3-tiny \(persistent\): decode +4 tokens: [0-9.]+ tok/s' "$S" &&
        grep -Eq '^  qwen3-tiny \(persistent\): - of the probe kernel.s read bandwidth \([0-9.]+ of - GB/s; the goal: 0.85\)' "$S" &&
        grep -Eq '^  qwen3-tiny \(persistent\): decode kernel: persistent, [0-9]+ steps .*; 0 on the graph path instead' "$S"
    ok gpu_window_big_on_both_kernels $? "$(grep -A12 '^stage big' "$S")"
else
    echo "FAIL gpu_window_big_on_both_kernels: $(grep '^stage big' "$S")"
fi

# every raw log of the window
mkdir -p "$TMP/logs"
tar -xzf "$TMP/out/logs.tar.gz" -C "$TMP/logs" 2>/dev/null

# Many streams (issue 35): 9 prompts decoded together (past the 8 exact row counts: a
# padded bucket) against one by one, interleaved, every row drawn on the device.
n_streams=$(awk -F'\t' '$2 + 0 > 0 && $3 + 0 > 0' "$TMP/logs/streams.tsv" 2>/dev/null | wc -l)
[ "$n_streams" -ge 2 ] && grep -Eq 'stories260K: 4 tokens a stream, greedy: 1 stream [0-9.]+ tok/s, 9 streams [0-9.]+ tok/s aggregate: [0-9.]+x' "$S" &&
    grep -Eq '^  scheduler: .*\(widest 9\).* ([0-9]+) of \1 rows drawn on the device' "$S"
ok gpu_window_streams_ratio $? "$n_streams rounds; $(grep -A3 '^stage streams' "$S")"

# The trace: one row per graph node of each step kind, as varent bench counted them.
T=$TMP/out/decode-trace.tsv
want_greedy=$(sed -n 's/^decode step .* \([0-9]*\) graph nodes.*/\1/p' "$TMP/logs/trace-greedy-bench.txt" 2>/dev/null)
want_armed=$(sed -n 's/^sampler *standard .* \([0-9]*\) graph nodes.*/\1/p' "$TMP/logs/trace-armed-temp1-bench.txt" 2>/dev/null)
rows_greedy=$(awk -F'\t' '$1 == "greedy"' "$T" 2>/dev/null | wc -l)
rows_armed=$(awk -F'\t' '$1 == "armed-temp1"' "$T" 2>/dev/null | wc -l)
[ "$(head -1 "$T" 2>/dev/null)" = $'step_kind\tnode\tkernel\tdur_us\tgap_us' ]
ok gpu_window_trace_header $? "$(head -1 "$T" 2>/dev/null)"
[ -n "$want_greedy" ] && [ "$rows_greedy" = "$want_greedy" ]
ok gpu_window_trace_greedy_one_row_per_node $? "$rows_greedy rows; varent bench: '$want_greedy' graph nodes"
[ -n "$want_armed" ] && [ "$rows_armed" = "$want_armed" ] && [ "$want_armed" != "$want_greedy" ]
ok gpu_window_trace_armed_one_row_per_node $? "$rows_armed rows; varent bench: '$want_armed' graph nodes (greedy $want_greedy)"
awk -F'\t' 'NR > 1 { if ($1 != k) { k = $1; i = 0 } if ($2 != i++ || $3 == "" || $4 + 0 < 0) bad = 1 } END { exit bad }' "$T"
ok gpu_window_trace_rows_in_node_order $? "$(head -5 "$T")"
grep -q 'memcpy' <(awk -F'\t' '$1 == "armed-temp1" { print $3 }' "$T")
ok gpu_window_trace_armed_step_has_copy_nodes $? "$(awk -F'\t' '$1 == "armed-temp1" { print $3 }' "$T" | sort | uniq -c | head)"
grep -q 'traced .* tok/s, untraced .* tok/s' "$S"
ok gpu_window_traced_against_untraced $? "$(grep -A12 '^stage trace' "$S")"
[ "$(ls "$TMP/out" | wc -l)" -le 8 ]
ok gpu_window_out_fits_the_device_tool $? "$(ls "$TMP/out")"
