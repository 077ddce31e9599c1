// shard.c: cut a loaded model down to one tensor-parallel rank's share (model/tp.h).
// Row slices (q/k/v, gate/up, their biases, the lm_head) stay views into the mapped
// files, so a rank only ever pages in its own rows; column slices (wo, down) are copied
// once into one buffer the model owns.
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "host/util/sha256.h"

// Rows [first, first + count) of a [rows, cols] tensor: a view.
static wref rows_of(wref w, size_t first, size_t cols) {
    return (wref){ (const char *)w.data + first * cols * wtype_size(w.type), w.type };
}

// Columns [first, first + count) of a [rows, cols] tensor, copied to dst [rows, count].
static wref cols_of(wref w, size_t rows, size_t cols, size_t first, size_t count, char *dst) {
    size_t es = wtype_size(w.type);
    for (size_t r = 0; r < rows; r++)
        memcpy(dst + r * count * es, (const char *)w.data + (r * cols + first) * es, count * es);
    return (wref){ dst, w.type };
}

static size_t layer_copy_bytes(const model *m, const tp_shard *s, const layer_weights *w) {
    const model_config *c = &m->cfg;
    return (size_t)c->dim * s->n_heads * c->head_dim * wtype_size(w->wo.type) +
           (size_t)c->dim * s->n_ffn * wtype_size(w->w_down.type);
}

static void shard_layer(const model *m, const tp_shard *s, layer_weights *w, char **dst) {
    const model_config *c = &m->cfg;
    size_t hd = (size_t)c->head_dim, D = (size_t)c->dim;
    size_t q0 = (size_t)s->head0 * hd, nq = (size_t)s->n_heads * hd, kv0 = (size_t)s->kv_head0 * hd;
    w->wq = rows_of(w->wq, q0, D);
    w->wk = rows_of(w->wk, kv0, D);
    w->wv = rows_of(w->wv, kv0, D);
    if (c->attn_bias) {
        w->bq = rows_of(w->bq, q0, 1);
        w->bk = rows_of(w->bk, kv0, 1);
        w->bv = rows_of(w->bv, kv0, 1);
    }
    w->wo = cols_of(w->wo, D, (size_t)c->n_heads * hd, q0, nq, *dst);
    *dst += D * nq * wtype_size(w->wo.type);
    w->w_gate = rows_of(w->w_gate, (size_t)s->ffn0, D);
    w->w_up = rows_of(w->w_up, (size_t)s->ffn0, D);
    w->w_down = cols_of(w->w_down, D, (size_t)c->hidden_dim, (size_t)s->ffn0, (size_t)s->n_ffn, *dst);
    *dst += D * s->n_ffn * wtype_size(w->w_down.type);
}

size_t model_shard_bytes(const model *m, const tp_shard *s) {
    const model_config *c = &m->cfg;
    size_t hd = (size_t)c->head_dim, D = (size_t)c->dim, n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *w = &m->layers[l];
        n += 2 * D * wtype_size(w->attn_norm.type);
        n += D * s->n_heads * hd * (wtype_size(w->wq.type) + wtype_size(w->wo.type));
        n += D * s->n_kv_heads * hd * (wtype_size(w->wk.type) + wtype_size(w->wv.type));
        n += D * s->n_ffn * (wtype_size(w->w_gate.type) + wtype_size(w->w_up.type) + wtype_size(w->w_down.type));
    }
    return n + D * s->n_vocab * wtype_size(m->lm_head.type) + D * wtype_size(m->final_norm.type);
}

int model_shard(model *m, const tp_shard *s, verr *err) {
    if (m->tp.size > 1) return verr_set(err, "%s: the model is already sharded", m->dir);
    if (s->size <= 1) return 0;
    size_t bytes = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) bytes += layer_copy_bytes(m, s, &m->layers[l]);
    char *buf = malloc(bytes ? bytes : 1), *dst = buf;
    if (!buf)
        return verr_set(err, "%s: out of memory copying rank %d's %zu bytes of o_proj and down_proj columns", m->dir,
                        s->rank, bytes);
    for (int l = 0; l < m->cfg.n_layers; l++) shard_layer(m, s, &m->layers[l], &dst);
    m->lm_head = rows_of(m->lm_head, (size_t)s->vocab0, (size_t)m->cfg.dim);
    m->tp = *s;
    m->tp_owned = buf;
    m->weight_bytes = model_shard_bytes(m, s);
    return 0;
}

int model_digest(const model *m, char out[65], verr *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", m->dir);
    sha256_ctx h;
    sha256_init(&h);
    // The file content, not its name: two copies of one checkpoint agree.
    char hex[65];
    if (sha256_file(path, hex, NULL, NULL, err)) return -1;
    sha256_update(&h, hex, 64);
    for (int i = 0; i < m->files.n; i++) {  // each safetensors header: names, dtypes, shapes, offsets
        const st_file *f = &m->files.files[i];
        uint64_t len = 0;
        if (f->size >= 8) memcpy(&len, f->map, 8);
        if (len > f->size - 8) len = f->size - 8;
        sha256_update(&h, &f->size, sizeof f->size);
        sha256_update(&h, f->map, 8 + (size_t)len);
    }
    sha256_hex(&h, out);
    return 0;
}
