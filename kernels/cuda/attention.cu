// attention.cu: causal GQA attention over a bf16 KV cache split in trunk + tail
// segments (kv_span), and the attention statistics of the newest query.
//
// Decode (T == 1) is in attention_decode.cu (flash-decoding, split + fused combine);
// this file holds the entry point cuda_attention, which sends T == 1 there, and:
// Prefill (T > 1): attn_prefill_kernel grid (T, n_heads), one block per (query, head),
//   keys in tiles of blockDim with an online softmax: the shapes the tiled kernel
//   (attention_prefill.cu, the same bits) does not take, and VARENT_CUDA_PREFILL_TILED=0.
// Stats (cuda_attn_stats), entropix's four attention metrics from the last query's
//   captured scores [n_heads, n_keys], the twin of cpu_attn_stats:
//   attn_stats_head_kernel  grid (n_heads): lse_h, entropy E_h, sum_j |s_h(j)| per head
//   attn_stats_agree_kernel grid (parts): per key, sum_h |a_h(j) - abar(j)|, summed per block
//   attn_stats_final_kernel 1 block: mean and variance of E_h, agreement, interaction.
//   Sums are in double (scratch holds the per-head and per-block doubles), so the
//   result matches the host's double math to ~1e-6 relative. Formulas in docs/cuda.md.
#include "kernels/cuda/attention.cuh"

// ---- prefill -------------------------------------------------------------------------
// grid (T, n_heads), block ATT_THREADS; smem q_s[hd] + p_s[ATT_THREADS]
__global__ void attn_prefill_kernel(float *out, float *last_scores, const float *q,
                                    const uint16_t *k_trunk, const uint16_t *v_trunk,
                                    const uint16_t *k_tail, const uint16_t *v_tail, int n_trunk,
                                    const int *table, int shift, int n_keys, int T, int n_heads, int n_kv,
                                    int hd, float scale) {
    extern __shared__ float smem[];
    float *q_s = smem, *p_s = smem + hd;
    int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int G = n_heads / n_kv, kvh = h / G, kv_dim = n_kv * hd;
    int nk = n_keys - T + t + 1;  // causal: keys 0 .. position of query t
    bool write_scores = last_scores && t == T - 1;
    const float *qr = q + ((size_t)t * n_heads + h) * hd;
    for (int i = tid; i < hd; i += blockDim.x) q_s[i] = qr[i];
    __syncthreads();

    constexpr int ND = ATT_MAX_HD / ATT_THREADS;
    float acc[ND];
#pragma unroll
    for (int r = 0; r < ND; r++) acc[r] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int k0 = 0; k0 < nk; k0 += blockDim.x) {
        int n = min((int)blockDim.x, nk - k0);
        float s = -INFINITY;
        if (tid < n) {
            const uint16_t *kr = kv_row_pg(k_trunk, k_tail, n_trunk, k0 + tid, kv_dim, table, shift) + (size_t)kvh * hd;
            s = dot_q_k(q_s, kr, hd) * scale;
            if (write_scores) last_scores[(size_t)h * n_keys + k0 + tid] = s;
        }
        p_s[tid] = s;
        __syncthreads();
        float tmax = -INFINITY;
        for (int jj = 0; jj < n; jj++) tmax = fmaxf(tmax, p_s[jj]);
        float m_new = fmaxf(m, tmax);
        float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
        __syncthreads();               // everyone has read the raw scores
        if (tid < n) p_s[tid] = expf(s - m_new);
        __syncthreads();
        float tsum = 0.f;
        for (int jj = 0; jj < n; jj++) tsum += p_s[jj];
        l = l * corr + tsum;
#pragma unroll
        for (int r = 0; r < ND; r++) {
            int d = tid + r * ATT_THREADS;
            if (d < hd) {
                float a = acc[r] * corr;
                for (int jj = 0; jj < n; jj++) {
                    const uint16_t *vr =
                        kv_row_pg(v_trunk, v_tail, n_trunk, k0 + jj, kv_dim, table, shift) + (size_t)kvh * hd;
                    a = fmaf(p_s[jj], bf16_bits_to_f32(vr[d]), a);
                }
                acc[r] = a;
            }
        }
        m = m_new;
        __syncthreads();  // p_s is rewritten by the next tile
    }
    float inv = 1.f / l;
    float *orow = out + ((size_t)t * n_heads + h) * hd;
