// matvec.cuh: the decode matvec's device code (matmul.cu's kernels and the persistent
// decode kernel, persist.cu, run the same functions, so a row has the same bits in
// both): one output row per warp (mv_vec_row), four rows (mv_vec4_rows), the gate|up
// pair with SwiGLU (mv_glu_pair), the scalar fallback (mv_scalar_row), and the rule that
// picks the kernel of a matrix (mv_kind).
#ifndef VARENT_CUDA_MATVEC_CUH
#define VARENT_CUDA_MATVEC_CUH

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sync.cuh"
#include <type_traits>

#define MV_WARPS 4  // warps per block

// The fusions the hot loops test, as template parameters F (no branch on them inside a
// loop): MV_NORM, a folded RMSNorm (p.nw set); MV_COHERENT, x written by other blocks
// of the running kernel (the persistent kernel), read through L2; MV_SHARED_X, x staged
// in the block's shared memory (the persistent kernel's, once a block and phase), read
// there. The vector kernels take F; the scalar fallback, the bias, the residual add and
// the argmax (once per row) read mv_rows.
enum { MV_NORM = 1, MV_COHERENT = 2, MV_SHARED_X = 4 };

__device__ __forceinline__ float dot8(const float f[8], float4 a, float4 b) {
    float s = f[0] * a.x;
    s = fmaf(f[1], a.y, s); s = fmaf(f[2], a.z, s); s = fmaf(f[3], a.w, s);
    s = fmaf(f[4], b.x, s); s = fmaf(f[5], b.y, s); s = fmaf(f[6], b.z, s);
    s = fmaf(f[7], b.w, s);
    return s;
}

// Rows of one launch (batched decode): x points at row r0 of the batch, nr <= R rows are
// valid (rows past nr re-read row nr-1, which is valid memory, and are not written). Row
// r's output o goes to the planar-by-segment layout of ops_cuda.h (B rows in all).
// Fusions (cuda_mv_fuse): nw (f32 [n_in], NULL: none) folds each x row's RMSNorm into
// the product, as W (x * inv_rms * nw) = inv_rms * (W * nw) x: the weights are scaled
// by nw as they are widened and the sum by the row's inv_rms at the end; bias (f32
// [n_out]) is added to each result; add makes the store out += v (the residual add).
// coherent: x (and out, for the add) were written by other blocks of the running kernel
// (the persistent decode kernel): read through L2 (ld.global.cg), never the non-coherent
// read-only path (__ldg), which may hold a line from before the write.
// amax (NULL: none; row 0 of the batch only): every stored value's argmax_key goes into
// *amax by atomicMax (the greedy draw in the lm_head's epilogue, cuda_argmax_finish).
struct mv_rows {
    float *out;
    const float *x;
    int r0, nr, B, s1, s2;
    const float *nw;
    float eps;
    int add;
    const float *bias;
    int coherent;
    unsigned long long *amax;
};

template <int F>
__device__ __forceinline__ float4 mv_ldx(const float4 *a) {
    if (F & MV_SHARED_X) return *a;
    return (F & MV_COHERENT) ? __ldcg(a) : __ldg(a);
}

__device__ __forceinline__ const float *mv_x(const mv_rows &p, int r, int n_in) {
    return p.x + (size_t)min(r, p.nr - 1) * n_in;
}

// ss + the squares of one 8-element x chunk: the kernels sum each x row's squares from
// the chunks they load for the dot products anyway, instead of a second pass over x
// after the dots (a chain of L2 reads at the end of every warp).
__device__ __forceinline__ float mv_sq8(float ss, float4 a, float4 b) {
    ss = fmaf(a.x, a.x, ss); ss = fmaf(a.y, a.y, ss); ss = fmaf(a.z, a.z, ss); ss = fmaf(a.w, a.w, ss);
    ss = fmaf(b.x, b.x, ss); ss = fmaf(b.y, b.y, ss); ss = fmaf(b.z, b.z, ss); ss = fmaf(b.w, b.w, ss);
    return ss;
}

// 1 / rms of a row from each lane's partial sum of squares; 1 without a folded norm.
__device__ __forceinline__ float mv_inv_rms(const mv_rows &p, float ss, int n_in) {
    return rsqrtf(warp_sum(ss) / (float)n_in + p.eps);
}
template <int F>
__device__ __forceinline__ float mv_inv_from_ss(const mv_rows &p, float ss, int n_in) {
    return (F & MV_NORM) ? mv_inv_rms(p, ss, n_in) : 1.f;
}

