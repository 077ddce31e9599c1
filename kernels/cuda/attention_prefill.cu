// attention_prefill.cu: the prefill attention (T > 1) in tiles, for head_dim 64 and 128
// and groups of up to 16 heads; other shapes, and VARENT_CUDA_PREFILL_TILED=0, take
// attn_prefill_kernel (attention.cu), whose bits this kernel keeps.
//
// attn_prefill_kernel runs one block per (query, head): every block reads all its keys
// and values from L2, a group's G heads read them G times, each of its 128 threads sums
// a whole key tile's max and exp sum on its own, and a value is one 2-byte load through
// the block table per multiply-add. Here one block takes PF_ROWS = 16 rows, the G heads of
// QB = 16 / G consecutive queries that share a KV head: it copies each 64-key piece of K,
// then of V, into shared memory once (16-byte loads, every line whole) and every row
// reads it there.
//
// The same bits as attn_prefill_kernel: the key tiles are its 128 keys (ATT_THREADS),
// a score is q . k summed dimension by dimension then scaled, a row's tile max and exp
// sum run key by key in one thread, and o[d] = o[d] * corr then p_j v_j[d] multiply-added
// key by key. A row skips the tiles past its causal length, as that kernel's loop ends.
#include "kernels/cuda/attention.cuh"

#define PF_TILE ATT_THREADS  // keys of one online-softmax step: attn_prefill_kernel's tile
#define PF_SUB 64            // keys of K or V in shared memory at once
#define PF_ROWS 16           // (query, head) rows a block
#define PF_PSTRIDE (PF_TILE + 1)  // floats of a row of p_s: one more, so the rows' threads
                                  // walking their rows key by key read different banks

// the scores: each thread one key of a piece against half the rows
static_assert(ATT_THREADS == 2 * PF_SUB && PF_ROWS % 2 == 0, "a block is two threads a key of a piece");

// The rows a block takes for a group of G heads (G <= PF_ROWS): whole queries.
__host__ __device__ __forceinline__ int pf_queries(int G) { return PF_ROWS / G; }

// Eight rows' scores against one shared-memory key row, each summed as dot_q_k sums it
// (dimension by dimension: the same bits). The key's chunk is widened once for the eight
// rows, whose q chunks a warp reads together (all its lanes take the same rows).
template <int HD>
__device__ __forceinline__ void pf_dots(float sc[PF_ROWS / 2], const float *q, const uint16_t *k) {
#pragma unroll
    for (int rr = 0; rr < PF_ROWS / 2; rr++) sc[rr] = 0.f;
#pragma unroll 2
    for (int c = 0; c < HD / 8; c++) {
        float f[8];
        unpack8<WT_BF16>(*(const uint4 *)(k + 8 * c), f);
#pragma unroll
        for (int rr = 0; rr < PF_ROWS / 2; rr++) {
            const float *qc = q + rr * HD + 8 * c;
#pragma unroll
            for (int e = 0; e < 8; e++) sc[rr] = fmaf(qc[e], f[e], sc[rr]);
        }
    }
}

// Rows [kb, kb + n) of K or V (KV head kvh) into kv_s: rows of HD + 8 bf16, the 16 bytes
// of padding spreading a warp's 16-byte reads of consecutive rows over the banks. All of
// a thread's loads (4 at head_dim 64, 8 at 128) are issued before its first store.
template <int HD>
__device__ __forceinline__ void pf_load(uint16_t *kv_s, const uint16_t *trunk, const uint16_t *tail, int n_trunk,
                                        int kb, int n, int kv_dim, int kvh, const int *table, int shift) {
    constexpr int C = HD / 8, PER = PF_SUB * C / ATT_THREADS;
    uint4 v[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        int i = threadIdx.x + u * ATT_THREADS, j = i / C, c = i - j * C;
        if (j < n)
            v[u] = __ldg((const uint4 *)(kv_row_pg(trunk, tail, n_trunk, kb + j, kv_dim, table, shift) +
                                         (size_t)kvh * HD) + c);
    }
#pragma unroll
    for (int u = 0; u < PER; u++) {
        int i = threadIdx.x + u * ATT_THREADS, j = i / C, c = i - j * C;
        if (j < n) *(uint4 *)(kv_s + j * (HD + 8) + 8 * c) = v[u];
    }
}

// The shape the kernel takes.
struct pf_args {
    float *out, *last_scores;
    const float *q;
    const uint16_t *k_trunk, *v_trunk, *k_tail, *v_tail;
    const int *table;
    int n_trunk, shift, n_keys, T, n_heads, n_kv;
    float scale;
};

