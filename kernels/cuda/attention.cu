// attention.cu: causal GQA attention over a bf16 KV cache split in trunk + tail
// segments (kv_span), and the attention statistics of the newest query.
//
// Decode (T == 1), flash-decoding style, for B sequences at once (grid z / y = row):
//   attn_decode_split_kernel  grid (n_splits, n_kv_heads, B): one block takes an equal share
//       of the keys for the G = n_heads/n_kv_heads query heads sharing a KV head, in
//       tiles of S keys with an online softmax, then writes the split's max m, sum
//       l = sum exp(s - m) and unnormalized output o = sum exp(s-m) v to scratch
//       part[n_heads, n_splits, head_dim + 2] (o..., m, l). Empty splits write l = 0.
//   attn_decode_combine_kernel grid (n_heads, B): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M)
//       over the splits with l_s > 0. With counters reserved (cuda_reserve_attention) the
//       last split block of each (row, KV head) does this itself and no combine launches.
//   The segments and lengths come either from kernel arguments (cuda_attention) or from
//   device records (cuda_attention_decode_dev, graph replay); the split count is a host
//   value fixed by the longest length the caller supports.
// Prefill (T > 1): attn_prefill_kernel grid (T, n_heads), one block per (query, head),
//   keys in tiles of blockDim with an online softmax. Simple and correct first.
// Stats (cuda_attn_stats), entropix's four attention metrics from the last query's
//   captured scores [n_heads, n_keys], the twin of cpu_attn_stats:
//   attn_stats_head_kernel  grid (n_heads): lse_h, entropy E_h, sum_j |s_h(j)| per head
//   attn_stats_agree_kernel grid (parts): per key, sum_h |a_h(j) - abar(j)|, summed per block
//   attn_stats_final_kernel 1 block: mean and variance of E_h, agreement, interaction.
//   Sums are in double (scratch holds the per-head and per-block doubles), so the
//   result matches the host's double math to ~1e-6 relative. Formulas in docs/cuda.md.
#include "kernels/cuda/common.cuh"

#define ATT_THREADS 128
#define ATT_MAX_HD 512   // prefill keeps head_dim/ATT_THREADS accumulators per thread
#define ATT_SMEM_MAX (48 * 1024)

// Key/value row j (0 <= j < n_keys) of a kv_span: trunk then tail.
__device__ __forceinline__ const uint16_t *kv_row(const uint16_t *trunk, const uint16_t *tail,
                                                  int n_trunk, int j, int kv_dim) {
    return j < n_trunk ? trunk + (size_t)j * kv_dim : tail + (size_t)(j - n_trunk) * kv_dim;
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

// dot_q_k for a head_dim known at compile time (64 and 128, the common ones): the loads of
// the key row are unrolled ahead of the products, where the runtime loop waits on each in
// turn (ptxas still interleaves some with the products: sm_90 SASS shows 3 of 8 issued
// before the first product at 64). The sums are in the same order: the same bits.
template <int HD>
__device__ __forceinline__ float dot_q_k_fixed(const float *q, const uint16_t *k) {
    const uint4 *k4 = (const uint4 *)k;
    uint4 raw[HD / 8];
#pragma unroll
    for (int c = 0; c < HD / 8; c++) raw[c] = __ldg(k4 + c);
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < HD / 8; c++) {
        float f[8];
        unpack8<WT_BF16>(raw[c], f);
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(q[8 * c + e], f[e], s);
    }
    return s;
}

template <int HD>
__device__ __forceinline__ float dot_q_k_hd(const float *q, const uint16_t *k, int hd) {
    if constexpr (HD > 0) return dot_q_k_fixed<HD>(q, k);
    else return dot_q_k(q, k, hd);
}

