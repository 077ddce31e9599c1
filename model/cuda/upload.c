// forward_cuda_upload.c: the device memory of a CUDA forward (model/forward_cuda.h):
// the weights, uploaded once from the mmapped checkpoint into one arena in the GPU's
// formats, and the activation buffers, step block and scratch sized for its shapes.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int forward_cuda_upload_unused;  // nothing to build without CUDA
#else

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/util/progress.h"
#include "model/cuda/internal.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// Step block layout: lens [rows], layers [n_layers][rows], ids, pos, rows [max_T].
static size_t par_lens(int rows) { return ((size_t)rows * sizeof(cuda_kv_lens) + 15) & ~(size_t)15; }

step_params cuda_forward_params(void *base, int n_layers, int max_T, int rows) {
    char *p = base;
    step_params s;
    s.lens = (cuda_kv_lens *)p;
    s.layers = (cuda_kv_layer *)(p + par_lens(rows));
    s.ids = (int *)(p + par_lens(rows) + (size_t)n_layers * rows * sizeof(cuda_kv_layer));
    s.pos = s.ids + max_T;
    s.rows = s.pos + max_T;
    return s;
}

static size_t par_size(int n_layers, int max_T, int rows) {
    return par_lens(rows) + (size_t)n_layers * rows * sizeof(cuda_kv_layer) + 3 * (size_t)max_T * sizeof(int);
}

// ---- weight upload -----------------------------------------------------------------------
// Two passes over the same layout code: the first (base == NULL) only sums the sizes,
// the second uploads into one arena of that size.
typedef struct {
    cuda_ctx *ctx;
    char *base;                // NULL: sizing pass
    size_t off;
    void *stage;               // pinned staging for converted tensors
    size_t stage_bytes;
    progress *pg;              // upload pass: MiB done (a bar on a terminal)
    size_t done;
    verr *err;
} uploader;

static void up_progress(uploader *u, size_t bytes) {
    u->done += bytes;
    if (u->pg) progress_update(u->pg, (long)(u->done >> 20), NULL);
}

static float widen(const void *p, wtype t, size_t i) {
    if (t == WT_F32) return ((const float *)p)[i];
    if (t == WT_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return f16_to_f32(((const uint16_t *)p)[i]);
}

static void convert(void *dst, wtype dt, const void *src, wtype st, size_t i0, size_t n) {
#pragma omp parallel for if (n > 65536)
    for (size_t j = 0; j < n; j++) {
        float f = widen(src, st, i0 + j);
        if (dt == WT_F32) ((float *)dst)[j] = f;
        else if (dt == WT_BF16) ((uint16_t *)dst)[j] = f32_to_bf16(f);
        else ((uint16_t *)dst)[j] = f32_to_f16(f);
    }
}

// n elements of src (stored type st) into device dst as dt.
static int up_copy(uploader *u, char *dst, wtype dt, const void *src, wtype st, size_t n) {
    size_t esz = wtype_size(dt);
    if (dt == st) {
        if (cuda_upload(u->ctx, dst, src, n * esz)) return verr_set(u->err, "uploading weights: %s", u->ctx->err.msg);
        up_progress(u, n * esz);
        return 0;
    }
    size_t chunk = u->stage_bytes / esz;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        convert(u->stage, dt, src, st, i, k);
        if (cuda_upload(u->ctx, dst + i * esz, u->stage, k * esz))
            return verr_set(u->err, "uploading weights: %s", u->ctx->err.msg);
        up_progress(u, k * esz);
    }
    return 0;
}

// out = concat(parts) as type dt, parts[i] holding n[i] elements.
static int up_concat(uploader *u, wref *out, wtype dt, const wref *parts, const size_t *n, int k) {
    size_t total = 0;
    for (int i = 0; i < k; i++) total += n[i];
    size_t off = align256(u->off);
    u->off = off + total * wtype_size(dt);
    out->type = dt;
    out->data = NULL;
    if (!u->base) return 0;
    out->data = u->base + off;
    char *dst = u->base + off;
    for (int i = 0; i < k; i++) {
        if (up_copy(u, dst, dt, parts[i].data, parts[i].type, n[i])) return -1;
        dst += n[i] * wtype_size(dt);
    }
    return 0;
}

// Matrices: f16 stays f16 when every part is f16, everything else becomes bf16.
static wtype mat_type(const wref *parts, int k) {
    for (int i = 0; i < k; i++)
        if (parts[i].type != WT_F16) return WT_BF16;
    return WT_F16;
}

static int up_mat(uploader *u, wref *out, const wref *parts, const size_t *n, int k) {
    return up_concat(u, out, mat_type(parts, k), parts, n, k);
}

static int up_vec(uploader *u, wref *out, const wref *parts, const size_t *n, int k) {
    return up_concat(u, out, WT_F32, parts, n, k);
}

