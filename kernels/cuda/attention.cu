// attention.cu: causal GQA attention over a bf16 KV cache split in trunk + tail
// segments (kv_span), and the attention statistics of the newest query.
//
// Decode (T == 1), flash-decoding style:
//   attn_decode_split_kernel  grid (n_splits, n_kv_heads): one block scores S keys for
//       the G = n_heads/n_kv_heads query heads sharing a KV head, then writes the
//       split's max m, sum l = sum exp(s - m) and unnormalized output o = sum exp(s-m) v
//       to scratch part[n_heads, n_splits, head_dim + 2] (o..., m, l).
//   attn_decode_combine_kernel grid (n_heads): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// Prefill (T > 1): attn_prefill_kernel grid (T, n_heads), one block per (query, head),
//   keys in tiles of blockDim with an online softmax. Simple and correct first.
// Stats (head_stats != NULL), from the last query's scores [n_heads, n_keys]:
//   attn_lse_kernel -> lse per head; attn_mean_prob_kernel -> abar[j] = mean_h a_h(j);
//   attn_head_stats_kernel -> per head entropy/agreement/interaction; cuda_attn_stats
//   reduces the heads to 4 floats. Formulas in docs/cuda.md.
#include "kernels/cuda/common.cuh"

#define ATT_THREADS 128
#define ATT_MAX_HD 512   // prefill keeps head_dim/ATT_THREADS accumulators per thread
#define ATT_SMEM_MAX (48 * 1024)

// Key/value row j (0 <= j < n_keys) of a kv_span: trunk then tail.
__device__ __forceinline__ const uint16_t *kv_row(const uint16_t *trunk, const uint16_t *tail,
                                                  int n_trunk, int j, int kv_dim) {
    return j < n_trunk ? trunk + (size_t)j * kv_dim : tail + (size_t)(j - n_trunk) * kv_dim;
}

// q[0..hd) (shared fp32) . k[0..hd) (bf16, 16-byte aligned), hd % 8 == 0
__device__ __forceinline__ float dot_q_k(const float *q, const uint16_t *k, int hd) {
    const uint4 *k4 = (const uint4 *)k;
    float s = 0.f;
    for (int c = 0; c < hd / 8; c++) {
        float f[8];
        unpack8<WT_BF16>(__ldg(k4 + c), f);
        const float *qc = q + 8 * c;
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(qc[e], f[e], s);
    }
    return s;
}

// ---- decode -------------------------------------------------------------------------
// smem: q_s[G * hd] then sc[G * S]
__global__ void attn_decode_split_kernel(float *part, float *last_scores, const float *q,
                                         const uint16_t *k_trunk, const uint16_t *v_trunk,
                                         const uint16_t *k_tail, const uint16_t *v_tail,
                                         int n_trunk, int n_keys, int n_heads, int n_kv, int hd,
                                         float scale, int S) {
    extern __shared__ float smem[];
    int split = blockIdx.x, kvh = blockIdx.y, n_splits = gridDim.x;
    int G = n_heads / n_kv, kv_dim = n_kv * hd;
    int j0 = split * S;
    int n = min(S, n_keys - j0);
    float *q_s = smem, *sc = smem + G * hd;
    const float *qg = q + (size_t)kvh * G * hd;  // heads kvh*G .. kvh*G+G-1 are contiguous
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) q_s[i] = qg[i];
    __syncthreads();

    // 1. scores s = q_h . k_j * scale, for (g, jj) pairs; a warp walks consecutive keys.
    for (int idx = threadIdx.x; idx < G * n; idx += blockDim.x) {
        int g = idx / n, jj = idx - g * n, j = j0 + jj;
        const uint16_t *kr = kv_row(k_trunk, k_tail, n_trunk, j, kv_dim) + (size_t)kvh * hd;
        float s = dot_q_k(q_s + g * hd, kr, hd) * scale;
        sc[g * S + jj] = s;
        if (last_scores) last_scores[(size_t)(kvh * G + g) * n_keys + j] = s;
    }
    __syncthreads();

    // 2. per head: split max m, p = exp(s - m) in place, l = sum p. One warp per head.
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int g = warp; g < G; g += nw) {
        float *sg = sc + g * S;
        float m = -INFINITY;
        for (int jj = lane; jj < n; jj += 32) m = fmaxf(m, sg[jj]);
        m = warp_max(m);
        float l = 0.f;
        for (int jj = lane; jj < n; jj += 32) {
            float p = expf(sg[jj] - m);
            sg[jj] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) {
            float *pp = part + ((size_t)(kvh * G + g) * n_splits + split) * (hd + 2);
            pp[hd] = m;
            pp[hd + 1] = l;
        }
    }
    __syncthreads();

    // 3. o[g][d] = sum_jj p[g][jj] * v[j][d]; one thread per (g, pair of d).
    int half = hd / 2;
    for (int idx = threadIdx.x; idx < G * half; idx += blockDim.x) {
        int g = idx / half, d = 2 * (idx - g * half);
        const float *pg = sc + g * S;
        float o0 = 0.f, o1 = 0.f;
        for (int jj = 0; jj < n; jj++) {
            const uint16_t *vr = kv_row(v_trunk, v_tail, n_trunk, j0 + jj, kv_dim) + (size_t)kvh * hd;
            uint32_t u = *(const uint32_t *)(vr + d);  // d even, rows 16-byte aligned
            float p = pg[jj];
            o0 = fmaf(p, __uint_as_float(u << 16), o0);
            o1 = fmaf(p, __uint_as_float(u & 0xffff0000u), o1);
        }
        float *pp = part + ((size_t)(kvh * G + g) * n_splits + split) * (hd + 2);
        pp[d] = o0;
        pp[d + 1] = o1;
    }
}