// ---- decode -------------------------------------------------------------------------
// smem: q_s[G*hd] | o_s[G*hd] | sc[G*S] | m_s[G] | l_s[G] | c_s[G] | kn_s[hd] | vn_s[hd]
// (the last two: the newest key and value with fused RoPE). Each thread owns fixed
// o_s entries (same idx stride every tile), so o_s needs no barrier of its own.
// L/N are used as given unless dL/dN (device records) are set. grid z = batch row b:
// its records dL[b], dN[b], query q[b], partials and scores (score_stride floats apart).
// out[g][hd] = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the splits of nh
// consecutive heads (ph0: the first head's n_splits partials; out: its output row).
// Splits with l_s == 0 (no keys) get weight 0; split 0 always has keys, so M is finite.
// Warp g works out head g's weights w[g][s] (one expf per split, all lanes at once) and
// 1/L into shared memory; then every thread takes outputs of all nh heads. Done split by
// split in one thread, this was a serial chain of 3 * n_splits L2 reads per head, slower
// than the split kernel itself on an H200 (docs/benchmarks.md, 2026-11-26).
// w: nh * n_splits floats and inv: nh floats of shared memory. Called by a whole block.
// ldcg: partials of other blocks are read from L2, never a stale L1 line.
__device__ void combine_heads(float *out, const float *ph0, int nh, int n_splits, int hd, float *w, float *inv) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    size_t hstride = (size_t)n_splits * (hd + 2);
    for (int g = warp; g < nh; g += nw) {
        const float *ph = ph0 + g * hstride;
        float M = -INFINITY;
        for (int s = lane; s < n_splits; s += 32) {
            const float *ps = ph + (size_t)s * (hd + 2);
            if (__ldcg(ps + hd + 1) > 0.f) M = fmaxf(M, __ldcg(ps + hd));
        }
        M = warp_max(M);
        float L = 0.f;
        for (int s = lane; s < n_splits; s += 32) {
            const float *ps = ph + (size_t)s * (hd + 2);
            float l = __ldcg(ps + hd + 1);
            float ws = l > 0.f ? expf(__ldcg(ps + hd) - M) : 0.f;
            w[g * n_splits + s] = ws;
            L = fmaf(l, ws, L);
        }
        L = warp_sum(L);
        if (lane == 0) inv[g] = 1.f / L;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < nh * hd; idx += blockDim.x) {
        int g = idx / hd, d = idx - g * hd;
        const float *po = ph0 + g * hstride + d, *wg = w + g * n_splits;
        float o = 0.f;
#pragma unroll 4
        for (int s = 0; s < n_splits; s++) o = fmaf(__ldcg(po + (size_t)s * (hd + 2)), wg[s], o);
        out[(size_t)g * hd + d] = __fmul_rn(o, inv[g]);
    }
}

// The step's RoPE and KV store, fused into the decode attention (on: set): q is the raw
// query [B, n_heads*hd] and k, v the raw new key and value [B, kv_dim] of each row, at
// position pos[b], stored at cache row rows[b] of its record's k_dst / v_dst. The math is
// rope_kv_store_kernel's (rope_head_pair): the same bits.
struct rope_fuse {
    int on;
    const float *k, *v;
    const int *pos, *rows;
    const float *inv_freq, *q_norm, *k_norm;
    float eps;
};

// Prologue of a split block with fused RoPE: warp w rotates query heads w, w + nw, ...
// of the group into q_s; the block that owns the newest key (own) also rotates its KV
// head's new key, stores it and the value in the cache as bf16, and keeps both (as the
// floats of those bf16 values) in kn_s / vn_s, which its tile loop reads for that key:
// the cache row it has just written is not read back through the read-only path.
__device__ void rope_fuse_prologue(const rope_fuse &rf, const float *qg, float *q_s, float *kn_s, float *vn_s,
                                   const cuda_kv_layer &L, int b, int kvh, int G, int n_kv, int hd, bool own) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, half = hd / 2;
    int pos = rf.pos[b];
    for (int g = warp; g < G + (own ? 1 : 0); g += nw) {
        bool is_k = g == G;
        const float *src = is_k ? rf.k + (size_t)b * n_kv * hd + (size_t)kvh * hd : qg + (size_t)g * hd;
        const float *nwt = is_k ? rf.k_norm : rf.q_norm;
        float inv = nwt ? head_inv_rms(src, hd, rf.eps) : 1.f;
        size_t dst = (size_t)rf.rows[b] * n_kv * hd + (size_t)kvh * hd;
        for (int j = lane; j < half; j += 32) {
            float y0, y1;
            rope_head_pair(src, j, half, inv, nwt, pos, rf.inv_freq, y0, y1);
            if (!is_k) {
                q_s[g * hd + j] = y0;
                q_s[g * hd + j + half] = y1;
                continue;
            }
            uint16_t k0 = f32_to_bf16_bits(y0), k1 = f32_to_bf16_bits(y1);
            ((uint16_t *)L.k_dst)[dst + j] = k0;
            ((uint16_t *)L.k_dst)[dst + j + half] = k1;
            kn_s[j] = bf16_bits_to_f32(k0);
            kn_s[j + half] = bf16_bits_to_f32(k1);
        }
        if (!is_k) continue;
        const float *vs = rf.v + (size_t)b * n_kv * hd + (size_t)kvh * hd;
        for (int j = lane; j < hd; j += 32) {
            uint16_t h = f32_to_bf16_bits(vs[j]);
            ((uint16_t *)L.v_dst)[dst + j] = h;
            vn_s[j] = bf16_bits_to_f32(h);
        }
    }
}

