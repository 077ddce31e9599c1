// matmul.cu: out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T.
// T == 1 (decode): hand-written matvec, one warp per output row (four rows per warp
// for tall matrices), 16-byte weight loads (8 bf16/f16 or 2x4 f32), fp32
// accumulation, warp-shuffle reduction. The weight matrix is streamed once, so this
// is bound by memory bandwidth.
// T > 1 (prefill): cuBLAS GEMM. Activations are rounded to the weight's 16-bit type
// into scratch (cublasGemmEx needs matching A/B types), fp32 compute, fp32 output.
#include <cublas_v2.h>
#include "kernels/cuda/common.cuh"

#define MV_WARPS 4  // warps per block

// 8 consecutive weights starting at element 8*i, widened to fp32.
template <int WT>
__device__ __forceinline__ void load_w8(const void *w, size_t i, float f[8]) {
    if (WT == WT_F32) {
        const float4 *p = (const float4 *)w + 2 * i;
        float4 a = __ldg(p), b = __ldg(p + 1);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    } else {
        unpack8<WT>(__ldg((const uint4 *)w + i), f);
    }
}

__device__ __forceinline__ float dot8(const float f[8], float4 a, float4 b) {
    float s = f[0] * a.x;
    s = fmaf(f[1], a.y, s); s = fmaf(f[2], a.z, s); s = fmaf(f[3], a.w, s);
    s = fmaf(f[4], b.x, s); s = fmaf(f[5], b.y, s); s = fmaf(f[6], b.z, s);
    s = fmaf(f[7], b.w, s);
    return s;
}

// Vector path: n_in % 8 == 0, w and x 16-byte aligned.
// grid (cdiv(n_out, MV_WARPS)), block 32*MV_WARPS
template <int WT>
__global__ void matvec_vec_kernel(float *out, const float *x, const void *w, int n_in, int n_out) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;  // whole warp exits together
    int nv = n_in / 8;         // 8-element chunks per row
    size_t rbase = (size_t)row * nv;
    const float4 *x4 = (const float4 *)x;
    float acc0 = 0.f, acc1 = 0.f;
    int i = lane;
    // Two chunks in flight per lane per iteration for memory-level parallelism.
    for (; i + 32 < nv; i += 64) {
        float f0[8], f1[8];
        load_w8<WT>(w, rbase + i, f0);
        load_w8<WT>(w, rbase + i + 32, f1);
        acc0 += dot8(f0, __ldg(x4 + 2 * i), __ldg(x4 + 2 * i + 1));
        acc1 += dot8(f1, __ldg(x4 + 2 * (i + 32)), __ldg(x4 + 2 * (i + 32) + 1));
    }
    if (i < nv) {
        float f0[8];
        load_w8<WT>(w, rbase + i, f0);
        acc0 += dot8(f0, __ldg(x4 + 2 * i), __ldg(x4 + 2 * i + 1));
    }
    float acc = warp_sum(acc0 + acc1);
    if (lane == 0) out[row] = acc;
}

// Four rows per warp for tall matrices (gate/up, lm_head): each lane's x chunk is
// loaded once for four weight chunks, and four 16-byte weight loads are in flight.
// Rows past n_out read row n_out-1 (valid memory) and are not written.
// grid (cdiv(n_out, 4*MV_WARPS)), block 32*MV_WARPS
template <int WT>
__global__ void matvec_vec4_kernel(float *out, const float *x, const void *w, int n_in, int n_out) {
    int lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * 4;
    if (row0 >= n_out) return;  // whole warp exits together
    int nv = n_in / 8;
    size_t rb[4];
#pragma unroll
    for (int r = 0; r < 4; r++) rb[r] = (size_t)min(row0 + r, n_out - 1) * nv;
    const float4 *x4 = (const float4 *)x;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = lane; i < nv; i += 32) {
        float f[4][8];
#pragma unroll
        for (int r = 0; r < 4; r++) load_w8<WT>(w, rb[r] + i, f[r]);
        float4 xa = __ldg(x4 + 2 * i), xb = __ldg(x4 + 2 * i + 1);
#pragma unroll
        for (int r = 0; r < 4; r++) acc[r] += dot8(f[r], xa, xb);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        float a = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < n_out) out[row0 + r] = a;
    }
}

// Generic path: any n_in / alignment, one element per lane per step.
__global__ void matvec_scalar_kernel(float *out, const float *x, const void *w, int wt, int n_in,
                                     int n_out) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;
    size_t rbase = (size_t)row * n_in;
    float acc = 0.f;
    for (int i = lane; i < n_in; i += 32) acc = fmaf(load_w(w, wt, rbase + i), x[i], acc);
    acc = warp_sum(acc);
    if (lane == 0) out[row] = acc;
}

extern "C" int cuda_matvec(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out) {
    CUDA_REQUIRE(ctx, n_in > 0 && n_out > 0, "cuda_matvec: bad shape n_in=%d n_out=%d", n_in, n_out);
    unsigned grid = cdiv_u(n_out, MV_WARPS), block = 32 * MV_WARPS;
    int vec = n_in % 8 == 0 && is_aligned(w.data, 16) && is_aligned(x, 16);
    if (!vec) {
        matvec_scalar_kernel<<<grid, block, 0, ctx->stream>>>(out, x, w.data, (int)w.type, n_in, n_out);
        CUDA_CHECK_LAUNCH(ctx, "matvec_scalar_kernel");
        return 0;
    }
    // Four rows per warp only when that still leaves >= 2 blocks per SM.
    if ((long)n_out >= 4L * MV_WARPS * 2 * (ctx->n_sm > 0 ? ctx->n_sm : 1)) {
        unsigned grid4 = cdiv_u(n_out, 4 * MV_WARPS);
        switch (w.type) {
        case WT_BF16:
            matvec_vec4_kernel<WT_BF16><<<grid4, block, 0, ctx->stream>>>(out, x, w.data, n_in, n_out);
            break;
        case WT_F16:
            matvec_vec4_kernel<WT_F16><<<grid4, block, 0, ctx->stream>>>(out, x, w.data, n_in, n_out);
            break;
        default:
            matvec_vec4_kernel<WT_F32><<<grid4, block, 0, ctx->stream>>>(out, x, w.data, n_in, n_out);
            break;
        }
        CUDA_CHECK_LAUNCH(ctx, "matvec_vec4_kernel");
        return 0;
    }
    switch (w.type) {
    case WT_BF16:
        matvec_vec_kernel<WT_BF16><<<grid, block, 0, ctx->stream>>>(out, x, w.data, n_in, n_out);
        break;
    case WT_F16:
        matvec_vec_kernel<WT_F16><<<grid, block, 0, ctx->stream>>>(out, x, w.data, n_in, n_out);
        break;
    default:
        matvec_vec_kernel<WT_F32><<<grid, block, 0, ctx->stream>>>(out, x, w.data, n_in, n_out);
        break;
    }
    CUDA_CHECK_LAUNCH(ctx, "matvec_vec_kernel");
    return 0;
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
        CUBLAS_CHECK(ctx, cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha, w.data,
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
    CUBLAS_CHECK(ctx, cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha, w.data, dt,
                                   n_in, ctx->scratch, dt, n_in, &beta, out, CUDA_R_32F, n_out,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}
