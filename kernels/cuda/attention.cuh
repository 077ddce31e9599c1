// attention.cuh: what the attention files share (attention.cu: prefill, statistics and
// the entry points; attention_decode.cu: decode, T == 1). Included by .cu files only.
#ifndef VARENT_CUDA_ATTENTION_CUH
#define VARENT_CUDA_ATTENTION_CUH

#include "kernels/cuda/common.cuh"

#define ATT_THREADS 128
#define ATT_MAX_HD 512   // prefill keeps head_dim/ATT_THREADS accumulators per thread
#define ATT_SMEM_MAX (48 * 1024)

// Key/value row j (0 <= j < n_keys) of a kv_span: trunk then tail.
__device__ __forceinline__ const uint16_t *kv_row(const uint16_t *trunk, const uint16_t *tail,
                                                  int n_trunk, int j, int kv_dim) {
    return j < n_trunk ? trunk + (size_t)j * kv_dim : tail + (size_t)(j - n_trunk) * kv_dim;
}

// The same through a paged trunk's block table (cuda_kv_lens.table; NULL: kv_row).
__device__ __forceinline__ const uint16_t *kv_row_pg(const uint16_t *trunk, const uint16_t *tail, int n_trunk, int j,
                                                     int kv_dim, const int *table, int shift) {
    if (!table) return kv_row(trunk, tail, n_trunk, j, kv_dim);
    size_t row = ((size_t)table[j >> shift] << shift) + (size_t)(j & ((1 << shift) - 1));
    return trunk + row * kv_dim;
}

// q[0..hd) (shared fp32) . k[0..hd) (bf16). hd % 8 == 0: 16-byte loads (rows are
// 16-byte aligned then); otherwise one element at a time (e.g. head_dim 28).
__device__ __forceinline__ float dot_q_k(const float *q, const uint16_t *k, int hd) {
    float s = 0.f;
    if (hd & 7) {
        for (int d = 0; d < hd; d++) s = fmaf(q[d], bf16_bits_to_f32(k[d]), s);
        return s;
    }
    const uint4 *k4 = (const uint4 *)k;
    for (int c = 0; c < hd / 8; c++) {
        float f[8];
        unpack8<WT_BF16>(__ldg(k4 + c), f);
        const float *qc = q + 8 * c;
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(qc[e], f[e], s);
    }
    return s;
}

// attention_prefill.cu: the tiled prefill (T > 1), the same bits as attn_prefill_kernel;
// for head_dim 64 and 128 and groups of up to 16 heads, when ctx->prefill_tiled.
extern "C" int attn_prefill_tiled_ok(const cuda_ctx *ctx, attn_shape s);
int attn_prefill_tiled(cuda_ctx *ctx, float *out, const float *q, kv_span kv, kv_pages pg, int T, attn_shape s,
                       float *last_scores);

// attention_decode.cu. The decode part of the shape check: the GQA group fits one of the
// decode kernels' shared memory (error in ctx->err, -1, otherwise 0).
int attn_decode_shape_check(cuda_ctx *ctx, attn_shape s);
// Decode (T == 1) over a kv_span given by value (a paged trunk with pg.blocks, device
// memory); the shape and span are checked.
int attn_decode_span(cuda_ctx *ctx, float *out, const float *q, kv_span kv, kv_pages pg, attn_shape s,
                     float *last_scores);

#endif
