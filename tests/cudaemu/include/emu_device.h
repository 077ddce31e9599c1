// emu_device.h (emulated device): what CUDA kernel code sees when the .cu files are
// compiled as host C++ (tests/cudaemu/, docs/cuda.md "The emulated device"). Each CUDA
// thread is a fiber with its own stack (tests/cudaemu/exec.cpp); threadIdx and friends
// read the running fiber's context; barriers and warp intrinsics block the fiber until
// the threads they name arrive. Launches are rewritten at build time from
// kernel<<<grid, block, smem, stream>>>(args) to emu_launch("kernel", kernel, grid,
// block, smem, stream, args) (tests/cudaemu/rewrite.py), and __shared__ declarations to
// EMU_SHARED / emu::shared_dynamic(), so no kernel body has a second copy.
#ifndef VARENT_EMU_DEVICE_H
#define VARENT_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline))

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

namespace emu {

// The running CUDA thread (one per fiber), set by the scheduler at every switch.
struct thread_ctx {
    uint3 tid, bid;
    uint3 bdim, gdim;
    int linear;  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
    struct async_copies *copies;  // cp.async copies not yet waited for (async.cpp; NULL: none)
};
extern thread_local thread_ctx *cur;

enum warp_kind { WARP_SHFL, WARP_SHFL_XOR, WARP_SHFL_UP, WARP_SHFL_DOWN, WARP_BALLOT, WARP_REDUCE_ADD,
                 WARP_MATCH_ANY, WARP_SYNC, WARP_ANY, WARP_ALL };

void syncthreads(const char *file, int line);
// Blocks until every lane named in mask arrives at the same intrinsic with the same
// mask; returns this lane's result (tests/cudaemu/exec.cpp).
uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int arg, int width, const char *what);
void *shared_static(const void *key, size_t bytes, size_t align);
void *shared_dynamic(void);

// A launch hands the runtime a closure: run(args) per thread, copy (graph capture)
// and destroy.
struct closure_ops {
    void (*run)(void *);
    void *(*copy)(const void *);
    void (*destroy)(void *);
};
cudaError_t launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   void *closure, const closure_ops *ops);
// A launch with attributes (cudaLaunchKernelEx).
struct launch_attrs {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    bool cooperative, pdl;
};
cudaError_t launch_ex(const char *name, const void *func, const launch_attrs &a, void *closure,
                      const closure_ops *ops);

// Co-resident blocks (tests/cudaemu/exec.cpp): the running fiber yields to the others at
// an acquire load (p: what it read, for the deadlock detector) or __nanosleep (p NULL),
// waits until *p >= target, or waits at cudaGridDependencySynchronize for the grid
// before it. progress: events that can let a waiting fiber go on (atomics, fences, ...).
void spin_yield(const void *p, uint64_t value, const char *file, int line);
void wait_geq(const unsigned *p, unsigned target, const char *file, int line);
void grid_dep_sync(const char *file, int line);
extern thread_local unsigned long progress;

// Asynchronous copies into shared memory (cp.async; kernels/cuda/sync.cuh), as a GPU
// may carry them out at the latest (tests/cudaemu/async.cpp): the source is read at the
// issue and its destination poisoned, and the data lands at the issuing thread's
// cp_async_wait_all (or the cp_async_wait_group that covers its group). A read of the
// destination before that wait sees NaN, and a thread that ends with copies it never
// waited for is reported.
void cp_async(void *dst, const void *src, size_t bytes, const char *file, int line);
void cp_async_wait_all(const char *file, int line);
// cp.async.commit_group: the copies issued since the last commit form a group.
// cp.async.wait_group n: every committed group but the newest n has landed (copies not
// yet committed stay in flight).
void cp_async_commit();
void cp_async_wait_group(int n, const char *file, int line);

// %globaltimer: nanoseconds of the host's monotonic clock (tests/cudaemu/runtime.cpp).
unsigned long long globaltimer_ns();

template <typename... P>
struct closure {
    void (*k)(P...);
    std::tuple<typename std::decay<P>::type...> args;
    static void run(void *c) {
        closure *self = static_cast<closure *>(c);
        std::apply(self->k, self->args);
    }
    static void *copy(const void *c) { return new closure(*static_cast<const closure *>(c)); }
    static void destroy(void *c) { delete static_cast<closure *>(c); }
};

