// gemm.h: the CPU GEMM's internal interface between its driver (gemm.c) and the
// per-ISA micro-kernels (gemm_x86.c, and the portable one in gemm.c).
//
// A panel is GEMM_NR consecutive weight rows (output columns), packed once per job so
// the micro-kernel reads it sequentially while it is reused for every token tile:
//   f32 panel:  p[k * GEMM_NR + j]          = w[r0 + j][k]            (widened to fp32)
//   bf16 panel: p[(k/2) * GEMM_NR + j]      = w[r0 + j][k, k+1] pair  (32-bit lanes,
//               the even element in the low half, as vdpbf16ps wants)
// Rows past n_out (and the odd k of an odd n_in) are packed as zeros.
#ifndef VARENT_GEMM_H
#define VARENT_GEMM_H

#include <stddef.h>
#include <stdint.h>

#define GEMM_NR 32
#define GEMM_MR_MAX 8

// tile[t * GEMM_NR + j] = sum_k x[t][k] * panel[k][j] for t < mr (rows of x are ldx
// apart; t >= mr are not written). K: the reduction length (k-pairs for bf16).
typedef void gemm_f32_fn(float *tile, const float *x, size_t ldx, int mr, const float *panel, int K);
typedef void gemm_bf16_fn(float *tile, const uint32_t *x, size_t ldx, int mr, const uint32_t *panel, int K2);

#if defined(__x86_64__)
gemm_f32_fn gemm_f32_avx2, gemm_f32_avx512;
gemm_bf16_fn gemm_bf16_avx512bf16;
// x[n] as bf16 pairs (round to nearest even), the odd tail padded with zero: n2 words.
void gemm_to_bf16_avx512bf16(uint32_t *out, const float *x, int n);
// Pack a whole panel's leading columns with AVX-512 transposes: returns how many k (or
// k-pairs) it packed, 0 unless nr == GEMM_NR; the caller packs the rest. wt: a wtype.
int gemm_pack_f32_avx512(float *panel, const void *w, int wt, int nr, int n_in);
int gemm_pack_bf16_avx512(uint32_t *panel, const uint16_t *w, int nr, int n_in);
#endif

#endif