// q (shared fp32) . the newest key kept in shared memory by the prologue, in dot_q_k's
// order: the same bits as reading it from the cache.
__device__ __forceinline__ float dot_q_kn(const float *q, const float *kn, int hd) {
    float s = 0.f;
    for (int d = 0; d < hd; d++) s = fmaf(q[d], kn[d], s);
    return s;
}

// count (NULL: the combine kernel follows) holds one counter per (row, KV head): each
// split block adds 1 after writing its partials (and a fence); the block that brings it
// to n_splits combines the group's G heads into out and sets it back to 0 for the next
// step (a captured graph replays the same counters).
// HD: head_dim when it is 64 or 128 (unrolled key loads), else 0 (any even head_dim).
template <int HD>
__global__ void attn_decode_split_kernel(float *part, float *last_scores, const float *q,
                                         cuda_kv_layer L, cuda_kv_lens N,
                                         const cuda_kv_layer *dL, const cuda_kv_lens *dN,
                                         int n_heads, int n_kv, int hd, float scale, int S,
                                         size_t score_stride, unsigned *count, float *out, rope_fuse rf) {
    extern __shared__ float smem[];
    int b = blockIdx.z;
    if (dL) L = dL[b];
    if (dN) N = dN[b];
    int split = blockIdx.x, kvh = blockIdx.y, n_splits = gridDim.x;
    q += (size_t)b * n_heads * hd;
    part += (size_t)b * n_heads * n_splits * (hd + 2);
    if (last_scores) last_scores += b * score_stride;
    int G = n_heads / n_kv, kv_dim = n_kv * hd, n_keys = N.n_keys, n_trunk = N.n_trunk;
    int per = (n_keys + n_splits - 1) / n_splits;  // keys per split
    int j0 = split * per, j1 = min(n_keys, j0 + per);
    const uint16_t *kt = (const uint16_t *)L.k_trunk, *vt = (const uint16_t *)L.v_trunk;
    const uint16_t *kl = (const uint16_t *)L.k_tail, *vl = (const uint16_t *)L.v_tail;
    float *q_s = smem, *o_s = q_s + G * hd, *sc = o_s + G * hd;
    float *m_s = sc + G * S, *l_s = m_s + G, *c_s = l_s + G, *kn_s = c_s + G, *vn_s = kn_s + hd;
    const float *qg = q + (size_t)kvh * G * hd;  // heads kvh*G .. kvh*G+G-1 are contiguous
    // With fused RoPE the split holding the newest key (j = n_keys - 1) rotates and stores it.
    int newest = rf.on ? n_keys - 1 : -1;
    bool own = rf.on && j0 <= newest && newest < j1;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
        if (!rf.on) q_s[i] = qg[i];
        o_s[i] = 0.f;
    }
    if (rf.on) rope_fuse_prologue(rf, qg, q_s, kn_s, vn_s, L, b, kvh, G, n_kv, hd, own);
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        m_s[g] = -INFINITY;
        l_s[g] = 0.f;
    }
    __syncthreads();

    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, half = hd / 2;
    for (int jt = j0; jt < j1; jt += S) {
        int n = min(S, j1 - jt);
        // 1. scores s = q_h . k_j * scale for (g, jj) pairs; a warp walks consecutive keys.
        for (int idx = threadIdx.x; idx < G * n; idx += blockDim.x) {
            int g = idx / n, jj = idx - g * n, j = jt + jj;
            float s;
            if (j == newest) {
                s = dot_q_kn(q_s + g * hd, kn_s, hd) * scale;
            } else {
                const uint16_t *kr = kv_row(kt, kl, n_trunk, j, kv_dim) + (size_t)kvh * hd;
                s = dot_q_k_hd<HD>(q_s + g * hd, kr, hd) * scale;
            }
            sc[g * S + jj] = s;
            if (last_scores) last_scores[(size_t)(kvh * G + g) * n_keys + j] = s;
        }
        __syncthreads();
        // 2. per head (one warp each): new running max, p = exp(s - m) in place, l.
        for (int g = warp; g < G; g += nw) {
            float *sg = sc + g * S;
            float m_old = m_s[g], l_old = l_s[g];  // read by every lane before lane 0 writes
            float tm = -INFINITY;
            for (int jj = lane; jj < n; jj += 32) tm = fmaxf(tm, sg[jj]);
            tm = warp_max(tm);
            float m_new = fmaxf(m_old, tm);
            float corr = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
            float l = 0.f;
            for (int jj = lane; jj < n; jj += 32) {
                float p = expf(sg[jj] - m_new);
                sg[jj] = p;
                l += p;
            }
            l = warp_sum(l);
            __syncwarp();  // orders the lanes' reads of m_s/l_s before the write
            if (lane == 0) {
                m_s[g] = m_new;
                l_s[g] = l_old * corr + l;
                c_s[g] = corr;
            }
        }
        __syncthreads();
        // 3. o[g][d] = o * corr + sum_jj p[g][jj] * v[j][d]; one thread per (g, pair of d).
        for (int idx = threadIdx.x; idx < G * half; idx += blockDim.x) {
            int g = idx / half, d = 2 * (idx - g * half);
            const float *pg = sc + g * S;
            float corr = c_s[g];
            float o0 = o_s[g * hd + d] * corr, o1 = o_s[g * hd + d + 1] * corr;
#pragma unroll 8
            for (int jj = 0; jj < n; jj++) {
                float v0, v1;
                if (jt + jj == newest) {
                    v0 = vn_s[d];
                    v1 = vn_s[d + 1];
                } else {
                    const uint16_t *vr = kv_row(vt, vl, n_trunk, jt + jj, kv_dim) + (size_t)kvh * hd;
                    uint32_t u = *(const uint32_t *)(vr + d);  // d and hd even: 4-byte aligned
                    v0 = __uint_as_float(u << 16);
                    v1 = __uint_as_float(u & 0xffff0000u);
                }
                float p = pg[jj];
                o0 = fmaf(p, v0, o0);
                o1 = fmaf(p, v1, o1);
            }
            o_s[g * hd + d] = o0;
            o_s[g * hd + d + 1] = o1;
        }
        __syncthreads();  // sc and c_s are rewritten by the next tile
    }
    // o_s entries are final for their owners; m_s, l_s were published before a barrier.
    for (int idx = threadIdx.x; idx < G * half; idx += blockDim.x) {
        int g = idx / half, d = 2 * (idx - g * half);
        float *pp = part + ((size_t)(kvh * G + g) * n_splits + split) * (hd + 2);
        pp[d] = o_s[g * hd + d];
        pp[d + 1] = o_s[g * hd + d + 1];
    }
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        float *pp = part + ((size_t)(kvh * G + g) * n_splits + split) * (hd + 2);
        pp[hd] = m_s[g];
        pp[hd + 1] = l_s[g];
    }
    if (!count) return;
    __shared__ unsigned last;
    __threadfence();  // this block's partials are visible device-wide before it counts
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[(size_t)b * n_kv + kvh], 1u) == (unsigned)n_splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();  // the other blocks' partials, counted before ours, are visible
    // sc (G * S floats, S >= n_splits: decode_splits) is free after the last tile's barrier.
    combine_heads(out + ((size_t)b * n_heads + kvh * G) * hd, part + (size_t)kvh * G * n_splits * (hd + 2), G,
                  n_splits, hd, sc, m_s);
    if (threadIdx.x == 0) count[(size_t)b * n_kv + kvh] = 0;
}