#pragma unroll
    for (int r = 0; r < ND; r++) {
        int d = tid + r * ATT_THREADS;
        if (d < hd) orow[d] = acc[r] * inv;
    }
}

// ---- statistics of the last query --------------------------------------------------------
// The stats kernels take n_keys as an argument, or from dN when it is set (graph replay).
#define STATS_THREADS 256
#define STATS_LN_CLIP (-23.025850929940457f)  // ln(1e-10): below it a is clipped inside the log
#define STATS_LOG2_CLIP (-33.219280948873624) // log2(1e-10)
#define STATS_LOG2E 1.4426950408889634

// a = exp(s - lse) with the difference taken in double, so the float rounding of ln a is
// per element (it averages out) rather than a common error of lse.
__device__ __forceinline__ float attn_prob(float s, double lse, float *ln_a) {
    float y = (float)((double)s - lse);
    *ln_a = y;
    return expf(y);
}

// grid (n_heads), block STATS_THREADS. head[3h..3h+2] = {lse_h (nats),
// E_h = -sum_j a log2(clip(a, 1e-10, 1)) (bits), sum_j |s_h(j)|}.
__global__ void attn_stats_head_kernel(double *head, const float *scores, int n_keys, const cuda_kv_lens *dN) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    if (dN) n_keys = dN->n_keys;
    if (n_keys <= 0) return;  // the final kernel writes zeros
    int h = blockIdx.x;
    const float *sr = scores + (size_t)h * n_keys;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) m = fmaxf(m, sr[j]);
    m = block_max(m, shf);
    double z = 0.0;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) z += (double)expf(sr[j] - m);
    z = block_sum(z, shd);
    double lse = (double)m + log(z);  // z >= 1 (the max contributes 1): every ln a <= 0
    double ent = 0.0, mag = 0.0;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        float s = sr[j], y, a = attn_prob(s, lse, &y);
        ent -= (double)a * (y < STATS_LN_CLIP ? STATS_LOG2_CLIP : (double)y * STATS_LOG2E);
        mag += (double)fabsf(s);
    }
    ent = block_sum(ent, shd);
    mag = block_sum(mag, shd);
    if (threadIdx.x == 0) {
        head[3 * h + 0] = lse;
        head[3 * h + 1] = ent;
        head[3 * h + 2] = mag;
    }
}

// grid (n_parts), block STATS_THREADS, smem n_heads doubles (padded to 4). Keys j = block * blockDim +
// thread, grid-stride; part[block] = sum over its keys of sum_h |a_h(j) - abar(j)|,
// abar(j) = mean_h a_h(j). Every block writes its part (0 without keys).
__global__ void attn_stats_agree_kernel(double *part, const float *scores, const double *head, int n_heads,
                                        int n_keys, const cuda_kv_lens *dN) {
    extern __shared__ double lse_s[];
    __shared__ double shd[32];
    if (dN) n_keys = dN->n_keys;
    if (n_keys <= 0) {  // the head kernel wrote nothing; the final kernel writes zeros
        if (threadIdx.x == 0) part[blockIdx.x] = 0.0;
        return;
    }
    for (int h = threadIdx.x; h < n_heads; h += blockDim.x) lse_s[h] = head[3 * h];
    __syncthreads();
    double dev = 0.0;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n_keys; j += gridDim.x * blockDim.x) {
        float y, abar = 0.f, d = 0.f;
        for (int h = 0; h < n_heads; h++) abar += attn_prob(scores[(size_t)h * n_keys + j], lse_s[h], &y);
        abar /= (float)n_heads;
        for (int h = 0; h < n_heads; h++) d += fabsf(attn_prob(scores[(size_t)h * n_keys + j], lse_s[h], &y) - abar);
        dev += (double)d;
    }
    dev = block_sum(dev, shd);
    if (threadIdx.x == 0) part[blockIdx.x] = dev;
}

