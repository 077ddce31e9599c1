// matmul.cu: out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T.
// T == 1 (decode): hand-written matvec, one warp per output row (four rows per warp
// for tall matrices), 16-byte weight loads (8 bf16/f16 or 2x4 f32), fp32
// accumulation, warp-shuffle reduction. The weight matrix is streamed once, so this
// is bound by memory bandwidth. cuda_matvec_rows runs the same kernels for up to 8
// sequences at once (batched decode), each weight load serving every row.
// T > 1 (prefill): cuBLAS GEMM. Activations are rounded to the weight's 16-bit type
// into scratch (cublasGemmEx needs matching A/B types), fp32 compute, fp32 output.
#include <cublas_v2.h>
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/common.cuh"

#define MV_WARPS 4  // warps per block

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
struct mv_rows {
    float *out;
    const float *x;
    int r0, nr, B, s1, s2;
    const float *nw;
    float eps;
    int add;
    const float *bias;
};

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
__device__ __forceinline__ float mv_inv_from_ss(const mv_rows &p, float ss, int n_in) {
    if (!p.nw) return 1.f;
    return rsqrtf(warp_sum(ss) / (float)n_in + p.eps);
}

// f[0..8) *= the norm's weights g of chunk i (vector kernels; nw 16-byte aligned).
__device__ __forceinline__ void mv_norm8(const mv_rows &p, size_t i, float g[8]) {
    const float4 *n4 = (const float4 *)p.nw + 2 * i;
    float4 a = __ldg(n4), b = __ldg(n4 + 1);
    g[0] = a.x; g[1] = a.y; g[2] = a.z; g[3] = a.w;
    g[4] = b.x; g[5] = b.y; g[6] = b.z; g[7] = b.w;
}

__device__ __forceinline__ void mv_scale8(const mv_rows &p, size_t i, float f[8]) {
    if (!p.nw) return;
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
    *d = p.add ? __fadd_rn(*d, v) : v;
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

// Chunks in flight per lane in the one-row-per-warp kernel: one or two 16-byte loads per
// lane left the weight stream latency-bound on rows of 2K-8K elements.
#define MV_INFLIGHT 4

// acc += w chunk i (raw, widened and norm-scaled here) . x chunk i of each row; ss[r]
// gathers row r's squares when a norm is folded.
template <int WT, int R>
__device__ __forceinline__ void mv_chunk(const mv_rows &p, const uint4 raw[2], const float4 *const x4[R], int i,
                                         float acc[R], float ss[R]) {
    float f[8];
    widen_w8<WT>(raw, f);
    mv_scale8(p, i, f);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float4 xa = __ldg(x4[r] + 2 * i), xb = __ldg(x4[r] + 2 * i + 1);
        acc[r] += dot8(f, xa, xb);
        if (p.nw) ss[r] = mv_sq8(ss[r], xa, xb);
    }
}

// Vector path: n_in % 8 == 0, w and x 16-byte aligned. R rows share each weight load;
// every row's sums are in the order of the R == 1 kernel, so results do not depend on R.
// Each lane loads MV_INFLIGHT chunks (i, i+32, ...) before it uses any; chunks alternate
// between two accumulators.
// grid (cdiv(n_out, MV_WARPS)), block 32*MV_WARPS
template <int WT, int R>
__global__ void matvec_vec_kernel(mv_rows p, const void *w, int n_in, int n_out) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;  // whole warp exits together
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
    int i = lane;
    for (; i + 32 * (MV_INFLIGHT - 1) < nv; i += 32 * MV_INFLIGHT) {
        uint4 raw[MV_INFLIGHT][2];
#pragma unroll
        for (int c = 0; c < MV_INFLIGHT; c++) ld_w8<WT>(w, rbase + i + 32 * c, raw[c]);
#pragma unroll
        for (int c = 0; c < MV_INFLIGHT; c++) mv_chunk<WT, R>(p, raw[c], x4, i + 32 * c, acc[c & 1], ss);
    }
    for (; i < nv; i += 32) {  // the last 0-3 chunks of the lane
        uint4 raw[2];
        ld_w8<WT>(w, rbase + i, raw);
        mv_chunk<WT, R>(p, raw, x4, i, acc[0], ss);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float acc_r = __fmul_rn(warp_sum(acc[0][r] + acc[1][r]), mv_inv_from_ss(p, ss[r], n_in));
        if (lane == 0) mv_store(p, r, row, n_out, acc_r);
    }
}

