// matmul.cu: out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T.
// T == 1 (decode): hand-written matvec, one warp per output row (four rows per warp
// for tall matrices), 16-byte weight loads (8 bf16/f16 or 2x4 f32), fp32
// accumulation, warp-shuffle reduction. The weight matrix is streamed once, so this
// is bound by memory bandwidth. cuda_matvec_rows runs the same kernels for B sequences
// at once (batched decode): each weight load serves up to 8 rows, and one launch covers
// all B rows in passes of 8 (mv_pass).
// T > 1 (prefill): cuBLAS GEMM. Activations are rounded to the weight's 16-bit type
// into scratch (cublasGemmEx needs matching A/B types), fp32 compute, fp32 output.
#include <cublas_v2.h>
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/matvec.cuh"

// One launch serves every row of the batch in passes of R rows: block i takes pass
// i % passes of tile i / passes, so the passes over one weight tile are neighbours in
// the grid, run together, and the tile comes from DRAM once (the others hit L2). Each
// row's sum is the R == 1 sum whatever its pass, so a row's bits do not depend on B.
// p covers rows [0, p.B) (r0 0, x row 0); the pass's rows are set here.
template <int R>
__device__ __forceinline__ int mv_pass(mv_rows &p, int n_in, int passes) {
    int pass = (int)(blockIdx.x % (unsigned)passes);
    p.r0 = pass * R;
    p.nr = min(R, p.B - p.r0);
    p.x += (size_t)p.r0 * n_in;
    return (int)(blockIdx.x / (unsigned)passes);
}

// The vector kernels are instantiated per weight type WT, rows per pass R and fusion
// flags F (matvec.cuh: MV_NORM when p.nw is set; never MV_COHERENT here).
// grid (passes * cdiv(n_out, MV_WARPS)), block 32*MV_WARPS
template <int WT, int R, int F>
__global__ void matvec_vec_kernel(mv_rows p, const void *w, int n_in, int n_out, int passes) {
    pdl_trigger();
    int row = mv_pass<R>(p, n_in, passes) * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;  // whole warp exits together
    mv_vec_row<WT, R, F>(p, w, n_in, n_out, row, pdl_waiter{true});
}

// One row (R = 1) with 8 chunks a lane in flight instead of 4 (ctx->mv_deep, for rows of
// 2048 elements or more; the same sums, matvec.cuh): twice the bytes in flight a warp,
// for the long rows (down projections) whose warps an SM holds too few of to cover the
// memory's latency at 4. grid cdiv(n_out, MV_WARPS), block 32*MV_WARPS
template <int WT, int F>
__global__ void matvec_deep_kernel(mv_rows p, const void *w, int n_in, int n_out) {
    pdl_trigger();
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;  // whole warp exits together
    mv_vec_row<WT, 1, F, pdl_waiter, mv_noring, 8>(p, w, n_in, n_out, row, pdl_waiter{true});
}

// The four-row and gate|up kernels for one row with the next chunks in flight while
// these are summed (ctx->mv_deep, rows of 512 inputs or more; mv4_dots_deep, the same
// sums). grid cdiv(n_out, 4*MV_WARPS) and cdiv(hid, 2*MV_WARPS), block 32*MV_WARPS
template <int WT, int F>
__global__ void matvec_vec4_deep_kernel(mv_rows p, const void *w, int n_in, int n_out) {
    pdl_trigger();
    int row0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * 4;
    if (row0 >= n_out) return;  // whole warp exits together
    mv_vec4_rows<WT, 1, F, pdl_waiter, mv_noring, 1>(p, w, n_in, n_out, row0, pdl_waiter{true});
}
template <int WT, int F>
__global__ void matvec_glu_deep_kernel(mv_rows p, const void *w, int n_in, int hid) {
    pdl_trigger();
    int j0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * 2;
    if (j0 >= hid) return;  // whole warp exits together
    mv_glu_pair<WT, 1, F, pdl_waiter, mv_noring, 1>(p, w, n_in, hid, j0, pdl_waiter{true});
}

// grid (passes * cdiv(n_out, 4*MV_WARPS)), block 32*MV_WARPS
template <int WT, int R, int F>
__global__ void matvec_vec4_kernel(mv_rows p, const void *w, int n_in, int n_out, int passes) {
    pdl_trigger();
    int row0 = (mv_pass<R>(p, n_in, passes) * MV_WARPS + (threadIdx.x >> 5)) * 4;
    if (row0 >= n_out) return;  // whole warp exits together
    mv_vec4_rows<WT, R, F>(p, w, n_in, n_out, row0, pdl_waiter{true});
}