// grid (ceil(T / QB), n_kv), block ATT_THREADS (4 warps: 2 x PF_SUB threads).
// smem: q_s[PF_ROWS][HD] f32 | p_s[PF_ROWS][PF_PSTRIDE] f32 | kv_s[PF_SUB][HD + 8] bf16 |
//       m_s, c_s[PF_ROWS] f32 | nt_s[PF_ROWS] int.
// Row r is head kvh * G + r % G of query qb * QB + r / G. For the values, thread
// (slot, chunk) keeps dims 8 * chunk .. + 8 of rows slot, slot + SLOTS, ...
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS) attn_prefill_tiled_kernel(pf_args a) {
    constexpr int C = HD / 8, SLOTS = ATT_THREADS / C, RPT = (PF_ROWS + SLOTS - 1) / SLOTS;
    extern __shared__ float4 pf_smem4[];
    float *q_s = (float *)pf_smem4, *p_s = q_s + PF_ROWS * HD;
    uint16_t *kv_s = (uint16_t *)(p_s + PF_ROWS * PF_PSTRIDE);
    float *m_s = (float *)(kv_s + PF_SUB * (HD + 8)), *c_s = m_s + PF_ROWS;
    int *nt_s = (int *)(c_s + PF_ROWS);
    int tid = threadIdx.x, kvh = blockIdx.y, G = a.n_heads / a.n_kv, QB = pf_queries(G), R = QB * G;
    int t0 = blockIdx.x * QB, kv_dim = a.n_kv * HD;
    // keys of the block's last query (the most any row sees)
    int n_max = a.n_keys - a.T + min(a.T - 1, t0 + QB - 1) + 1;
    for (int i = tid; i < PF_ROWS * HD; i += blockDim.x) {
        int r = i / HD, t = t0 + r / G;
        q_s[i] = r < R && t < a.T ? a.q[((size_t)t * a.n_heads + kvh * G + r % G) * HD + i % HD] : 0.f;
    }
    // the row's own state, in thread r (r < R): its keys, running max and sum
    int my_t = t0 + tid / G;
    int my_n = tid < R && my_t < a.T ? a.n_keys - a.T + my_t + 1 : 0;
    float m = -INFINITY, l = 0.f;
    int slot = tid / C, ch = tid - slot * C;
    float acc[RPT][8];
#pragma unroll
    for (int i = 0; i < RPT; i++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[i][e] = 0.f;
    for (int k0 = 0; k0 < n_max; k0 += PF_TILE) {
        // 1. scores of the tile, a 64-key piece of K at a time: a thread's key against 8 rows
        for (int kb = k0; kb < min(k0 + PF_TILE, n_max); kb += PF_SUB) {
            int n = min(PF_SUB, n_max - kb);
            __syncthreads();  // kv_s and (first piece) p_s are free
            pf_load<HD>(kv_s, a.k_trunk, a.k_tail, a.n_trunk, kb, n, kv_dim, kvh, a.table, a.shift);
            __syncthreads();
            float sc[PF_ROWS / 2];
            pf_dots<HD>(sc, q_s + (tid / PF_SUB) * (PF_ROWS / 2) * HD, kv_s + (tid % PF_SUB) * (HD + 8));
#pragma unroll
            for (int rr = 0; rr < PF_ROWS / 2; rr++) {
                int r = (tid / PF_SUB) * (PF_ROWS / 2) + rr, j = tid % PF_SUB, t = t0 + r / G;
                if (r >= R || j >= n || t >= a.T || kb + j >= a.n_keys - a.T + t + 1) continue;
                float s = sc[rr] * a.scale;
                p_s[r * PF_PSTRIDE + kb - k0 + j] = s;
                if (a.last_scores && t == a.T - 1) a.last_scores[(size_t)(kvh * G + r % G) * a.n_keys + kb + j] = s;
            }
        }
        __syncthreads();
        // 2. each row's tile max, key by key, and its correction (rows past their keys: none)
        if (tid < R) {
            int n = my_n > k0 ? min(PF_TILE, my_n - k0) : 0;
            float tmax = -INFINITY;
            for (int jj = 0; jj < n; jj++) tmax = fmaxf(tmax, p_s[tid * PF_PSTRIDE + jj]);
            float m_new = fmaxf(m, tmax);
            c_s[tid] = expf(m - m_new);  // 0 on the first tile (m = -inf)
            m_s[tid] = m_new;
            nt_s[tid] = n;
            if (n > 0) m = m_new;
        }
        __syncthreads();
        // 3. p = exp(s - max), every (row, key) at once
        for (int i = tid; i < R * PF_TILE; i += blockDim.x) {
            int r = i / PF_TILE, j = i - r * PF_TILE;
            float *pi = p_s + r * PF_PSTRIDE + j;
            if (j < nt_s[r]) *pi = expf(*pi - m_s[r]);
        }
        __syncthreads();
        // 4. the row's sum, key by key (while the other threads load the first piece of V)
        if (tid < R && nt_s[tid] > 0) {
            float tsum = 0.f;
            for (int jj = 0; jj < nt_s[tid]; jj++) tsum += p_s[tid * PF_PSTRIDE + jj];
            l = l * c_s[tid] + tsum;
        }
        // 5. o = o * corr + sum p v, a 64-key piece of V at a time
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            int r = slot + i * SLOTS;
            if (r < R && nt_s[r] > 0)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[i][e] = acc[i][e] * c_s[r];
        }
        for (int kb = k0; kb < min(k0 + PF_TILE, n_max); kb += PF_SUB) {
            int n = min(PF_SUB, n_max - kb);
            if (kb > k0) __syncthreads();  // the last piece of V is used (K: read before step 2)
            pf_load<HD>(kv_s, a.v_trunk, a.v_tail, a.n_trunk, kb, n, kv_dim, kvh, a.table, a.shift);
            __syncthreads();
            int nr[RPT], nmax = 0;  // each of the thread's rows' keys of the piece
#pragma unroll
            for (int i = 0; i < RPT; i++) {
                int r = slot + i * SLOTS;
                nr[i] = r < R ? min(n, nt_s[r] - (kb - k0)) : 0;
                nmax = max(nmax, nr[i]);
            }
            const float *pr = p_s + slot * PF_PSTRIDE + kb - k0;
            for (int jj = 0; jj < nmax; jj++) {
                float f[8];
                unpack8<WT_BF16>(*(const uint4 *)(kv_s + jj * (HD + 8) + 8 * ch), f);
#pragma unroll
                for (int i = 0; i < RPT; i++) {
                    if (jj >= nr[i]) continue;
                    float p = pr[i * SLOTS * PF_PSTRIDE + jj];
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[i][e] = fmaf(p, f[e], acc[i][e]);
                }
            }
        }
    }
    __syncthreads();
    if (tid < R) m_s[tid] = 1.f / l;  // m_s: the rows' 1 / l from here on
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        int r = slot + i * SLOTS, t = t0 + r / G;
        if (r >= R || t >= a.T) continue;
        float *o = a.out + ((size_t)t * a.n_heads + kvh * G + r % G) * HD + 8 * ch;
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = acc[i][e] * m_s[r];
    }
}