// grid (n_heads, B), block ATT_THREADS. Splits with l == 0 (no keys) are skipped; split 0
// always has keys, so M is finite.
// smem: w[n_splits] | inv[1].
__global__ void attn_decode_combine_kernel(float *out, const float *part, int n_splits, int hd) {
    extern __shared__ float smem[];
    int h = blockIdx.x, hb = blockIdx.y * gridDim.x + h;  // head h of row blockIdx.y
    combine_heads(out + (size_t)hb * hd, part + (size_t)hb * n_splits * (hd + 2), 1, n_splits, hd, smem,
                  smem + n_splits);
}

static int decode_tile(attn_shape s);

// Split count for n_keys keys: about two blocks per SM, at least 32 keys per split, and
// at most the tile size S, since the combining block keeps G * n_splits weights in the
// G * S floats of its score tile.
static int decode_splits(int n_sm, int n_keys, attn_shape s) {
    int target = (2 * (n_sm > 0 ? n_sm : 1) + s.n_kv_heads - 1) / s.n_kv_heads;
    int by_len = (n_keys + 31) / 32;
    int ns = target < by_len ? target : by_len;
    int S = decode_tile(s);
    if (S >= 32 && ns > S) ns = S;
    return ns < 1 ? 1 : ns;
}

// Keys per tile S (a multiple of 32, at most 256) so the decode kernel's shared memory
// fits in ATT_SMEM_MAX; 0 if not even 32 fit.
static int decode_tile(attn_shape s) {
    int G = s.n_heads / s.n_kv_heads;
    long fixed = 2L * G * s.head_dim + 3L * G + 2L * s.head_dim;  // q_s, o_s, m_s, l_s, c_s, kn_s, vn_s
    long room = (long)(ATT_SMEM_MAX / sizeof(float)) - fixed;
    long S = room > 0 ? room / G / 32 * 32 : 0;
    return S > 256 ? 256 : (int)S;
}

