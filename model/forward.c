// forward.c: Llama / Qwen2 / Qwen3 decoder layers, written top to bottom:
//   x = embed(ids)
//   per layer: x += o_proj(attn(rope(norm_qk(q, k)), v)),  x += down(silu(gate) * up)
//   logits = lm_head(norm(x_last))
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int forward_init(forward_state *s, const model *m, int max_T, int ctx, verr *err) {
    memset(s, 0, sizeof *s);
    const model_config *c = &m->cfg;
    s->m = m, s->max_T = max_T, s->ctx = ctx, s->attn_layer = -1;
    size_t T = (size_t)max_T, q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    s->x = malloc(T * c->dim * sizeof(float));
    s->xb = malloc(T * (c->dim > (int)q_dim ? (size_t)c->dim : q_dim) * sizeof(float));
    s->q = malloc(T * q_dim * sizeof(float));
    s->k = malloc(T * kv_dim * sizeof(float));
    s->v = malloc(T * kv_dim * sizeof(float));
    s->att = malloc(T * q_dim * sizeof(float));
    s->hb = malloc(T * c->hidden_dim * sizeof(float));
    s->hb2 = malloc(T * c->hidden_dim * sizeof(float));
    s->pos = malloc(T * sizeof(int));
    s->logits = malloc((size_t)c->vocab_size * sizeof(float));
    s->attn_scores = malloc((size_t)c->n_heads * ctx * sizeof(float));
    if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->pos || !s->logits ||
        !s->attn_scores) {
        forward_free(s);
        return verr_set(err, "out of memory allocating forward buffers");
    }
    return 0;
}

void forward_free(forward_state *s) {
    free(s->x), free(s->xb), free(s->q), free(s->k), free(s->v), free(s->att);
    free(s->hb), free(s->hb2), free(s->pos), free(s->logits), free(s->attn_scores);
    memset(s, 0, sizeof *s);
}

// Where the new keys/values of this chunk go: the tail if the view has one.
static kv_cache *write_target(kv_view *kv) { return kv->tail ? kv->tail : kv->trunk; }

