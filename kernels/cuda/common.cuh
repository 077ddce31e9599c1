// common.cuh: shared helpers of the CUDA kernels: error macros that name the call,
// file and line; 16-bit float widening; warp and block reductions.
#ifndef VARENT_CUDA_COMMON_CUH
#define VARENT_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include <utility>
#include "kernels/ops_cuda.h"

// Record a failed CUDA runtime call in ctx->err and return -1 from the caller.
#define CUDA_CHECK(ctx, call)                                                          \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess)                                                         \
            return verr_set(&(ctx)->err, "%s failed: %s (%s:%d)", #call,               \
                            cudaGetErrorString(e_), __FILE__, __LINE__);               \
    } while (0)

// After a <<<>>> launch: report a bad configuration (grid, smem) by kernel name.
#define CUDA_CHECK_LAUNCH(ctx, name)                                                   \
    do {                                                                               \
        cudaError_t e_ = cudaGetLastError();                                           \
        if (e_ != cudaSuccess)                                                         \
            return verr_set(&(ctx)->err, "launch of %s failed: %s (%s:%d)", name,      \
                            cudaGetErrorString(e_), __FILE__, __LINE__);               \
        (ctx)->n_launches++;                                                           \
    } while (0)

#define CUBLAS_CHECK(ctx, call)                                                        \
    do {                                                                               \
        cublasStatus_t s_ = (call);                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                               \
            return verr_set(&(ctx)->err, "%s failed: %s (%s:%d)", #call,               \
                            cuda_blas_status(ctx, s_), __FILE__, __LINE__);            \
        (ctx)->n_launches++;                                                           \
    } while (0)

// Argument validation in host wrappers.
#define CUDA_REQUIRE(ctx, cond, ...)                                                   \
    do {                                                                               \
        if (!(cond)) return verr_set(&(ctx)->err, __VA_ARGS__);                        \
    } while (0)

// ---- programmatic dependent launch (sm_90) ---------------------------------------------
// A decode kernel launched with launch_pdl may start while the kernel before it on the
// stream still runs: it loads what that kernel does not write (weights, norm weights,
// old KV rows, the step block, which a copy before the first kernel filled) first, then
// waits at pdl_wait() for it to complete (its writes visible), then reads activations.
// pdl_trigger() lets the kernel after it be scheduled (it still waits at its pdl_wait
// for this one to complete). Both do nothing where there is no PDL (sm_80 PTX; a launch
// without the attribute).
__device__ __forceinline__ void pdl_wait() {
#if defined(VARENT_EMU_DEVICE) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    cudaGridDependencySynchronize();
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(VARENT_EMU_DEVICE) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// threadIdx.x, blockIdx.x and gridDim.x as the shared device functions read them. A
// translation unit that defines KERNEL_FRESH_IDS before its includes (persist.cu) reads
// them afresh at each use, as a volatile move the compiler cannot hoist out of a loop:
// the persistent kernel's layer loop would otherwise keep every value derived from them
// (lanes, warp ids, ring slices, attention rows) in registers across all its phases,
// and spill (145 LDL/STL at head_dim 64, 116 at 128). Elsewhere they are the plain
// reads, and the graph path's code is unchanged.
#if defined(KERNEL_FRESH_IDS) && defined(__CUDA_ARCH__)
#define K_SREG(reg, plain)                          \
    unsigned v;                                     \
    asm volatile("mov.u32 %0, %%" reg ";" : "=r"(v)); \
    return v
#else
#define K_SREG(reg, plain) return plain
#endif
static __device__ __forceinline__ unsigned k_tid() { K_SREG("tid.x", threadIdx.x); }
static __device__ __forceinline__ unsigned k_bid() { K_SREG("ctaid.x", blockIdx.x); }
static __device__ __forceinline__ unsigned k_grid() { K_SREG("nctaid.x", gridDim.x); }
#undef K_SREG

// What a kernel body waits for before it reads activations, called by every thread of
// its warp (or block) after the loads that may go first: the kernel ahead (pdl_waiter,
// when launched with PDL), or nothing.
struct pdl_waiter {
    bool on;
    __device__ __forceinline__ void operator()() const {
        if (on) pdl_wait();
    }
};

// Launches k on ctx->stream, with programmatic dependent launch when ctx->pdl. name: the
// kernel's, for the emulated device's reports (LAUNCH_PDL passes it).
template <typename... P, typename... A>
static inline cudaError_t launch_pdl(const char *name, const cuda_ctx *ctx, void (*k)(P...), dim3 grid, dim3 block,
                                     size_t smem, A &&...a) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    // (positional: the emulated device's threadIdx-style macros take the member names)
    cudaLaunchConfig_t cfg = { grid, block, smem, ctx->stream, attr, ctx->pdl ? 1u : 0u };
#ifdef VARENT_EMU_DEVICE
    return emu_launch_ex(name, &cfg, k, std::forward<A>(a)...);
#else
    (void)name;
    return cudaLaunchKernelEx(&cfg, k, std::forward<A>(a)...);
#endif
}
// LAUNCH_PDL(ctx, (kernel<T>), grid, block, smem, args...): the kernel in parentheses
// when it has template arguments.
#define LAUNCH_PDL(ctx, kernel, grid, block, smem, ...) launch_pdl(#kernel, ctx, kernel, grid, block, smem, __VA_ARGS__)

