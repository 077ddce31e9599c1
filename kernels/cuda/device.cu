// device.cu: device discovery, context (stream + cuBLAS handle), allocation with
// readable out-of-memory messages, scratch, copies.
#include <stdlib.h>
#include <string.h>
#include <cublas_v2.h>
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/common.cuh"

extern "C" int cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear the non-sticky "no driver / no device" error
        return 0;
    }
    return n < 0 ? 0 : n;
}

extern "C" int cuda_init(cuda_ctx *ctx, int device, verr *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->device = device;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return verr_set(err, "no CUDA device available (%s); run with the CPU backend",
                        e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    }
    if (device < 0 || device >= n)
        return verr_set(err, "CUDA device %d does not exist (%d device%s found)", device, n,
                        n == 1 ? "" : "s");
#define INIT_CHECK(call)                                                               \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            verr_set(err, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_),      \
                     __FILE__, __LINE__);                                              \
            cuda_destroy(ctx);                                                         \
            return -1;                                                                 \
        }                                                                              \
    } while (0)
    INIT_CHECK(cudaSetDevice(device));
    INIT_CHECK(cudaDeviceGetAttribute(&ctx->n_sm, cudaDevAttrMultiProcessorCount, device));
    INIT_CHECK(cudaDeviceGetAttribute(&ctx->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    INIT_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    int major = 0;
    INIT_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const char *pdl = getenv("VARENT_CUDA_PDL");
    ctx->pdl = major >= 9 && !(pdl && !strcmp(pdl, "0"));  // programmatic dependent launch: sm_90
    const char *deep = getenv("VARENT_CUDA_MV_DEEP");
    ctx->mv_deep = deep && !strcmp(deep, "1");
    const char *ask = getenv("VARENT_CUDA_ATT_SPLIT_KEYS");
    ctx->att_split_keys = ask && *ask ? atoi(ask) : -1;
    const char *pt = getenv("VARENT_CUDA_PREFILL_TILED");
    ctx->prefill_tiled = !(pt && !strcmp(pt, "0"));
#undef INIT_CHECK
    ctx->blas = (struct cuda_blas *)calloc(1, sizeof *ctx->blas);
    if (!ctx->blas || cuda_blas_load(ctx->blas, err)) {
        if (!ctx->blas) verr_set(err, "out of memory");
        cuda_destroy(ctx);
        return -1;
    }
    cublasHandle_t h = NULL;
    cublasStatus_t s = ctx->blas->create(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        verr_set(err, "cublasCreate failed: %s (%s:%d)", cuda_blas_status(ctx, s), __FILE__,
                 __LINE__);
        cuda_destroy(ctx);
        return -1;
    }
    ctx->cublas = h;
    s = ctx->blas->set_stream(h, ctx->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        verr_set(err, "cublasSetStream failed: %s (%s:%d)", cuda_blas_status(ctx, s), __FILE__,
                 __LINE__);
        cuda_destroy(ctx);
        return -1;
    }
    return 0;
}

extern "C" void cuda_destroy(cuda_ctx *ctx) {
    if (!ctx) return;
    // Teardown: errors here cannot be acted on; clear them so they do not leak into
    // the next call's cudaGetLastError.
    if (ctx->scratch) cudaFree(ctx->scratch);
    if (ctx->att_count) cudaFree(ctx->att_count);
    if (ctx->sample_buf) cudaFree(ctx->sample_buf);
    if (ctx->cublas) ctx->blas->destroy(ctx->cublas);
    free(ctx->blas);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    cudaGetLastError();
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    ctx->att_count = NULL;
    ctx->att_count_n = 0;
    ctx->sample_buf = NULL;
    ctx->sample_bytes = 0;
    ctx->cublas = NULL;
    ctx->blas = NULL;
    ctx->stream = NULL;
}

extern "C" int cuda_malloc(void **p, size_t bytes, const char *what, verr *err) {
    *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) return 0;
    cudaGetLastError();  // cudaErrorMemoryAllocation is not sticky
    *p = NULL;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return verr_set(err, "cudaMalloc of %zu bytes for %s failed: %s", bytes,
                        what ? what : "buffer", cudaGetErrorString(e));
    }
    return verr_set(err,
                    "cudaMalloc of %zu bytes (%.1f MiB) for %s failed: %s; device has %zu "
                    "bytes (%.1f MiB) free of %zu (%.1f MiB)",
                    bytes, bytes / 1048576.0, what ? what : "buffer", cudaGetErrorString(e),
                    free_b, free_b / 1048576.0, total_b, total_b / 1048576.0);
}

