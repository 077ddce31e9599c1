// core.c: see core.h. The step block's layout and filling, the activation arena, the
// pinned result buffers and the step's statistics.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_core_unused;  // nothing to build without CUDA
#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/core.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// ---- the step block ------------------------------------------------------------------------
// Layout: lens [rows], layers [n_layers][rows], ids, pos, rows [max_T].
static size_t par_lens(int rows) { return ((size_t)rows * sizeof(cuda_kv_lens) + 15) & ~(size_t)15; }

step_params cuda_core_params(const cuda_core *f, void *base) {
    int n_layers = f->m->cfg.n_layers, rows = f->rows;
    char *p = base;
    step_params s;
    s.lens = (cuda_kv_lens *)p;
    s.layers = (cuda_kv_layer *)(p + par_lens(rows));
    s.ids = (int *)(p + par_lens(rows) + (size_t)n_layers * rows * sizeof(cuda_kv_layer));
    s.pos = s.ids + f->max_T;
    s.rows = s.pos + f->max_T;
    return s;
}

static size_t par_size(int n_layers, int max_T, int rows) {
    return par_lens(rows) + (size_t)n_layers * rows * sizeof(cuda_kv_layer) + 3 * (size_t)max_T * sizeof(int);
}

// Row b's records for T tokens appended to kv. Mirrors forward.c's kv_span. A paged
// trunk (a sequence of the device pool) is one segment read through row b's block table
// (uploaded by cuda_core_tables); its layer rows are the pool's.
static void fill_row(cuda_core *f, step_params p, int b, const kv_view *kv, int T) {
    const model_config *c = &f->m->cfg;
    const kv_cache *tr = kv->trunk, *tl = kv->tail, *dst = tl ? tl : tr;
    size_t kv_dim = (size_t)model_kv_dim(f->m);
    int n_trunk = tl ? kv->n_trunk : tr->len + T, n_tail = tl ? tl->len + T : 0;
    p.lens[b].n_trunk = n_trunk;
    p.lens[b].n_keys = n_trunk + n_tail;
    p.lens[b].table = tr->table ? f->d_tables + (size_t)b * f->table_cap : NULL;
    p.lens[b].shift = tr->table ? tr->block_shift : 0;
    f->last_keys = n_trunk + n_tail;
    size_t tr_rows = kv_cache_layer_rows(tr), tl_rows = tl ? kv_cache_layer_rows(tl) : 0;
    size_t dst_rows = kv_cache_layer_rows(dst);
    for (int l = 0; l < c->n_layers; l++) {
        cuda_kv_layer *L = &p.layers[(size_t)l * f->rows + b];
        L->k_trunk = (const uint16_t *)tr->dk + (size_t)l * tr_rows * kv_dim;
        L->v_trunk = (const uint16_t *)tr->dv + (size_t)l * tr_rows * kv_dim;
        L->k_tail = tl ? (const uint16_t *)tl->dk + (size_t)l * tl_rows * kv_dim : NULL;
        L->v_tail = tl ? (const uint16_t *)tl->dv + (size_t)l * tl_rows * kv_dim : NULL;
        L->k_dst = (uint16_t *)dst->dk + (size_t)l * dst_rows * kv_dim;
        L->v_dst = (uint16_t *)dst->dv + (size_t)l * dst_rows * kv_dim;
    }
}

void cuda_core_fill_prefill(cuda_core *f, const kv_view *kv, const int *ids, int T) {
    step_params p = cuda_core_params(f, f->h_par);
    const kv_cache *dst = kv->tail ? kv->tail : kv->trunk;
    int pos0 = kv_view_len(kv);
    fill_row(f, p, 0, kv, T);
    for (int t = 0; t < T; t++)
        p.ids[t] = ids[t], p.pos[t] = pos0 + t, p.rows[t] = (int)kv_cache_phys(dst, dst->len + t);
}

void cuda_core_fill_decode(cuda_core *f, const kv_view *views, const int *ids, int B) {
    step_params p = cuda_core_params(f, f->h_par);
    for (int b = 0; b < B; b++) {
        const kv_cache *dst = views[b].tail ? views[b].tail : views[b].trunk;
        fill_row(f, p, b, &views[b], 1);
        p.ids[b] = ids[b], p.pos[b] = kv_view_len(&views[b]), p.rows[b] = (int)kv_cache_phys(dst, dst->len);
    }
}

void cuda_core_fill_pad(cuda_core *f, int B, int nb) {
    step_params p = cuda_core_params(f, f->h_par);
    size_t kv_dim = (size_t)model_kv_dim(f->m), layer = (size_t)f->rows * kv_dim;
    const uint16_t *v0 = f->pad_kv + (size_t)f->m->cfg.n_layers * layer;
    for (int b = B; b < nb; b++) {
        p.lens[b] = (cuda_kv_lens){ 1, 1, NULL, 0 };
        for (int l = 0; l < f->m->cfg.n_layers; l++) {
            cuda_kv_layer *L = &p.layers[(size_t)l * f->rows + b];
            size_t at = (size_t)l * layer + (size_t)b * kv_dim;
            L->k_trunk = f->pad_kv + at, L->v_trunk = v0 + at;
            L->k_tail = NULL, L->v_tail = NULL;
            L->k_dst = f->pad_kv + at, L->v_dst = (uint16_t *)v0 + at;
        }
        p.ids[b] = 0, p.pos[b] = 0, p.rows[b] = 0;
    }
}