extern "C" int attn_prefill_tiled_ok(const cuda_ctx *ctx, attn_shape s) {
    int G = s.n_heads / s.n_kv_heads;
    return ctx->prefill_tiled && (s.head_dim == 64 || s.head_dim == 128) && G >= 1 && G <= PF_ROWS;
}

static size_t pf_smem(int hd) {
    return (size_t)PF_ROWS * hd * 4 + (size_t)PF_ROWS * PF_PSTRIDE * 4 + (size_t)PF_SUB * (hd + 8) * 2 +
           (size_t)PF_ROWS * 12;
}

int attn_prefill_tiled(cuda_ctx *ctx, float *out, const float *q, kv_span kv, kv_pages pg, int T, attn_shape s,
                       float *last_scores) {
    int G = s.n_heads / s.n_kv_heads, QB = pf_queries(G);
    pf_args a = { out, last_scores, q, (const uint16_t *)kv.k_trunk, (const uint16_t *)kv.v_trunk,
                  (const uint16_t *)kv.k_tail, (const uint16_t *)kv.v_tail, pg.blocks, kv.n_trunk, pg.shift,
                  kv.n_trunk + kv.n_tail, T, s.n_heads, s.n_kv_heads, s.scale };
    dim3 grid((unsigned)((T + QB - 1) / QB), (unsigned)s.n_kv_heads);
    size_t smem = pf_smem(s.head_dim);
    if (s.head_dim == 64)
        attn_prefill_tiled_kernel<64><<<grid, ATT_THREADS, smem, ctx->stream>>>(a);
    else
        attn_prefill_tiled_kernel<128><<<grid, ATT_THREADS, smem, ctx->stream>>>(a);
    CUDA_CHECK_LAUNCH(ctx, "attn_prefill_tiled_kernel");
    return 0;
}