extern "C" void cuda_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" int cuda_reserve_scratch(cuda_ctx *ctx, size_t bytes) {
    if (bytes <= ctx->scratch_bytes) return 0;
    // The old scratch may still be read by queued kernels.
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    if (ctx->scratch) CUDA_CHECK(ctx, cudaFree(ctx->scratch));
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    bytes = (bytes + 255) & ~(size_t)255;
    if (cuda_malloc(&ctx->scratch, bytes, "kernel scratch", &ctx->err)) return -1;
    ctx->scratch_bytes = bytes;
    return 0;
}

extern "C" int cuda_reserve_attention(cuda_ctx *ctx, int n) {
    if (n <= ctx->att_count_n) return 0;
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));  // queued kernels may use the old ones
    if (ctx->att_count) CUDA_CHECK(ctx, cudaFree(ctx->att_count));
    ctx->att_count = NULL;
    ctx->att_count_n = 0;
    if (cuda_malloc((void **)&ctx->att_count, (size_t)n * sizeof(unsigned), "attention counters", &ctx->err))
        return -1;
    CUDA_CHECK(ctx, cudaMemset(ctx->att_count, 0, (size_t)n * sizeof(unsigned)));
    ctx->att_count_n = n;
    return 0;
}

extern "C" int cuda_upload(cuda_ctx *ctx, void *dst_dev, const void *src_host, size_t bytes) {
    if (bytes == 0) return 0;
    CUDA_CHECK(ctx, cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    ctx->n_syncs++;
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return 0;
}

extern "C" int cuda_download(cuda_ctx *ctx, void *dst_host, const void *src_dev, size_t bytes) {
    if (bytes == 0) return 0;
    CUDA_CHECK(ctx, cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    ctx->n_syncs++;
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return 0;
}

extern "C" int cuda_memset(cuda_ctx *ctx, void *p, int byte, size_t bytes) {
    if (bytes == 0) return 0;
    CUDA_CHECK(ctx, cudaMemsetAsync(p, byte, bytes, ctx->stream));
    return 0;
}

extern "C" int cuda_sync(cuda_ctx *ctx) {
    ctx->n_syncs++;
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return 0;
}

extern "C" int cuda_activate(cuda_ctx *ctx) {
    CUDA_CHECK(ctx, cudaSetDevice(ctx->device));
    return 0;
}

extern "C" int cuda_copy_2d(cuda_ctx *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t height) {
    if (width == 0 || height == 0) return 0;
    CUDA_CHECK(ctx, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                      cudaMemcpyDeviceToDevice, ctx->stream));
    return 0;
}

extern "C" int cuda_copy_gbs(cuda_ctx *ctx, double *gbs) {
    *gbs = 0;
    size_t free_b = 0, total_b = 0, n = (size_t)256 << 20;
    CUDA_CHECK(ctx, cudaMemGetInfo(&free_b, &total_b));
    while (n > ((size_t)1 << 20) && 2 * n + ((size_t)64 << 20) > free_b) n /= 2;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    float best_ms = 0;
    if (cuda_malloc(&a, n, "copy bench", &ctx->err) || cuda_malloc(&b, n, "copy bench", &ctx->err))
        goto out;
#define COPY_CHECK(call)                                                               \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            verr_set(&ctx->err, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_),\
                     __FILE__, __LINE__);                                              \
            goto out;                                                                  \
        }                                                                              \
    } while (0)
    COPY_CHECK(cudaEventCreate(&e0));
    COPY_CHECK(cudaEventCreate(&e1));
    COPY_CHECK(cudaMemsetAsync(a, 1, n, ctx->stream));
    COPY_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, ctx->stream));  // warm-up
    for (int r = 0; r < 5; r++) {
        COPY_CHECK(cudaEventRecord(e0, ctx->stream));
        COPY_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, ctx->stream));
        COPY_CHECK(cudaEventRecord(e1, ctx->stream));
        COPY_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        COPY_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
    }
#undef COPY_CHECK
    if (best_ms > 0) *gbs = 2.0 * (double)n / (best_ms * 1e-3) / 1e9;
    rc = 0;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cuda_free(a);
    cuda_free(b);
    return rc;
}

extern "C" int cuda_describe(cuda_ctx *ctx, char *buf, size_t n) {
    cudaDeviceProp p;
    CUDA_CHECK(ctx, cudaGetDeviceProperties(&p, ctx->device));
    snprintf(buf, n, "%s, %d SMs, %.1f GiB", p.name, p.multiProcessorCount,
             p.totalGlobalMem / 1073741824.0);
    return 0;
}
