// matmul.c: out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T with fp32 accumulation.
// Weights stay in their stored dtype and are widened in registers: decode is
// memory-bound, so streaming bf16 moves half the bytes of fp32. Rows of w are split
// across threads; each weight row is read once and dotted with all T inputs.
#include <omp.h>

#include <stdint.h>
#include <stdlib.h>

#include "kernels/ops.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define MATMUL_ROWS 4  // rows per pass: each load of x feeds four weight rows
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 4  // rows ahead to prefetch: short rows defeat the hardware prefetcher
#endif

static inline __m512 load16_f32(const void *p, size_t i) { return _mm512_loadu_ps((const float *)p + i); }
static inline __m512 load16_bf16(const void *p, size_t i) {
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 load16_f16(const void *p, size_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}
static inline float widen1(const void *p, size_t i, wtype t) {
    return t == WT_F32 ? ((const float *)p)[i] : t == WT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i])
                                                              : f16_to_f32(((const uint16_t *)p)[i]);
}

// out[r..r+4) = rows r..r+4 of w dotted with x; rows are n elements apart.
#define DOT4(NAME, LOAD, TYPE)                                                             \
    static void NAME(float *out, const void *w, size_t r, const float *x, int n) {         \
        const size_t stride = (size_t)n;                                                   \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
        int i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                     \
            __m512 xv = _mm512_loadu_ps(x + i);                                            \
            for (int k = 0; k < 4; k++)                                                    \
                _mm_prefetch((const char *)w + ((r + k + PREFETCH_ROWS) * stride + i) * wtype_size(TYPE), _MM_HINT_T0); \
            a0 = _mm512_fmadd_ps(LOAD(w, (r + 0) * stride + i), xv, a0);                   \
            a1 = _mm512_fmadd_ps(LOAD(w, (r + 1) * stride + i), xv, a1);                   \
            a2 = _mm512_fmadd_ps(LOAD(w, (r + 2) * stride + i), xv, a2);                   \
            a3 = _mm512_fmadd_ps(LOAD(w, (r + 3) * stride + i), xv, a3);                   \
        }                                                                                  \
        float s[4] = { _mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1),                \
                       _mm512_reduce_add_ps(a2), _mm512_reduce_add_ps(a3) };               \
        for (; i < n; i++)                                                                 \
            for (int k = 0; k < 4; k++) s[k] += widen1(w, (r + k) * stride + i, TYPE) * x[i]; \
        for (int k = 0; k < 4; k++) out[k] = s[k];                                         \
    }
DOT4(dot4_f32, load16_f32, WT_F32)
DOT4(dot4_bf16, load16_bf16, WT_BF16)
DOT4(dot4_f16, load16_f16, WT_F16)

// Prefill tile: rows r..r+4 of w against inputs x[0..4) (n apart), 16 accumulators.
// Each widened weight vector feeds four tokens and each x vector four rows, so the
// loop does 16 FMAs per 8 loads instead of 4 per 5: prefill is compute-bound.
// out[t * ldo + k] receives row r+k for token t.
#define TILE4X4(NAME, LOAD, TYPE)                                                          \
    static void NAME(float *out, size_t ldo, const void *w, size_t r, const float *x, int n) { \
        const size_t stride = (size_t)n;                                                   \
        __m512 acc[4][4];                                                                  \
        for (int t = 0; t < 4; t++)                                                        \
            for (int k = 0; k < 4; k++) acc[t][k] = _mm512_setzero_ps();                   \
        int i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                     \
            __m512 w0 = LOAD(w, (r + 0) * stride + i), w1 = LOAD(w, (r + 1) * stride + i); \
            __m512 w2 = LOAD(w, (r + 2) * stride + i), w3 = LOAD(w, (r + 3) * stride + i); \
            for (int t = 0; t < 4; t++) {                                                  \
                __m512 xv = _mm512_loadu_ps(x + (size_t)t * n + i);                        \
                acc[t][0] = _mm512_fmadd_ps(w0, xv, acc[t][0]);                            \
                acc[t][1] = _mm512_fmadd_ps(w1, xv, acc[t][1]);                            \
                acc[t][2] = _mm512_fmadd_ps(w2, xv, acc[t][2]);                            \
                acc[t][3] = _mm512_fmadd_ps(w3, xv, acc[t][3]);                            \
            }                                                                              \
        }                                                                                  \
        for (int t = 0; t < 4; t++)                                                        \
            for (int k = 0; k < 4; k++) {                                                  \
                float s = _mm512_reduce_add_ps(acc[t][k]);                                 \
                for (int j = i; j < n; j++) s += widen1(w, (r + k) * stride + j, TYPE) * x[(size_t)t * n + j]; \
                out[(size_t)t * ldo + k] = s;                                              \
            }                                                                              \
    }
