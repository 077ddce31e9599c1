// attention_decode.cu: decode attention (T == 1), flash-decoding style, for B sequences
// at once (grid z = row), over a bf16 KV cache split in trunk + tail segments.
//
// One block per (split, KV head, row) takes an equal share of the keys for the
// G = n_heads / n_kv_heads query heads sharing that KV head (each K/V row is read once
// per group), walks it in tiles with an online softmax, and writes the split's max m, sum
// l = sum exp(s - m) and unnormalized output o = sum exp(s - m) v to scratch
// part[n_heads, n_splits, head_dim + 2] (o..., m, l); an empty split writes l = 0.
// attn_decode_combine_kernel grid (n_heads, B): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M)
// over the splits with l_s > 0. With counters reserved (cuda_reserve_attention) the last
// split block of each (row, KV head) does this itself and no combine launches.
// Two split kernels:
//   attn_decode_flash_kernel<HD> (head_dim 64 and 128, groups of up to 10 heads): the
//       block's threads load whole K and V rows of a tile together, 16 bytes a thread
//       (consecutive threads, consecutive chunks of a row: every load instruction reads
//       whole 128-byte lines), into registers, the next tile's loads issued before the
//       current tile is used (register double buffering); each thread keeps its chunk's
//       8 dimensions for scores (a shuffle sum over the row's threads) and for o.
//   attn_decode_split_kernel (any even head_dim, larger groups): one thread per
//       (head, key) dot, one per (head, pair of dims) for o, the rows read directly.
// The segments and lengths come either from kernel arguments (cuda_attention) or from
// device records (cuda_attention_decode_dev / _rows, graph replay). A paged trunk (the
// scheduler's device pool) is read through its block table (cuda_kv_lens.table): the
// same keys in the same order, so the same bits as the rows stored contiguously. The grid's split
// count is a host value fixed by the longest length the caller supports; each step uses
// as many of them as its live length needs (live_splits: one key tile a split by
// default, VARENT_CUDA_ATT_SPLIT_KEYS), read on the device, and one split writes the
// output itself: no partials, no counter, no combine.
#include "kernels/cuda/attention_decode.cuh"
__global__ void attn_decode_split_kernel(float *part, float *last_scores, const float *q,
                                         cuda_kv_layer L, cuda_kv_lens N,
                                         const cuda_kv_layer *dL, const cuda_kv_lens *dN,
                                         int kps, int n_heads, int n_kv, int hd, float scale, int S,
                                         size_t score_stride, unsigned *count, float *out, rope_fuse rf) {
    extern __shared__ float smem[];
    __shared__ unsigned last;
    pdl_trigger();
    int b = blockIdx.z;
    if (dL) L = dL[b];
    if (dN) N = dN[b];
    decode_split(part, last_scores, q, L, N, b, blockIdx.x, blockIdx.y, gridDim.x, kps, n_heads, n_kv, hd, scale, S,
                 score_stride, count, out, rf, pdl_waiter{true}, smem, &last);
}

// grid (n_heads, B), block ATT_THREADS. Splits with l == 0 (no keys) are skipped; split 0
// always has keys, so M is finite. n_splits: the grid's; the row's live count comes from
// its length (N, or dN[row]) as in the split blocks, and with one split that block has
// written the output itself.
// smem: w[n_splits] | inv[1].
__global__ void attn_decode_combine_kernel(float *out, const float *part, int n_splits, int hd, cuda_kv_lens N,
                                           const cuda_kv_lens *dN, int kps) {
    extern __shared__ float smem[];
    pdl_trigger();
    int h = blockIdx.x, b = blockIdx.y, hb = b * gridDim.x + h;  // head h of row b
    if (dN) N = dN[b];
    int ns = live_splits(n_splits, N.n_keys, kps);
    if (ns == 1) return;
    pdl_wait();
    const float *ph = part + ((size_t)b * gridDim.x * n_splits + (size_t)h * ns) * (hd + 2);
    combine_heads(out + (size_t)hb * hd, ph, 1, ns, hd, smem, smem + ns);
}