// f[0..8) *= the norm's weights g of chunk i (vector kernels; nw 16-byte aligned).
__device__ __forceinline__ void mv_norm8(const mv_rows &p, size_t i, float g[8]) {
    const float4 *n4 = (const float4 *)p.nw + 2 * i;
    float4 a = __ldg(n4), b = __ldg(n4 + 1);
    g[0] = a.x; g[1] = a.y; g[2] = a.z; g[3] = a.w;
    g[4] = b.x; g[5] = b.y; g[6] = b.z; g[7] = b.w;
}

template <int F>
__device__ __forceinline__ void mv_scale8(const mv_rows &p, size_t i, float f[8]) {
    if (!(F & MV_NORM)) return;
    float g[8];
    mv_norm8(p, i, g);
#pragma unroll
    for (int e = 0; e < 8; e++) f[e] *= g[e];
}

__device__ __forceinline__ void mv_store(const mv_rows &p, int r, int o, int n_out, float v) {
    if (r >= p.nr) return;
    // Explicit roundings: nvcc would contract the caller's sum * inv_rms with this add into
    // an FMA in some template instances and not others, and batched rows would no longer
    // equal B == 1 bit for bit (seen on an H200; the emulated device cannot see it).
    if (p.bias) v = __fadd_rn(v, p.bias[o]);
    int b = p.r0 + r;
    float *d;
    if (o < p.s1) d = p.out + (size_t)b * p.s1 + o;
    else if (o < p.s2) d = p.out + (size_t)p.B * p.s1 + (size_t)b * (p.s2 - p.s1) + (o - p.s1);
    else d = p.out + (size_t)p.B * p.s2 + (size_t)b * (n_out - p.s2) + (o - p.s2);
    float s = p.add ? __fadd_rn(p.coherent ? __ldcg(d) : *d, v) : v;
    *d = s;
    if (p.amax && b == 0 && s == s) {  // NaN never wins
        unsigned long long k = argmax_key(s, o);
        if (k > __ldcg(p.amax)) atomicMax(p.amax, k);  // keys only grow: most rows skip the atomic
    }
}

// The raw 16-byte loads of weight chunk i (two for f32) and their widening to fp32, apart,
// so that a loop can issue several chunks' loads before any arithmetic on them.
template <int WT>
__device__ __forceinline__ void ld_w8(const void *w, size_t i, uint4 raw[2]) {
    if (WT == WT_F32) {
        const uint4 *q = (const uint4 *)w + 2 * i;
        raw[0] = __ldg(q);
        raw[1] = __ldg(q + 1);
    } else {
        raw[0] = __ldg((const uint4 *)w + i);
    }
}

template <int WT>
__device__ __forceinline__ void widen_w8(const uint4 raw[2], float f[8]) {
    if (WT == WT_F32) {
        f[0] = __uint_as_float(raw[0].x); f[1] = __uint_as_float(raw[0].y);
        f[2] = __uint_as_float(raw[0].z); f[3] = __uint_as_float(raw[0].w);
        f[4] = __uint_as_float(raw[1].x); f[5] = __uint_as_float(raw[1].y);
        f[6] = __uint_as_float(raw[1].z); f[7] = __uint_as_float(raw[1].w);
    } else {
        unpack8<WT>(raw[0], f);
    }
}

// ---- the weight ring (the persistent kernel's cross-phase prefetch, docs/cuda.md) ----
// A warp's slice of shared memory. The first unit of each matvec phase copies the first
// chunks of its weight rows there (cp_async16) before it waits for its inputs, so those
// bytes stream while the phase before is still running; after the wait the unit reads
// them from the slice and the rest of each row from memory as before. The values are
// the same, and so are the bits. A unit's rows share the slice: row q's first n chunks
// at s[q * n + j], each chunk copied and read by the same lane (no warp barrier).
struct mv_ring {
    uint4 *s;  // shared [cap] 16-byte chunks, this warp's (NULL: no prefetch)
    int cap;
};
// The graph path's: no ring, and every test of one folds away at compile time.
struct mv_noring {};
// A slice filled before the unit runs (the persistent kernel's staged phases: copied by
// ring_fill before the block's wait, landed in it): chunks [0, n) of each row, laid out
// as ring_fill lays them.
struct mv_ring_ready {
    const uint4 *s;
    int n;
};