TILE4X4(tile4x4_f32, load16_f32, WT_F32)
TILE4X4(tile4x4_bf16, load16_bf16, WT_BF16)
TILE4X4(tile4x4_f16, load16_f16, WT_F16)

static void tile_rows(float *out, size_t ldo, wref w, size_t r, const float *x, int n) {
    switch (w.type) {
    case WT_BF16: tile4x4_bf16(out, ldo, w.data, r, x, n); break;
    case WT_F16: tile4x4_f16(out, ldo, w.data, r, x, n); break;
    default: tile4x4_f32(out, ldo, w.data, r, x, n); break;
    }
}

// bf16 without a widening shuffle: a 32-bit lane holds elements 2j (low half) and
// 2j+1 (high half); shifting left by 16 gives the even element as fp32, masking the
// low half gives the odd one. x is split into even (xe) and odd (xo) halves to match.
static void dot4_bf16_eo(float *out, const uint16_t *w, size_t r, const float *x, const float *xe,
                         const float *xo, int n) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const uint16_t *w0 = w + r * (size_t)n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 e = _mm512_loadu_ps(xe + i / 2), o = _mm512_loadu_ps(xo + i / 2);
        // Fetch rows PREFETCH_ROWS ahead while these are summed.
        _mm_prefetch((const char *)(w0 + PREFETCH_ROWS * (size_t)n + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + PREFETCH_ROWS * (size_t)n + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(w2 + PREFETCH_ROWS * (size_t)n + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(w3 + PREFETCH_ROWS * (size_t)n + i), _MM_HINT_T0);
#define EO_FMA(acc, wr)                                                                            \
    do {                                                                                           \
        __m512i v = _mm512_loadu_si512((const void *)(wr + i));                                    \
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), e, acc);              \
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), o, acc);               \
    } while (0)
        EO_FMA(a0, w0); EO_FMA(a1, w1); EO_FMA(a2, w2); EO_FMA(a3, w3);
#undef EO_FMA
    }
    float s[4] = { _mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                   _mm512_reduce_add_ps(a3) };
    for (; i < n; i++)
        for (int k = 0; k < 4; k++) s[k] += bf16_to_f32(w[(r + k) * (size_t)n + i]) * x[i];
    for (int k = 0; k < 4; k++) out[k] = s[k];
}

// dot4_bf16_eo for NT tokens at once (rows t of x and of split, ldx and 2h apart; out
// rows ldo apart): each widened weight vector feeds NT tokens, so a batch spends fewer
// loads and conversions per FMA. Each (token, row) sum takes exactly dot4_bf16_eo's
// steps (the same FMAs in the same order, the same reduction and tail), so a token's
// result does not depend on the tokens beside it.
#define DOT4X_EO(NAME, NT)                                                                              \
    static void NAME(float *out, size_t ldo, const uint16_t *w, size_t r, const float *x, size_t ldx,  \
                     const float *split, size_t h, int n) {                                             \
        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);                                         \
        const uint16_t *wr[4] = { w + r * (size_t)n, w + (r + 1) * (size_t)n, w + (r + 2) * (size_t)n,  \
                                  w + (r + 3) * (size_t)n };                                            \
        __m512 acc[NT][4];                                                                              \
        for (int t = 0; t < NT; t++)                                                                    \
            for (int k = 0; k < 4; k++) acc[t][k] = _mm512_setzero_ps();                                \
        int i = 0;                                                                                      \
        for (; i + 32 <= n; i += 32) {                                                                  \
            __m512 e[NT], o[NT];                                                                        \
            for (int t = 0; t < NT; t++) {                                                              \
                e[t] = _mm512_loadu_ps(split + 2 * t * h + i / 2);                                      \
                o[t] = _mm512_loadu_ps(split + (2 * t + 1) * h + i / 2);                                \
            }                                                                                           \
            for (int k = 0; k < 4; k++)                                                                 \
                _mm_prefetch((const char *)(wr[k] + PREFETCH_ROWS * (size_t)n + i), _MM_HINT_T0);       \
            for (int k = 0; k < 4; k++) {                                                               \
                __m512i v = _mm512_loadu_si512((const void *)(wr[k] + i));                              \
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));                              \
                __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));                               \
                for (int t = 0; t < NT; t++) {                                                          \
                    acc[t][k] = _mm512_fmadd_ps(we, e[t], acc[t][k]);                                   \
                    acc[t][k] = _mm512_fmadd_ps(wo, o[t], acc[t][k]);                                   \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        for (int t = 0; t < NT; t++) {                                                                  \
            float s[4] = { _mm512_reduce_add_ps(acc[t][0]), _mm512_reduce_add_ps(acc[t][1]),            \
                           _mm512_reduce_add_ps(acc[t][2]), _mm512_reduce_add_ps(acc[t][3]) };          \
            for (int j = i; j < n; j++)                                                                 \
                for (int k = 0; k < 4; k++) s[k] += bf16_to_f32(wr[k][j]) * x[t * ldx + j];             \
            for (int k = 0; k < 4; k++) out[t * ldo + k] = s[k];                                        \
        }                                                                                               \
    }
