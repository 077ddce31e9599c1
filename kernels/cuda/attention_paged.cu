// attention_paged.cu: the decode step (T == 1) of B sequences over one paged bf16 KV
// pool, the CUDA twin of cpu_attention_paged (model/kv_pool.h's layout): key j of row b
// is pool row (table_b[j >> shift] << shift) + (j & (2^shift - 1)).
//
// The launch shape depends only on the row count B, the heads and max_keys: the block
// tables and lengths are read on the device, so one captured graph serves a row bucket
// (cuda_row_bucket) whatever the lengths. A row of the bucket with no keys (lens[b] == 0)
// is padding: its output is zeros and nothing is stored for it.
//
// One block per (KV head, row) reads the row's keys once for the G = n_heads / n_kv
// query heads sharing them, in three passes over global scratch [B, n_heads, max_keys]:
// scores, then each head's max and sum of exp, then o = sum p v / l. Plain and exact to
// the CPU twin's tolerance; the split-KV kernels of attention_decode.cu stay the fast
// path for a contiguous cache.
#include "kernels/cuda/attention.cuh"

__device__ __forceinline__ size_t paged_row(const int *table, int shift, int j) {
    return ((size_t)table[j >> shift] << shift) + (size_t)(j & ((1 << shift) - 1));
}

// grid (n_kv, B), block ATT_THREADS; smem: q_s[G*hd] | m_s[G] | inv_s[G].
// p: scratch, row b's probabilities at p + b * n_heads * max_keys, [n_heads, n_keys_b].
__global__ void attn_paged_kernel(float *out, float *last_scores, float *p, const float *q, const uint16_t *k_pool,
                                  const uint16_t *v_pool, const int *tables, const int *lens, int table_stride,
                                  int shift, int n_heads, int n_kv, int hd, float scale, int max_keys) {
    extern __shared__ float smem[];
    int kvh = blockIdx.x, b = blockIdx.y, G = n_heads / n_kv, kv_dim = n_kv * hd, half = hd / 2;
    int n = min(lens[b], max_keys);
    const int *table = tables + (size_t)b * table_stride;
    float *q_s = smem, *m_s = q_s + G * hd, *inv_s = m_s + G;
    float *ob = out + ((size_t)b * n_heads + (size_t)kvh * G) * hd;
    if (n <= 0) {  // padding row of the bucket
        for (int i = threadIdx.x; i < G * hd; i += blockDim.x) ob[i] = 0.f;
        return;
    }
    const float *qg = q + ((size_t)b * n_heads + (size_t)kvh * G) * hd;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) q_s[i] = qg[i];
    __syncthreads();
    float *pg = p + ((size_t)b * n_heads + (size_t)kvh * G) * max_keys;
    float *sg = last_scores ? last_scores + (size_t)b * n_heads * max_keys + (size_t)kvh * G * n : NULL;
    // 1. scores; consecutive threads take consecutive keys of one head
    for (int idx = threadIdx.x; idx < G * n; idx += blockDim.x) {
        int g = idx / n, j = idx - g * n;
        const uint16_t *kr = k_pool + paged_row(table, shift, j) * kv_dim + (size_t)kvh * hd;
        float s = dot_q_k(q_s + g * hd, kr, hd) * scale;
        pg[(size_t)g * max_keys + j] = s;
        if (sg) sg[(size_t)g * n + j] = s;
    }
    __syncthreads();
    // 2. per head (a warp each): max, p = exp(s - max) in place, 1 / sum
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int g = warp; g < G; g += nw) {
        float *ph = pg + (size_t)g * max_keys;
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, ph[j]);
        m = warp_max(m);
        float l = 0.f;
        for (int j = lane; j < n; j += 32) {
            float e = expf(ph[j] - m);
            ph[j] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) inv_s[g] = 1.f / l;
    }
    __syncthreads();
    // 3. o[g][d..d+1] = sum_j p[g][j] v[j][d..d+1] / l; one thread per (head, pair of dims)
    for (int idx = threadIdx.x; idx < G * half; idx += blockDim.x) {
        int g = idx / half, d = 2 * (idx - g * half);
        const float *ph = pg + (size_t)g * max_keys;
        float o0 = 0.f, o1 = 0.f;
        for (int j = 0; j < n; j++) {
            const uint16_t *vr = v_pool + paged_row(table, shift, j) * kv_dim + (size_t)kvh * hd;
            uint32_t u = *(const uint32_t *)(vr + d);  // d and hd even: 4-byte aligned
            o0 = fmaf(ph[j], __uint_as_float(u << 16), o0);
            o1 = fmaf(ph[j], __uint_as_float(u & 0xffff0000u), o1);
        }
        ob[(size_t)g * hd + d] = o0 * inv_s[g];
        ob[(size_t)g * hd + d + 1] = o1 * inv_s[g];
    }
}