static size_t decode_smem(attn_shape s, int S) {
    int G = s.n_heads / s.n_kv_heads;
    return ((size_t)2 * G * s.head_dim + (size_t)G * S + 3 * (size_t)G + 2 * (size_t)s.head_dim) * sizeof(float);
}

extern "C" size_t cuda_attention_rows_scratch_bytes(const cuda_ctx *ctx, int max_keys, attn_shape s, int B) {
    if (max_keys < 1 || B < 1 || s.n_kv_heads < 1 || s.n_heads < s.n_kv_heads) return 0;
    // decode_splits grows with n_keys up to its target: bound it at max_keys.
    size_t ns = (size_t)decode_splits(ctx->n_sm, max_keys, s);
    size_t part = (size_t)B * s.n_heads * ns * (s.head_dim + 2) * sizeof(float);
    size_t stats = cuda_attn_stats_scratch_bytes(ctx, s.n_heads, max_keys);  // after the combine
    return part > stats ? part : stats;
}

extern "C" size_t cuda_attention_scratch_bytes(const cuda_ctx *ctx, int max_keys, attn_shape s) {
    return cuda_attention_rows_scratch_bytes(ctx, max_keys, s, 1);
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
    CUDA_REQUIRE(ctx, decode_tile(s) >= 32,
                 "cuda_attention: a GQA group of %d heads x head_dim %d does not fit the decode "
                 "kernel's %d bytes of shared memory", s.n_heads / s.n_kv_heads, s.head_dim,
                 ATT_SMEM_MAX);
    return 0;
}

extern "C" int cuda_attention_validate(cuda_ctx *ctx, attn_shape s) { return shape_check(ctx, s); }

// Split + combine on ctx->scratch; L/N by value (B == 1), or B rows of dL/dN on the
// device, row b's scores score_stride floats after row b-1's.
static int decode_launch(cuda_ctx *ctx, float *out, const float *q, cuda_kv_layer L, cuda_kv_lens N,
                         const cuda_kv_layer *dL, const cuda_kv_lens *dN, int B, int ns, attn_shape s,
                         float *last_scores, size_t score_stride, rope_fuse rf) {
    CUDA_REQUIRE(ctx, B >= 1 && B <= 65535 && (B == 1 || (dL && dN)),
                 "cuda_attention: %d rows need device records (1..65535 rows)", B);
    size_t need = (size_t)B * s.n_heads * ns * (s.head_dim + 2) * sizeof(float);
    CUDA_REQUIRE(ctx, ctx->scratch && ctx->scratch_bytes >= need,
                 "cuda_attention: scratch too small: need %zu bytes, have %zu "
                 "(reserve cuda_attention_scratch_bytes)", need, ctx->scratch_bytes);
    int S = decode_tile(s);
    float *part = (float *)ctx->scratch;
    // With counters for every (row, KV head) the split blocks combine themselves.
    unsigned *count = ctx->att_count && ctx->att_count_n >= B * s.n_kv_heads ? ctx->att_count : NULL;
    dim3 grid(ns, s.n_kv_heads, B), cgrid(s.n_heads, B);
    size_t smem = decode_smem(s, S);
    if (s.head_dim == 64)
        attn_decode_split_kernel<64><<<grid, ATT_THREADS, smem, ctx->stream>>>(
            part, last_scores, q, L, N, dL, dN, s.n_heads, s.n_kv_heads, s.head_dim, s.scale, S, score_stride, count,
            out, rf);
    else if (s.head_dim == 128)
        attn_decode_split_kernel<128><<<grid, ATT_THREADS, smem, ctx->stream>>>(
            part, last_scores, q, L, N, dL, dN, s.n_heads, s.n_kv_heads, s.head_dim, s.scale, S, score_stride, count,
            out, rf);
    else
        attn_decode_split_kernel<0><<<grid, ATT_THREADS, smem, ctx->stream>>>(
            part, last_scores, q, L, N, dL, dN, s.n_heads, s.n_kv_heads, s.head_dim, s.scale, S, score_stride, count,
            out, rf);
    CUDA_CHECK_LAUNCH(ctx, "attn_decode_split_kernel");
    if (count) return 0;
    size_t csmem = ((size_t)ns + 1) * sizeof(float);
    attn_decode_combine_kernel<<<cgrid, ATT_THREADS, csmem, ctx->stream>>>(out, part, ns, s.head_dim);
    CUDA_CHECK_LAUNCH(ctx, "attn_decode_combine_kernel");
    return 0;
}

