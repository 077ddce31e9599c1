// vocab.cu: per-row statistics over the vocabulary in one pass, and argmax.
//
// vocab_stats keeps, per thread, the online state over its logits x with running max m:
//   s0 = sum e^(x-m),  s1 = sum e^(x-m) (x-m),  s2 = sum e^(x-m) (x-m)^2
// and merges states (rescaling to the larger max) across the warp, then the block.
// With p = e^(x-m)/s0 and y = x - m:
//   lse = m + ln s0,   H = ln s0 - s1/s0 (nats),   V = s2/s0 - (s1/s0)^2 (nats^2),
// reported in bits: H / ln 2 and V / (ln 2)^2.
#include <limits.h>
#include "kernels/cuda/common.cuh"

#define VOCAB_THREADS 1024

struct vstate {
    float m, s0, s1, s2;
};

// Re-express a state relative to a new max mn >= st.m: y' = y + d with d = st.m - mn.
__device__ __forceinline__ vstate vstate_rescale(vstate st, float mn) {
    if (st.s0 == 0.f) return vstate{mn, 0.f, 0.f, 0.f};  // empty (m = -inf)
    float d = st.m - mn, f = expf(d);
    vstate r;
    r.m = mn;
    r.s0 = f * st.s0;
    r.s1 = f * (st.s1 + d * st.s0);
    r.s2 = f * (st.s2 + 2.f * d * st.s1 + d * d * st.s0);
    return r;
}

__device__ __forceinline__ vstate vstate_merge(vstate a, vstate b) {
    if (b.s0 == 0.f) return a;
    if (a.s0 == 0.f) return b;
    float mn = fmaxf(a.m, b.m);
    a = vstate_rescale(a, mn);
    b = vstate_rescale(b, mn);
    return vstate{mn, a.s0 + b.s0, a.s1 + b.s1, a.s2 + b.s2};
}

__device__ __forceinline__ vstate vstate_add(vstate st, float x) {
    if (x == -INFINITY) return st;  // masked logit: probability 0
    if (st.s0 == 0.f) return vstate{x, 1.f, 0.f, 0.f};
    if (x > st.m) {
        st = vstate_rescale(st, x);
        st.s0 += 1.f;  // the new max contributes e^0 = 1, y = 0
        return st;
    }
    float y = x - st.m, e = expf(y);  // NaN x propagates through y
    st.s0 += e;
    st.s1 = fmaf(e, y, st.s1);
    st.s2 = fmaf(e * y, y, st.s2);
    return st;
}

// Merge the states of a warp's 32 lanes; every lane gets the result.
__device__ __forceinline__ vstate warp_vmerge(vstate st) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        vstate b;
        b.m = __shfl_xor_sync(0xffffffffu, st.m, o);
        b.s0 = __shfl_xor_sync(0xffffffffu, st.s0, o);
        b.s1 = __shfl_xor_sync(0xffffffffu, st.s1, o);
        b.s2 = __shfl_xor_sync(0xffffffffu, st.s2, o);
        st = vstate_merge(st, b);
    }
    return st;
}

// grid (rows), block VOCAB_THREADS; out[row*4 + {0,1,2,3}] = {max, lse, H bits, V bits^2}
__global__ void vocab_stats_kernel(float *out, const float *logits, int n) {
    __shared__ vstate sh[32];
    const float *x = logits + (size_t)blockIdx.x * n;
    vstate st = {-INFINITY, 0.f, 0.f, 0.f};
    for (int i = threadIdx.x; i < n; i += blockDim.x) st = vstate_add(st, x[i]);
    st = warp_vmerge(st);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = st;
    __syncthreads();
    if (warp != 0) return;
    st = lane < nw ? sh[lane] : vstate{-INFINITY, 0.f, 0.f, 0.f};
    st = warp_vmerge(st);
    if (lane == 0) {
        const float LN2 = 0.69314718055994531f;
        float mean_y = st.s1 / st.s0;
        float h = logf(st.s0) - mean_y;
        float v = fmaxf(st.s2 / st.s0 - mean_y * mean_y, 0.f);
        float *o = out + (size_t)blockIdx.x * 4;
        o[0] = st.m;
        o[1] = st.m + logf(st.s0);
        o[2] = h / LN2;
        o[3] = v / (LN2 * LN2);
    }
}

extern "C" int cuda_vocab_stats(cuda_ctx *ctx, float *out, const float *logits, int rows, int n) {
    CUDA_REQUIRE(ctx, rows >= 0 && n > 0, "cuda_vocab_stats: bad shape rows=%d n=%d", rows, n);
    if (rows == 0) return 0;
    vocab_stats_kernel<<<rows, VOCAB_THREADS, 0, ctx->stream>>>(out, logits, n);
    CUDA_CHECK_LAUNCH(ctx, "vocab_stats_kernel");
    return 0;
}

// ---- argmax -------------------------------------------------------------------------------
// grid (rows), block VOCAB_THREADS
__global__ void argmax_kernel(int *out, const float *logits, int n) {
    __shared__ float sv[33];
    __shared__ int si[33];
    int best = block_argmax(logits + (size_t)blockIdx.x * n, n, sv, si);
    if (threadIdx.x == 0) out[blockIdx.x] = best;
}

extern "C" int cuda_argmax(cuda_ctx *ctx, int *out, const float *logits, int rows, int n) {
    CUDA_REQUIRE(ctx, rows >= 0 && n > 0, "cuda_argmax: bad shape rows=%d n=%d", rows, n);
    if (rows == 0) return 0;
    argmax_kernel<<<rows, VOCAB_THREADS, 0, ctx->stream>>>(out, logits, n);
    CUDA_CHECK_LAUNCH(ctx, "argmax_kernel");
    return 0;
}