DOT4X_EO(dot4x4_bf16_eo, 4)
DOT4X_EO(dot4x2_bf16_eo, 2)

// Eight tokens over two weight rows (r, r+1): 16 accumulators, the split rows read from L1
// as FMA operands. One pass feeds all eight tokens while the rows stream in, where two
// passes of dot4x4 leave the second pass's FMAs after the memory stream. Each (token,
// row) sum takes dot4_bf16_eo's steps exactly, as in DOT4X_EO.
static void dot2x8_bf16_eo(float *out, size_t ldo, const uint16_t *w, size_t r, const float *x, size_t ldx,
                           const float *split, size_t h, int n) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const uint16_t *w0 = w + r * (size_t)n, *w1 = w0 + n;
    __m512 a0[8], a1[8];
    for (int t = 0; t < 8; t++) {
        a0[t] = _mm512_setzero_ps();
        a1[t] = _mm512_setzero_ps();
    }
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)(w0 + PREFETCH_ROWS * (size_t)n + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + PREFETCH_ROWS * (size_t)n + i), _MM_HINT_T0);
        __m512i v0 = _mm512_loadu_si512((const void *)(w0 + i));
        __m512i v1 = _mm512_loadu_si512((const void *)(w1 + i));
        __m512 we0 = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16));
        __m512 wo0 = _mm512_castsi512_ps(_mm512_and_si512(v0, hi));
        __m512 we1 = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16));
        __m512 wo1 = _mm512_castsi512_ps(_mm512_and_si512(v1, hi));
        for (int t = 0; t < 8; t++) {
            __m512 e = _mm512_loadu_ps(split + 2 * t * h + i / 2);
            __m512 o = _mm512_loadu_ps(split + (2 * t + 1) * h + i / 2);
            a0[t] = _mm512_fmadd_ps(we0, e, a0[t]);
            a0[t] = _mm512_fmadd_ps(wo0, o, a0[t]);
            a1[t] = _mm512_fmadd_ps(we1, e, a1[t]);
            a1[t] = _mm512_fmadd_ps(wo1, o, a1[t]);
        }
    }
    for (int t = 0; t < 8; t++) {
        float s0 = _mm512_reduce_add_ps(a0[t]), s1 = _mm512_reduce_add_ps(a1[t]);
        for (int j = i; j < n; j++) {
            s0 += bf16_to_f32(w0[j]) * x[t * ldx + j];
            s1 += bf16_to_f32(w1[j]) * x[t * ldx + j];
        }
        out[t * ldo] = s0;
        out[t * ldo + 1] = s1;
    }
}