// Copies the first n chunks of each of the rows at rb[0..rows) (chunk offsets) into the
// slice, asynchronously; returns n (0: nothing copied).
template <int WT>
__device__ __forceinline__ int ring_fill(const mv_noring &, const void *, const size_t *, int, int) {
    return 0;
}
template <int WT>
__device__ __forceinline__ int ring_fill(const mv_ring &r, const void *w, const size_t *rb, int rows, int nv) {
    if (WT == WT_F32 || !r.s) return 0;  // an f32 chunk is two loads: no ring
    int n = min(nv, r.cap / rows), lane = k_tid() & 31;
    for (int q = 0; q < rows; q++)
        for (int j = lane; j < n; j += 32) cp_async16(r.s + q * n + j, (const uint4 *)w + rb[q] + j);
    return n;
}
template <int WT>
__device__ __forceinline__ int ring_fill(const mv_ring_ready &r, const void *, const size_t *, int, int) {
    return r.n;
}
// The lane's copies have landed (after the unit's input wait).
__device__ __forceinline__ void ring_land(const mv_noring &) {}
__device__ __forceinline__ void ring_land(const mv_ring &) { cp_async_wait_all(); }
__device__ __forceinline__ void ring_land(const mv_ring_ready &) {}
// Whether chunk i of a row is in the ring (n: ring_fill's); false at compile time without one.
__device__ __forceinline__ bool ring_has(const mv_noring &, int, int) { return false; }
__device__ __forceinline__ bool ring_has(const mv_ring &, int n, int i) { return i < n; }
__device__ __forceinline__ bool ring_has(const mv_ring_ready &, int n, int i) { return i < n; }
// Ring chunk k (never called without a ring: ring_has is false there).
__device__ __forceinline__ uint4 ring_get(const mv_noring &, int) { return make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ uint4 ring_get(const mv_ring &r, int k) { return r.s[k]; }
__device__ __forceinline__ uint4 ring_get(const mv_ring_ready &r, int k) { return r.s[k]; }

// Zeroes raw with a ring only: every chunk is loaded or taken from the ring before its
// use, which gcc (the emulated device) cannot see; the graph path's code stays as it was.
template <typename Ring, int N>
__device__ __forceinline__ void ring_clear(uint4 (&raw)[N][2]) {
    if constexpr (!std::is_same<Ring, mv_noring>::value) {
#pragma unroll
        for (int c = 0; c < N; c++) raw[c][0] = raw[c][1] = make_uint4(0, 0, 0, 0);
    }
}

// Chunk i of a row, at chunk `at` of w: from the ring when it holds it (i < n; the row's
// chunks start at ring chunk k there), else from memory.
template <int WT, typename Ring>
__device__ __forceinline__ void mv_ld(const Ring &ring, int n, int k, const void *w, size_t at, int i, uint4 raw[2]) {
    if (ring_has(ring, n, i)) raw[0] = ring_get(ring, k + i);
    else ld_w8<WT>(w, at, raw);
}

// Chunks in flight per lane in the one-row-per-warp kernel: one or two 16-byte loads per
// lane left the weight stream latency-bound on rows of 2K-8K elements.
#define MV_INFLIGHT 4

// acc += w chunk i (raw, widened and norm-scaled here) . x chunk i of each row; ss[r]
// gathers row r's squares when a norm is folded.
template <int WT, int R, int F>
__device__ __forceinline__ void mv_chunk(const mv_rows &p, const uint4 raw[2], const float4 *const x4[R], int i,
                                         float acc[R], float ss[R]) {
    float f[8];
    widen_w8<WT>(raw, f);
    mv_scale8<F>(p, i, f);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float4 xa = mv_ldx<F>(x4[r] + 2 * i), xb = mv_ldx<F>(x4[r] + 2 * i + 1);
        acc[r] += dot8(f, xa, xb);
        if (F & MV_NORM) ss[r] = mv_sq8(ss[r], xa, xb);
    }
}

