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
#endif