// acc[q][r] = weight row rb[q] (offset in 8-element chunks) . x row r, for four weight
// rows at once: each lane's x chunk is loaded once for four weight chunks, and four
// 16-byte weight loads are in flight. The order of the sums is fixed (one accumulator
// per row and x row, lane chunks in order), so results do not depend on R. ss[r]: the
// lane's sum of squares of x row r when a norm is folded.
template <int WT, int R>
__device__ __forceinline__ void mv4_dots(const mv_rows &p, const void *w, const size_t rb[4], int n_in,
                                         float acc[4][R], float ss[R]) {
    int lane = threadIdx.x & 31, nv = n_in / 8;
    const float4 *x4[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        x4[r] = (const float4 *)mv_x(p, r, n_in);
        ss[r] = 0.f;
#pragma unroll
        for (int q = 0; q < 4; q++) acc[q][r] = 0.f;
    }
    for (int i = lane; i < nv; i += 32) {
        uint4 raw[4][2];
        float f[4][8];
#pragma unroll
        for (int q = 0; q < 4; q++) ld_w8<WT>(w, rb[q] + i, raw[q]);
#pragma unroll
        for (int q = 0; q < 4; q++) widen_w8<WT>(raw[q], f[q]);
        if (p.nw) {  // the four rows share chunk i's norm weights: one load
            float g[8];
            mv_norm8(p, i, g);
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int e = 0; e < 8; e++) f[q][e] *= g[e];
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float4 xa = __ldg(x4[r] + 2 * i), xb = __ldg(x4[r] + 2 * i + 1);
#pragma unroll
            for (int q = 0; q < 4; q++) acc[q][r] += dot8(f[q], xa, xb);
            if (p.nw) ss[r] = mv_sq8(ss[r], xa, xb);
        }
    }
}

// Four weight rows per warp for tall matrices (gate/up, lm_head). Weight rows past
// n_out read row n_out-1 (valid memory) and are not written.
// grid (cdiv(n_out, 4*MV_WARPS)), block 32*MV_WARPS
template <int WT, int R>
__global__ void matvec_vec4_kernel(mv_rows p, const void *w, int n_in, int n_out) {
    int lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * 4;
    if (row0 >= n_out) return;  // whole warp exits together
    size_t rb[4];
#pragma unroll
    for (int q = 0; q < 4; q++) rb[q] = (size_t)min(row0 + q, n_out - 1) * (n_in / 8);
    float acc[4][R], ss[R], inv[R];
    mv4_dots<WT, R>(p, w, rb, n_in, acc, ss);
#pragma unroll
    for (int r = 0; r < R; r++) inv[r] = mv_inv_from_ss(p, ss[r], n_in);
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float a = __fmul_rn(warp_sum(acc[q][r]), inv[r]);
            if (lane == 0 && row0 + q < n_out) mv_store(p, r, row0 + q, n_out, a);
        }
}

// SwiGLU fused into the gate|up matvec. w is [2*hid, n_in]: gate rows, then up rows.
// Each warp takes outputs j, j+1 and their four weight rows {j, j+1, hid+j, hid+j+1}
// and writes silu(gate) * up, [B, hid]. The dots are mv4_dots' and the product
// swiglu_kernel's: the same bits as the four-rows-per-warp matvec and swiglu_kernel
// in two launches. Rows past hid read row hid-1 and are not written.
// grid (cdiv(hid, 2*MV_WARPS)), block 32*MV_WARPS
template <int WT, int R>
__global__ void matvec_glu_kernel(mv_rows p, const void *w, int n_in, int hid) {
    int lane = threadIdx.x & 31;
    int j0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * 2;
    if (j0 >= hid) return;  // whole warp exits together
    size_t rb[4];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        rb[q] = (size_t)min(j0 + q, hid - 1) * (n_in / 8);
        rb[2 + q] = (size_t)(hid + min(j0 + q, hid - 1)) * (n_in / 8);
    }
    float acc[4][R], ss[R], inv[R];
    mv4_dots<WT, R>(p, w, rb, n_in, acc, ss);