// Vector path: n_in % 8 == 0, w and x 16-byte aligned. R rows share each weight load;
// every row's sums are in the order of the R == 1 kernel, so results do not depend on R.
// Each lane loads IF chunks (i, i+32, ...; MV_INFLIGHT = 4, or 8 in the graph path's deep
// kernel) before it uses any; chunks alternate between two accumulators. A lane's last
// 1 to IF-1 chunks are loaded together too, so a short row (n_in < 32 * 8 * IF; all of
// SmolLM2's at 4) has every chunk in flight before any arithmetic. The sums do not depend
// on IF: chunk m of a lane goes to accumulator m & 1 within whole groups of four and to
// accumulator 0 in the lane's last 0-3, in order, for IF = 4 and 8 alike. The first loads
// go out before wait() (the kernel ahead, in a PDL launch; the producing phase, in the
// persistent kernel), the activations are read after it. One output row of a warp (lane
// 0 stores).
template <int WT, int R, int F, typename Wait, typename Ring = mv_noring, int IF = MV_INFLIGHT>
__device__ __forceinline__ void mv_vec_row(const mv_rows &p, const void *w, int n_in, int n_out, int row,
                                           const Wait &wait, const Ring &ring = Ring()) {
    static_assert(IF == 4 || IF == 8, "the accumulators' order is defined for groups of 4 and 8");
    int lane = k_tid() & 31;
    int nv = n_in / 8;         // 8-element chunks per row
    size_t rbase = (size_t)row * nv;
    const float4 *x4[R];
    float acc[2][R], ss[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        x4[r] = (const float4 *)mv_x(p, r, n_in);
        acc[0][r] = 0.f;
        acc[1][r] = 0.f;
        ss[r] = 0.f;
    }
    int n = ring_fill<WT>(ring, w, &rbase, 1, nv);  // chunks [0, n) come from the ring
    int i = lane;
    uint4 raw[IF][2];
    ring_clear<Ring>(raw);
    bool full = i + 32 * (IF - 1) < nv;
    if (full) {
#pragma unroll
        for (int c = 0; c < IF; c++)
            if (!ring_has(ring, n, i + 32 * c)) ld_w8<WT>(w, rbase + i + 32 * c, raw[c]);
    } else {  // the lane's last chunks, all in flight
#pragma unroll
        for (int c = 0; c < IF - 1; c++)
            if (i + 32 * c < nv && !ring_has(ring, n, i + 32 * c)) ld_w8<WT>(w, rbase + i + 32 * c, raw[c]);
    }
    wait();
    if (n > 0) {
        ring_land(ring);
#pragma unroll
        for (int c = 0; c < IF; c++)
            if (ring_has(ring, n, i + 32 * c)) raw[c][0] = ring_get(ring, i + 32 * c);
    }
    if constexpr (IF == 4 || !std::is_same<Ring, mv_noring>::value) {
        while (full) {
#pragma unroll
            for (int c = 0; c < IF; c++) mv_chunk<WT, R, F>(p, raw[c], x4, i + 32 * c, acc[c & 1], ss);
            i += 32 * IF;
            full = i + 32 * (IF - 1) < nv;
            if (full) {
#pragma unroll
                for (int c = 0; c < IF; c++) mv_ld<WT>(ring, n, 0, w, rbase + i + 32 * c, i + 32 * c, raw[c]);
            } else {
#pragma unroll
                for (int c = 0; c < IF - 1; c++)
                    if (i + 32 * c < nv) mv_ld<WT>(ring, n, 0, w, rbase + i + 32 * c, i + 32 * c, raw[c]);
            }
        }
    } else {
        // 8 deep, the graph path's: each half of the group is reloaded with the next
        // group's chunks as soon as it is summed, so the first half's loads are in flight
        // while the second half is summed (never fewer than 4 a lane). The sums are in the
        // same order. (The persistent kernel's staged units keep the loop above: this one
        // took 10 more registers there and spilled.)
        while (full) {
            int j = i + 32 * IF;
            bool next = j + 32 * (IF - 1) < nv;
#pragma unroll
            for (int c = 0; c < IF / 2; c++) mv_chunk<WT, R, F>(p, raw[c], x4, i + 32 * c, acc[c & 1], ss);
#pragma unroll
            for (int c = 0; c < IF / 2; c++)
                if (next || j + 32 * c < nv) mv_ld<WT>(ring, n, 0, w, rbase + j + 32 * c, j + 32 * c, raw[c]);
#pragma unroll
            for (int c = IF / 2; c < IF; c++) mv_chunk<WT, R, F>(p, raw[c], x4, i + 32 * c, acc[c & 1], ss);
#pragma unroll
            for (int c = IF / 2; c < IF; c++)
                if (next || j + 32 * c < nv) mv_ld<WT>(ring, n, 0, w, rbase + j + 32 * c, j + 32 * c, raw[c]);
            i = j;
            full = next;
        }
    }
    // The lane's last chunks: a whole group of four among them alternates as above
    // (IF = 8 only; at 4 there are at most 3), the rest go to accumulator 0.
    bool four = IF > 4 && i + 32 * 3 < nv;
#pragma unroll
    for (int c = 0; c < IF - 1; c++) {
        if (i + 32 * c >= nv) continue;
        if (c < 4 && (c & 1) && four) mv_chunk<WT, R, F>(p, raw[c], x4, i + 32 * c, acc[1], ss);
        else mv_chunk<WT, R, F>(p, raw[c], x4, i + 32 * c, acc[0], ss);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float acc_r = __fmul_rn(warp_sum(acc[0][r] + acc[1][r]), mv_inv_from_ss<F>(p, ss[r], n_in));
        if (lane == 0) mv_store(p, r, row, n_out, acc_r);
    }
}