static int up_layer(uploader *u, const model *m, int l, dev_layer *L) {
    const model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    const tp_shard *t = &m->tp;  // this process's share (all of it without tensor parallelism)
    size_t D = (size_t)c->dim, Q = (size_t)t->n_heads * c->head_dim, KV = (size_t)t->n_kv_heads * c->head_dim;
    size_t H = (size_t)t->n_ffn, hd = (size_t)c->head_dim;
    wref qkv[3] = { w->wq, w->wk, w->wv }, gu[2] = { w->w_gate, w->w_up };
    size_t n_qkv[3] = { Q * D, KV * D, KV * D }, n_gu[2] = { H * D, H * D }, n_b[3] = { Q, KV, KV };
    size_t nD = D, nQD = D * Q, nDH = D * H;
    if (up_vec(u, &L->attn_norm, &w->attn_norm, &nD, 1) || up_vec(u, &L->ffn_norm, &w->ffn_norm, &nD, 1) ||
        up_mat(u, &L->wqkv, qkv, n_qkv, 3) || up_mat(u, &L->wo, &w->wo, &nQD, 1) ||
        up_mat(u, &L->w_gu, gu, n_gu, 2) || up_mat(u, &L->w_down, &w->w_down, &nDH, 1))
        return -1;
    memset(&L->bqkv, 0, sizeof L->bqkv);
    memset(&L->q_norm, 0, sizeof L->q_norm);
    memset(&L->k_norm, 0, sizeof L->k_norm);
    if (c->attn_bias) {
        wref b[3] = { w->bq, w->bk, w->bv };
        if (up_vec(u, &L->bqkv, b, n_b, 3)) return -1;
    }
    if (c->qk_norm && (up_vec(u, &L->q_norm, &w->q_norm, &hd, 1) || up_vec(u, &L->k_norm, &w->k_norm, &hd, 1)))
        return -1;
    return 0;
}

static int up_model(uploader *u, const model *m, dev_weights *w) {
    const model_config *c = &m->cfg;
    size_t VD = (size_t)c->vocab_size * c->dim, D = (size_t)c->dim, half = (size_t)c->head_dim / 2;
    size_t v0 = (size_t)m->tp.vocab0, nVD = (size_t)m->tp.n_vocab * c->dim;  // this shard's lm_head rows
    if (up_mat(u, &w->embed, &m->embed, &VD, 1) || up_vec(u, &w->final_norm, &m->final_norm, &D, 1)) return -1;
    if ((const char *)m->lm_head.data == (const char *)m->embed.data + v0 * D * wtype_size(m->embed.type)) {
        // tied: the embedding's rows (a shard's slice of them)
        w->lm_head = w->embed;
        if (w->embed.data) w->lm_head.data = (const char *)w->embed.data + v0 * D * wtype_size(w->embed.type);
    } else if (up_mat(u, &w->lm_head, &m->lm_head, &nVD, 1)) {
        return -1;
    }
    wref inv = { m->inv_freq, WT_F32 };
    wref dinv;
    if (up_vec(u, &dinv, &inv, &half, 1)) return -1;
    w->inv_freq = dinv.data;
    for (int l = 0; l < c->n_layers; l++)
        if (up_layer(u, m, l, &w->layers[l])) return -1;
    return 0;
}

int cuda_forward_upload(cuda_forward *f, verr *err) {
    const model *m = f->m;
    dev_weights *w = &f->own;
    w->layers = calloc((size_t)m->cfg.n_layers, sizeof *w->layers);
    if (!w->layers) return verr_set(err, "out of memory");
    uploader u = { &f->ctx, NULL, 0, NULL, 0, NULL, 0, err };
    if (up_model(&u, m, w)) return -1;
    w->bytes = u.off;
    void *arena = NULL;
    if (cuda_malloc(&arena, w->bytes, "model weights", err)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return verr_set(err, "the weights of %s (%.1f MiB in the GPU's formats) do not fit on CUDA device %d: %s",
                        m->dir, w->bytes / 1048576.0, f->ctx.device, msg);
    }
    w->arena = arena;
    // A bar on a terminal for big models; tests and logs stay quiet.
    progress pg;
    int quiet = !isatty(STDERR_FILENO) || w->bytes < ((size_t)256 << 20);
    progress_start(&pg, "upload MiB", (long)(w->bytes >> 20), quiet);
    u = (uploader){ &f->ctx, arena, 0, NULL, (size_t)16 << 20, &pg, 0, err };
    CK(cudaHostAlloc(&u.stage, u.stage_bytes, cudaHostAllocDefault));
    int rc = up_model(&u, m, w);
    cudaFreeHost(u.stage);
    if (rc == 0) progress_finish(&pg, NULL);
    if (rc == 0 && u.off != w->bytes)
        return verr_set(err, "weight upload layout mismatch: %zu vs %zu bytes (%s:%d)", u.off, w->bytes, __FILE__,
                        __LINE__);
    return rc;
}

// ---- activations ---------------------------------------------------------------------------
int cuda_forward_alloc(cuda_forward *f, verr *err) {
    const model_config *c = &f->m->cfg;
    const tp_shard *t = &f->m->tp;  // the weights' shapes are the shard's; logits and captures the whole model's
    size_t T = (size_t)f->max_T, R = (size_t)f->rows, q_dim = (size_t)t->n_heads * c->head_dim;
    size_t qkv_dim = q_dim + 2 * (size_t)t->n_kv_heads * c->head_dim;
    // x (decode) and y (prefill) are also the all-reduce's buffers: padded for the
    // reduce-scatter's equal shares
    size_t sizes[10] = { T * c->dim + cuda_tp_pad(f), T * c->dim, T * c->dim + cuda_tp_pad(f), T * qkv_dim, T * q_dim,
                         T * 2 * t->n_ffn, R * c->vocab_size, R * c->n_heads * f->max_ctx, 8 * R, 0 };
    f->par_bytes = par_size(c->n_layers, f->max_T, f->rows);
    size_t off[10], total = 0;
    for (int i = 0; i < 10; i++) {
        off[i] = total;
        total = align256(total + (i < 9 ? sizes[i] * sizeof(float) : f->par_bytes));
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
    f->d_par = a + off[9];
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
void cuda_forward_pin_host(cuda_forward *f) {
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

#endif
