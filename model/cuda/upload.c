// upload.c: see upload.h. The weights of a device forward, uploaded once from the
// mmapped checkpoint into one arena in the GPU's formats.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int forward_cuda_upload_unused;  // nothing to build without CUDA
#else

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/util/progress.h"
#include "model/cuda/upload.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

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

int cuda_weights_upload(cuda_ctx *ctx, const model *m, dev_weights *w, verr *err) {
    w->layers = calloc((size_t)m->cfg.n_layers, sizeof *w->layers);
    if (!w->layers) return verr_set(err, "out of memory");
    uploader u = { ctx, NULL, 0, NULL, 0, NULL, 0, err };
    if (up_model(&u, m, w)) return -1;
    w->bytes = u.off;
    void *arena = NULL;
    if (cuda_malloc(&arena, w->bytes, "model weights", err)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return verr_set(err, "the weights of %s (%.1f MiB in the GPU's formats) do not fit on CUDA device %d: %s",
                        m->dir, w->bytes / 1048576.0, ctx->device, msg);
    }
    w->arena = arena;
    // A bar on a terminal for big models; tests and logs stay quiet.
    progress pg;
    int quiet = !isatty(STDERR_FILENO) || w->bytes < ((size_t)256 << 20);
    u = (uploader){ ctx, arena, 0, NULL, (size_t)16 << 20, &pg, 0, err };
    CK(cudaHostAlloc(&u.stage, u.stage_bytes, cudaHostAllocDefault));
    progress_start(&pg, "upload MiB", (long)(w->bytes >> 20), quiet);
    int rc = up_model(&u, m, w);
    cudaFreeHost(u.stage);
    if (rc == 0) progress_finish(&pg, NULL);
    else progress_stop(&pg);  // the error follows; the ticker must not outlive pg
    if (rc == 0 && u.off != w->bytes)
        return verr_set(err, "weight upload layout mismatch: %zu vs %zu bytes (%s:%d)", u.off, w->bytes, __FILE__,
                        __LINE__);
    return rc;
}

void cuda_weights_free(dev_weights *w) {
    cuda_free(w->arena);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

#endif