template <typename T>
static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp intrinsics move at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T>
static inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

}  // namespace emu

template <typename... P, typename... A>
static inline cudaError_t emu_launch(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t s, A &&...a) {
    static const emu::closure_ops ops = {emu::closure<P...>::run, emu::closure<P...>::copy,
                                         emu::closure<P...>::destroy};
    auto *c = new emu::closure<P...>{k, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
    return emu::launch(name, (const void *)k, grid, block, smem, s, c, &ops);
}

// ---- launches with attributes (cooperative, programmatic dependent launch) ----------------
enum cudaLaunchAttributeID {
    cudaLaunchAttributeIgnore = 0,
    cudaLaunchAttributeCooperative = 2,
    cudaLaunchAttributeProgrammaticStreamSerialization = 6,
    cudaLaunchAttributePriority = 8
};
union cudaLaunchAttributeValue {
    char pad[64];
    int cooperative;
    int programmaticStreamSerializationAllowed;
    int priority;
};
struct cudaLaunchAttribute {
    enum cudaLaunchAttributeID id;
    char pad[8 - sizeof(enum cudaLaunchAttributeID)];
    union cudaLaunchAttributeValue val;
};
typedef struct cudaLaunchConfig_st {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

// cudaLaunchKernelEx(&config, kernel, args...), rewritten by tests/cudaemu/rewrite.py to
// carry the kernel's name.
template <typename... P, typename... A>
static inline cudaError_t emu_launch_ex(const char *name, const cudaLaunchConfig_t *config, void (*k)(P...),
                                        A &&...a) {
    static const emu::closure_ops ops = {emu::closure<P...>::run, emu::closure<P...>::copy,
                                         emu::closure<P...>::destroy};
    emu::launch_attrs at = {config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream, false, false};
    for (unsigned i = 0; i < config->numAttrs; i++) {
        if (config->attrs[i].id == cudaLaunchAttributeCooperative) at.cooperative = config->attrs[i].val.cooperative;
        if (config->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization)
            at.pdl = config->attrs[i].val.programmaticStreamSerializationAllowed;
    }
    auto *c = new emu::closure<P...>{k, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
    return emu::launch_ex(name, (const void *)k, at, c, &ops);
}
template <typename... P, typename... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config, void (*k)(P...), A &&...a) {
    return emu_launch_ex("(cudaLaunchKernelEx)", config, k, std::forward<A>(a)...);
}
template <typename... P>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void (*k)(P...), int block_size,
                                                                        size_t smem) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, (const void *)k, block_size, smem);
}

// Programmatic dependent launch: the dependent grid waits here for the one before it.
#define cudaGridDependencySynchronize() emu::grid_dep_sync(__FILE__, __LINE__)
static inline void cudaTriggerProgrammaticLaunchCompletion(void) {}
// A pause in a spin loop: the other co-resident blocks run meanwhile.
#define __nanosleep(ns) emu::spin_yield(nullptr, (ns), __FILE__, __LINE__)

// CUDA's C++ overload: a kernel by its function.
template <typename... P>
static inline cudaError_t cudaFuncSetAttribute(void (*k)(P...), enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)k, attr, value);
}

// __shared__ T name[dims]; -> EMU_SHARED(T, name, [dims]); one block-wide object per
// declaration, in the block's shared memory (poisoned at block start).
#define EMU_SHARED(T, name, dims)                                                                      \
    static const char emu_key_##name = 0;                                                            \
    auto &name = *reinterpret_cast<T(*) dims>(emu::shared_static(&emu_key_##name, sizeof(T dims),     \
                                                                   alignof(T)))

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::cur->bid)
#define blockDim (emu::cur->bdim)
#define gridDim (emu::cur->gdim)
static constexpr int warpSize = 32;
#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)

