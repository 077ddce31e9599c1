// matmul.c: out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T with fp32 accumulation.
// Weights stay in their stored dtype and are widened in registers: decode is
// memory-bound, so streaming bf16 moves half the bytes of fp32. Rows of w are split
// across threads; each weight row is read once and dotted with all T inputs.
#include <omp.h>

#include "kernels/ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 load8_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256 load8_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

// Two accumulators per input row hide the FMA latency.
#define DOT_BODY(LOAD_W)                                                   \
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();             \
    int i = 0;                                                             \
    for (; i + 16 <= n; i += 16) {                                         \
        a0 = _mm256_fmadd_ps(LOAD_W(w + i), _mm256_loadu_ps(x + i), a0);   \
        a1 = _mm256_fmadd_ps(LOAD_W(w + i + 8), _mm256_loadu_ps(x + i + 8), a1); \
    }                                                                      \
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD_W(w + i), _mm256_loadu_ps(x + i), a0); \
    float s = hsum256(_mm256_add_ps(a0, a1));

static float dot_f32(const float *w, const float *x, int n) {
    DOT_BODY(_mm256_loadu_ps)
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}
static float dot_bf16(const uint16_t *w, const float *x, int n) {
    DOT_BODY(load8_bf16)
    for (; i < n; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}
static float dot_f16(const uint16_t *w, const float *x, int n) {
    DOT_BODY(load8_f16)
    for (; i < n; i++) s += f16_to_f32(w[i]) * x[i];
    return s;
}
#else
// Portable fallback: 8 independent partial sums so the compiler can vectorise.
#define DOT_PORTABLE(CONV)                                           \
    float acc[8] = { 0 };                                            \
    int i = 0;                                                       \
    for (; i + 8 <= n; i += 8)                                       \
        for (int k = 0; k < 8; k++) acc[k] += CONV(w[i + k]) * x[i + k]; \
    float s = 0;                                                     \
    for (int k = 0; k < 8; k++) s += acc[k];                         \
    for (; i < n; i++) s += CONV(w[i]) * x[i];                       \
    return s;
#define ID(v) (v)
static float dot_f32(const float *w, const float *x, int n) { DOT_PORTABLE(ID) }
static float dot_bf16(const uint16_t *w, const float *x, int n) { DOT_PORTABLE(bf16_to_f32) }
static float dot_f16(const uint16_t *w, const float *x, int n) { DOT_PORTABLE(f16_to_f32) }
#endif

static inline float dot_row(wref w, size_t row, const float *x, int n) {
    size_t off = row * (size_t)n;
    switch (w.type) {
    case WT_BF16: return dot_bf16((const uint16_t *)w.data + off, x, n);
    case WT_F16: return dot_f16((const uint16_t *)w.data + off, x, n);
    default: return dot_f32((const float *)w.data + off, x, n);
    }
}

void cpu_matmul(float *out, const float *x, wref w, int T, int n_in, int n_out) {
    // Small problems are not worth waking the thread team for.
    long work = (long)n_out * n_in * T;
#pragma omp parallel for schedule(static) if (work > 32768)
    for (int r = 0; r < n_out; r++) {
        for (int t = 0; t < T; t++)
            out[(size_t)t * n_out + r] = dot_row(w, (size_t)r, x + (size_t)t * n_in, n_in);
    }
}