#pragma unroll
    for (int r = 0; r < R; r++) inv[r] = mv_inv_from_ss(p, ss[r], n_in);
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
template <int R>
__global__ void matvec_scalar_kernel(mv_rows p, const void *w, int wt, int n_in, int n_out) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;
    size_t rbase = (size_t)row * n_in;
    const float *xr[R];
    float acc[R], ss[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        xr[r] = mv_x(p, r, n_in);
        acc[r] = 0.f;
        ss[r] = 0.f;
    }
    for (int i = lane; i < n_in; i += 32) {
        float wv = load_w(w, wt, rbase + i);
        if (p.nw) wv *= p.nw[i];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float xv = xr[r][i];
            acc[r] = fmaf(wv, xv, acc[r]);
            if (p.nw) ss[r] = fmaf(xv, xv, ss[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float a = __fmul_rn(warp_sum(acc[r]), mv_inv_from_ss(p, ss[r], n_in));
        if (lane == 0) mv_store(p, r, row, n_out, a);
    }
}

// Which kernel a matrix gets depends only on its shape, the same for every B.
enum { MV_SCALAR, MV_VEC, MV_VEC4 };

template <int R>
static void mv_launch(cuda_ctx *ctx, int kind, const mv_rows &p, wref w, int n_in, int n_out) {
    unsigned block = 32 * MV_WARPS, grid = cdiv_u(n_out, MV_WARPS), grid4 = cdiv_u(n_out, 4 * MV_WARPS);
    cudaStream_t st = ctx->stream;
    if (kind == MV_SCALAR) {
        matvec_scalar_kernel<R><<<grid, block, 0, st>>>(p, w.data, (int)w.type, n_in, n_out);
    } else if (kind == MV_VEC4) {
        if (w.type == WT_BF16) matvec_vec4_kernel<WT_BF16, R><<<grid4, block, 0, st>>>(p, w.data, n_in, n_out);
        else if (w.type == WT_F16) matvec_vec4_kernel<WT_F16, R><<<grid4, block, 0, st>>>(p, w.data, n_in, n_out);
        else matvec_vec4_kernel<WT_F32, R><<<grid4, block, 0, st>>>(p, w.data, n_in, n_out);
    } else {
        if (w.type == WT_BF16) matvec_vec_kernel<WT_BF16, R><<<grid, block, 0, st>>>(p, w.data, n_in, n_out);
        else if (w.type == WT_F16) matvec_vec_kernel<WT_F16, R><<<grid, block, 0, st>>>(p, w.data, n_in, n_out);
        else matvec_vec_kernel<WT_F32, R><<<grid, block, 0, st>>>(p, w.data, n_in, n_out);
    }
}

// The vector kernels need n_in % 8 == 0 and 16-byte aligned w, x (rows start n_in floats
// apart, so every row keeps x's alignment) and folded norm weights.
static bool mv_vectorizable(const void *w, const float *x, int n_in, const cuda_mv_fuse *fz) {
    return n_in % 8 == 0 && is_aligned(w, 16) && is_aligned(x, 16) && (!fz || !fz->norm || is_aligned(fz->norm, 16));
}

static mv_rows mv_rows_of(float *out, const float *x, int r0, int nr, int B, int s1, int s2,
                          const cuda_mv_fuse *fz) {
    mv_rows p = { out, x, r0, nr, B, s1, s2, NULL, 0.f, 0, NULL };
    if (fz) {
        p.nw = fz->norm;
        p.eps = fz->eps;
        p.add = fz->add;
        p.bias = fz->bias;
    }
    return p;
}

extern "C" int cuda_matvec_rows_fused(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out,
                                      int B, int s1, int s2, const cuda_mv_fuse *fz) {
    CUDA_REQUIRE(ctx, n_in > 0 && n_out > 0 && B >= 1 && 0 <= s1 && s1 <= s2 && s2 <= n_out,
                 "cuda_matvec_rows: bad shape n_in=%d n_out=%d B=%d s1=%d s2=%d", n_in, n_out, B, s1, s2);
    CUDA_REQUIRE(ctx, w.type == WT_F32 || w.type == WT_F16 || w.type == WT_BF16,
                 "cuda_matvec_rows: unsupported weight type %d", (int)w.type);
    CUDA_REQUIRE(ctx, !fz || !fz->add || (s1 == n_out && s2 == n_out),
                 "cuda_matvec_rows: the residual add needs the plain layout (s1 = s2 = n_out)");
    int kind = mv_vectorizable(w.data, x, n_in, fz) ? MV_VEC : MV_SCALAR;
    // Four weight rows per warp only when that still leaves >= 2 blocks per SM.
    if (kind == MV_VEC && (long)n_out >= 4L * MV_WARPS * 2 * (ctx->n_sm > 0 ? ctx->n_sm : 1)) kind = MV_VEC4;
    static_assert(CUDA_MATVEC_ROWS == 8, "mv_launch instantiates R = 1, 2, 4, 8");
    for (int r0 = 0; r0 < B; r0 += CUDA_MATVEC_ROWS) {
        int nr = B - r0 < CUDA_MATVEC_ROWS ? B - r0 : CUDA_MATVEC_ROWS;
        mv_rows p = mv_rows_of(out, x + (size_t)r0 * n_in, r0, nr, B, s1, s2, fz);
        if (nr == 1) mv_launch<1>(ctx, kind, p, w, n_in, n_out);
        else if (nr == 2) mv_launch<2>(ctx, kind, p, w, n_in, n_out);
        else if (nr <= 4) mv_launch<4>(ctx, kind, p, w, n_in, n_out);
        else mv_launch<8>(ctx, kind, p, w, n_in, n_out);
        CUDA_CHECK_LAUNCH(ctx, kind == MV_SCALAR ? "matvec_scalar_kernel"
                               : kind == MV_VEC4 ? "matvec_vec4_kernel" : "matvec_vec_kernel");
    }
    return 0;
}

extern "C" int cuda_matvec_rows(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out, int B,
                                int s1, int s2) {
    return cuda_matvec_rows_fused(ctx, out, x, w, n_in, n_out, B, s1, s2, NULL);
}

template <int R>
static void glu_launch(cuda_ctx *ctx, const mv_rows &p, wref w, int n_in, int hid) {
    unsigned grid = cdiv_u(hid, 2 * MV_WARPS), block = 32 * MV_WARPS;
    cudaStream_t st = ctx->stream;
    if (w.type == WT_BF16) matvec_glu_kernel<WT_BF16, R><<<grid, block, 0, st>>>(p, w.data, n_in, hid);
    else if (w.type == WT_F16) matvec_glu_kernel<WT_F16, R><<<grid, block, 0, st>>>(p, w.data, n_in, hid);
    else matvec_glu_kernel<WT_F32, R><<<grid, block, 0, st>>>(p, w.data, n_in, hid);
}

extern "C" int cuda_matvec_glu_rows(cuda_ctx *ctx, float *out, float *tmp, const float *x, wref w, int n_in,
                                    int hid, int B, const cuda_mv_fuse *fz) {
    CUDA_REQUIRE(ctx, n_in > 0 && hid > 0 && B >= 1, "cuda_matvec_glu_rows: bad shape n_in=%d hid=%d B=%d", n_in,
                 hid, B);
    CUDA_REQUIRE(ctx, w.type == WT_F32 || w.type == WT_F16 || w.type == WT_BF16,
                 "cuda_matvec_glu_rows: unsupported weight type %d", (int)w.type);
    CUDA_REQUIRE(ctx, !fz || !fz->add, "cuda_matvec_glu_rows: no residual add into silu(gate) * up");
    if (!mv_vectorizable(w.data, x, n_in, fz)) {  // two launches, as before
        if (cuda_matvec_rows_fused(ctx, tmp, x, w, n_in, 2 * hid, B, hid, 2 * hid, fz)) return -1;
        return cuda_swiglu(ctx, out, tmp, tmp + (size_t)B * hid, (size_t)B * hid);
    }
    for (int r0 = 0; r0 < B; r0 += CUDA_MATVEC_ROWS) {
        int nr = B - r0 < CUDA_MATVEC_ROWS ? B - r0 : CUDA_MATVEC_ROWS;
        mv_rows p = mv_rows_of(out, x + (size_t)r0 * n_in, r0, nr, B, hid, hid, fz);
        if (nr == 1) glu_launch<1>(ctx, p, w, n_in, hid);
        else if (nr == 2) glu_launch<2>(ctx, p, w, n_in, hid);
        else if (nr <= 4) glu_launch<4>(ctx, p, w, n_in, hid);
        else glu_launch<8>(ctx, p, w, n_in, hid);
        CUDA_CHECK_LAUNCH(ctx, "matvec_glu_kernel");
    }
    return 0;
}

extern "C" int cuda_matvec(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out) {
    return cuda_matvec_rows(ctx, out, x, w, n_in, n_out, 1, n_out, n_out);
}

// ---- prefill GEMM ----------------------------------------------------------------------
// dst[n] = round(x[n]) to bf16 (to_f16 == 0) or f16 (to_f16 == 1), raw bits.
__global__ void f32_to_16_kernel(uint16_t *dst, const float *x, size_t n, int to_f16) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dst[i] = to_f16 ? __half_as_ushort(__float2half_rn(x[i])) : f32_to_bf16_bits(x[i]);
}