// ---- warp intrinsics ----------------------------------------------------------------
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return emu::from_bits<T>(emu::warp_op(emu::WARP_SHFL, mask, emu::to_bits(v), src, width, "__shfl_sync"));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return emu::from_bits<T>(emu::warp_op(emu::WARP_SHFL_XOR, mask, emu::to_bits(v), lane_mask, width, "__shfl_xor_sync"));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu::from_bits<T>(emu::warp_op(emu::WARP_SHFL_UP, mask, emu::to_bits(v), (int)delta, width, "__shfl_up_sync"));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu::from_bits<T>(
        emu::warp_op(emu::WARP_SHFL_DOWN, mask, emu::to_bits(v), (int)delta, width, "__shfl_down_sync"));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)emu::warp_op(emu::WARP_BALLOT, mask, pred != 0, 0, 32, "__ballot_sync");
}
static inline int __any_sync(unsigned mask, int pred) {
    return (int)emu::warp_op(emu::WARP_ANY, mask, pred != 0, 0, 32, "__any_sync");
}
static inline int __all_sync(unsigned mask, int pred) {
    return (int)emu::warp_op(emu::WARP_ALL, mask, pred != 0, 0, 32, "__all_sync");
}
static inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
    return (unsigned)emu::warp_op(emu::WARP_REDUCE_ADD, mask, v, 0, 32, "__reduce_add_sync");
}
template <typename T>
static inline unsigned __match_any_sync(unsigned mask, T v) {
    return (unsigned)emu::warp_op(emu::WARP_MATCH_ANY, mask, emu::to_bits(v), 0, 32, "__match_any_sync");
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_op(emu::WARP_SYNC, mask, 0, 0, 32, "__syncwarp"); }

// ---- integer and bit intrinsics ------------------------------------------------------
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline float __uint_as_float(unsigned u) { return emu::from_bits<float>(u); }
static inline unsigned __float_as_uint(float f) { return (unsigned)emu::to_bits(f); }
static inline float __int_as_float(int u) { return emu::from_bits<float>((unsigned)u); }
static inline int __float_as_int(float f) { return (int)emu::to_bits(f); }
static inline double __longlong_as_double(long long u) { return emu::from_bits<double>((uint64_t)u); }
static inline long long __double_as_longlong(double d) { return (long long)emu::to_bits(d); }
template <typename T>
static inline T __ldg(const T *p) {
    return *p;
}
template <typename T>
static inline T __ldcg(const T *p) {  // L2-only load on a GPU; memory is coherent here
    return *p;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// ---- float intrinsics: the fast-math ones are the plain functions here (their
// exact bits on a GPU differ; docs/cuda.md) ---------------------------------------------
// glibc declares __expf and __logf itself (its internal names of expf and logf)
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }

// ---- atomics: shared memory is touched by one OS thread (the block's fibers take
// turns), global memory by several; __atomic serves both ----------------------------------
#define EMU_ATOMIC_INT(T)                                                                              \
    static inline T atomicAdd(T *p, T v) { return emu::progress++, __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicSub(T *p, T v) { return emu::progress++, __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicOr(T *p, T v) { return emu::progress++, __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicAnd(T *p, T v) { return emu::progress++, __atomic_fetch_and(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicExch(T *p, T v) { return emu::progress++, __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicCAS(T *p, T cmp, T v) {                                                      \
        emu::progress++;                                                                               \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);           \
        return cmp;                                                                                    \
    }                                                                                                  \
    static inline T atomicMax(T *p, T v) {                                                             \
        emu::progress++;                                                                               \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                  \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) \
            ;                                                                                          \
        return old;                                                                                    \
    }                                                                                                  \
    static inline T atomicMin(T *p, T v) {                                                             \
        emu::progress++;                                                                               \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                  \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) \
            ;                                                                                          \
        return old;                                                                                    \
    }
EMU_ATOMIC_INT(int)
EMU_ATOMIC_INT(unsigned)
EMU_ATOMIC_INT(unsigned long long)
#undef EMU_ATOMIC_INT

template <typename F>
static inline F emu_atomic_add_float(F *p, F v) {
    emu::progress++;
    F old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        want = old + v;
    } while (!__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
static inline float atomicAdd(float *p, float v) { return emu_atomic_add_float(p, v); }
static inline double atomicAdd(double *p, double v) { return emu_atomic_add_float(p, v); }

static inline void __threadfence(void) {
    emu::progress++;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#include "cuda_fp16.h"
#include "cuda_bf16.h"

#endif
