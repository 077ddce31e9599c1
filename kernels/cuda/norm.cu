// norm.cu: RMSNorm, optionally fused with the residual add. One block per row.
#include "kernels/cuda/common.cuh"

// out[row] = x[row] * rsqrt(mean(x[row]^2) + eps) * w.
// If y != NULL: x[row] += y[row] first (written back), then normalized.
// grid (rows), block threads_for(dim)
__global__ void rmsnorm_kernel(float *out, float *x, const float *y, const void *w, int wt,
                               int dim, float eps) {
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * dim;
    float *xr = x + base;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (y) {
            v += y[base + i];
            xr[i] = v;  // each element is read back by the same thread below
        }
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    float r = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[base + i] = xr[i] * r * load_w(w, wt, (size_t)i);
}

static int threads_for(int dim) {
    int t = ((dim / 4 + 31) / 32) * 32;  // about 4 elements per thread
    return t < 32 ? 32 : t > 1024 ? 1024 : t;
}

static int rmsnorm_launch(cuda_ctx *ctx, float *out, float *x, const float *y, wref w, int T,
                          int dim, float eps) {
    CUDA_REQUIRE(ctx, T >= 0 && dim > 0, "cuda_rmsnorm: bad shape T=%d dim=%d", T, dim);
    if (T == 0) return 0;
    rmsnorm_kernel<<<T, threads_for(dim), 0, ctx->stream>>>(out, x, y, w.data, (int)w.type, dim, eps);
    CUDA_CHECK_LAUNCH(ctx, "rmsnorm_kernel");
    return 0;
}

extern "C" int cuda_rmsnorm(cuda_ctx *ctx, float *out, const float *x, wref w, int T, int dim,
                            float eps) {
    // x is only written when y != NULL; the cast keeps one kernel for both forms.
    return rmsnorm_launch(ctx, out, (float *)x, NULL, w, T, dim, eps);
}

extern "C" int cuda_rmsnorm_residual(cuda_ctx *ctx, float *out, float *x, const float *y, wref w,
                                     int T, int dim, float eps) {
    CUDA_REQUIRE(ctx, out != x && out != y, "cuda_rmsnorm_residual: out must not alias x or y");
    return rmsnorm_launch(ctx, out, x, y, w, T, dim, eps);
}
