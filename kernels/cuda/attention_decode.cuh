// attention_decode.cuh: the decode attention's device code and launch geometry
// (attention_decode.cu's kernels and the persistent decode kernel, persist.cu, run the
// same functions, so a split has the same bits in both). See attention_decode.cu.
#ifndef VARENT_CUDA_ATTENTION_DECODE_CUH
#define VARENT_CUDA_ATTENTION_DECODE_CUH

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/sync.cuh"

// ---- decode -------------------------------------------------------------------------
// Splits a step uses: the grid has n_splits of them (sized for the longest length the
// caller supports, so a captured graph stays valid), a step of n_keys keys uses
// ceil(n_keys / kps) of them, at least 1 and at most n_splits; every split block works
// it out from the live length it reads on the device, and the partials are laid out by
// it. kps 0: all n_splits (the sizing by capacity, for A/B). The others exit at once.
__host__ __device__ __forceinline__ int live_splits(int n_splits, int n_keys, int kps) {
    if (kps <= 0) return n_splits;
    int ns = (n_keys + kps - 1) / kps;
    return ns < 1 ? 1 : ns > n_splits ? n_splits : ns;
}

// A single split's output, o / l: the bits the combine gives for one split (its weight
// expf(m - M) is 1 and its sum l, so it computes o * (1 / l)).
__device__ __forceinline__ float single_split_out(float o, float l) { return __fmul_rn(o, 1.f / l); }

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
static __device__ void combine_heads(float *out, const float *ph0, int nh, int n_splits, int hd, float *w, float *inv) {
    int lane = k_tid() & 31, warp = k_tid() >> 5, nw = blockDim.x >> 5;
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
    for (int idx = k_tid(); idx < nh * hd; idx += blockDim.x) {
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
    const float *tab, *q_norm, *k_norm;  // tab: the RoPE table (cuda_rope_table)
    float eps;
};

// Prologue of a split block with fused RoPE: warp w rotates query heads w, w + nw, ...
// of the group into q_s; the block that owns the newest key (own) also rotates its KV
// head's new key, stores it and the value in the cache as bf16, and keeps both (as the
// floats of those bf16 values) in kn_s / vn_s, which its tile loop reads for that key:
// the cache row it has just written is not read back through the read-only path.
// kn_s / vn_s (floats, the generic kernel) or kn_h / vn_h (the bf16 bits, the tiled
// kernel) may be NULL.
static __device__ void rope_fuse_prologue(const rope_fuse &rf, const float *qg, float *q_s, float *kn_s, float *vn_s,
                                   uint16_t *kn_h, uint16_t *vn_h,
                                   const cuda_kv_layer &L, int b, int kvh, int G, int n_kv, int hd, bool own) {
    int lane = k_tid() & 31, warp = k_tid() >> 5, nw = blockDim.x >> 5, half = hd / 2;
    int pos = rf.pos[b];
    for (int g = warp; g < G + (own ? 1 : 0); g += nw) {
        bool is_k = g == G;
        const float *src = is_k ? rf.k + (size_t)b * n_kv * hd + (size_t)kvh * hd : qg + (size_t)g * hd;
        const float *nwt = is_k ? rf.k_norm : rf.q_norm;
        float inv = nwt ? head_inv_rms(src, hd, rf.eps) : 1.f;
        size_t dst = (size_t)rf.rows[b] * n_kv * hd + (size_t)kvh * hd;
        for (int j = lane; j < half; j += 32) {
            float y0, y1;
            rope_head_pair(src, j, half, inv, nwt, pos, rf.tab, y0, y1);
            if (!is_k) {
                q_s[g * hd + j] = y0;
                q_s[g * hd + j + half] = y1;
                continue;
            }
            uint16_t k0 = f32_to_bf16_bits(y0), k1 = f32_to_bf16_bits(y1);
            ((uint16_t *)L.k_dst)[dst + j] = k0;
            ((uint16_t *)L.k_dst)[dst + j + half] = k1;
            if (kn_s) {
                kn_s[j] = bf16_bits_to_f32(k0);
                kn_s[j + half] = bf16_bits_to_f32(k1);
            }
            if (kn_h) {
                kn_h[j] = k0;
                kn_h[j + half] = k1;
            }
        }
        if (!is_k) continue;
        const float *vs = rf.v + (size_t)b * n_kv * hd + (size_t)kvh * hd;
        for (int j = lane; j < hd; j += 32) {
            uint16_t h = f32_to_bf16_bits(__ldcg(vs + j));
            ((uint16_t *)L.v_dst)[dst + j] = h;
            if (vn_s) vn_s[j] = bf16_bits_to_f32(h);
            if (vn_h) vn_h[j] = h;
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

// Step 2 of a tile, per head (one warp each): the new running max over the tile's n
// scores sc[g * S + jj], p = exp(s - m) in place, l; c_s[g] = the rescale of the old
// sums. Ends with a barrier.
__device__ __forceinline__ void softmax_tile(float *sc, int S, int n, int G, float *m_s, float *l_s, float *c_s) {
    int lane = k_tid() & 31, warp = k_tid() >> 5, nw = blockDim.x >> 5;
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
}

// The end of a split block, after its o partials are written: m and l of each head to
// part, then with counters (count set) the count of the (row, KV head) group, and the
// block that completes it combines the group (w: G * n_splits floats of shared memory
// that are free now, inv: G floats) and resets its counter for the next step. last_s:
// one shared flag (headers declare no __shared__ of their own). True in the block that
// combined (every thread of it), once its writes of out are issued.
static __device__ bool split_finish(float *part, float *out, const float *m_s, const float *l_s, float *w, float *inv,
                                    unsigned *count, int b, int kvh, int G, int n_heads, int n_kv, int hd, int split,
                                    int n_splits, unsigned *last_s) {
    for (int g = k_tid(); g < G; g += blockDim.x) {
        float *pp = part + ((size_t)(kvh * G + g) * n_splits + split) * (hd + 2);
        pp[hd] = m_s[g];
        pp[hd + 1] = l_s[g];
    }
    if (!count) return false;
    __threadfence();  // this block's partials are visible device-wide before it counts
    __syncthreads();  // also: every thread is done reading m_s, l_s and w's old contents
    if (k_tid() == 0) *last_s = atomicAdd(&count[(size_t)b * n_kv + kvh], 1u) == (unsigned)n_splits - 1;
    __syncthreads();
    if (!*last_s) return false;
    __threadfence();  // the other blocks' partials, counted before ours, are visible
    combine_heads(out + ((size_t)b * n_heads + kvh * G) * hd, part + (size_t)kvh * G * n_splits * (hd + 2), G,
                  n_splits, hd, w, inv);
    if (k_tid() == 0) count[(size_t)b * n_kv + kvh] = 0;
    return true;
}

// count (NULL: the combine kernel follows) holds one counter per (row, KV head): each
// split block adds 1 after writing its partials (and a fence); the block that brings it
// to n_splits combines the group's G heads into out and sets it back to 0 for the next
// step (a captured graph replays the same counters).
// The generic kernel: any even head_dim and GQA group that fits (the tiled kernel below
// takes head_dim 64 and 128 with groups of up to 10 heads).
// One split block's work: split `split` of n_splits of KV head kvh of row b (the kernel
// passes its block index; the persistent decode kernel its work unit). wait(), called
// by every thread, before reading activations: the kernel ahead (PDL) or the producing
// phase. smem: decode_smem's floats.
template <typename Wait>
__device__ bool decode_split(float *part, float *last_scores, const float *q, cuda_kv_layer L, cuda_kv_lens N, int b,
                             int split, int kvh, int n_splits, int kps, int n_heads, int n_kv, int hd, float scale,
                             int S, size_t score_stride, unsigned *count, float *out, const rope_fuse &rf,
                             const Wait &wait, float *smem, unsigned *last_s) {
    part += (size_t)b * n_heads * n_splits * (hd + 2);  // the row's partials: sized by the grid's splits
    n_splits = live_splits(n_splits, N.n_keys, kps);
    if (split >= n_splits) return false;  // a split the live length does not need
    wait();
    q += (size_t)b * n_heads * hd;
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
    for (int i = k_tid(); i < G * hd; i += blockDim.x) {
        if (!rf.on) q_s[i] = __ldcg(qg + i);
        o_s[i] = 0.f;
    }
    if (rf.on) rope_fuse_prologue(rf, qg, q_s, kn_s, vn_s, NULL, NULL, L, b, kvh, G, n_kv, hd, own);
    for (int g = k_tid(); g < G; g += blockDim.x) {
        m_s[g] = -INFINITY;
        l_s[g] = 0.f;
    }
    __syncthreads();

    int half = hd / 2;
    for (int jt = j0; jt < j1; jt += S) {
        int n = min(S, j1 - jt);
        // 1. scores s = q_h . k_j * scale for (g, jj) pairs; a warp walks consecutive keys.
        for (int idx = k_tid(); idx < G * n; idx += blockDim.x) {
            int g = idx / n, jj = idx - g * n, j = jt + jj;
            float s;
            if (j == newest) {
                s = dot_q_kn(q_s + g * hd, kn_s, hd) * scale;
            } else {
                const uint16_t *kr = kv_row_pg(kt, kl, n_trunk, j, kv_dim, N.table, N.shift) + (size_t)kvh * hd;
                s = dot_q_k(q_s + g * hd, kr, hd) * scale;
            }
            sc[g * S + jj] = s;
            if (last_scores) last_scores[(size_t)(kvh * G + g) * n_keys + j] = s;
        }
        __syncthreads();
        softmax_tile(sc, S, n, G, m_s, l_s, c_s);
        // 3. o[g][d] = o * corr + sum_jj p[g][jj] * v[j][d]; one thread per (g, pair of d).
        for (int idx = k_tid(); idx < G * half; idx += blockDim.x) {
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
                    const uint16_t *vr = kv_row_pg(vt, vl, n_trunk, jt + jj, kv_dim, N.table, N.shift) + (size_t)kvh * hd;
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
    if (n_splits == 1) {  // the only split: the output itself, no partials
        float *og = out + ((size_t)b * n_heads + (size_t)kvh * G) * hd;
        for (int idx = k_tid(); idx < G * hd; idx += blockDim.x)
            og[idx] = single_split_out(o_s[idx], l_s[idx / hd]);
        return true;
    }
    for (int idx = k_tid(); idx < G * half; idx += blockDim.x) {
        int g = idx / half, d = 2 * (idx - g * half);
        float *pp = part + ((size_t)(kvh * G + g) * n_splits + split) * (hd + 2);
        pp[d] = o_s[g * hd + d];
        pp[d + 1] = o_s[g * hd + d + 1];
    }
    return split_finish(part, out, m_s, l_s, sc, m_s, count, b, kvh, G, n_heads, n_kv, hd, split, n_splits, last_s);
}

// ---- the tiled kernel (head_dim 64 and 128) ---------------------------------------------
// A K or V row of one head is C 16-byte chunks; the block's ATT_THREADS threads cover R
// rows at once (thread t: chunk t % C of row t / C of each pass); a tile is S keys, CH
// rows per thread. A tile of K and V is 16 KiB whatever HD: per block, that many bytes
// are in flight while the previous tile is used.
template <int HD>
struct flash_geom {
    static constexpr int C = HD / 8, R = ATT_THREADS / C, S = 4096 / HD, CH = S / R;
};
#define FLASH_MAX_G 10  // G * 4 KiB of o accumulators must leave room in ATT_SMEM_MAX

// Shared floats: q_s[G*HD] | o_s[G][2][ATT_THREADS][4] | kn_h, vn_h (HD bf16 each) | sc[G*S] |
// m_s[G] | l_s[G] | c_s[G]; every part starts 16-byte aligned.
static inline size_t flash_smem(int G, int hd) {
    return ((size_t)G * hd + (size_t)G * ATT_THREADS * 8 + hd + (size_t)G * (4096 / hd) + 3 * (size_t)G) *
           sizeof(float);
}

// flash_smem and the staged tile (flash_split's STAGED form): CH = 4 K and 4 V chunks of
// 16 bytes a thread, past the rest rounded up to 16 bytes.
static inline size_t flash_smem_staged(int G, int hd) {
    return (flash_smem(G, hd) + 15) / 16 * 16 + (size_t)2 * 4 * ATT_THREADS * 16;
}

static inline bool flash_ok(attn_shape s) {
    int G = s.n_heads / s.n_kv_heads;
    return (s.head_dim == 64 || s.head_dim == 128) && G <= FLASH_MAX_G &&
           flash_smem(G, s.head_dim) <= ATT_SMEM_MAX;
}

// Row j's key (kb) and value (vb) of KV head kvh: in the trunk (paged through table
// when set, 2^shift rows a page) below n_trunk, else in the tail.
__device__ __forceinline__ void flash_row(const cuda_kv_layer &L, int n_trunk, const int *table, int shift,
                                          int kv_dim, int kvh, int hd, int j, const uint16_t *&kb,
                                          const uint16_t *&vb) {
    bool tr = j < n_trunk;
    size_t row = (size_t)(tr ? j : j - n_trunk);
    if (table) row = ((size_t)table[j >> shift] << shift) + (size_t)(j & ((1 << shift) - 1));  // paged trunk
    size_t off = row * kv_dim + (size_t)kvh * hd;
    kb = (const uint16_t *)(tr ? L.k_trunk : L.k_tail) + off;
    vb = (const uint16_t *)(tr ? L.v_trunk : L.v_tail) + off;
}

// This thread's chunks of the tile at jt: chunk c of rows jt + rg + R * k (k < CH) of K
// and V, 16-byte read-only loads, zeros past j1 (not loaded).
template <int HD>
__device__ __forceinline__ void flash_load(uint4 (&kr)[flash_geom<HD>::CH], uint4 (&vr)[flash_geom<HD>::CH],
                                           const cuda_kv_layer &L, int n_trunk, const int *table, int shift,
                                           int kv_dim, int kvh, int jt, int j1, int rg, int c) {
    constexpr int R = flash_geom<HD>::R, CH = flash_geom<HD>::CH;
#pragma unroll
    for (int k = 0; k < CH; k++) {
        int j = jt + rg + R * k;
        if (j < j1) {
            const uint16_t *kb, *vb;
            flash_row(L, n_trunk, table, shift, kv_dim, kvh, HD, j, kb, vb);
            kr[k] = __ldg((const uint4 *)kb + c);
            vr[k] = __ldg((const uint4 *)vb + c);
        } else {
            kr[k] = make_uint4(0u, 0u, 0u, 0u);
            vr[k] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// flash_load of the staged form, for the keys (V false) or the values: the same chunks
// into this thread's own slots of st (chunk k at st[k * ATT_THREADS + t], so a warp's
// 16-byte slots are consecutive) by cp.async, the zeros past j1 stored; then one commit
// group. Only thread t reads its slots, so no barrier orders them: its own
// cp_async_wait_group does.
template <int HD, bool V>
__device__ __forceinline__ void flash_stage(uint4 *st, const cuda_kv_layer &L, int n_trunk, const int *table,
                                            int shift, int kv_dim, int kvh, int jt, int j1, int rg, int c, int t) {
    constexpr int R = flash_geom<HD>::R, CH = flash_geom<HD>::CH;
#pragma unroll
    for (int k = 0; k < CH; k++) {
        int j = jt + rg + R * k;
        const uint16_t *kb, *vb;
        if (j >= j1) {
            st[k * ATT_THREADS + t] = make_uint4(0u, 0u, 0u, 0u);
            continue;
        }
        flash_row(L, n_trunk, table, shift, kv_dim, kvh, HD, j, kb, vb);
        cp_async16(st + k * ATT_THREADS + t, (const uint4 *)(V ? vb : kb) + c);
    }
    cp_async_commit();
}

// Chunk k of this thread's staged tile (st: flash_stage's), or of the newest key or value
// the prologue kept (nh: kn_h or vn_h) when row k is that key.
__device__ __forceinline__ uint4 flash_staged(const uint4 *st, int k, int t, bool newest, const uint16_t *nh, int c) {
    return newest ? ((const uint4 *)nh)[c] : st[k * ATT_THREADS + t];
}

// The four partial sums v[0..3] (keys 0..3 of this thread) summed over the C threads of
// a row (lanes differing in their low log2(C) bits, c = this thread's index among them)
// by a reduce-scatter: the first level trades two values for two (lanes with bit C/2 set
// keep keys 2, 3), the second one for one (bit C/4: key 1 or 3), then a butterfly over
// the rest. 5 shuffles at C = 16 (4 at 8) where four butterflies take 16 (12); the
// thread ends with the full sum of key 2 * [c & C/2] + [c & C/4], every thread of a
// key with the same bits.
template <int C>
__device__ __forceinline__ float row_sum4(const float (&v)[4], int c) {
    bool hi = (c & (C / 2)) != 0, hi2 = (c & (C / 4)) != 0;
    float s0 = hi ? v[0] : v[2], s1 = hi ? v[1] : v[3];
    float w0 = __fadd_rn(hi ? v[2] : v[0], __shfl_xor_sync(0xffffffffu, s0, C / 2));
    float w1 = __fadd_rn(hi ? v[3] : v[1], __shfl_xor_sync(0xffffffffu, s1, C / 2));
    float x = __fadd_rn(hi2 ? w1 : w0, __shfl_xor_sync(0xffffffffu, hi2 ? w0 : w1, C / 4));
#pragma unroll
    for (int o = C / 8; o > 0; o >>= 1) x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// grid (n_splits, n_kv, B), block ATT_THREADS; arguments as attn_decode_split_kernel's.
// Per tile: (1) scores: thread (rg, c) takes, per head g, the product of its 8 dims of
// q_g and of each of its CH = 4 keys, summed over the row's C threads by row_sum4 (a
// shuffle reduce-scatter), after which one thread per key stores it in sc and the
// capture; (2) softmax_tile; (3) o: thread (rg, c) adds p * v of its rows to its own 8
// accumulators per head in o_s (no other thread touches them until the end; two float4
// planes, so a warp's 16-byte accesses are consecutive: no bank conflicts). At the end
// the R row groups' accumulators are summed in row-group order into the partials.
// The newest key with fused RoPE comes from kn_h / vn_h (the bf16 bits the prologue
// stored), not from the cache row it has just written: the same bits as reading it back.
// One split block's work (as decode_split). smem4: flash_smem's bytes (STAGED:
// flash_smem_staged's). Where a tile lives (STAGED):
// - false (the graph kernel): in registers, its K and V loads issued as the tile before
//   starts (the first tile's before wait() with the fused RoPE and KV store), its chunks
//   widened once for every head;
// - true (the persistent kernel at 4 blocks an SM: 128 registers, where the tile in
//   flight was spilled): in shared memory, by cp.async into each thread's own slots, the
//   next tile's keys once this tile's scores are summed and its values once they are
//   used (two commit groups a tile), each head widening the chunks it reads. The first
//   tile's copies go out after wait(): the persistent kernel's block wait is the barrier
//   after which the phase before (whose staged input and weight ring the slots may lie
//   over) is done.
// The same bits either way.
template <int HD, typename Wait, bool STAGED = false>
__device__ __forceinline__ bool flash_split(float *part, float *last_scores, const float *q, cuda_kv_layer L,
                                            cuda_kv_lens N, int b, int split, int kvh, int n_splits, int kps,
                                            int n_heads, int n_kv, float scale, size_t score_stride, unsigned *count,
                                            float *out, const rope_fuse &rf, const Wait &wait, float4 *smem4,
                                            unsigned *last_s) {
    constexpr int C = flash_geom<HD>::C, R = flash_geom<HD>::R, S = flash_geom<HD>::S, CH = flash_geom<HD>::CH;
    static_assert(CH == 4 && C >= 8, "row_sum4 takes four keys a thread over rows of at least 8 chunks");
    part += (size_t)b * n_heads * n_splits * (HD + 2);  // the row's partials: sized by the grid's splits
    n_splits = live_splits(n_splits, N.n_keys, kps);
    if (split >= n_splits) return false;  // a split the live length does not need
    q += (size_t)b * n_heads * HD;
    if (last_scores) last_scores += b * score_stride;
    int G = n_heads / n_kv, kv_dim = n_kv * HD, n_keys = N.n_keys, n_trunk = N.n_trunk;
    int per = (n_keys + n_splits - 1) / n_splits;  // keys per split
    int j0 = split * per, j1 = min(n_keys, j0 + per);
    float *q_s = (float *)smem4, *o_s = q_s + G * HD;
    uint16_t *kn_h = (uint16_t *)(o_s + G * ATT_THREADS * 8), *vn_h = kn_h + HD;
    float *sc = (float *)(vn_h + HD), *m_s = sc + G * S, *l_s = m_s + G, *c_s = l_s + G;
    // STAGED: the tile's K slots, then its V slots, 16-byte aligned past c_s
    uint4 *k_st = (uint4 *)(q_s + ((G * HD + G * ATT_THREADS * 8 + HD + G * S + 3 * G + 3) & ~3));
    uint4 *v_st = k_st + CH * ATT_THREADS;
    const float *qg = q + (size_t)kvh * G * HD;  // heads kvh*G .. kvh*G+G-1 are contiguous
    int newest = rf.on ? n_keys - 1 : -1;
    bool own = rf.on && j0 <= newest && newest < j1;
    int t = k_tid(), c = t % C, rg = t / C;

    // With the fused KV store (rf.on) the kernel ahead writes no cache row: the first
    // tile can be loaded before the wait. Without it, that kernel may have stored the
    // newest row (cuda_kv_store), so the wait comes first. Shared memory is written only
    // after the wait: the persistent kernel's block wait is a barrier its warps reach
    // once done with the phase before, whose staged input shares this memory.
    uint4 kr[CH], vr[CH];  // the next tile, in flight (not STAGED)
    if constexpr (STAGED) {
        wait();
        flash_stage<HD, false>(k_st, L, n_trunk, N.table, N.shift, kv_dim, kvh, j0, j1, rg, c, t);
        flash_stage<HD, true>(v_st, L, n_trunk, N.table, N.shift, kv_dim, kvh, j0, j1, rg, c, t);
    } else {
        if (!rf.on) wait();
        flash_load<HD>(kr, vr, L, n_trunk, N.table, N.shift, kv_dim, kvh, j0, j1, rg, c);
        if (rf.on) wait();
    }
    for (int g = 0; g < 2 * G; g++) ((float4 *)o_s)[g * ATT_THREADS + t] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int g = t; g < G; g += ATT_THREADS) {
        m_s[g] = -INFINITY;
        l_s[g] = 0.f;
    }
    if (!rf.on)
        for (int i = t; i < G * HD; i += ATT_THREADS) q_s[i] = __ldcg(qg + i);
    if (rf.on) rope_fuse_prologue(rf, qg, q_s, NULL, NULL, kn_h, vn_h, L, b, kvh, G, n_kv, HD, own);
    __syncthreads();

    for (int jt = j0; jt < j1; jt += S) {
        int n = min(S, j1 - jt);
        bool more = jt + S < j1;
        uint4 ck[CH], cv[CH];
        if constexpr (STAGED) {
            cp_async_wait_group(1);  // this tile's keys (its values may still be in flight)
        } else {
#pragma unroll
            for (int k = 0; k < CH; k++) {
                ck[k] = kr[k];
                cv[k] = vr[k];
            }
            if (more) flash_load<HD>(kr, vr, L, n_trunk, N.table, N.shift, kv_dim, kvh, jt + S, j1, rg, c);
            if (own) {
#pragma unroll
                for (int k = 0; k < CH; k++)
                    if (jt + rg + R * k == newest) {
                        ck[k] = ((const uint4 *)kn_h)[c];
                        cv[k] = ((const uint4 *)vn_h)[c];
                    }
            }
        }
        // 1. scores (not STAGED: the key chunks widened once for all G heads)
        float kf[CH][8];
        if constexpr (!STAGED) {
#pragma unroll
            for (int k = 0; k < CH; k++) unpack8<WT_BF16>(ck[k], kf[k]);
        }
        // Key of this thread's sum after row_sum4; the row's threads with c % (C / 4) == 0
        // hold distinct keys and store them.
        int kmine = ((c & (C / 2)) ? 2 : 0) + ((c & (C / 4)) ? 1 : 0), jmine = rg + R * kmine;
        bool store = (c & (C / 4 - 1)) == 0 && jmine < n;
        for (int g = 0; g < G; g++) {
            const float4 *qc = (const float4 *)(q_s + g * HD) + 2 * c;
            float4 qa = qc[0], qb = qc[1];
            float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
            float part4[CH];
#pragma unroll
            for (int k = 0; k < CH; k++) {
                float kt[8];
                if constexpr (STAGED)
                    unpack8<WT_BF16>(flash_staged(k_st, k, t, own && jt + rg + R * k == newest, kn_h, c), kt);
                const float(&kk)[8] = STAGED ? kt : kf[k];
                float s = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) s = fmaf(qv[e], kk[e], s);
                part4[k] = s;
            }
            float s = row_sum4<C>(part4, c);
            if (store) {
                s = __fmul_rn(s, scale);
                sc[g * S + jmine] = s;
                if (last_scores) last_scores[(size_t)(kvh * G + g) * n_keys + jt + jmine] = s;
            }
        }
        // (STAGED: the next tile's keys into the slots this thread has read, its values below)
        if (STAGED && more) flash_stage<HD, false>(k_st, L, n_trunk, N.table, N.shift, kv_dim, kvh, jt + S, j1, rg, c, t);
        __syncthreads();
        // 2. running max, p in place, l
        softmax_tile(sc, S, n, G, m_s, l_s, c_s);
        // 3. o = o * corr + sum p v over this thread's rows (not STAGED: v widened once
        // for all G heads, in the registers the widened keys held)
        if constexpr (STAGED) {
            if (more)
                cp_async_wait_group(1);  // this tile's values; the next tile's keys stay in flight
            else
                cp_async_wait_group(0);
        }
        float vf[CH][8];
        if constexpr (!STAGED) {
#pragma unroll
            for (int k = 0; k < CH; k++) unpack8<WT_BF16>(cv[k], vf[k]);
        }
        for (int g = 0; g < G; g++) {
            float corr = c_s[g];
            float4 *op = (float4 *)o_s + 2 * g * ATT_THREADS + t;  // dims 0-3, then 4-7 a plane below
            float4 oa = op[0], ob = op[ATT_THREADS];
            float a[8] = {__fmul_rn(oa.x, corr), __fmul_rn(oa.y, corr), __fmul_rn(oa.z, corr),
                          __fmul_rn(oa.w, corr), __fmul_rn(ob.x, corr), __fmul_rn(ob.y, corr),
                          __fmul_rn(ob.z, corr), __fmul_rn(ob.w, corr)};
#pragma unroll
            for (int k = 0; k < CH; k++) {
                int jj = rg + R * k;
                float p = jj < n ? sc[g * S + jj] : 0.f;
                float vt[8];
                if constexpr (STAGED)
                    unpack8<WT_BF16>(flash_staged(v_st, k, t, own && jt + jj == newest, vn_h, c), vt);
                const float(&vv)[8] = STAGED ? vt : vf[k];
#pragma unroll
                for (int e = 0; e < 8; e++) a[e] = fmaf(p, vv[e], a[e]);
            }
            op[0] = make_float4(a[0], a[1], a[2], a[3]);
            op[ATT_THREADS] = make_float4(a[4], a[5], a[6], a[7]);
        }
        if (STAGED && more) flash_stage<HD, true>(v_st, L, n_trunk, N.table, N.shift, kv_dim, kvh, jt + S, j1, rg, c, t);
        __syncthreads();  // sc and c_s are rewritten by the next tile
    }
    // o (g, d) = the R row groups' accumulators of chunk d / 8, in row-group order.
    for (int idx = t; idx < G * HD; idx += ATT_THREADS) {
        int g = idx / HD, d = idx - g * HD;
        const float *og = o_s + ((2 * g + ((d >> 2) & 1)) * ATT_THREADS + (d >> 3)) * 4 + (d & 3);
        float o = 0.f;
#pragma unroll
        for (int r = 0; r < R; r++) o = __fadd_rn(o, og[r * C * 4]);
        if (n_splits == 1)  // the only split: the output itself, no partials
            out[((size_t)b * n_heads + (size_t)kvh * G + g) * HD + d] = single_split_out(o, l_s[g]);
        else
            part[((size_t)(kvh * G + g) * n_splits + split) * (HD + 2) + d] = o;
    }
    if (n_splits == 1) return true;
    // o_s (G * ATT_THREADS * 8 floats >= G * n_splits: decode_splits) holds the combine's
    // weights once split_finish's barrier has passed.
    return split_finish(part, out, m_s, l_s, o_s, c_s, count, b, kvh, G, n_heads, n_kv, HD, split, n_splits, last_s);
}

static inline int decode_tile(attn_shape s);

// Split count for n_keys keys. The tiled kernel: about four blocks per SM (its
// __launch_bounds__ residency), at least one tile of S keys per split, at most
// ATT_THREADS * 8 splits (the combining block keeps G * n_splits weights in o_s). The
// generic kernel: about two blocks per SM, at least 32 keys per split, and at most its
// tile size S (it keeps them in its G * S score tile).
static inline int decode_splits(int n_sm, int n_keys, attn_shape s) {
    int sms = n_sm > 0 ? n_sm : 1, ns;
    if (flash_ok(s)) {
        int S = 4096 / s.head_dim;
        int target = (4 * sms + s.n_kv_heads - 1) / s.n_kv_heads, by_len = (n_keys + S - 1) / S;
        ns = target < by_len ? target : by_len;
        if (ns > ATT_THREADS * 8) ns = ATT_THREADS * 8;
    } else {
        int target = (2 * sms + s.n_kv_heads - 1) / s.n_kv_heads, by_len = (n_keys + 31) / 32;
        ns = target < by_len ? target : by_len;
        int S = decode_tile(s);
        if (S >= 32 && ns > S) ns = S;
    }
    return ns < 1 ? 1 : ns;
}

// Keys per split of a live length (live_splits): ctx->att_split_keys when set (0: the
// capacity's splits), else one key tile of the kernel: the tiled kernel's S, the
// generic kernel's 32 (decode_splits' own minimum per split).
static inline int split_keys(const cuda_ctx *ctx, attn_shape s) {
    if (ctx->att_split_keys >= 0) return ctx->att_split_keys;
    return flash_ok(s) ? 4096 / s.head_dim : 32;
}

// Keys per tile S (a multiple of 32, at most 256) so the decode kernel's shared memory
// fits in ATT_SMEM_MAX; 0 if not even 32 fit.
static inline int decode_tile(attn_shape s) {
    int G = s.n_heads / s.n_kv_heads;
    long fixed = 2L * G * s.head_dim + 3L * G + 2L * s.head_dim;  // q_s, o_s, m_s, l_s, c_s, kn_s, vn_s
    long room = (long)(ATT_SMEM_MAX / sizeof(float)) - fixed;
    long S = room > 0 ? room / G / 32 * 32 : 0;
    return S > 256 ? 256 : (int)S;
}

static inline size_t decode_smem(attn_shape s, int S) {
    int G = s.n_heads / s.n_kv_heads;
    return ((size_t)2 * G * s.head_dim + (size_t)G * S + 3 * (size_t)G + 2 * (size_t)s.head_dim) * sizeof(float);
}

#endif