// grid 1, block STATS_THREADS: out4 = {mean_h E_h, population variance of E_h,
// agreement = sum(part) / (H n), interaction = sum_h |s| / (H n)}; zeros without keys.
__global__ void attn_stats_final_kernel(float *out4, const double *head, const double *part, int n_parts,
                                        int n_heads, int n_keys, const cuda_kv_lens *dN) {
    __shared__ double shd[32];
    if (dN) n_keys = dN->n_keys;
    if (n_keys <= 0) {
        if (threadIdx.x < 4) out4[threadIdx.x] = 0.f;
        return;
    }
    double e = 0.0, in = 0.0, ag = 0.0;
    for (int h = threadIdx.x; h < n_heads; h += blockDim.x) {
        e += head[3 * h + 1];
        in += head[3 * h + 2];
    }
    for (int b = threadIdx.x; b < n_parts; b += blockDim.x) ag += part[b];
    e = block_sum(e, shd);
    in = block_sum(in, shd);
    ag = block_sum(ag, shd);
    double mean = e / n_heads, var = 0.0;
    for (int h = threadIdx.x; h < n_heads; h += blockDim.x) {
        double d = head[3 * h + 1] - mean;
        var += d * d;
    }
    var = block_sum(var, shd);
    if (threadIdx.x == 0) {
        double cells = (double)n_heads * n_keys;
        out4[0] = (float)mean;
        out4[1] = (float)(var / n_heads);
        out4[2] = (float)(ag / cells);
        out4[3] = (float)(in / cells);
    }
}

// Blocks of the agreement kernel: one per STATS_THREADS keys, at most two per SM.
static int stats_parts(const cuda_ctx *ctx, int max_keys) {
    int by_len = (int)cdiv_u(max_keys > 0 ? (size_t)max_keys : 1, STATS_THREADS);
    int cap = 2 * (ctx->n_sm > 0 ? ctx->n_sm : 1);
    return by_len < cap ? by_len : cap;
}

extern "C" size_t cuda_attn_stats_scratch_bytes(const cuda_ctx *ctx, int n_heads, int max_keys) {
    if (n_heads < 1) return 0;
    return ((size_t)3 * n_heads + (size_t)stats_parts(ctx, max_keys)) * sizeof(double);
}

extern "C" int cuda_attn_stats(cuda_ctx *ctx, float *out4, const float *scores, int n_heads, int max_keys,
                               const cuda_kv_lens *d_lens) {
    CUDA_REQUIRE(ctx, n_heads > 0 && n_heads <= 4096 && max_keys >= 0,
                 "cuda_attn_stats: n_heads=%d (1..4096), max_keys=%d", n_heads, max_keys);
    size_t need = cuda_attn_stats_scratch_bytes(ctx, n_heads, max_keys);
    CUDA_REQUIRE(ctx, ctx->scratch && ctx->scratch_bytes >= need,
                 "cuda_attn_stats: scratch too small: need %zu bytes, have %zu "
                 "(reserve cuda_attn_stats_scratch_bytes)", need, ctx->scratch_bytes);
    int np = stats_parts(ctx, max_keys);
    double *head = (double *)ctx->scratch, *part = head + 3 * (size_t)n_heads;
    attn_stats_head_kernel<<<n_heads, STATS_THREADS, 0, ctx->stream>>>(head, scores, max_keys, d_lens);
    CUDA_CHECK_LAUNCH(ctx, "attn_stats_head_kernel");
    // lse_s is padded to a multiple of 4 doubles: ptxas merges the tail loop's lse_s[h] and
    // lse_s[h + 1] into one 16-byte LDS issued before the bound check, which read past an
    // 8-byte array at n_heads 1 (compute-sanitizer memcheck on an H200, docs/benchmarks.md).
    size_t lse_bytes = (((size_t)n_heads + 3) & ~(size_t)3) * sizeof(double);
    attn_stats_agree_kernel<<<np, STATS_THREADS, lse_bytes, ctx->stream>>>(part, scores, head, n_heads, max_keys,
                                                                           d_lens);
    CUDA_CHECK_LAUNCH(ctx, "attn_stats_agree_kernel");
    attn_stats_final_kernel<<<1, STATS_THREADS, 0, ctx->stream>>>(out4, head, part, np, n_heads, max_keys, d_lens);
    CUDA_CHECK_LAUNCH(ctx, "attn_stats_final_kernel");
    return 0;
}