template <int HD>
__global__ void __launch_bounds__(ATT_THREADS, 4)
    attn_decode_flash_kernel(float *part, float *last_scores, const float *q, cuda_kv_layer L, cuda_kv_lens N,
                             const cuda_kv_layer *dL, const cuda_kv_lens *dN, int kps, int n_heads, int n_kv,
                             float scale,
                             size_t score_stride, unsigned *count, float *out, rope_fuse rf) {
    extern __shared__ float4 smem4[];
    __shared__ unsigned last;
    pdl_trigger();
    int b = blockIdx.z;
    if (dL) L = dL[b];
    if (dN) N = dN[b];
    flash_split<HD>(part, last_scores, q, L, N, b, blockIdx.x, blockIdx.y, gridDim.x, kps, n_heads, n_kv, scale,
                    score_stride, count, out, rf, pdl_waiter{true}, smem4, &last);
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

int attn_decode_shape_check(cuda_ctx *ctx, attn_shape s) {
    if (flash_ok(s)) return 0;
    CUDA_REQUIRE(ctx, decode_tile(s) >= 32,
                 "cuda_attention: a GQA group of %d heads x head_dim %d does not fit the decode "
                 "kernel's %d bytes of shared memory", s.n_heads / s.n_kv_heads, s.head_dim,
                 ATT_SMEM_MAX);
    return 0;
}

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
    float *part = (float *)ctx->scratch;
    // With counters for every (row, KV head) the split blocks combine themselves.
    unsigned *count = ctx->att_count && ctx->att_count_n >= B * s.n_kv_heads ? ctx->att_count : NULL;
    dim3 grid(ns, s.n_kv_heads, B), cgrid(s.n_heads, B);
    int kps = split_keys(ctx, s);
    cudaError_t rc;
    if (flash_ok(s)) {
        size_t smem = flash_smem(s.n_heads / s.n_kv_heads, s.head_dim);
        if (s.head_dim == 64)
            rc = LAUNCH_PDL(ctx, attn_decode_flash_kernel<64>, grid, ATT_THREADS, smem, part, last_scores, q, L, N,
                            dL, dN, kps, s.n_heads, s.n_kv_heads, s.scale, score_stride, count, out, rf);
        else
            rc = LAUNCH_PDL(ctx, attn_decode_flash_kernel<128>, grid, ATT_THREADS, smem, part, last_scores, q, L, N,
                            dL, dN, kps, s.n_heads, s.n_kv_heads, s.scale, score_stride, count, out, rf);
        CUDA_CHECK_LAUNCH_RC(ctx, "attn_decode_flash_kernel", rc);
    } else {
        int S = decode_tile(s);
        rc = LAUNCH_PDL(ctx, attn_decode_split_kernel, grid, ATT_THREADS, decode_smem(s, S), part, last_scores, q, L,
                        N, dL, dN, kps, s.n_heads, s.n_kv_heads, s.head_dim, s.scale, S, score_stride, count, out,
                        rf);
        CUDA_CHECK_LAUNCH_RC(ctx, "attn_decode_split_kernel", rc);
    }
    if (count) return 0;
    size_t csmem = ((size_t)ns + 1) * sizeof(float);
    rc = LAUNCH_PDL(ctx, attn_decode_combine_kernel, cgrid, ATT_THREADS, csmem, out, (const float *)part, ns,
                    s.head_dim, N, dN, kps);
    CUDA_CHECK_LAUNCH_RC(ctx, "attn_decode_combine_kernel", rc);
    return 0;
}

int attn_decode_span(cuda_ctx *ctx, float *out, const float *q, kv_span kv, kv_pages pg, attn_shape s,
                     float *last_scores) {
    int n_keys = kv.n_trunk + kv.n_tail;
    cuda_kv_layer L = {kv.k_trunk, kv.v_trunk, kv.k_tail, kv.v_tail, NULL, NULL};
    cuda_kv_lens N = {kv.n_trunk, n_keys, pg.blocks, pg.shift};
    rope_fuse none = { 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.f };
    return decode_launch(ctx, out, q, L, N, NULL, NULL, 1, decode_splits(ctx->n_sm, n_keys, s), s, last_scores, 0,
                         none);
}

extern "C" int cuda_attention_decode_rows(cuda_ctx *ctx, float *out, const float *q,
                                          const cuda_kv_layer *d_layers, const cuda_kv_lens *d_lens, int B,
                                          int max_keys, attn_shape s, float *last_scores) {
    return cuda_attention_decode_rows_rope(ctx, out, q, NULL, d_layers, d_lens, B, max_keys, s, last_scores);
}

extern "C" int cuda_attention_decode_rows_rope(cuda_ctx *ctx, float *out, const float *q, const cuda_rope_kv *rk,
                                               const cuda_kv_layer *d_layers, const cuda_kv_lens *d_lens, int B,
                                               int max_keys, attn_shape s, float *last_scores) {
    if (cuda_attention_validate(ctx, s)) return -1;
    CUDA_REQUIRE(ctx, d_layers && d_lens && max_keys >= 1,
                 "cuda_attention_decode_rows: needs device records and max_keys >= 1 (got %d)",
                 max_keys);
    rope_fuse rf = { 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.f };
    if (rk) {
        CUDA_REQUIRE(ctx, rk->k && rk->v && rk->pos && rk->rows && rk->rope_tab && !rk->q_norm == !rk->k_norm,
                     "cuda_attention_decode_rows_rope: needs k, v, pos, rows and rope_tab (q_norm and k_norm "
                     "go together)");
        rf = (rope_fuse){ 1, rk->k, rk->v, rk->pos, rk->rows, rk->rope_tab, rk->q_norm, rk->k_norm, rk->eps };
    }
    cuda_kv_layer L = {NULL, NULL, NULL, NULL, NULL, NULL};
    cuda_kv_lens N = {0, 0, NULL, 0};
    return decode_launch(ctx, out, q, L, N, d_layers, d_lens, B, decode_splits(ctx->n_sm, max_keys, s), s,
                         last_scores, (size_t)s.n_heads * max_keys, rf);
}

extern "C" int cuda_attention_decode_dev(cuda_ctx *ctx, float *out, const float *q,
                                         const cuda_kv_layer *d_layer, const cuda_kv_lens *d_lens,
                                         int max_keys, attn_shape s, float *last_scores) {
    return cuda_attention_decode_rows(ctx, out, q, d_layer, d_lens, 1, max_keys, s, last_scores);
}
extern "C" int cuda_attention_live_splits(const cuda_ctx *ctx, int n_keys, int max_keys, attn_shape s) {
    return live_splits(decode_splits(ctx->n_sm, max_keys, s), n_keys, split_keys(ctx, s));
}