// Chunk i of four weight rows (raw, widened here) summed into acc[q][r] against x row r;
// a folded norm's weights are loaded once for the four rows.
template <int WT, int R, int F>
__device__ __forceinline__ void mv4_chunk(const mv_rows &p, const uint4 (&raw)[4][2], const float4 *const x4[R],
                                          int i, float acc[4][R], float ss[R]) {
    float f[4][8];
#pragma unroll
    for (int q = 0; q < 4; q++) widen_w8<WT>(raw[q], f[q]);
    if (F & MV_NORM) {
        float g[8];
        mv_norm8(p, i, g);
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int e = 0; e < 8; e++) f[q][e] *= g[e];
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float4 xa = mv_ldx<F>(x4[r] + 2 * i), xb = mv_ldx<F>(x4[r] + 2 * i + 1);
#pragma unroll
        for (int q = 0; q < 4; q++) acc[q][r] += dot8(f[q], xa, xb);
        if (F & MV_NORM) ss[r] = mv_sq8(ss[r], xa, xb);
    }
}

// acc[q][r] = weight row rb[q] (offset in 8-element chunks) . x row r, for four weight
// rows at once: each lane's x chunk is loaded once for four weight chunks, and four
// 16-byte weight loads are in flight. The order of the sums is fixed (one accumulator
// per row and x row, lane chunks in order), so results do not depend on R. ss[r]: the
// lane's sum of squares of x row r when a norm is folded.
template <int WT, int R, int F, typename Wait, typename Ring>
__device__ __forceinline__ void mv4_dots(const mv_rows &p, const void *w, const size_t rb[4], int n_in,
                                         float acc[4][R], float ss[R], const Wait &wait, const Ring &ring) {
    int lane = k_tid() & 31, nv = n_in / 8;
    const float4 *x4[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        x4[r] = (const float4 *)mv_x(p, r, n_in);
        ss[r] = 0.f;
#pragma unroll
        for (int q = 0; q < 4; q++) acc[q][r] = 0.f;
    }
    int n = ring_fill<WT>(ring, w, rb, 4, nv);  // chunks [0, n) of each row come from the ring
    uint4 raw[4][2];
    ring_clear<Ring>(raw);
    if (lane < nv && !ring_has(ring, n, lane)) {  // the first chunks go out before the wait
#pragma unroll
        for (int q = 0; q < 4; q++) ld_w8<WT>(w, rb[q] + lane, raw[q]);
    }
    wait();
    if (n > 0) {
        ring_land(ring);
        if (ring_has(ring, n, lane)) {
#pragma unroll
            for (int q = 0; q < 4; q++) raw[q][0] = ring_get(ring, q * n + lane);
        }
    }
    for (int i = lane; i < nv; i += 32) {
        if (i != lane) {
#pragma unroll
            for (int q = 0; q < 4; q++) mv_ld<WT>(ring, n, q * n, w, rb[q] + i, i, raw[q]);
        }
        mv4_chunk<WT, R, F>(p, raw, x4, i, acc, ss);
    }
}