// grid (passes * cdiv(hid, 2*MV_WARPS)), block 32*MV_WARPS
template <int WT, int R, int F>
__global__ void matvec_glu_kernel(mv_rows p, const void *w, int n_in, int hid, int passes) {
    pdl_trigger();
    int j0 = (mv_pass<R>(p, n_in, passes) * MV_WARPS + (threadIdx.x >> 5)) * 2;
    if (j0 >= hid) return;  // whole warp exits together
    mv_glu_pair<WT, R, F>(p, w, n_in, hid, j0, pdl_waiter{true});
}

template <int R>
__global__ void matvec_scalar_kernel(mv_rows p, const void *w, int wt, int n_in, int n_out, int passes) {
    pdl_trigger();
    int row = mv_pass<R>(p, n_in, passes) * MV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;
    mv_scalar_row<R>(p, w, wt, n_in, n_out, row, pdl_waiter{true});
}


// Whether a one-row vector matvec takes the deep kernel: asked for (ctx->mv_deep) and a
// row of at least 8 chunks a lane (2048 elements), where 8 in flight differ from 4; for
// the four-row and gate|up kernels, at least 2 chunks a lane (512 elements).
static bool mv_deep(const cuda_ctx *ctx, int n_in) { return ctx->mv_deep && n_in >= 32 * 8 * 8; }
static bool mv4_deep(const cuda_ctx *ctx, int n_in) { return ctx->mv_deep && n_in >= 32 * 8 * 2; }

template <int R, int F>
static cudaError_t mv_launch_f(cuda_ctx *ctx, int kind, const mv_rows &p, wref w, int n_in, int n_out) {
    int ps = (p.B + R - 1) / R;
    unsigned block = 32 * MV_WARPS, grid = ps * cdiv_u(n_out, MV_WARPS), grid4 = ps * cdiv_u(n_out, 4 * MV_WARPS);
    if (kind == MV_VEC4 && R == 1 && mv4_deep(ctx, n_in)) {
        ctx->n_mv_deep++;
        if (w.type == WT_BF16) return LAUNCH_PDL(ctx, (matvec_vec4_deep_kernel<WT_BF16, F>), grid4, block, 0, p, w.data, n_in, n_out);
        if (w.type == WT_F16) return LAUNCH_PDL(ctx, (matvec_vec4_deep_kernel<WT_F16, F>), grid4, block, 0, p, w.data, n_in, n_out);
        return LAUNCH_PDL(ctx, (matvec_vec4_deep_kernel<WT_F32, F>), grid4, block, 0, p, w.data, n_in, n_out);
    }
    if (kind == MV_VEC4) {
        if (w.type == WT_BF16) return LAUNCH_PDL(ctx, (matvec_vec4_kernel<WT_BF16, R, F>), grid4, block, 0, p, w.data, n_in, n_out, ps);
        if (w.type == WT_F16) return LAUNCH_PDL(ctx, (matvec_vec4_kernel<WT_F16, R, F>), grid4, block, 0, p, w.data, n_in, n_out, ps);
        return LAUNCH_PDL(ctx, (matvec_vec4_kernel<WT_F32, R, F>), grid4, block, 0, p, w.data, n_in, n_out, ps);
    }
    if (R == 1 && mv_deep(ctx, n_in)) {
        ctx->n_mv_deep++;
        if (w.type == WT_BF16) return LAUNCH_PDL(ctx, (matvec_deep_kernel<WT_BF16, F>), grid, block, 0, p, w.data, n_in, n_out);
        if (w.type == WT_F16) return LAUNCH_PDL(ctx, (matvec_deep_kernel<WT_F16, F>), grid, block, 0, p, w.data, n_in, n_out);
        return LAUNCH_PDL(ctx, (matvec_deep_kernel<WT_F32, F>), grid, block, 0, p, w.data, n_in, n_out);
    }
    if (w.type == WT_BF16) return LAUNCH_PDL(ctx, (matvec_vec_kernel<WT_BF16, R, F>), grid, block, 0, p, w.data, n_in, n_out, ps);
    if (w.type == WT_F16) return LAUNCH_PDL(ctx, (matvec_vec_kernel<WT_F16, R, F>), grid, block, 0, p, w.data, n_in, n_out, ps);
    return LAUNCH_PDL(ctx, (matvec_vec_kernel<WT_F32, R, F>), grid, block, 0, p, w.data, n_in, n_out, ps);
}

template <int R>
static cudaError_t mv_launch(cuda_ctx *ctx, int kind, const mv_rows &p, wref w, int n_in, int n_out) {
    if (kind == MV_SCALAR) {
        int ps = (p.B + R - 1) / R;
        unsigned grid = ps * cdiv_u(n_out, MV_WARPS);
        return LAUNCH_PDL(ctx, matvec_scalar_kernel<R>, grid, 32 * MV_WARPS, 0, p, w.data, (int)w.type, n_in, n_out, ps);
    }
    return p.nw ? mv_launch_f<R, MV_NORM>(ctx, kind, p, w, n_in, n_out) : mv_launch_f<R, 0>(ctx, kind, p, w, n_in, n_out);
}

