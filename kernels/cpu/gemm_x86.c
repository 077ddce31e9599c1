// gemm_x86.c: the x86 micro-kernels of the CPU GEMM (layout and contract: gemm.h).
// Each is compiled for its own instruction set with a target attribute, so a build for
// plain x86-64 still carries them and gemm.c picks one at run time (cpu_isa.c).
//
// Register tiling: an accumulator per (token, 16- or 8-wide column vector). Each panel
// vector loaded feeds every token of the tile, each broadcast x value every column
// vector, so one load serves MR (or 2) multiply-adds and the FMA units stay busy.
#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

#define X86_MR8 8
#define AVX2_MR 6

// x row pointers for a tile of mr < MR rows: the missing rows repeat the last one (their
// sums are computed and dropped), so the unrolled loop has no branches.
#define ROWS(T, r, x, ldx, mr, MR)                                                   \
    const T *r[MR];                                                                  \
    for (int t_ = 0; t_ < MR; t_++) r[t_] = x + (size_t)(t_ < mr ? t_ : mr - 1) * ldx

__attribute__((target("avx512f,avx512bw,avx512vl,fma")))
void gemm_f32_avx512(float *tile, const float *x, size_t ldx, int mr, const float *panel, int K) {
    ROWS(float, r, x, ldx, mr, X86_MR8);
    __m512 c[X86_MR8][2];
    for (int t = 0; t < X86_MR8; t++) c[t][0] = c[t][1] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *p = panel + (size_t)k * GEMM_NR;
        __m512 w0 = _mm512_loadu_ps(p), w1 = _mm512_loadu_ps(p + 16);
        for (int t = 0; t < X86_MR8; t++) {
            __m512 b = _mm512_set1_ps(r[t][k]);
            c[t][0] = _mm512_fmadd_ps(w0, b, c[t][0]);
            c[t][1] = _mm512_fmadd_ps(w1, b, c[t][1]);
        }
    }
    for (int t = 0; t < mr; t++) {
        _mm512_storeu_ps(tile + t * GEMM_NR, c[t][0]);
        _mm512_storeu_ps(tile + t * GEMM_NR + 16, c[t][1]);
    }
}

// AVX2 has 16 registers: 6 tokens x 2 vectors of 8 columns (12 accumulators), so the
// 32-column panel is done as two passes over 16 columns.
__attribute__((target("avx2,fma")))
void gemm_f32_avx2(float *tile, const float *x, size_t ldx, int mr, const float *panel, int K) {
    ROWS(float, r, x, ldx, mr, AVX2_MR);
    for (int half = 0; half < 2; half++) {
        __m256 c[AVX2_MR][2];
        for (int t = 0; t < AVX2_MR; t++) c[t][0] = c[t][1] = _mm256_setzero_ps();
        for (int k = 0; k < K; k++) {
            const float *p = panel + (size_t)k * GEMM_NR + half * 16;
            __m256 w0 = _mm256_loadu_ps(p), w1 = _mm256_loadu_ps(p + 8);
            for (int t = 0; t < AVX2_MR; t++) {
                __m256 b = _mm256_broadcast_ss(r[t] + k);
                c[t][0] = _mm256_fmadd_ps(w0, b, c[t][0]);
                c[t][1] = _mm256_fmadd_ps(w1, b, c[t][1]);
            }
        }
        for (int t = 0; t < mr; t++) {
            _mm256_storeu_ps(tile + t * GEMM_NR + half * 16, c[t][0]);
            _mm256_storeu_ps(tile + t * GEMM_NR + half * 16 + 8, c[t][1]);
        }
    }
}