// The stride of the even and odd halves of a split row: n_in/2 + 1 floats rounded up to a
// cache line, so that (with a 64-byte aligned split) every 16-float load of them is one
// line. Loads that straddle two lines cost two, and the many-row kernels are load-bound.
static size_t eo_half(int n_in) { return ((size_t)n_in / 2 + 1 + 15) & ~(size_t)15; }
static float *align64(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

// Decode-time bf16 matvec with the even/odd split of x, for T <= MATMUL_EO_MAX_T
// tokens (cpu_matmul; any T for cpu_matmul_rows): each token's row is computed exactly as alone (a batch of branches gives the
// logits of one-at-a-time decoding, bit for bit), while a block's four weight rows are
// read from memory once and from cache for the other tokens. split: [T, 2, eo_half(n_in)], 64-byte aligned.
#define MATMUL_EO_MAX_T 8
static void matvec_bf16_eo(float *out, const float *x, const uint16_t *w, int T, int n_in, int n_out, float *split) {
    size_t h = eo_half(n_in);
    for (int t = 0; t < T; t++)
        for (int i = 0; i + 1 < n_in; i += 2)
            split[2 * t * h + i / 2] = x[(size_t)t * n_in + i], split[(2 * t + 1) * h + i / 2] = x[(size_t)t * n_in + i + 1];
    int blocks = n_out / MATMUL_ROWS;
#pragma omp parallel for schedule(static) if ((long)n_out * n_in * T > 32768)
    for (int b = 0; b < blocks; b++) {
        size_t r = (size_t)b * MATMUL_ROWS;
        int t = 0;
        for (; t + 8 <= T; t += 8)
            for (int k = 0; k < MATMUL_ROWS; k += 2)
                dot2x8_bf16_eo(out + (size_t)t * n_out + r + k, (size_t)n_out, w, r + k, x + (size_t)t * n_in,
                               (size_t)n_in, split + 2 * t * h, h, n_in);
        for (; t + 4 <= T; t += 4)
            dot4x4_bf16_eo(out + (size_t)t * n_out + r, (size_t)n_out, w, r, x + (size_t)t * n_in, (size_t)n_in,
                           split + 2 * t * h, h, n_in);
        for (; t + 2 <= T; t += 2)
            dot4x2_bf16_eo(out + (size_t)t * n_out + r, (size_t)n_out, w, r, x + (size_t)t * n_in, (size_t)n_in,
                           split + 2 * t * h, h, n_in);
        for (; t < T; t++)
            dot4_bf16_eo(out + (size_t)t * n_out + r, w, r, x + (size_t)t * n_in, split + 2 * t * h,
                         split + (2 * t + 1) * h, n_in);
    }
    for (int r = blocks * MATMUL_ROWS; r < n_out; r++)
        for (int t = 0; t < T; t++) {
            float s = 0;
            for (int i = 0; i < n_in; i++) s += bf16_to_f32(w[(size_t)r * n_in + i]) * x[(size_t)t * n_in + i];
            out[(size_t)t * n_out + r] = s;
        }
}

static void dot_rows(float *out, wref w, size_t r, const float *x, int n) {
    switch (w.type) {
    case WT_BF16: dot4_bf16(out, w.data, r, x, n); break;
    case WT_F16: dot4_f16(out, w.data, r, x, n); break;
    default: dot4_f32(out, w.data, r, x, n); break;
    }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
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

// The matrix-vector paths: every row summed as a row alone is (exact 1: any T; else the
// bf16 even/odd split up to MATMUL_EO_MAX_T rows, as cpu_matmul has always done).
static void matvec_rows(float *out, const float *x, wref w, int T, int n_in, int n_out, int exact) {
    // Small problems are not worth waking the thread team for.
    long work = (long)n_out * n_in * T;
#ifdef MATMUL_ROWS
    if (T == 1 && w.type == WT_BF16 && n_in <= 65536) {
        float buf[2 * eo_half(n_in) + 16];
        matvec_bf16_eo(out, x, w.data, 1, n_in, n_out, align64(buf));
        return;
    }
    if (w.type == WT_BF16 && (exact ? n_in <= 65536 : T <= MATMUL_EO_MAX_T)) {  // a batch of decode rows
        float *buf = malloc(sizeof(float) * ((size_t)T * 2 * eo_half(n_in) + 16));
        if (buf) {
            matvec_bf16_eo(out, x, w.data, T, n_in, n_out, align64(buf));
            free(buf);
            return;
        }
    }
    int blocks = n_out / MATMUL_ROWS;
#pragma omp parallel for schedule(static) if (work > 32768)
    for (int b = 0; b < blocks; b++) {
        size_t r = (size_t)b * MATMUL_ROWS;
        int t = 0;
        for (; t + 4 <= T; t += 4) tile_rows(out + (size_t)t * n_out + r, (size_t)n_out, w, r, x + (size_t)t * n_in, n_in);
        for (; t < T; t++) {
            float o[MATMUL_ROWS];
            dot_rows(o, w, (size_t)b * MATMUL_ROWS, x + (size_t)t * n_in, n_in);
            for (int k = 0; k < MATMUL_ROWS; k++) out[(size_t)t * n_out + (size_t)b * MATMUL_ROWS + k] = o[k];
        }
    }
    for (int r = blocks * MATMUL_ROWS; r < n_out; r++)  // leftover rows
        for (int t = 0; t < T; t++) out[(size_t)t * n_out + r] = dot_row(w, (size_t)r, x + (size_t)t * n_in, n_in);
#else
    (void)exact;
#pragma omp parallel for schedule(static) if (work > 32768)
    for (int r = 0; r < n_out; r++) {
        for (int t = 0; t < T; t++)
            out[(size_t)t * n_out + r] = dot_row(w, (size_t)r, x + (size_t)t * n_in, n_in);
    }
#endif
}

void cpu_matmul(float *out, const float *x, wref w, int T, int n_in, int n_out) {
    if (T > 8 && cpu_gemm(out, x, w, T, n_in, n_out) == 0) return;  // prefill: the blocked GEMM (gemm.c)
    matvec_rows(out, x, w, T, n_in, n_out, 0);
}

void cpu_matmul_rows(float *out, const float *x, wref w, int T, int n_in, int n_out) {
    matvec_rows(out, x, w, T, n_in, n_out, 1);
}