// ---- block tables of paged caches ------------------------------------------------------------
// Rows [0, B) of the table area hold the views' tables (row b at b * table_cap), copied
// up before the step; the area grows to the widest table (the stream is idle then:
// callers wait for the previous step first).
int cuda_core_tables(cuda_core *f, const kv_view *views, int B, verr *err) {
    int need = 0;
    for (int b = 0; b < B; b++)
        if (views[b].trunk->table && views[b].trunk->table_cap > need) need = views[b].trunk->table_cap;
    if (need == 0) return 0;
    if (need > f->table_cap) {
        cuda_free(f->d_tables);
        if (f->h_tables) cudaFreeHost(f->h_tables);
        f->d_tables = NULL, f->h_tables = NULL, f->table_cap = 0;
        size_t bytes = sizeof(int) * (size_t)f->rows * need;
        if (cuda_malloc((void **)&f->d_tables, bytes, "KV block tables", err)) return -1;
        CK(cudaHostAlloc((void **)&f->h_tables, bytes, cudaHostAllocDefault));
        f->table_cap = need;
    }
    for (int b = 0; b < B; b++) {
        const kv_cache *c = views[b].trunk;
        if (c->table) memcpy(f->h_tables + (size_t)b * f->table_cap, c->table, sizeof(int) * (size_t)(c->ctx >> c->block_shift));
    }
    CK(cudaMemcpyAsync(f->d_tables, f->h_tables, sizeof(int) * (size_t)B * f->table_cap, cudaMemcpyHostToDevice,
                       f->ctx.stream));
    return 0;
}

// ---- statistics and errors -------------------------------------------------------------------
int cuda_core_stats(cuda_core *f, int B, step_params dp, verr *err) {
    const model_config *c = &f->m->cfg;
    OP(cuda_vocab_stats(&f->ctx, f->stats, f->logits, B, c->vocab_size));
    for (int b = 0; b < B; b++)
        OP(cuda_attn_stats(&f->ctx, f->stats + 4 * (size_t)f->rows + 4 * b,
                           f->scores + (size_t)b * c->n_heads * f->max_ctx, c->n_heads, f->max_ctx, dp.lens + b));
    return 0;
}

// The device keeps no per-layer trace: the message says where one is.
int cuda_core_nonfinite(const cuda_core *f, int pos, int id, float v, verr *err) {
    return verr_set(err, "non-finite logits at position %d (logit %d is %g) on CUDA device %d (weights of NaN, inf "
                    "or near FLT_MAX? --device cpu names the first non-finite layer)", pos, id, v, f->ctx.device);
}

// ---- memory --------------------------------------------------------------------------------
int cuda_core_init(cuda_core *f, const model *m, forward_state *fw, int device, verr *err) {
    f->m = m, f->fw = fw, f->max_T = fw->max_T, f->max_ctx = fw->ctx;
    f->rows = fw->max_T < CUDA_ROWS ? fw->max_T : CUDA_ROWS;
    size_t row_scores = (size_t)m->cfg.n_heads * fw->ctx * sizeof(float);
    while (f->rows > CUDA_MATVEC_ROWS && (size_t)f->rows * row_scores > ((size_t)CUDA_ROWS_SCORES_MB << 20)) f->rows /= 2;
    return cuda_init(&f->ctx, device, err);
}