// After a launch_pdl: its error (or the runtime's last), by kernel name.
#define CUDA_CHECK_LAUNCH_RC(ctx, name, rc)                                            \
    do {                                                                               \
        cudaError_t r_ = (rc), l_ = cudaGetLastError();                                \
        if (r_ == cudaSuccess) r_ = l_;                                                \
        if (r_ != cudaSuccess)                                                         \
            return verr_set(&(ctx)->err, "launch of %s failed: %s (%s:%d)", name,      \
                            cudaGetErrorString(r_), __FILE__, __LINE__);               \
        (ctx)->n_launches++;                                                           \
    } while (0)

// A logit's key for an integer atomicMax argmax: the larger value first, then the smaller
// index (cuda_sample's first index on ties; -0 counts as +0); 0, a cleared slot, is below
// every key (the caller leaves NaN out). cuda_argmax_token turns it back into the index.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    unsigned u = __float_as_uint(v == 0.f ? 0.f : v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xffffffffu - (unsigned)i);
}

static inline unsigned cdiv_u(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
static inline int is_aligned(const void *p, size_t n) { return ((uintptr_t)p % n) == 0; }

// ---- 16-bit floats kept as raw uint16 bits ---------------------------------------
__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)h));
}
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {  // round to nearest even
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Element i of a weight of type t, widened to fp32.
__device__ __forceinline__ float load_w(const void *p, int t, size_t i) {
    if (t == WT_BF16) return bf16_bits_to_f32(((const uint16_t *)p)[i]);
    if (t == WT_F16) return f16_bits_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

// silu(g) * u, as swiglu_kernel and the fused gate|up matvec both compute it (one
// expression: the two paths give the same bits).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Widen 8 packed 16-bit values (one uint4) to fp32.
template <int WT>
__device__ __forceinline__ void unpack8(uint4 v, float f[8]) {
    uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (WT == WT_BF16) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        } else {
            f[2 * i] = f16_bits_to_f32(u[i] & 0xffffu);
            f[2 * i + 1] = f16_bits_to_f32(u[i] >> 16);
        }
    }
}

// ---- RoPE ----------------------------------------------------------------------------
// HF rotate-half of one pair by the angle with sine s and cosine c. Explicit roundings:
// nvcc contracts a * b - c * d into an FMA in some kernels and not others, and the
// kernels that rotate (rope_kernel, rope_kv_store_kernel, the decode attention's fused
// RoPE) must give the same bits.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float s, float c, float &y0, float &y1) {
    y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Rotated pair (j, j + half) of one head at src for position pos, RMS-normalised first
// with inv (head_inv_rms) and the weights nw when nw is set (Qwen3's q/k norm). The
// angle's cosine and sine come from the RoPE table (cuda_rope_table: [n_pos, half] of
// (cos, sin), written before the step by rope_kernel's sincosf, so the same bits).
__device__ __forceinline__ void rope_head_pair(const float *src, int j, int half, float inv, const float *nw,
                                               int pos, const float *tab, float &y0, float &y1) {
    float x0 = __ldcg(src + j), x1 = __ldcg(src + j + half);  // L2: src may be the running kernel's output
    if (nw) {
        x0 = __fmul_rn(__fmul_rn(x0, inv), nw[j]);
        x1 = __fmul_rn(__fmul_rn(x1, inv), nw[j + half]);
    }
    float2 cs = __ldg((const float2 *)tab + (size_t)pos * half + j);
    rope_rotate(x0, x1, cs.y, cs.x, y0, y1);
}

// ---- reductions (blockDim.x a multiple of 32, at most 1024) ------------------------
// (v, i) beats (bv, bi) if v is larger, or equal with a smaller index. NaN never wins.
__device__ __forceinline__ void amax_merge(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}
__device__ __forceinline__ void warp_amax(float &bv, int &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
}
// The winner of every thread's (bv, bi) over the block (NaN never wins; 0 when none
// does). Every thread gets it; sv/si hold >= 33 entries (the last passes the result).
__device__ __forceinline__ int block_amax_finish(float bv, int bi, float *sv, int *si) {
    warp_amax(bv, bi);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
        warp_amax(bv, bi);
        if (lane == 0) si[32] = bi == 0x7fffffff ? 0 : bi;
    }
    __syncthreads();
    int r = si[32];
    __syncthreads();  // sv/si may be reused right after
    return r;
}
// First index of the largest of x[n] over the block (NaN never wins; 0 when all are NaN).
__device__ __forceinline__ int block_argmax(const float *x, int n, float *sv, int *si) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) amax_merge(bv, bi, x[i], i);
    return block_amax_finish(bv, bi, sv, si);
}
// Sums for float, double and 64-bit integer partials alike.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// 1 / rms of one head's hd values at src, by one warp (fp32 squares in lane order); every
// lane gets it.
__device__ __forceinline__ float head_inv_rms(const float *src, int hd, float eps) {
    float ss = 0.f;
    for (int j = threadIdx.x & 31; j < hd; j += 32) {
        float v = __ldcg(src + j);
        ss = fmaf(v, v, ss);
    }
    return rsqrtf(warp_sum(ss) / (float)hd + eps);
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum over the block; every thread gets the result. `sh` holds >= 32 values and may
// be reused right after the call returns (a trailing barrier protects it).
template <typename T>
__device__ __forceinline__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : T(0);
    v = warp_sum(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    v = warp_max(v);
    __syncthreads();
    return v;
}

#endif