static void attention_block(forward_state *s, const layer_weights *w, int l, kv_view *kv, int T) {
    const model_config *c = &s->m->cfg;
    int q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    kv_cache *dst = write_target(kv);
    // New keys and values are written straight into the cache rows they belong to.
    float *kdst = kv_cache_k(dst, l) + (size_t)dst->len * kv_dim;
    float *vdst = kv_cache_v(dst, l) + (size_t)dst->len * kv_dim;

    cpu_rmsnorm(s->xb, s->x, w->attn_norm, T, c->dim, c->norm_eps);
    cpu_matmul(s->q, s->xb, w->wq, T, c->dim, q_dim);
    cpu_matmul(kdst, s->xb, w->wk, T, c->dim, kv_dim);
    cpu_matmul(vdst, s->xb, w->wv, T, c->dim, kv_dim);
    if (c->attn_bias) {
        cpu_add_bias(s->q, w->bq, T, q_dim);
        cpu_add_bias(kdst, w->bk, T, kv_dim);
        cpu_add_bias(vdst, w->bv, T, kv_dim);
    }
    if (c->qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
        cpu_rmsnorm(s->q, s->q, w->q_norm, T * c->n_heads, c->head_dim, c->norm_eps);
        cpu_rmsnorm(kdst, kdst, w->k_norm, T * c->n_kv_heads, c->head_dim, c->norm_eps);
    }
    cpu_rope(s->q, s->pos, T, c->n_heads, c->head_dim, s->m->inv_freq, 0);
    cpu_rope(kdst, s->pos, T, c->n_kv_heads, c->head_dim, s->m->inv_freq, 0);

    kv_span span = {
        .k_trunk = kv_cache_k(kv->trunk, l), .v_trunk = kv_cache_v(kv->trunk, l),
        .n_trunk = kv->tail ? kv->n_trunk : kv->trunk->len + T,
        .k_tail = kv->tail ? kv_cache_k(kv->tail, l) : NULL, .v_tail = kv->tail ? kv_cache_v(kv->tail, l) : NULL,
        .n_tail = kv->tail ? kv->tail->len + T : 0,
    };
    attn_shape shape = { c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    int capture = l == s->attn_layer;
    cpu_attention(s->att, s->q, span, T, shape, capture ? s->attn_scores : NULL);
    if (capture) s->attn_keys = span.n_trunk + span.n_tail;
    cpu_matmul(s->xb, s->att, w->wo, T, q_dim, c->dim);
    cpu_add(s->x, s->xb, (size_t)T * c->dim);
}

static void mlp_block(forward_state *s, const layer_weights *w, int T) {
    const model_config *c = &s->m->cfg;
    cpu_rmsnorm(s->xb, s->x, w->ffn_norm, T, c->dim, c->norm_eps);
    cpu_matmul(s->hb, s->xb, w->w_gate, T, c->dim, c->hidden_dim);
    cpu_matmul(s->hb2, s->xb, w->w_up, T, c->dim, c->hidden_dim);
    cpu_swiglu(s->hb, s->hb, s->hb2, (size_t)T * c->hidden_dim);
    cpu_matmul(s->xb, s->hb, w->w_down, T, c->hidden_dim, c->dim);
    cpu_add(s->x, s->xb, (size_t)T * c->dim);
}

// One chunk of at most max_T tokens; the caller has validated ids and room.
// all: NULL, or [T, vocab] for every position's logits (the last one also goes to s->logits).
static void forward_chunk(forward_state *s, kv_view *kv, const int *ids, int T, float *all) {
    const model *m = s->m;
    const model_config *c = &m->cfg;
    int pos0 = kv_view_len(kv);
    for (int t = 0; t < T; t++) s->pos[t] = pos0 + t;
    cpu_embed(s->x, m->embed, ids, T, c->dim);
    for (int l = 0; l < c->n_layers; l++) {
        attention_block(s, &m->layers[l], l, kv, T);
        mlp_block(s, &m->layers[l], T);
    }
    write_target(kv)->len += T;
    if (!kv->tail) kv->n_trunk = kv->trunk->len;
    if (all) {  // scoring: every position
        cpu_rmsnorm(s->x, s->x, m->final_norm, T, c->dim, c->norm_eps);
        cpu_matmul(all, s->x, m->lm_head, T, c->dim, c->vocab_size);
        memcpy(s->logits, all + (size_t)(T - 1) * c->vocab_size, sizeof(float) * (size_t)c->vocab_size);
        return;
    }
    // Generation needs only the last token's logits.
    float *last = s->x + (size_t)(T - 1) * c->dim;
    cpu_rmsnorm(last, last, m->final_norm, 1, c->dim, c->norm_eps);
    cpu_matmul(s->logits, last, m->lm_head, 1, c->dim, c->vocab_size);
}

static int forward_run(forward_state *s, kv_view *kv, const int *ids, int T, float *all, verr *err) {
    const model_config *c = &s->m->cfg;
    if (T <= 0) return verr_set(err, "forward: no tokens to process");
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return verr_set(err, "token id %d at index %d is out of range (vocab_size %d)", ids[t], t, c->vocab_size);
    if (T > kv_view_room(kv) || kv_view_len(kv) + T > s->ctx)
        return verr_set(err, "%d tokens do not fit: %d of the %d-token context are used (raise --ctx)", T,
                        kv_view_len(kv), s->ctx);
    for (int done = 0; done < T; done += s->max_T) {
        int n = T - done < s->max_T ? T - done : s->max_T;
        forward_chunk(s, kv, ids + done, n, all ? all + (size_t)done * c->vocab_size : NULL);
    }
    return 0;
}

int forward(forward_state *s, kv_view *kv, const int *ids, int T, verr *err) {
    return forward_run(s, kv, ids, T, NULL, err);
}

int forward_all(forward_state *s, kv_view *kv, const int *ids, int T, float *out, verr *err) {
    return forward_run(s, kv, ids, T, out, err);
}
