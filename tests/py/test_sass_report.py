"""tools/sass_report.py, the SASS reader behind tools/sass-report.sh, on planted machine
code: each check feeds it SASS or -res-usage text whose answer is known by hand, and a
reader that miscounts fails. No cuobjdump or GPU needed (the real objects are read by
the tool itself, not here)."""
import vtest
from vtest import check
import sass_report as sr

HEADER = "\n\tcode for sm_90\n\t\tFunction : {name}\n\t.headerflags @\"EF_CUDA_SM90\"\n"


def sass(name, lines):
    """cuobjdump-style text: one instruction per line at 16-byte addresses from 0."""
    body = "".join(f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x000 */\n" for i, ins in enumerate(lines))
    return HEADER.format(name=name) + body


# A loop whose weight loads (R30) are all issued before the first use: 4 in flight.
UNROLLED = [
    "MOV R2, RZ",
    "LDG.E.128.CONSTANT R4, desc[UR4][R30.64]",        # 0x10: loop head
    "LDG.E.128.CONSTANT R8, desc[UR4][R30.64+0x200]",
    "LDG.E.128.CONSTANT R12, desc[UR4][R30.64+0x400]",
    "LDG.E.128.CONSTANT R16, desc[UR4][R30.64+0x600]",
    "LDG.E.128 R20, desc[UR4][R32.64]",                # activations, own register
    "FFMA R2, R4, R20, R2",
    "FFMA R2, R8, R21, R2",
    "ISETP.NE.AND P0, PT, R3, RZ, PT",
    "@P0 BRA 0x10",
    "EXIT",
]
# Both streams 4 deep: (8, 4).
BOTH = UNROLLED[:6] + ["LDG.E.128 R24, desc[UR4][R32.64+0x10]", "LDG.E.128 R36, desc[UR4][R32.64+0x20]",
                       "LDG.E.128 R40, desc[UR4][R32.64+0x30]"] + UNROLLED[6:]
BOTH[-2] = "@P0 BRA 0x10"
# The same loop with each load used before the next one is issued: 1 in flight.
SERIAL = [
    "MOV R2, RZ",
    "LDG.E.128.CONSTANT R4, desc[UR4][R30.64]",
    "LDG.E.128 R20, desc[UR4][R32.64]",
    "FFMA R2, R4, R20, R2",
    "LDG.E.128.CONSTANT R8, desc[UR4][R30.64+0x200]",
    "FFMA R2, R8, R21, R2",
    "@P0 BRA 0x10",
    "EXIT",
]
# No backward branch: a load outside any loop is not counted.
STRAIGHT = ["LDG.E.128 R4, desc[UR4][R30.64]", "FADD R5, R4, R4", "STG.E desc[UR4][R30.64], R5", "EXIT"]
# A store reads every operand: a use of R6 in STG ends the window.
STORE_USE = ["LDG.E.128 R4, desc[UR4][R30.64]", "STG.E desc[UR4][R8.64], R6",
             "LDG.E.128 R12, desc[UR4][R30.64+0x10]", "@P0 BRA 0x0", "EXIT"]
SPILL = ["STL [R1+0x4], R7", "LDL R7, [R1+0x4]", "EXIT"]
# A layer loop (0x10..0x80) around a chunk loop (0x30..0x50): a spill reload at the top of
# each layer (cold) and one inside the chunk loop (hot).
NESTED = [
    "STL [R1+0x4], R7",                          # 0x00: once
    "LDL R7, [R1+0x4]",                          # 0x10: layer loop head, once a layer
    "MOV R2, RZ",
    "LDG.E.128.CONSTANT R4, desc[UR4][R30.64]",  # 0x30: chunk loop head
    "LDL R9, [R1+0x8]",                          # 0x40: in the chunk loop
    "@P1 BRA 0x30",                              # 0x50
    "IADD3 R7, R7, 0x1, RZ",
    "ISETP.NE.AND P0, PT, R7, R3, PT",
    "@P0 BRA 0x10",                              # 0x80
    "EXIT",
]
# A key loop that streams a tile and holds a per-head loop: the tile spilled across the
# head loop is reloaded once a tile, in a loop that is not innermost.
STREAM = [
    "MOV R2, RZ",                                # 0x00
    "LDG.E.128.CONSTANT R4, desc[UR4][R30.64]",  # 0x10: key loop head, this tile
    "STL.128 [R1], R4",                          # 0x20: the tile spilled
    "FFMA R8, R8, R9, R8",                       # 0x30: head loop
    "@P1 BRA 0x30",                              # 0x40
    "LDL.128 R4, [R1]",                          # 0x50: reloaded, once a tile
    "@P0 BRA 0x10",                              # 0x60
    "LDL R9, [R1+0x10]",                         # 0x70: after the loops, once a unit
    "@P2 BRA 0x00",                              # 0x80: unit loop: around a streaming one
    "EXIT",
]
# nvcc's pipelined loop: the next iteration's four weight loads at the bottom, before the
# back edge, used at the top after one activation load: 5 in flight in the steady state,
# though from the loop head only the activation load comes before a use.
ROTATED = [
    "LDG.E.128.CONSTANT R12, desc[UR4][R6.64]",        # 0x00: the first iteration's, before the loop
    "LDG.E.128.CONSTANT R16, desc[UR4][R6.64+0x200]",
    "LDG.E.128.CONSTANT R20, desc[UR4][R6.64+0x400]",
    "LDG.E.128.CONSTANT R24, desc[UR4][R6.64+0x600]",
    "LDG.E.128.CONSTANT R28, desc[UR4][R36.64]",       # 0x40: loop head, an activation chunk
    "FFMA R2, R12, R28, R2",
    "FFMA R2, R16, R29, R2",
    "FFMA R2, R20, R30, R2",
    "FFMA R2, R24, R31, R2",
    "LDG.E.128.CONSTANT R12, desc[UR4][R6.64+0x800]",  # the next iteration's weights
    "LDG.E.128.CONSTANT R16, desc[UR4][R6.64+0xa00]",
    "LDG.E.128.CONSTANT R20, desc[UR4][R6.64+0xc00]",
    "LDG.E.128.CONSTANT R24, desc[UR4][R6.64+0xe00]",
    "@P0 BRA 0x40",
    "EXIT",
]

# A ring fill: cp.async copies (LDGSTS: a shared address, then the global one), each
# through the same shared address register R15, then a key loop that streams through
# cp.async and holds a head loop, with a reload once a tile. The copies are no loads in
# flight (no register waits on them), but the loop streams.
ASYNC = [
    "LDGSTS.E.BYPASS.128 [R15], desc[UR8][R6.64]",        # 0x00: fill loop head
    "LDGSTS.E.BYPASS.128 [R15+0x200], desc[UR8][R6.64]",
    "IADD3 R15, R15, 0x400, RZ",
    "@P0 BRA 0x00",                                       # 0x30
    "LDGSTS.E.BYPASS.128 [R17], desc[UR8][R8.64]",        # 0x40: key loop head
    "FFMA R2, R2, R3, R2",                                # 0x50: head loop
    "@P1 BRA 0x50",                                       # 0x60
    "LDL R9, [R1+0x8]",                                   # 0x70: once a tile
    "@P2 BRA 0x40",                                       # 0x80
    "EXIT",
]

RES = """
Resource usage:
 Common:
  GLOBAL:0
 Function _Z6kernelPf:
  REG:40 STACK:0 SHARED:1280 LOCAL:0 CONSTANT[0]:560 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z5spillPf:
  REG:255 STACK:16 SHARED:0 LOCAL:24 CONSTANT[0]:560 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_in_flight():
    f = sr.parse_sass(sass("unrolled", UNROLLED) + sass("serial", SERIAL) + sass("straight", STRAIGHT)
                      + sass("store_use", STORE_USE))
    check(sorted(f) == ["serial", "store_use", "straight", "unrolled"] and len(f["unrolled"]) == len(UNROLLED),
          "sass_parse_functions", f"{sorted(f)} {[len(v) for v in f.values()]}")
    check(sr.loops(f["unrolled"]) == [(1, 9)], "sass_loop_found", f"{sr.loops(f['unrolled'])}")
    # 4 weight loads and 1 activation load before the first FFMA: 5 in all, and the
    # activation stream (R32) has only 1: the conservative per-stream figure.
    got = sr.max_in_flight(f["unrolled"])
    check(got == (5, 1), "sass_in_flight_unrolled", f"{got}")
    check(sr.loads_in_flight(f["unrolled"], 1, 9, "R30") == 4, "sass_in_flight_unrolled_weights",
          f"{sr.loads_in_flight(f['unrolled'], 1, 9, 'R30')}")
    both = sr.parse_sass(sass("both", BOTH))["both"]
    check(sr.max_in_flight(both) == (8, 4), "sass_in_flight_both_streams", f"{sr.max_in_flight(both)}")
    check(sr.max_in_flight(f["serial"]) == (2, 1), "sass_in_flight_serial", f"{sr.max_in_flight(f['serial'])}")
    # every loop, not only the best: a kernel with the deep loop and the serial one
    second = [i.replace("BRA 0x10", "BRA 0xb0") for i in SERIAL]  # its head at index 11 after UNROLLED[:-1]
    two = sr.parse_sass(sass("two", UNROLLED[:-1] + second))["two"]
    check(sr.every_in_flight(two) == [(5, 1), (2, 1)] and sr.max_in_flight(two) == (5, 1),
          "sass_every_loop_reported", f"{sr.every_in_flight(two)}")
    check(sr.max_in_flight(f["straight"]) is None, "sass_no_loop_no_count", f"{sr.max_in_flight(f['straight'])}")
    check(sr.loads_in_flight(f["store_use"], 0, 3, None) == 1, "sass_store_reads_all_operands",
          f"{sr.loads_in_flight(f['store_use'], 0, 3, None)}")
    check(sr.spill_insns(sr.parse_sass(sass("spill", SPILL))["spill"]) == 2, "sass_spill_count")
    nested = sr.parse_sass(sass("nested", NESTED))["nested"]
    spans = sr.loops(nested)
    check(sorted(spans) == [(1, 8), (3, 5)] and sr.innermost(spans) == [(3, 5)], "sass_innermost_loop",
          f"{spans} {sr.innermost(spans)}")
    check(sr.spill_insns(nested) == 3 and sr.hot_spill_insns(nested) == 1, "sass_hot_spill_only_in_a_loop",
          f"{sr.spill_insns(nested)} {sr.hot_spill_insns(nested)}")
    st = sr.parse_sass(sass("stream", STREAM))["stream"]
    check(sr.streaming(st, sr.loops(st)) == [(1, 6)] and sr.hot_spill_insns(st) == 2,
          "sass_hot_spill_in_a_streaming_loop", f"{sr.streaming(st, sr.loops(st))} {sr.hot_spill_insns(st)}")
    check(sr.streaming(nested, sr.loops(nested)) == [(3, 5)] and sr.hot_spill_insns(nested) == 1,
          "sass_layer_loop_not_streaming", f"{sr.streaming(nested, sr.loops(nested))}")
    # the loops listed: a matvec's every loop; elsewhere the innermost and the streaming
    # ones (STREAM's key loop and its head loop), not the unit loop around them
    check(sr.listed_loops("attn_decode_flash_kernel", st) == [(1, 6), (3, 4)]
          and sr.listed_loops("matvec_vec_kernel", st) == sr.loops(st), "sass_listed_loops",
          f"{sr.listed_loops('attn_decode_flash_kernel', st)} {sr.loops(st)}")
    rot = sr.parse_sass(sass("rot", ROTATED))["rot"]
    check(sr.loops(rot) == [(4, 13)] and sr.loads_in_flight(rot, 4, 13, None) == 1, "sass_rotated_loop_from_head",
          f"{sr.loops(rot)} {sr.loads_in_flight(rot, 4, 13, None)}")
    check(sr.every_in_flight(rot) == [(5, 1)] and sr.steady_in_flight(rot, 4, 13, "R6") == 4,
          "sass_rotated_loop_steady_state", f"{sr.every_in_flight(rot)} {sr.steady_in_flight(rot, 4, 13, 'R6')}")


def test_async_copy():
    a = sr.parse_sass(sass("async", ASYNC))["async"]
    # the reader's old mistake: LDGSTS as a load writing R15..R18, which the next copy
    # reads: "1 in flight" in every ring fill of the persistent kernel
    check(sr.every_in_flight(a) == [] and sr.max_in_flight(a) is None, "sass_async_copy_not_in_flight",
          f"{sr.every_in_flight(a)} {sr.max_in_flight(a)}")
    check(sr.async_copy_loops(a) == 2, "sass_async_copy_loops_counted", f"{sr.async_copy_loops(a)}")
    spans = sr.loops(a)
    check(sorted(sr.streaming(a, spans)) == [(0, 3), (4, 8)] and sr.hot_spill_insns(a) == 1,
          "sass_async_copy_loop_streams", f"{sr.streaming(a, spans)} {sr.hot_spill_insns(a)}")


def test_res_usage():
    u = sr.parse_res_usage(RES)
    want = {"_Z6kernelPf": dict(REG=40, STACK=0, SHARED=1280, LOCAL=0),
            "_Z5spillPf": dict(REG=255, STACK=16, SHARED=0, LOCAL=24)}
    check(u == want, "sass_res_usage", f"{u}")
    rows = [dict(kernel="k", base="matvec_x", local=0, spills=0, in_flight=(3, 3)),
            dict(kernel="s", base="rope", local=24, spills=0, in_flight=None),
            dict(kernel="ok", base="matvec_y", local=0, spills=0, in_flight=(4, 1))]
    p = sr.problems(rows)
    check(len(p) == 2 and "k:" in p[0] and "s:" in p[1], "sass_problems_flag_spill_and_few_loads", f"{p}")
    # every loop is checked: a deep best loop does not hide a shallow second one
    two = [dict(kernel="two", base="matvec_z", local=0, spills=0, in_flight=(5, 1), loops=[(5, 1), (2, 1)]),
           dict(kernel="deep", base="matvec_w", local=0, spills=0, in_flight=(8, 4), loops=[(8, 4), (4, 1)]),
           dict(kernel="attn", base="attn_k", local=0, spills=0, in_flight=(8, 1), loops=[(8, 1), (1, 1)])]
    p = sr.problems(two)
    check(len(p) == 1 and p[0].startswith("two: loop 2 of 2 has 2"), "sass_problems_every_matvec_loop", f"{p}")


def test_occupancy():
    # Worked by hand from the sm_90 limits: 64 warps, 65536 registers (256 per warp
    # granule), 32 blocks, 228 KiB shared with 1 KiB reserved per block.
    cases = [((32, 256, 0), (1.0, "warps")),         # 8 warps/block, 8 blocks
             ((128, 256, 0), (0.25, "registers")),   # 4096 regs/warp -> 16 warps -> 2 blocks
             ((40, 128, 1024), (0.75, "registers")),  # 1280/warp -> 51 warps -> 12 blocks of 4
             ((16, 32, 0), (0.5, "blocks")),         # 32 blocks of 1 warp
             ((32, 1024, 120 * 1024), (0.5, "shared"))]  # one 120 KiB block per SM
    for args, want in cases:
        got = sr.occupancy(*args)
        check(abs(got[0] - want[0]) < 1e-9 and got[1] == want[1], f"sass_occupancy_{args[0]}_{args[1]}_{args[2]}",
              f"{got} want {want}")
    check(sr.occupancy(32, None, 0) == (None, "?"), "sass_occupancy_unknown_block")


def test_launch_blocks():
    d = vtest.tmpdir("sass")
    with open(f"{d}/k.cu", "w") as f:
        f.write("#define THREADS 256  // per block\n#define WARPS 4\n"
                "void a() { one_kernel<<<cdiv(n, 256), THREADS, 0, s>>>(x); }\n"
                "void b() { unsigned block = 32 * WARPS, grid = 9; two_kernel<R><<<grid, block, 0, s>>>(x); }\n"
                "void c() { three_kernel<<<T, threads_for(dim), 0, s>>>(x); }\n")
    got = sr.launch_blocks(d)
    check(got == {"one_kernel": 256, "two_kernel": 128, "three_kernel": None}, "sass_launch_blocks", f"{got}")
    check(sr.base_name("void matvec_vec_kernel<0, 1>(mv_rows, void const*, int, int)") == "matvec_vec_kernel",
          "sass_base_name_template")


def test_trig_stack():
    # A kernel calling sincosf has LDL/STL from its range reduction: reported, not a spill;
    # the same local memory in a kernel without trig is one, and so are LOCAL bytes.
    d = vtest.tmpdir("sass_trig")
    with open(f"{d}/k.cu", "w") as f:
        f.write("__global__ void rope_k(float *x) {\n    float s, c;\n    sincosf(x[0], &s, &c);\n}\n"
                "__global__ void plain_k(float *x) {\n    x[0] = 1.f;\n}\n")
    check(sr.trig_kernels(d) == {"rope_k"}, "sass_trig_kernels", f"{sr.trig_kernels(d)}")
    # Through __device__ helpers (also in a .cuh), past __launch_bounds__ and templates.
    with open(f"{d}/h.cuh", "w") as f:
        f.write("__device__ __forceinline__ void angle(float x, float *s, float *c) { sincosf(x, s, c); }\n"
                "__device__ void helper(float *x);\n")
    with open(f"{d}/t.cu", "w") as f:
        f.write("__device__ void helper(float *x) {\n    float s, c;\n    angle(x[0], &s, &c);\n}\n"
                "template <int N>\n__global__ void __launch_bounds__(128, 4)\n    deep_k(float *x) {\n"
                "    if (N) helper(x);\n}\n__global__ void near_k(float *x) { x[0] = 2.f; }\n")
    got = sr.trig_kernels(d)
    check(got == {"rope_k", "deep_k"}, "sass_trig_kernels_through_helpers", f"{got}")
    rows = [dict(kernel="r", base="rope_k", trig=True, local=0, stack=32, spills=5, in_flight=None),
            dict(kernel="p", base="plain_k", trig=False, local=0, stack=32, spills=5, in_flight=None),
            dict(kernel="l", base="rope_k", trig=True, local=16, stack=32, spills=5, in_flight=None),
            # trig in the source, but a 288-byte stack: spills beside the reduction array
            dict(kernel="s", base="rope_k", trig=True, local=0, stack=288, spills=251, in_flight=None)]
    p = sr.problems(rows)
    check(len(p) == 3 and p[0].startswith("p:") and p[1].startswith("l:") and p[2].startswith("s:"),
          "sass_trig_stack_not_a_spill", f"{p}")
    check("288 bytes of stack" in p[2], "sass_spill_names_the_stack", p[2])
    # cold LDL/STL only (none in an innermost loop): listed, not a failure; one hot: a failure
    rows = [dict(kernel="c", base="persist_k", trig=False, local=0, stack=24, spills=25, hot_spills=0,
                 in_flight=None),
            dict(kernel="h", base="persist_k", trig=False, local=0, stack=24, spills=25, hot_spills=1,
                 in_flight=None)]
    p = sr.problems(rows)
    check(len(p) == 1 and p[0].startswith("h:") and "1 of them in a loop" in p[0], "sass_cold_spills_pass",
          f"{p}")
    # a shallow loop fails in a matvec and in the persistent decode kernel, not elsewhere
    def shallow(base):
        return dict(kernel=base, base=base, trig=False, local=0, stack=0, spills=0, in_flight=(8, 1),
                    loops=[(8, 1), (2, 1)])
    p = sr.problems([shallow("matvec_vec_kernel"), shallow("persist_decode_kernel"), shallow("attn_prefill_kernel")])
    check(len(p) == 2 and p[0].startswith("matvec_vec_kernel: loop 2 of 2 has 2")
          and p[1].startswith("persist_decode_kernel: loop 2"), "sass_shallow_loop_in_decode_kernels", f"{p}")


test_in_flight()
test_async_copy()
test_res_usage()
test_occupancy()
test_launch_blocks()
test_trig_stack()
vtest.done()