int cuda_core_alloc(cuda_core *f, verr *err) {
    const model_config *c = &f->m->cfg;
    const tp_shard *t = &f->m->tp;  // the weights' shapes are the shard's; logits and captures the whole model's
    size_t T = (size_t)f->max_T, R = (size_t)f->rows, q_dim = (size_t)t->n_heads * c->head_dim;
    size_t qkv_dim = q_dim + 2 * (size_t)t->n_kv_heads * c->head_dim;
    // x (decode) and y (prefill) are also the all-reduce's buffers: padded for the
    // reduce-scatter's equal shares
    // (the padding rows' caches: 2 bf16 [n_layers, rows, kv_dim] = that many floats)
    size_t pad_kv = (size_t)c->n_layers * R * model_kv_dim(f->m);
    size_t half = (size_t)c->head_dim / 2;
    size_t sizes[12] = { T * c->dim + cuda_core_pad(f), T * c->dim, T * c->dim + cuda_core_pad(f), T * qkv_dim,
                         T * q_dim, T * 2 * t->n_ffn, R * c->vocab_size, R * c->n_heads * f->max_ctx, 8 * R, pad_kv,
                         (size_t)f->max_ctx * half * 2, 0 };
    f->par_bytes = par_size(c->n_layers, f->max_T, f->rows);
    size_t off[12], total = 0;
    for (int i = 0; i < 12; i++) {
        off[i] = total;
        total = align256(total + (i < 11 ? sizes[i] * sizeof(float) : f->par_bytes));
    }
    if (cuda_malloc(&f->act, total, "activations", err)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return verr_set(err, "%s (the buffers grow with --batch and --ctx)", msg);
    }
    char *a = f->act;
    f->x = (float *)(a + off[0]), f->xb = (float *)(a + off[1]), f->y = (float *)(a + off[2]);
    f->qkv = (float *)(a + off[3]), f->att = (float *)(a + off[4]), f->hb = (float *)(a + off[5]);
    f->logits = (float *)(a + off[6]), f->scores = (float *)(a + off[7]), f->stats = (float *)(a + off[8]);
    f->pad_kv = (uint16_t *)(a + off[9]);
    CK(cudaMemset(f->pad_kv, 0, pad_kv * sizeof(float)));  // finite keys before a padding row's first store
    // every position a cache of max_ctx holds (the steps' keys never outnumber it)
    f->rope_tab = (float *)(a + off[10]);
    if (cuda_rope_table(&f->ctx, f->rope_tab, f->w->inv_freq, (int)half, f->max_ctx))
        return verr_set(err, "%s", f->ctx.err.msg);
    f->d_par = a + off[11];
    CK(cudaHostAlloc(&f->h_par, f->par_bytes, cudaHostAllocDefault));
    memset(f->h_par, 0, f->par_bytes);
    void *hs = NULL;
    CK(cudaHostAlloc(&hs, 8 * R * sizeof(float), cudaHostAllocDefault));
    f->h_stats = hs;

    // Scratch: bf16 activations of a prefill GEMM, or the decode attention's partials
    // (of every row of a batch).
    size_t max_in = (size_t)c->dim;
    if (q_dim > max_in) max_in = q_dim;
    if ((size_t)t->n_ffn > max_in) max_in = (size_t)t->n_ffn;
    attn_shape sh = { t->n_heads, t->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    size_t mm = cuda_matmul_scratch_bytes(f->max_T, (int)max_in);
    size_t at = cuda_attention_rows_scratch_bytes(&f->ctx, f->max_ctx, sh, f->rows);
    if (cuda_reserve_scratch(&f->ctx, mm > at ? mm : at)) return verr_set(err, "%s", f->ctx.err.msg);
    if (cuda_reserve_attention(&f->ctx, f->rows * t->n_kv_heads)) return verr_set(err, "%s", f->ctx.err.msg);
    // The sampler's arrays for the agents' usual spread and entropix's draws (more grow
    // them at the first such draw).
    if (cuda_reserve_sample(&f->ctx, c->vocab_size, CUDA_SAMPLE_RESERVE)) return verr_set(err, "%s", f->ctx.err.msg);
    return 0;
}

// Page-locked result buffers take the place of fw's malloc'd ones (put back on close),
// so the per-token copies are direct DMA. (cudaHostRegister on fw's own buffers could
// fail on a page shared with another allocation.) Optional: without them the copies go
// through pageable memory.
void cuda_core_pin_host(cuda_core *f) {
    const model_config *c = &f->m->cfg;
    forward_state *fw = f->fw;
    void *pl = NULL, *ps = NULL;
    if (cudaHostAlloc(&pl, (size_t)c->vocab_size * sizeof(float), cudaHostAllocDefault) != cudaSuccess ||
        cudaHostAlloc(&ps, (size_t)c->n_heads * fw->ctx * sizeof(float), cudaHostAllocDefault) != cudaSuccess) {
        if (pl) cudaFreeHost(pl);
        cudaGetLastError();
        return;
    }
    f->fw_logits = fw->logits, f->fw_scores = fw->attn_scores;
    f->pin_logits = fw->logits = pl;
    f->pin_scores = fw->attn_scores = ps;
}

void cuda_core_quiesce(cuda_core *f) {
    if (f->ctx.stream) {
        cudaSetDevice(f->ctx.device);
        cudaStreamSynchronize(f->ctx.stream);
    }
}

void cuda_core_free(cuda_core *f) {
    if (f->pin_logits) {
        f->fw->logits = f->fw_logits, f->fw->attn_scores = f->fw_scores;
        cudaFreeHost(f->pin_logits);
        cudaFreeHost(f->pin_scores);
        f->pin_logits = f->pin_scores = NULL;
    }
    if (f->h_par) cudaFreeHost(f->h_par);
    if (f->h_tables) cudaFreeHost(f->h_tables);
    cuda_free(f->d_tables);
    f->h_tables = NULL, f->d_tables = NULL, f->table_cap = 0;
    if (f->h_stats) cudaFreeHost(f->h_stats);
    cuda_free(f->act);
    f->h_par = NULL, f->h_stats = NULL, f->act = NULL;
    cuda_destroy(&f->ctx);
    cudaGetLastError();
}

#endif