// mv4_dots with the next chunk of each row in flight while this one is summed: 8
// 16-byte loads a lane instead of 4 (the graph path's deep kernels, ctx->mv_deep). Two
// sets of registers take chunks in turn, each reloaded as soon as it is summed (a copy
// from one set to the other would wait for its load to land, and keep 4 in flight).
// The sums are mv4_dots', in the same order; only the loads go out earlier. No ring.
template <int WT, int R, int F, typename Wait>
__device__ __forceinline__ void mv4_dots_deep(const mv_rows &p, const void *w, const size_t rb[4], int n_in,
                                              float acc[4][R], float ss[R], const Wait &wait) {
    int lane = k_tid() & 31, nv = n_in / 8;
    const float4 *x4[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        x4[r] = (const float4 *)mv_x(p, r, n_in);
        ss[r] = 0.f;
#pragma unroll
        for (int q = 0; q < 4; q++) acc[q][r] = 0.f;
    }
    uint4 ra[4][2], rb2[4][2];  // chunks lane, lane + 64, ... and lane + 32, lane + 96, ...
#pragma unroll
    for (int q = 0; q < 4; q++) {  // (a set past the row is never summed)
        ra[q][0] = ra[q][1] = make_uint4(0, 0, 0, 0);
        rb2[q][0] = rb2[q][1] = make_uint4(0, 0, 0, 0);
    }
    if (lane < nv) {  // the first two chunks of every row go out before the wait
#pragma unroll
        for (int q = 0; q < 4; q++) ld_w8<WT>(w, rb[q] + lane, ra[q]);
    }
    if (lane + 32 < nv) {
#pragma unroll
        for (int q = 0; q < 4; q++) ld_w8<WT>(w, rb[q] + lane + 32, rb2[q]);
    }
    wait();
    for (int i = lane; i < nv; i += 64) {
        mv4_chunk<WT, R, F>(p, ra, x4, i, acc, ss);
        if (i + 64 < nv) {
#pragma unroll
            for (int q = 0; q < 4; q++) ld_w8<WT>(w, rb[q] + i + 64, ra[q]);
        }
        if (i + 32 >= nv) break;
        mv4_chunk<WT, R, F>(p, rb2, x4, i + 32, acc, ss);
        if (i + 96 < nv) {
#pragma unroll
            for (int q = 0; q < 4; q++) ld_w8<WT>(w, rb[q] + i + 96, rb2[q]);
        }
    }
}

// mv4_dots, or mv4_dots_deep (DEEP: the graph path's, without a ring).
template <int WT, int R, int F, int DEEP, typename Wait, typename Ring>
__device__ __forceinline__ void mv4_dots_of(const mv_rows &p, const void *w, const size_t rb[4], int n_in,
                                            float acc[4][R], float ss[R], const Wait &wait, const Ring &ring) {
    if constexpr (DEEP) {
        static_assert(std::is_same<Ring, mv_noring>::value, "the deep dots take no ring");
        mv4_dots_deep<WT, R, F>(p, w, rb, n_in, acc, ss, wait);
    } else {
        mv4_dots<WT, R, F>(p, w, rb, n_in, acc, ss, wait, ring);
    }
}

// The chunk offsets of the four weight rows of mv_vec4_rows' unit at row0, and of
// mv_glu_pair's at output j0 (the persistent kernel fills its ring from them too).
__device__ __forceinline__ void mv_vec4_bases(size_t rb[4], int n_in, int n_out, int row0) {
#pragma unroll
    for (int q = 0; q < 4; q++) rb[q] = (size_t)min(row0 + q, n_out - 1) * (n_in / 8);
}
__device__ __forceinline__ void mv_glu_bases(size_t rb[4], int n_in, int hid, int j0) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
        rb[q] = (size_t)min(j0 + q, hid - 1) * (n_in / 8);
        rb[2 + q] = (size_t)(hid + min(j0 + q, hid - 1)) * (n_in / 8);
    }
}

// Four weight rows per warp for tall matrices (gate/up, lm_head): rows row0..row0+3 of a
// warp. Weight rows past n_out read row n_out-1 (valid memory) and are not written.
// DEEP: the next chunks in flight while these are summed (mv4_dots_deep; the same bits).
template <int WT, int R, int F, typename Wait, typename Ring = mv_noring, int DEEP = 0>
__device__ __forceinline__ void mv_vec4_rows(const mv_rows &p, const void *w, int n_in, int n_out, int row0,
                                             const Wait &wait, const Ring &ring = Ring()) {
    int lane = k_tid() & 31;
    size_t rb[4];
    mv_vec4_bases(rb, n_in, n_out, row0);
    float acc[4][R], ss[R], inv[R];
    mv4_dots_of<WT, R, F, DEEP>(p, w, rb, n_in, acc, ss, wait, ring);
#pragma unroll
    for (int r = 0; r < R; r++) inv[r] = mv_inv_from_ss<F>(p, ss[r], n_in);
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float a = __fmul_rn(warp_sum(acc[q][r]), inv[r]);
            if (lane == 0 && row0 + q < n_out) mv_store(p, r, row0 + q, n_out, a);
        }
}