extern "C" size_t cuda_matmul_scratch_bytes(int max_T, int max_n_in) {
    return (size_t)max_T * (size_t)max_n_in * 2;
}

extern "C" int cuda_matmul(cuda_ctx *ctx, float *out, const float *x, wref w, int T, int n_in,
                           int n_out) {
    CUDA_REQUIRE(ctx, T >= 0 && n_in > 0 && n_out > 0, "cuda_matmul: bad shape T=%d n_in=%d n_out=%d",
                 T, n_in, n_out);
    if (T == 0) return 0;
    if (T == 1) return cuda_matvec(ctx, out, x, w, n_in, n_out);
    const float alpha = 1.f, beta = 0.f;
    cublasHandle_t h = (cublasHandle_t)ctx->cublas;
    // Row-major out[T, n_out] is column-major out^T [n_out, T] = W x^T with W stored
    // column-major as [n_in, n_out] (lda = n_in, transposed) and x^T as [n_in, T].
    if (w.type == WT_F32) {
        CUBLAS_CHECK(ctx, ctx->blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha, w.data,
                                       CUDA_R_32F, n_in, x, CUDA_R_32F, n_in, &beta, out, CUDA_R_32F,
                                       n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    size_t need = cuda_matmul_scratch_bytes(T, n_in);
    CUDA_REQUIRE(ctx, ctx->scratch && ctx->scratch_bytes >= need,
                 "cuda_matmul: scratch too small: need %zu bytes, have %zu (cuda_reserve_scratch)",
                 need, ctx->scratch_bytes);
    size_t n = (size_t)T * n_in;
    int to_f16 = w.type == WT_F16;
    f32_to_16_kernel<<<cdiv_u(n, 256), 256, 0, ctx->stream>>>((uint16_t *)ctx->scratch, x, n, to_f16);
    CUDA_CHECK_LAUNCH(ctx, "f32_to_16_kernel");
    cudaDataType_t dt = to_f16 ? CUDA_R_16F : CUDA_R_16BF;
    CUBLAS_CHECK(ctx, ctx->blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha, w.data, dt,
                                   n_in, ctx->scratch, dt, n_in, &beta, out, CUDA_R_32F, n_out,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}