// Every row of the batch (the kernels pick their pass's rows, mv_pass).
static mv_rows mv_rows_of(float *out, const float *x, int B, int s1, int s2, const cuda_mv_fuse *fz) {
    mv_rows p = { out, x, 0, B, B, s1, s2, NULL, 0.f, 0, NULL, 0, NULL };
    if (fz) {
        p.nw = fz->norm;
        p.eps = fz->eps;
        p.add = fz->add;
        p.bias = fz->bias;
        p.amax = fz->amax;  // row 0's only (mv_store)
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
    CUDA_REQUIRE(ctx, !fz || !fz->amax || (s1 == n_out && s2 == n_out),
                 "cuda_matvec_rows: the argmax epilogue needs the plain layout (s1 = s2 = n_out)");
    int kind = mv_kind(ctx, w.data, x, n_in, n_out, fz ? fz->norm : NULL);
    static_assert(CUDA_MATVEC_ROWS == 8, "mv_launch instantiates R = 1, 2, 4, 8");
    mv_rows p = mv_rows_of(out, x, B, s1, s2, fz);
    cudaError_t rc = B == 1   ? mv_launch<1>(ctx, kind, p, w, n_in, n_out)
                     : B == 2 ? mv_launch<2>(ctx, kind, p, w, n_in, n_out)
                     : B <= 4 ? mv_launch<4>(ctx, kind, p, w, n_in, n_out)
                              : mv_launch<8>(ctx, kind, p, w, n_in, n_out);
    CUDA_CHECK_LAUNCH_RC(ctx, kind == MV_SCALAR ? "matvec_scalar_kernel"
                              : kind == MV_VEC4 ? (B == 1 && mv4_deep(ctx, n_in) ? "matvec_vec4_deep_kernel" : "matvec_vec4_kernel")
                              : B == 1 && mv_deep(ctx, n_in) ? "matvec_deep_kernel" : "matvec_vec_kernel", rc);
    return 0;
}

extern "C" int cuda_matvec_rows(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out, int B,
                                int s1, int s2) {
    return cuda_matvec_rows_fused(ctx, out, x, w, n_in, n_out, B, s1, s2, NULL);
}

template <int R, int F>
static cudaError_t glu_launch_f(cuda_ctx *ctx, const mv_rows &p, wref w, int n_in, int hid) {
    int ps = (p.B + R - 1) / R;
    unsigned grid = ps * cdiv_u(hid, 2 * MV_WARPS), block = 32 * MV_WARPS;
    if (R == 1 && mv4_deep(ctx, n_in)) {
        ctx->n_mv_deep++;
        if (w.type == WT_BF16) return LAUNCH_PDL(ctx, (matvec_glu_deep_kernel<WT_BF16, F>), grid, block, 0, p, w.data, n_in, hid);
        if (w.type == WT_F16) return LAUNCH_PDL(ctx, (matvec_glu_deep_kernel<WT_F16, F>), grid, block, 0, p, w.data, n_in, hid);
        return LAUNCH_PDL(ctx, (matvec_glu_deep_kernel<WT_F32, F>), grid, block, 0, p, w.data, n_in, hid);
    }
    if (w.type == WT_BF16) return LAUNCH_PDL(ctx, (matvec_glu_kernel<WT_BF16, R, F>), grid, block, 0, p, w.data, n_in, hid, ps);
    if (w.type == WT_F16) return LAUNCH_PDL(ctx, (matvec_glu_kernel<WT_F16, R, F>), grid, block, 0, p, w.data, n_in, hid, ps);
    return LAUNCH_PDL(ctx, (matvec_glu_kernel<WT_F32, R, F>), grid, block, 0, p, w.data, n_in, hid, ps);
}

template <int R>
static cudaError_t glu_launch(cuda_ctx *ctx, const mv_rows &p, wref w, int n_in, int hid) {
    return p.nw ? glu_launch_f<R, MV_NORM>(ctx, p, w, n_in, hid) : glu_launch_f<R, 0>(ctx, p, w, n_in, hid);
}

extern "C" int cuda_matvec_glu_rows(cuda_ctx *ctx, float *out, float *tmp, const float *x, wref w, int n_in,
                                    int hid, int B, const cuda_mv_fuse *fz) {
    CUDA_REQUIRE(ctx, n_in > 0 && hid > 0 && B >= 1, "cuda_matvec_glu_rows: bad shape n_in=%d hid=%d B=%d", n_in,
                 hid, B);
    CUDA_REQUIRE(ctx, w.type == WT_F32 || w.type == WT_F16 || w.type == WT_BF16,
                 "cuda_matvec_glu_rows: unsupported weight type %d", (int)w.type);
    CUDA_REQUIRE(ctx, !fz || (!fz->add && !fz->amax), "cuda_matvec_glu_rows: no residual add or argmax epilogue");
    if (!mv_vectorizable(w.data, x, n_in, fz ? fz->norm : NULL)) {  // two launches, as before
        if (cuda_matvec_rows_fused(ctx, tmp, x, w, n_in, 2 * hid, B, hid, 2 * hid, fz)) return -1;
        return cuda_swiglu(ctx, out, tmp, tmp + (size_t)B * hid, (size_t)B * hid);
    }
    mv_rows p = mv_rows_of(out, x, B, hid, hid, fz);
    cudaError_t rc = B == 1   ? glu_launch<1>(ctx, p, w, n_in, hid)
                     : B == 2 ? glu_launch<2>(ctx, p, w, n_in, hid)
                     : B <= 4 ? glu_launch<4>(ctx, p, w, n_in, hid)
                              : glu_launch<8>(ctx, p, w, n_in, hid);
    CUDA_CHECK_LAUNCH_RC(ctx, B == 1 && mv4_deep(ctx, n_in) ? "matvec_glu_deep_kernel" : "matvec_glu_kernel", rc);
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

// out[T, n_out] = x @ w^T by cuBLAS, x given as x (f32 weights) or as its 16-bit
// rounding in ctx->scratch (bf16 / f16 weights: the caller converted it).
static int gemm(cuda_ctx *ctx, float *out, const float *x, wref w, int T, int n_in, int n_out) {
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
    cudaDataType_t dt = w.type == WT_F16 ? CUDA_R_16F : CUDA_R_16BF;
    CUBLAS_CHECK(ctx, ctx->blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha, w.data, dt,
                                   n_in, ctx->scratch, dt, n_in, &beta, out, CUDA_R_32F, n_out,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

// x[T, n_in] rounded to w's 16-bit type into ctx->scratch (nothing for f32 weights).
static int round_x(cuda_ctx *ctx, const char *who, const float *x, wref w, int T, int n_in) {
    if (w.type == WT_F32) return 0;
    size_t need = cuda_matmul_scratch_bytes(T, n_in);
    CUDA_REQUIRE(ctx, ctx->scratch && ctx->scratch_bytes >= need,
                 "%s: scratch too small: need %zu bytes, have %zu (cuda_reserve_scratch)", who, need,
                 ctx->scratch_bytes);
    size_t n = (size_t)T * n_in;
    f32_to_16_kernel<<<cdiv_u(n, 256), 256, 0, ctx->stream>>>((uint16_t *)ctx->scratch, x, n, w.type == WT_F16);
    CUDA_CHECK_LAUNCH(ctx, "f32_to_16_kernel");
    return 0;
}

extern "C" int cuda_matmul(cuda_ctx *ctx, float *out, const float *x, wref w, int T, int n_in,
                           int n_out) {
    CUDA_REQUIRE(ctx, T >= 0 && n_in > 0 && n_out > 0, "cuda_matmul: bad shape T=%d n_in=%d n_out=%d",
                 T, n_in, n_out);
    if (T == 0) return 0;
    if (T == 1) return cuda_matvec(ctx, out, x, w, n_in, n_out);
    if (round_x(ctx, "cuda_matmul", x, w, T, n_in)) return -1;
    return gemm(ctx, out, x, w, T, n_in, n_out);
}

extern "C" int cuda_matmul_parts(cuda_ctx *ctx, float *const *outs, const float *x, wref w, int T, int n_in,
                                 const int *n_outs, int n_parts) {
    CUDA_REQUIRE(ctx, T >= 0 && n_in > 0 && n_parts >= 1, "cuda_matmul_parts: bad shape T=%d n_in=%d, %d parts",
                 T, n_in, n_parts);
    for (int i = 0; i < n_parts; i++)
        CUDA_REQUIRE(ctx, n_outs[i] > 0, "cuda_matmul_parts: part %d has %d rows", i, n_outs[i]);
    if (T == 0) return 0;
    if (T > 1 && round_x(ctx, "cuda_matmul_parts", x, w, T, n_in)) return -1;
    size_t row0 = 0;
    for (int i = 0; i < n_parts; i++) {
        wref wi = { (const char *)w.data + row0 * n_in * wtype_size(w.type), w.type };
        int rc = T == 1 ? cuda_matvec(ctx, outs[i], x, wi, n_in, n_outs[i]) : gemm(ctx, outs[i], x, wi, T, n_in, n_outs[i]);
        if (rc) return rc;
        row0 += (size_t)n_outs[i];
    }
    return 0;
}
