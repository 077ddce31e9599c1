// cuda_harness.h: the helpers the CUDA kernel harnesses share (test_cuda_kernels.c,
// test_cuda_batch.c): one context C, a fixed-seed generator, NaN-poisoned device
// buffers, random weights of each type, and the tol + |ref| * eps comparison.
// Include after check.h and kernels/ops_cuda.h, in a VARENT_CUDA build only.
#ifndef VARENT_CUDA_HARNESS_H
#define VARENT_CUDA_HARNESS_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static cuda_ctx C;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline float frand(void) {  // uniform in [-1, 1)
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
}
static inline int irand(int n) { return (int)((frand() * 0.5f + 0.5f) * n) % n; }

static inline void die_ctx(const char *what) {
    printf("FAIL %s: %s\n", what, C.err.msg);
    exit(1);
}
#define OK(call) do { if ((call) != 0) die_ctx(#call); } while (0)
// A direct CUDA runtime call of a bench: FAIL and exit on an error.
#define CK(call)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            printf("FAIL %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)
// A test program's start: 0 with C open on device 0; 1 after "SKIP name" (no device),
// -1 after "FAIL cuda_init" (the program then exits 1).
static inline int harness_open(const char *name) {
    if (cuda_device_count() == 0) {
        printf("SKIP %s: no CUDA device\n", name);
        return 1;
    }
    verr e;
    if (cuda_init(&C, 0, &e)) {
        printf("FAIL cuda_init: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static inline void *dalloc(size_t bytes) {
    void *p;
    verr e;
    if (cuda_malloc(&p, bytes, "test buffer", &e)) { printf("FAIL cuda_malloc: %s\n", e.msg); exit(1); }
    OK(cuda_memset(&C, p, 0xFF, bytes));  // NaN poison
    return p;
}
static inline void *dup_up(const void *h, size_t bytes) {
    void *p = dalloc(bytes);
    OK(cuda_upload(&C, p, h, bytes));
    return p;
}
static inline float *fvec(size_t n, float scale) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}
static inline float *fdown(const void *d, size_t n) {
    float *h = malloc(n * sizeof(float));
    OK(cuda_download(&C, h, d, n * sizeof(float)));
    return h;
}

// Random weight of type t: raw storage (for both backends).
static inline void *wmake(wtype t, size_t n, float scale) {
    void *raw = malloc(n * wtype_size(t));
    for (size_t i = 0; i < n; i++) {
        float f = frand() * scale;
        if (t == WT_F32) ((float *)raw)[i] = f;
        else if (t == WT_BF16) ((uint16_t *)raw)[i] = f32_to_bf16(f);
        else ((uint16_t *)raw)[i] = f32_to_f16(f);
    }
    return raw;
}

static inline void cmp(const char *name, const float *got, const float *ref, long n, float tol, float eps) {
    long bad = check_close(got, ref, n, tol, eps);
    double maxerr = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d > maxerr || d != d) maxerr = d;
    }
    CHECK(bad < 0, name, "at %ld of %ld: gpu %.8g cpu %.8g (max err %.3g)", bad, n,
          bad < 0 ? 0 : got[bad], bad < 0 ? 0 : ref[bad], maxerr);
}

static const wtype TYPES[3] = {WT_F32, WT_F16, WT_BF16};
static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

#endif