// grid B, block 256: row b's k[b], v[b] (fp32 [kv_dim]) as bf16 at its position pos[b].
__global__ void kv_store_paged_kernel(uint16_t *k_pool, uint16_t *v_pool, const float *k, const float *v,
                                      const int *pos, const int *tables, const int *lens, int table_stride,
                                      int shift, int kv_dim) {
    int b = blockIdx.x;
    if (lens[b] <= 0) return;  // padding row
    size_t row = paged_row(tables + (size_t)b * table_stride, shift, pos[b]);
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k_pool[row * kv_dim + i] = f32_to_bf16_bits(k[(size_t)b * kv_dim + i]);
        v_pool[row * kv_dim + i] = f32_to_bf16_bits(v[(size_t)b * kv_dim + i]);
    }
}

extern "C" int cuda_row_bucket(int rows) {
    if (rows <= 8) return 8;
    return (rows + 15) / 16 * 16;
}

extern "C" size_t cuda_attention_paged_scratch_bytes(int max_keys, attn_shape s, int B) {
    return (size_t)B * s.n_heads * (size_t)max_keys * sizeof(float);
}

static int paged_check(cuda_ctx *ctx, const cuda_paged_kv *pk, int B, attn_shape s) {
    CUDA_REQUIRE(ctx, B >= 1 && pk->max_keys >= 1 && pk->shift >= 0 && pk->shift < 24,
                 "paged attention: %d rows, %d keys at most, blocks of 2^%d positions", B, pk->max_keys, pk->shift);
    CUDA_REQUIRE(ctx, pk->table_stride << pk->shift >= pk->max_keys,
                 "paged attention: block tables of %d blocks of %d positions hold fewer than %d keys",
                 pk->table_stride, 1 << pk->shift, pk->max_keys);
    CUDA_REQUIRE(ctx, s.n_kv_heads >= 1 && s.n_heads % s.n_kv_heads == 0 && s.head_dim % 2 == 0,
                 "paged attention: %d heads over %d KV heads of dim %d (want a whole group, an even dim)", s.n_heads,
                 s.n_kv_heads, s.head_dim);
    size_t smem = ((size_t)s.n_heads / s.n_kv_heads * s.head_dim + 2 * (size_t)s.n_heads / s.n_kv_heads) * 4;
    CUDA_REQUIRE(ctx, smem <= ATT_SMEM_MAX, "paged attention: a group of %d heads of dim %d needs %zu bytes of shared memory (at most %d)",
                 s.n_heads / s.n_kv_heads, s.head_dim, smem, ATT_SMEM_MAX);
    return 0;
}

extern "C" int cuda_kv_store_paged(cuda_ctx *ctx, const cuda_paged_kv *pk, const float *k, const float *v,
                                   const int *pos, int B, int kv_dim) {
    CUDA_REQUIRE(ctx, B >= 1 && kv_dim >= 1, "paged KV store: %d rows of %d", B, kv_dim);
    kv_store_paged_kernel<<<B, 256, 0, ctx->stream>>>((uint16_t *)pk->k_pool, (uint16_t *)pk->v_pool, k, v, pos,
                                                      pk->tables, pk->lens, pk->table_stride, pk->shift, kv_dim);
    CUDA_CHECK_LAUNCH(ctx, "kv_store_paged_kernel");
    return 0;
}

extern "C" int cuda_attention_decode_paged(cuda_ctx *ctx, float *out, const float *q, const cuda_paged_kv *pk, int B,
                                           attn_shape s, float *last_scores) {
    if (paged_check(ctx, pk, B, s)) return -1;
    size_t need = cuda_attention_paged_scratch_bytes(pk->max_keys, s, B);
    CUDA_REQUIRE(ctx, ctx->scratch_bytes >= need,
                 "paged attention: scratch of %zu bytes, %zu needed (cuda_attention_paged_scratch_bytes)",
                 ctx->scratch_bytes, need);
    int G = s.n_heads / s.n_kv_heads;
    size_t smem = ((size_t)G * s.head_dim + 2 * (size_t)G) * sizeof(float);
    dim3 grid(s.n_kv_heads, B);
    attn_paged_kernel<<<grid, ATT_THREADS, smem, ctx->stream>>>(
        out, last_scores, (float *)ctx->scratch, q, (const uint16_t *)pk->k_pool, (const uint16_t *)pk->v_pool,
        pk->tables, pk->lens, pk->table_stride, pk->shift, s.n_heads, s.n_kv_heads, s.head_dim, s.scale, pk->max_keys);
    CUDA_CHECK_LAUNCH(ctx, "attn_paged_kernel");
    return 0;
}
