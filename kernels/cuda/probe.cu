// probe.cu: what the machine can do, measured by the project's own kernel: the device
// memory's read bandwidth, the denominator of every "% of bandwidth" figure (varent
// bench --probe, the GPU window's first stage), and the device's facts (SMs, L2,
// clocks, bus width, ECC, driver). The read kernel sums the buffer as 32-bit words so
// nothing can elide the loads, and the sum is checked against the CPU twin
// (cpu_read_checksum) in test_cuda_kernels.
#include <string.h>
#include <time.h>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sync.cuh"

__device__ __forceinline__ uint32_t sum4(uint4 v) { return v.x + v.y + v.z + v.w; }

// partial[block] = the sum of the 16-byte chunks this block's threads read (four loads
// in flight per thread), plus, in block 0, the tail bytes past the last whole chunk
// zero-padded to words. grid: any; block: 256.
__global__ void read_probe_kernel(const uint4 *__restrict__ p, size_t n16, const uint8_t *tail, int n_tail,
                                  uint32_t *partial) {
    __shared__ uint32_t sh[32];
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
        acc += sum4(a) + sum4(b) + sum4(c) + sum4(d);
    }
    for (; i < n16; i += stride) acc += sum4(__ldg(p + i));
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (int k = 0; k < n_tail; k++) acc += (uint32_t)tail[k] << (8 * (k % 4));  // little-endian words
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

enum { PROBE_THREADS = 256, PROBE_BLOCKS_PER_SM = 8 };

// One launch over buf; *ms its time (events), *sum the word sum (needs a scratch of
// n_blocks words: ctx->scratch).
static int read_probe_once(cuda_ctx *ctx, const void *buf, size_t bytes, uint32_t *sum, float *ms) {
    int n_blocks = ctx->n_sm * PROBE_BLOCKS_PER_SM;
    if (cuda_reserve_scratch(ctx, (size_t)n_blocks * sizeof(uint32_t))) return -1;
    uint32_t *partial = (uint32_t *)ctx->scratch;
    size_t n16 = bytes / 16;
    cudaEvent_t e0 = NULL, e1 = NULL;
    CUDA_CHECK(ctx, cudaEventCreate(&e0));
    CUDA_CHECK(ctx, cudaEventCreate(&e1));
    CUDA_CHECK(ctx, cudaEventRecord(e0, ctx->stream));
    read_probe_kernel<<<n_blocks, PROBE_THREADS, 0, ctx->stream>>>((const uint4 *)buf, n16,
                                                                  (const uint8_t *)buf + n16 * 16,
                                                                  (int)(bytes - n16 * 16), partial);
    CUDA_CHECK_LAUNCH(ctx, "read_probe_kernel");
    CUDA_CHECK(ctx, cudaEventRecord(e1, ctx->stream));
    CUDA_CHECK(ctx, cudaEventSynchronize(e1));
    CUDA_CHECK(ctx, cudaEventElapsedTime(ms, e0, e1));
    CUDA_CHECK(ctx, cudaEventDestroy(e0));
    CUDA_CHECK(ctx, cudaEventDestroy(e1));
    uint32_t *host = (uint32_t *)malloc((size_t)n_blocks * sizeof(uint32_t));
    CUDA_REQUIRE(ctx, host != NULL, "cuda_read_probe: out of memory");
    int rc = cuda_download(ctx, host, partial, (size_t)n_blocks * sizeof(uint32_t));
    uint32_t s = 0;
    for (int b = 0; b < n_blocks; b++) s += host[b];
    free(host);
    *sum = s;
    return rc;
}

extern "C" int cuda_read_probe(cuda_ctx *ctx, const void *buf, size_t bytes, uint32_t *sum, float *ms) {
    CUDA_REQUIRE(ctx, is_aligned(buf, 16), "cuda_read_probe: the buffer must be 16-byte aligned");
    return read_probe_once(ctx, buf, bytes, sum, ms);
}

// One thread waits for a counter that nothing releases (the persistent kernel's wait,
// with a timeout): a deadlocked wait, which must trap. grid 1, block 32.
__global__ void wait_probe_kernel(const unsigned *ctr, unsigned long long timeout_ns) {
    if (threadIdx.x == 0) wait_counter_gpu(ctr, 1u, 0u, timeout_ns);
}

extern "C" int cuda_wait_probe(cuda_ctx *ctx, unsigned long long timeout_ns, cudaError_t *end, double *ms) {
    unsigned *ctr = NULL;
    if (cuda_malloc((void **)&ctr, sizeof *ctr, "watchdog probe counter", &ctx->err)) return -1;
    if (cuda_memset(ctx, ctr, 0, sizeof *ctr)) return -1;
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    wait_probe_kernel<<<1, 32, 0, ctx->stream>>>(ctr, timeout_ns);
    CUDA_CHECK_LAUNCH(ctx, "wait_probe_kernel");
    *end = cudaStreamSynchronize(ctx->stream);  // the trap's error, expected
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (*end == cudaSuccess) cuda_free(ctr);  // after a trap the context is gone with it
    return 0;
}

extern "C" int cuda_device_facts(cuda_ctx *ctx, cuda_facts *f) {
    memset(f, 0, sizeof *f);
    cudaDeviceProp p;
    CUDA_CHECK(ctx, cudaGetDeviceProperties(&p, ctx->device));
    snprintf(f->name, sizeof f->name, "%s", p.name);
    f->n_sm = p.multiProcessorCount;
    f->mem_bytes = p.totalGlobalMem;
    CUDA_CHECK(ctx, cudaDeviceGetAttribute(&f->l2_bytes, cudaDevAttrL2CacheSize, ctx->device));
    CUDA_CHECK(ctx, cudaDeviceGetAttribute(&f->sm_clock_khz, cudaDevAttrClockRate, ctx->device));
    CUDA_CHECK(ctx, cudaDeviceGetAttribute(&f->mem_clock_khz, cudaDevAttrMemoryClockRate, ctx->device));
    CUDA_CHECK(ctx, cudaDeviceGetAttribute(&f->bus_bits, cudaDevAttrGlobalMemoryBusWidth, ctx->device));
    CUDA_CHECK(ctx, cudaDeviceGetAttribute(&f->ecc, cudaDevAttrEccEnabled, ctx->device));
    CUDA_CHECK(ctx, cudaDriverGetVersion(&f->driver));
    CUDA_CHECK(ctx, cudaRuntimeGetVersion(&f->runtime));
    return 0;
}

extern "C" int cuda_read_gbs(cuda_ctx *ctx, size_t bytes, int reps, double *gbs, int *checked) {
    *gbs = 0;
    *checked = 0;
    void *buf = NULL;
    if (cuda_malloc(&buf, bytes, "read bandwidth probe", &ctx->err)) return -1;
    // 0x01 in every byte: each word is 0x01010101, so the sum is known without a copy back.
    int rc = cuda_memset(ctx, buf, 1, bytes);
    uint32_t want = (uint32_t)(bytes / 4) * 0x01010101u, sum = 0;
    for (int k = 0; k < (int)(bytes % 4); k++) want += 1u << (8 * k);
    float best = 0, ms = 0;
    for (int r = 0; rc == 0 && r <= reps; r++) {  // the first run warms up and is not counted
        rc = read_probe_once(ctx, buf, bytes, &sum, &ms);
        if (rc == 0 && r > 0 && ms > 0 && (best == 0 || ms < best)) best = ms;
    }
    cuda_free(buf);
    if (rc) return -1;
    *checked = sum == want;
    if (best > 0) *gbs = (double)bytes / (best * 1e-3) / 1e9;
    return 0;
}