// grid (n_heads), block ATT_THREADS
__global__ void attn_decode_combine_kernel(float *out, const float *part, int n_splits, int hd) {
    int h = blockIdx.x;
    const float *ph = part + (size_t)h * n_splits * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, ph[(size_t)s * (hd + 2) + hd]);
    float L = 0.f;
    for (int s = 0; s < n_splits; s++) {
        const float *ps = ph + (size_t)s * (hd + 2);
        L += ps[hd + 1] * expf(ps[hd] - M);
    }
    float inv = 1.f / L;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < n_splits; s++) {
            const float *ps = ph + (size_t)s * (hd + 2);
            o = fmaf(ps[d], expf(ps[hd] - M), o);
        }
        out[(size_t)h * hd + d] = o * inv;
    }
}

// Split size S and count for n_keys keys; S is a multiple of 32, capped so the score
// buffer G*S floats stays within 32 KiB. Aim for >= 2 blocks per SM.
static void decode_splits(int n_sm, int n_keys, attn_shape s, int *S_out, int *n_splits_out) {
    int G = s.n_heads / s.n_kv_heads;
    int s_max = (8192 / G) / 32 * 32;
    if (s_max > 1024) s_max = 1024;
    if (s_max < 32) s_max = 32;
    int target = (2 * (n_sm > 0 ? n_sm : 1) + s.n_kv_heads - 1) / s.n_kv_heads;
    int by_len = (n_keys + 31) / 32;
    int ns = target < by_len ? target : by_len;
    if (ns < 1) ns = 1;
    int S = (n_keys + ns - 1) / ns;
    S = (S + 31) / 32 * 32;
    if (S > s_max) S = s_max;
    *S_out = S;
    *n_splits_out = (n_keys + S - 1) / S;
}

extern "C" size_t cuda_attention_scratch_bytes(const cuda_ctx *ctx, int max_keys, attn_shape s) {
    if (max_keys < 1 || s.n_kv_heads < 1 || s.n_heads < s.n_kv_heads) return 0;
    // The split count is not monotone in n_keys; bound it over every length.
    int G = s.n_heads / s.n_kv_heads;
    int s_max = (8192 / G) / 32 * 32;
    if (s_max > 1024) s_max = 1024;
    if (s_max < 32) s_max = 32;
    int target = (2 * (ctx->n_sm > 0 ? ctx->n_sm : 1) + s.n_kv_heads - 1) / s.n_kv_heads;
    size_t ns = (size_t)target + 1, by_cap = (size_t)(max_keys + s_max - 1) / s_max;
    if (by_cap > ns) ns = by_cap;
    size_t part = (size_t)s.n_heads * ns * (s.head_dim + 2) * sizeof(float);
    size_t abar = (size_t)max_keys * sizeof(float);  // stats, used after the combine
    return part > abar ? part : abar;
}

// ---- prefill -------------------------------------------------------------------------
// grid (T, n_heads), block ATT_THREADS; smem q_s[hd] + p_s[ATT_THREADS]
__global__ void attn_prefill_kernel(float *out, float *last_scores, const float *q,
                                    const uint16_t *k_trunk, const uint16_t *v_trunk,
                                    const uint16_t *k_tail, const uint16_t *v_tail, int n_trunk,
                                    int n_keys, int T, int n_heads, int n_kv, int hd, float scale) {
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
            const uint16_t *kr = kv_row(k_trunk, k_tail, n_trunk, k0 + tid, kv_dim) + (size_t)kvh * hd;
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
                        kv_row(v_trunk, v_tail, n_trunk, k0 + jj, kv_dim) + (size_t)kvh * hd;
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
// grid (n_heads), block 256: head_stats[h*4 + 3] = lse_h = log sum_j exp(s_h(j))
__global__ void attn_lse_kernel(float *head_stats, const float *scores, int n_keys) {
    __shared__ float sh[32];
    const float *sr = scores + (size_t)blockIdx.x * n_keys;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) m = fmaxf(m, sr[j]);
    m = block_max(m, sh);
    float l = 0.f;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) l += expf(sr[j] - m);
    l = block_sum(l, sh);
    if (threadIdx.x == 0) head_stats[blockIdx.x * 4 + 3] = m + logf(l);
}