static int shape_check(cuda_ctx *ctx, attn_shape s) {
    CUDA_REQUIRE(ctx, s.n_heads > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
                 "cuda_attention: n_heads=%d is not a multiple of n_kv_heads=%d", s.n_heads,
                 s.n_kv_heads);
    CUDA_REQUIRE(ctx, s.head_dim > 0 && s.head_dim % 2 == 0 && s.head_dim <= ATT_MAX_HD,
                 "cuda_attention: head_dim=%d must be even and <= %d", s.head_dim, ATT_MAX_HD);
    return attn_decode_shape_check(ctx, s);
}

extern "C" int cuda_attention_validate(cuda_ctx *ctx, attn_shape s) { return shape_check(ctx, s); }

extern "C" int cuda_attention(cuda_ctx *ctx, float *out, const float *q, kv_span kv, int T,
                              attn_shape s, float *last_scores) {
    kv_pages contiguous = { NULL, 0 };
    return cuda_attention_paged(ctx, out, q, kv, contiguous, T, s, last_scores);
}

extern "C" int cuda_attention_paged(cuda_ctx *ctx, float *out, const float *q, kv_span kv, kv_pages pg, int T,
                                    attn_shape s, float *last_scores) {
    int n_keys = kv.n_trunk + kv.n_tail;
    CUDA_REQUIRE(ctx, !pg.blocks || (kv.n_tail == 0 && pg.shift >= 0 && pg.shift < 24),
                 "cuda_attention: a paged trunk has no tail (n_tail=%d) and blocks of 2^0..2^23 positions (2^%d)",
                 kv.n_tail, pg.shift);
    if (shape_check(ctx, s)) return -1;
    CUDA_REQUIRE(ctx, kv.n_trunk >= 0 && kv.n_tail >= 0 && T >= 1 && T <= n_keys,
                 "cuda_attention: T=%d queries need 1..%d keys (n_trunk=%d n_tail=%d)", T, n_keys,
                 kv.n_trunk, kv.n_tail);
    CUDA_REQUIRE(ctx, kv.n_tail == 0 || (kv.k_tail && kv.v_tail),
                 "cuda_attention: n_tail=%d but tail buffers are NULL", kv.n_tail);
    CUDA_REQUIRE(ctx, is_aligned(kv.k_trunk, 16) && is_aligned(kv.v_trunk, 16) &&
                          is_aligned(kv.k_tail, 16) && is_aligned(kv.v_tail, 16),
                 "cuda_attention: KV buffers must be 16-byte aligned");
    CUDA_REQUIRE(ctx, T <= 65535, "cuda_attention: T=%d exceeds the grid limit", T);
    if (T == 1) return attn_decode_span(ctx, out, q, kv, pg, s, last_scores);
    if (attn_prefill_tiled_ok(ctx, s)) return attn_prefill_tiled(ctx, out, q, kv, pg, T, s, last_scores);
    const uint16_t *kt = (const uint16_t *)kv.k_trunk, *vt = (const uint16_t *)kv.v_trunk;
    const uint16_t *kl = (const uint16_t *)kv.k_tail, *vl = (const uint16_t *)kv.v_tail;
    dim3 grid(T, s.n_heads);
    size_t smem = (size_t)(s.head_dim + ATT_THREADS) * sizeof(float);
    attn_prefill_kernel<<<grid, ATT_THREADS, smem, ctx->stream>>>(
        out, last_scores, q, kt, vt, kl, vl, kv.n_trunk, pg.blocks, pg.shift, n_keys, T, s.n_heads, s.n_kv_heads,
        s.head_dim, s.scale);
    CUDA_CHECK_LAUNCH(ctx, "attn_prefill_kernel");
    return 0;
}