extern "C" int cuda_attention(cuda_ctx *ctx, float *out, const float *q, kv_span kv, int T,
                              attn_shape s, float *last_scores) {
    int n_keys = kv.n_trunk + kv.n_tail;
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
    const uint16_t *kt = (const uint16_t *)kv.k_trunk, *vt = (const uint16_t *)kv.v_trunk;
    const uint16_t *kl = (const uint16_t *)kv.k_tail, *vl = (const uint16_t *)kv.v_tail;

    if (T == 1) {
        cuda_kv_layer L = {kv.k_trunk, kv.v_trunk, kv.k_tail, kv.v_tail, NULL, NULL};
        cuda_kv_lens N = {kv.n_trunk, n_keys};
        rope_fuse none = { 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.f };
        if (decode_launch(ctx, out, q, L, N, NULL, NULL, 1, decode_splits(ctx->n_sm, n_keys, s), s,
                          last_scores, 0, none))
            return -1;
    } else {
        dim3 grid(T, s.n_heads);
        size_t smem = (size_t)(s.head_dim + ATT_THREADS) * sizeof(float);
        attn_prefill_kernel<<<grid, ATT_THREADS, smem, ctx->stream>>>(
            out, last_scores, q, kt, vt, kl, vl, kv.n_trunk, n_keys, T, s.n_heads, s.n_kv_heads,
            s.head_dim, s.scale);
        CUDA_CHECK_LAUNCH(ctx, "attn_prefill_kernel");
    }
    return 0;
}

extern "C" int cuda_attention_decode_rows(cuda_ctx *ctx, float *out, const float *q,
                                          const cuda_kv_layer *d_layers, const cuda_kv_lens *d_lens, int B,
                                          int max_keys, attn_shape s, float *last_scores) {
    return cuda_attention_decode_rows_rope(ctx, out, q, NULL, d_layers, d_lens, B, max_keys, s, last_scores);
}

extern "C" int cuda_attention_decode_rows_rope(cuda_ctx *ctx, float *out, const float *q, const cuda_rope_kv *rk,
                                               const cuda_kv_layer *d_layers, const cuda_kv_lens *d_lens, int B,
                                               int max_keys, attn_shape s, float *last_scores) {
    if (shape_check(ctx, s)) return -1;
    CUDA_REQUIRE(ctx, d_layers && d_lens && max_keys >= 1,
                 "cuda_attention_decode_rows: needs device records and max_keys >= 1 (got %d)",
                 max_keys);
    rope_fuse rf = { 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.f };
    if (rk) {
        CUDA_REQUIRE(ctx, rk->k && rk->v && rk->pos && rk->rows && rk->inv_freq && !rk->q_norm == !rk->k_norm,
                     "cuda_attention_decode_rows_rope: needs k, v, pos, rows and inv_freq (q_norm and k_norm "
                     "go together)");
        rf = (rope_fuse){ 1, rk->k, rk->v, rk->pos, rk->rows, rk->inv_freq, rk->q_norm, rk->k_norm, rk->eps };
    }
    cuda_kv_layer L = {NULL, NULL, NULL, NULL, NULL, NULL};
    cuda_kv_lens N = {0, 0};
    return decode_launch(ctx, out, q, L, N, d_layers, d_lens, B, decode_splits(ctx->n_sm, max_keys, s), s,
                         last_scores, (size_t)s.n_heads * max_keys, rf);
}

extern "C" int cuda_attention_decode_dev(cuda_ctx *ctx, float *out, const float *q,
                                         const cuda_kv_layer *d_layer, const cuda_kv_lens *d_lens,
                                         int max_keys, attn_shape s, float *last_scores) {
    return cuda_attention_decode_rows(ctx, out, q, d_layer, d_lens, 1, max_keys, s, last_scores);
}