// grid (cdiv(n_keys, 256)), block 256: abar[j] = mean_h exp(s_h(j) - lse_h)
__global__ void attn_mean_prob_kernel(float *abar, const float *scores, const float *head_stats,
                                      int n_heads, int n_keys) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_keys) return;
    float a = 0.f;
    for (int h = 0; h < n_heads; h++) a += expf(scores[(size_t)h * n_keys + j] - head_stats[h * 4 + 3]);
    abar[j] = a / (float)n_heads;
}

// grid (n_heads), block 256. Per head h, with a = exp(s - lse_h):
//   [0] entropy_bits = -sum_j a log2(clip(a, 1e-10, 1))
//   [1] agreement_h  = mean_j |a - abar[j]|
//   [2] interaction_h = mean_j |s|
__global__ void attn_head_stats_kernel(float *head_stats, const float *scores, const float *abar,
                                       int n_keys) {
    __shared__ float sh[32];
    int h = blockIdx.x;
    const float *sr = scores + (size_t)h * n_keys;
    float lse = head_stats[h * 4 + 3];
    float ent = 0.f, dev = 0.f, mag = 0.f;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        float s = sr[j], a = expf(s - lse);
        ent -= a * log2f(fminf(fmaxf(a, 1e-10f), 1.f));
        dev += fabsf(a - abar[j]);
        mag += fabsf(s);
    }
    ent = block_sum(ent, sh);
    dev = block_sum(dev, sh);
    mag = block_sum(mag, sh);
    if (threadIdx.x == 0) {
        head_stats[h * 4 + 0] = ent;
        head_stats[h * 4 + 1] = dev / (float)n_keys;
        head_stats[h * 4 + 2] = mag / (float)n_keys;
    }
}

// grid 1, block 32: out4 = {mean_h H_h, var_h H_h (population), mean_h agreement_h,
// mean_h interaction_h}
__global__ void attn_stats_kernel(float *out4, const float *head_stats, int n_heads) {
    int lane = threadIdx.x;
    float e = 0.f, ag = 0.f, in = 0.f;
    for (int h = lane; h < n_heads; h += 32) {
        e += head_stats[h * 4 + 0];
        ag += head_stats[h * 4 + 1];
        in += head_stats[h * 4 + 2];
    }
    float mean = warp_sum(e) / (float)n_heads;
    float var = 0.f;
    for (int h = lane; h < n_heads; h += 32) {
        float d = head_stats[h * 4 + 0] - mean;
        var += d * d;
    }
    var = warp_sum(var) / (float)n_heads;
    ag = warp_sum(ag) / (float)n_heads;
    in = warp_sum(in) / (float)n_heads;
    if (lane == 0) {
        out4[0] = mean;
        out4[1] = var;
        out4[2] = ag;
        out4[3] = in;
    }
}

extern "C" int cuda_attn_stats(cuda_ctx *ctx, float *out4, const float *head_stats, int n_heads) {
    CUDA_REQUIRE(ctx, n_heads > 0, "cuda_attn_stats: n_heads=%d", n_heads);
    attn_stats_kernel<<<1, 32, 0, ctx->stream>>>(out4, head_stats, n_heads);
    CUDA_CHECK_LAUNCH(ctx, "attn_stats_kernel");
    return 0;
}

static int head_stats_launch(cuda_ctx *ctx, float *head_stats, const float *scores, int n_heads,
                             int n_keys) {
    size_t need = (size_t)n_keys * sizeof(float);
    CUDA_REQUIRE(ctx, ctx->scratch && ctx->scratch_bytes >= need,
                 "cuda_attention: scratch too small for head stats: need %zu bytes, have %zu",
                 need, ctx->scratch_bytes);
    float *abar = (float *)ctx->scratch;
    attn_lse_kernel<<<n_heads, 256, 0, ctx->stream>>>(head_stats, scores, n_keys);
    CUDA_CHECK_LAUNCH(ctx, "attn_lse_kernel");
    attn_mean_prob_kernel<<<cdiv_u(n_keys, 256), 256, 0, ctx->stream>>>(abar, scores, head_stats,
                                                                        n_heads, n_keys);
    CUDA_CHECK_LAUNCH(ctx, "attn_mean_prob_kernel");
    attn_head_stats_kernel<<<n_heads, 256, 0, ctx->stream>>>(head_stats, scores, abar, n_keys);
    CUDA_CHECK_LAUNCH(ctx, "attn_head_stats_kernel");
    return 0;
}