// SwiGLU fused into the gate|up matvec. w is [2*hid, n_in]: gate rows, then up rows.
// A warp takes outputs j0, j0+1 and their four weight rows {j, j+1, hid+j, hid+j+1}
// and writes silu(gate) * up, [B, hid]. The dots are mv4_dots' and the product
// swiglu_kernel's: the same bits as the four-rows-per-warp matvec and swiglu_kernel
// in two launches. Rows past hid read row hid-1 and are not written. DEEP: as
// mv_vec4_rows'.
template <int WT, int R, int F, typename Wait, typename Ring = mv_noring, int DEEP = 0>
__device__ __forceinline__ void mv_glu_pair(const mv_rows &p, const void *w, int n_in, int hid, int j0,
                                            const Wait &wait, const Ring &ring = Ring()) {
    int lane = k_tid() & 31;
    size_t rb[4];
    mv_glu_bases(rb, n_in, hid, j0);
    float acc[4][R], ss[R], inv[R];
    mv4_dots_of<WT, R, F, DEEP>(p, w, rb, n_in, acc, ss, wait, ring);
#pragma unroll
    for (int r = 0; r < R; r++) inv[r] = mv_inv_from_ss<F>(p, ss[r], n_in);
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float g = __fmul_rn(warp_sum(acc[q][r]), inv[r]);
            float u = __fmul_rn(warp_sum(acc[2 + q][r]), inv[r]);
            if (lane == 0 && j0 + q < hid) mv_store(p, r, j0 + q, hid, silu_mul(g, u));
        }
}

// Generic path: any n_in / alignment, one element per lane per step.
template <int R, typename Wait>
__device__ __forceinline__ void mv_scalar_row(const mv_rows &p, const void *w, int wt, int n_in, int n_out, int row,
                                              const Wait &wait) {
    int lane = k_tid() & 31;
    size_t rbase = (size_t)row * n_in;
    const float *xr[R];
    float acc[R], ss[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        xr[r] = mv_x(p, r, n_in);
        acc[r] = 0.f;
        ss[r] = 0.f;
    }
    wait();
    for (int i = lane; i < n_in; i += 32) {
        float wv = load_w(w, wt, rbase + i);
        if (p.nw) wv *= p.nw[i];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float xv = p.coherent ? __ldcg(xr[r] + i) : xr[r][i];
            acc[r] = fmaf(wv, xv, acc[r]);
            if (p.nw) ss[r] = fmaf(xv, xv, ss[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float a = __fmul_rn(warp_sum(acc[r]), p.nw ? mv_inv_rms(p, ss[r], n_in) : 1.f);
        if (lane == 0) mv_store(p, r, row, n_out, a);
    }
}

// Which kernel a matrix gets depends only on its shape, the same for every B.
enum { MV_SCALAR, MV_VEC, MV_VEC4 };

// The vector kernels need n_in % 8 == 0 and 16-byte aligned w, x (rows start n_in floats
// apart, so every row keeps x's alignment) and folded norm weights.
static inline bool mv_vectorizable(const void *w, const float *x, int n_in, const float *norm) {
    return n_in % 8 == 0 && is_aligned(w, 16) && is_aligned(x, 16) && (!norm || is_aligned(norm, 16));
}

// The kernel of an n_out x n_in matrix: four weight rows per warp only when that still
// leaves >= 2 blocks per SM.
static inline int mv_kind_rows(const cuda_ctx *ctx, int n_out) {
    return (long)n_out >= 4L * MV_WARPS * 2 * (ctx->n_sm > 0 ? ctx->n_sm : 1) ? MV_VEC4 : MV_VEC;
}
static inline int mv_kind(const cuda_ctx *ctx, const void *w, const float *x, int n_in, int n_out, const float *norm) {
    return mv_vectorizable(w, x, n_in, norm) ? mv_kind_rows(ctx, n_out) : MV_SCALAR;
}

#endif