// vdpbf16ps: each 32-bit lane multiplies a pair of bf16 weights by a pair of bf16
// inputs and adds both products to an fp32 accumulator: 32 multiply-adds a vector.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
void gemm_bf16_avx512bf16(float *tile, const uint32_t *x, size_t ldx, int mr, const uint32_t *panel, int K2) {
    ROWS(uint32_t, r, x, ldx, mr, X86_MR8);
    __m512 c[X86_MR8][2];
    for (int t = 0; t < X86_MR8; t++) c[t][0] = c[t][1] = _mm512_setzero_ps();
    for (int k = 0; k < K2; k++) {
        const uint32_t *p = panel + (size_t)k * GEMM_NR;
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(p), w1 = (__m512bh)_mm512_loadu_si512(p + 16);
        for (int t = 0; t < X86_MR8; t++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)r[t][k]);
            c[t][0] = _mm512_dpbf16_ps(c[t][0], w0, b);
            c[t][1] = _mm512_dpbf16_ps(c[t][1], w1, b);
        }
    }
    for (int t = 0; t < mr; t++) {
        _mm512_storeu_ps(tile + t * GEMM_NR, c[t][0]);
        _mm512_storeu_ps(tile + t * GEMM_NR + 16, c[t][1]);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
void gemm_to_bf16_avx512bf16(uint32_t *out, const float *x, int n) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {  // vcvtne2ps2bf16: round to nearest even, as f32_to_bf16
        __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(out + i / 2, (__m512i)h);
    }
    for (; i < n; i += 2) {
        __m512 v = _mm512_maskz_loadu_ps(i + 1 < n ? 3 : 1, x + i);
        __m256bh h = _mm512_cvtneps_pbh(v);
        out[i / 2] = (uint32_t)_mm256_extract_epi32((__m256i)h, 0);
    }
}
// ---- Panel packing (gemm.h's layouts) as 16 x 16 transposes in registers ----------------
// The scalar packer reads 32 row streams one element at a time; here each group of 16
// rows x 16 columns is loaded as 16 vectors, transposed with 64 shuffles and stored as
// 16 panel half-rows, several times faster. Only whole groups go this way: gemm.c packs
// the edges (a last panel of fewer rows, the last columns) with the scalar loops.

// r[i] = row i of a 16 x 16 block of 32-bit lanes; stores column c at dst + c * ldd.
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void transpose16_store(__m512 r[16], float *dst,
                                                                                        size_t ldd) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {  // t[2i] lane L: x(2i,4L) x(2i+1,4L) x(2i,4L+1) x(2i+1,4L+1)
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int m = 0; m < 4; m++) {  // u[4m+c] lane L: column 4L+c, rows 4m..4m+3
        u[4 * m] = _mm512_shuffle_ps(t[4 * m], t[4 * m + 2], 0x44);
        u[4 * m + 1] = _mm512_shuffle_ps(t[4 * m], t[4 * m + 2], 0xEE);
        u[4 * m + 2] = _mm512_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0x44);
        u[4 * m + 3] = _mm512_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {  // column 4L+c: lane L of u[c], u[4+c], u[8+c], u[12+c]
        __m512 w0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), w1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 w2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), w3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        _mm512_storeu_ps(dst + (size_t)c * ldd, _mm512_shuffle_f32x4(w0, w2, 0x88));
        _mm512_storeu_ps(dst + (size_t)(4 + c) * ldd, _mm512_shuffle_f32x4(w0, w2, 0xDD));
        _mm512_storeu_ps(dst + (size_t)(8 + c) * ldd, _mm512_shuffle_f32x4(w1, w3, 0x88));
        _mm512_storeu_ps(dst + (size_t)(12 + c) * ldd, _mm512_shuffle_f32x4(w1, w3, 0xDD));
    }
}

// Elements k0..k0+16 of a row of type wt, widened to fp32.
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512 load16_f32(const void *row, int wt, int k0) {
    if (wt == WT_F32) return _mm512_loadu_ps((const float *)row + k0);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k0));
    if (wt == WT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16: the float's top half
}

__attribute__((target("avx512f,avx512bw,avx512vl")))
int gemm_pack_f32_avx512(float *panel, const void *w, int wt, int nr, int n_in) {
    if (nr != GEMM_NR) return 0;
    size_t esize = wt == WT_F32 ? 4 : 2;
    int k0 = 0;
    for (; k0 + 16 <= n_in; k0 += 16)
        for (int h = 0; h < GEMM_NR; h += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = load16_f32((const char *)w + (size_t)(h + i) * n_in * esize, wt, k0);
            transpose16_store(r, panel + (size_t)k0 * GEMM_NR + h, GEMM_NR);
        }
    return k0;
}

__attribute__((target("avx512f,avx512bw,avx512vl")))
int gemm_pack_bf16_avx512(uint32_t *panel, const uint16_t *w, int nr, int n_in) {
    if (nr != GEMM_NR) return 0;
    int k0 = 0;  // in pairs: a pair is the row's two bf16 as one little-endian 32-bit word
    for (; 2 * (k0 + 16) <= n_in; k0 += 16)
        for (int h = 0; h < GEMM_NR; h += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps((const void *)(w + (size_t)(h + i) * n_in + 2 * k0));
            transpose16_store(r, (float *)(panel + (size_t)k0 * GEMM_NR + h), GEMM_NR);
        }
    return k0;
}
#endif