extern "C" int cuda_attention(cuda_ctx *ctx, float *out, const float *q, kv_span kv, int T,
                              attn_shape s, float *last_scores, float *head_stats) {
    int n_keys = kv.n_trunk + kv.n_tail;
    CUDA_REQUIRE(ctx, s.n_heads > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
                 "cuda_attention: n_heads=%d is not a multiple of n_kv_heads=%d", s.n_heads,
                 s.n_kv_heads);
    CUDA_REQUIRE(ctx, s.head_dim > 0 && s.head_dim % 8 == 0 && s.head_dim <= ATT_MAX_HD,
                 "cuda_attention: head_dim=%d must be a multiple of 8 and <= %d", s.head_dim,
                 ATT_MAX_HD);
    CUDA_REQUIRE(ctx, kv.n_trunk >= 0 && kv.n_tail >= 0 && T >= 1 && T <= n_keys,
                 "cuda_attention: T=%d queries need 1..%d keys (n_trunk=%d n_tail=%d)", T, n_keys,
                 kv.n_trunk, kv.n_tail);
    CUDA_REQUIRE(ctx, kv.n_tail == 0 || (kv.k_tail && kv.v_tail),
                 "cuda_attention: n_tail=%d but tail buffers are NULL", kv.n_tail);
    CUDA_REQUIRE(ctx, !head_stats || last_scores, "cuda_attention: head_stats needs last_scores");
    CUDA_REQUIRE(ctx, is_aligned(kv.k_trunk, 16) && is_aligned(kv.v_trunk, 16) &&
                          is_aligned(kv.k_tail, 16) && is_aligned(kv.v_tail, 16),
                 "cuda_attention: KV buffers must be 16-byte aligned");
    CUDA_REQUIRE(ctx, T <= 65535, "cuda_attention: T=%d exceeds the grid limit", T);
    int G = s.n_heads / s.n_kv_heads;
    const uint16_t *kt = (const uint16_t *)kv.k_trunk, *vt = (const uint16_t *)kv.v_trunk;
    const uint16_t *kl = (const uint16_t *)kv.k_tail, *vl = (const uint16_t *)kv.v_tail;

    if (T == 1) {
        int S, ns;
        decode_splits(ctx->n_sm, n_keys, s, &S, &ns);
        size_t need = (size_t)s.n_heads * ns * (s.head_dim + 2) * sizeof(float);
        CUDA_REQUIRE(ctx, ctx->scratch && ctx->scratch_bytes >= need,
                     "cuda_attention: scratch too small: need %zu bytes, have %zu "
                     "(reserve cuda_attention_scratch_bytes)", need, ctx->scratch_bytes);
        size_t smem = (size_t)G * (s.head_dim + S) * sizeof(float);
        CUDA_REQUIRE(ctx, smem <= ATT_SMEM_MAX,
                     "cuda_attention: GQA group %d x head_dim %d needs %zu bytes of shared memory",
                     G, s.head_dim, smem);
        float *part = (float *)ctx->scratch;
        dim3 grid(ns, s.n_kv_heads);
        attn_decode_split_kernel<<<grid, ATT_THREADS, smem, ctx->stream>>>(
            part, last_scores, q, kt, vt, kl, vl, kv.n_trunk, n_keys, s.n_heads, s.n_kv_heads,
            s.head_dim, s.scale, S);
        CUDA_CHECK_LAUNCH(ctx, "attn_decode_split_kernel");
        attn_decode_combine_kernel<<<s.n_heads, ATT_THREADS, 0, ctx->stream>>>(out, part, ns,
                                                                              s.head_dim);
        CUDA_CHECK_LAUNCH(ctx, "attn_decode_combine_kernel");
    } else {
        dim3 grid(T, s.n_heads);
        size_t smem = (size_t)(s.head_dim + ATT_THREADS) * sizeof(float);
        attn_prefill_kernel<<<grid, ATT_THREADS, smem, ctx->stream>>>(
            out, last_scores, q, kt, vt, kl, vl, kv.n_trunk, n_keys, T, s.n_heads, s.n_kv_heads,
            s.head_dim, s.scale);
        CUDA_CHECK_LAUNCH(ctx, "attn_prefill_kernel");
    }
    if (head_stats) return head_stats_launch(ctx, head_stats, last_scores, s.n_heads, n_keys);
    return 0;
}
