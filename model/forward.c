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

int forward_set_comm(forward_state *s, tp_comm *c, verr *err) {
    const tp_shard *t = &s->m->tp;
    if (!c || c->size <= 1) return 0;
    if (c->size != t->size || c->rank != t->rank)
        return verr_set(err, "forward: the model holds rank %d of %d's share, the communicator is rank %d of %d",
                        t->rank, t->size, c->rank, c->size);
    size_t gathered = (size_t)TP_ROWS * t->max_vocab, heads = (size_t)t->max_heads * s->ctx;
    if (heads > gathered) gathered = heads;
    s->tp_logits = malloc(sizeof(float) * (size_t)TP_ROWS * t->max_vocab);
    s->tp_scores = malloc(sizeof(float) * heads);
    s->tp_gather = malloc(sizeof(float) * gathered * (size_t)c->size);
    if (!s->tp_logits || !s->tp_scores || !s->tp_gather)
        return verr_set(err, "out of memory allocating the tensor-parallel gather buffers (%zu floats)",
                        gathered * (size_t)c->size);
    s->comm = c;
    return 0;
}

int forward_set_lora(forward_state *s, const lora_use *u, int n, verr *err) {
    const model_config *c = &s->m->cfg;
    int r = lora_max_rank(u, n);
    if (r > s->lora_rank) {
        int q_dim = c->n_heads * c->head_dim, widest = c->dim > q_dim ? c->dim : q_dim;
        if (c->hidden_dim > widest) widest = c->hidden_dim;
        float *tmp = malloc(sizeof(float) * (size_t)s->max_T * r);
        float *dy = s->lora_dy ? s->lora_dy : malloc(sizeof(float) * (size_t)s->max_T * widest);
        if (!tmp || !dy) {
            free(tmp);
            if (dy != s->lora_dy) free(dy);
            return verr_set(err, "out of memory allocating LoRA scratch (rank %d)", r);
        }
        free(s->lora_tmp);
        s->lora_tmp = tmp, s->lora_dy = dy, s->lora_rank = r;
    }
    s->lora = n > 0 ? u : NULL, s->n_lora = n > 0 ? n : 0;
    return 0;
}

void forward_free(forward_state *s) {
    free(s->x), free(s->xb), free(s->q), free(s->k), free(s->v), free(s->att);
    free(s->hb), free(s->hb2), free(s->pos), free(s->logits), free(s->attn_scores);
    free(s->lora_tmp), free(s->lora_dy);
    free(s->tp_logits), free(s->tp_scores), free(s->tp_gather);
    memset(s, 0, sizeof *s);
}

// x @ w^T: forward_batch's rows each summed as a row alone (batching changes no bit),
// other passes by the fastest path for their T.
static void mm(const forward_state *s, float *out, const float *x, wref w, int T, int n_in, int n_out) {
    if (s->rows_exact) cpu_matmul_rows(out, x, w, T, n_in, n_out);
    else cpu_matmul(out, x, w, T, n_in, n_out);
}

// Where the new keys/values of a sequence go: the tail if the view has one.
static kv_cache *write_target(kv_view *kv) { return kv->tail ? kv->tail : kv->trunk; }

// One forward's rows: T consecutive tokens of one sequence (n_seq == 1: prefill, decode),
// or one token of each of n_seq == T sequences (forward_batch: rows share the weights,
// each has its own view, position and attention).
typedef struct {
    kv_view *views;  // [n_seq]
    int n_seq;
    float *scores;   // capture of sequence i at scores + i * n_heads * ctx; NULL: none
    int *keys;       // [n_seq] keys in each capture
    float *out;      // NULL: the last row's logits to s->logits; else every row's, [T, vocab]
    int capture;     // hand activations to the hooks (single-sequence forwards)
    int final;       // the forward call's last chunk (the attention hooks read its last query)
} chunk;

// Hands rows [T, dim] at layer l, point p to the activation hook when it wants them.
static void emit(const forward_state *s, const chunk *ch, int l, int p, const float *x, int T) {
    const forward_hooks *h = s->hooks;
    if (!h || !ch->capture || !h->on_act || !h->act_layers || !h->act_layers[l] || !(h->points >> p & 1u)) return;
    h->on_act(h->ud, l, p, x, T, s->pos[0]);
}

static int hook_attn(const forward_state *s, const chunk *ch, int l) {
    const forward_hooks *h = s->hooks;
    return h && ch->capture && ch->final && h->on_attn && h->attn_layers && h->attn_layers[l];
}

// --ablate-head: zero the ablated heads' slices of att [T, n_heads * head_dim].
static void ablate_heads(const forward_state *s, int l, float *att, int T) {
    const model_config *c = &s->m->cfg;
    const tp_shard *tp = &s->m->tp;  // att holds this rank's heads
    const unsigned char *a = s->hooks->ablate + (size_t)l * c->n_heads + tp->head0;
    for (int h = 0; h < tp->n_heads; h++)
        for (int t = 0; a[h] && t < T; t++)
            memset(att + ((size_t)t * tp->n_heads + h) * c->head_dim, 0, sizeof(float) * (size_t)c->head_dim);
}

// The keys and values a view sees at layer l once its n new positions are stored.
static kv_span span_of(const kv_view *kv, int l, int n) {
    const kv_cache *tr = kv->trunk, *tl = kv->tail;
    return (kv_span){
        .bf16 = tr->bf16,
        .k_trunk = kv_cache_k(tr, l), .v_trunk = kv_cache_v(tr, l),
        .n_trunk = tl ? kv->n_trunk : tr->len + n,
        .k_tail = tl ? kv_cache_k(tl, l) : NULL, .v_tail = tl ? kv_cache_v(tl, l) : NULL,
        .n_tail = tl ? tl->len + n : 0,
    };
}

// Tensor parallelism: x[n] summed over the ranks (the partial outputs of wo and down).
// A failure is kept for forward_run to report; later collectives are skipped.
static void tp_sum(forward_state *s, float *x, size_t n) {
    if (!s->comm || s->tp_failed) return;
    if (s->comm->sum(s->comm, x, n, &s->tp_err)) s->tp_failed = 1;
}

// Tensor parallelism: every rank's slice of `rows` rows, gathered into full rows. Rank
// r's slice of a row is count(r) values at first(r) (query heads times keys, vocabulary
// rows); part holds this rank's [rows, pad], out receives [rows, total].
static void tp_gather_rows(forward_state *s, const float *part, int rows, size_t pad, int per_head, size_t unit,
                           float *out, size_t total) {
    if (s->tp_failed) return;
    tp_comm *c = s->comm;
    size_t block = (size_t)rows * pad;
    if (c->gather(c, part, sizeof(float) * block, s->tp_gather, &s->tp_err)) {
        s->tp_failed = 1;
        return;
    }
    for (int r = 0; r < c->size; r++) {
        tp_shard o;
        tp_shard_plan(&s->m->cfg, r, c->size, &o, NULL);
        size_t first = per_head ? (size_t)o.head0 * unit : (size_t)o.vocab0;
        size_t count = per_head ? (size_t)o.n_heads * unit : (size_t)o.n_vocab;
        for (int i = 0; i < rows; i++)
            memcpy(out + (size_t)i * total + first, s->tp_gather + (size_t)r * block + (size_t)i * pad,
                   sizeof(float) * count);
    }
}

// The attention of sequence i's n new rows, with its capture of the last query (cap,
// [n_heads, keys], whole over every rank's heads) when cap is set.
static void attend(forward_state *s, float *out, const float *q, kv_span span, kv_pages pg, int n, float *cap) {
    const model_config *c = &s->m->cfg;
    const tp_shard *tp = &s->m->tp;
    attn_shape shape = { tp->n_heads, tp->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    if (!cap || !s->comm) {
        cpu_attention_paged(out, q, span, pg, n, shape, cap);
        return;
    }
    size_t keys = (size_t)span.n_trunk + span.n_tail;
    cpu_attention_paged(out, q, span, pg, n, shape, s->tp_scores);
    tp_gather_rows(s, s->tp_scores, 1, (size_t)tp->max_heads * keys, 1, keys, cap, (size_t)c->n_heads * keys);
}

// A batch's decode rows (one per sequence, no tensor parallelism) in one
// cpu_attention_rows call: 0 when there is no memory for its lists (attend them one by one).
static int attend_rows(forward_state *s, const chunk *ch, int l) {
    const model_config *c = &s->m->cfg;
    const tp_shard *tp = &s->m->tp;
    int B = ch->n_seq;
    attn_shape shape = { tp->n_heads, tp->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim) };
    kv_span *spans = malloc(sizeof *spans * (size_t)B);
    kv_pages *pgs = malloc(sizeof *pgs * (size_t)B);
    float **caps = malloc(sizeof *caps * (size_t)B);
    if (!spans || !pgs || !caps) {
        free(spans), free(pgs), free(caps);
        return 0;
    }
    for (int i = 0; i < B; i++) {
        spans[i] = span_of(&ch->views[i], l, 1);
        pgs[i] = (kv_pages){ ch->views[i].trunk->table, ch->views[i].trunk->block_shift };
        caps[i] = l == s->attn_layer && ch->scores ? ch->scores + (size_t)i * c->n_heads * s->ctx : NULL;
        if (caps[i]) ch->keys[i] = spans[i].n_trunk + spans[i].n_tail;
    }
    cpu_attention_rows(s->att, s->q, spans, pgs, B, shape, caps);
    free(spans), free(pgs), free(caps);
    return 1;
}

// One position's keys and values [kv_dim] into position `at` of cache d at layer l.
static void store_kv_row(kv_cache *d, int l, int at, const float *k, const float *v) {
    size_t n = (size_t)d->kv_dim, off = kv_cache_phys(d, at) * n;
    if (!d->bf16) {
        memcpy((float *)kv_cache_k(d, l) + off, k, sizeof(float) * n);
        memcpy((float *)kv_cache_v(d, l) + off, v, sizeof(float) * n);
        return;
    }
    uint16_t *kh = (uint16_t *)kv_cache_k(d, l) + off, *vh = (uint16_t *)kv_cache_v(d, l) + off;
    for (size_t i = 0; i < n; i++) kh[i] = f32_to_bf16(k[i]), vh[i] = f32_to_bf16(v[i]);
}

// Each sequence's n = T / n_seq rows, one attention call each, with the hooks' capture.
static void attend_each(forward_state *s, const chunk *ch, int l, int T) {
    const model_config *c = &s->m->cfg;
    int n = T / ch->n_seq, q_dim = s->m->tp.n_heads * c->head_dim;
    float *hcap = hook_attn(s, ch, l) ? s->hooks->attn_buf : NULL;  // n_seq == 1
    for (int i = 0; i < ch->n_seq; i++) {
        kv_span span = span_of(&ch->views[i], l, n);
        float *cap = l == s->attn_layer && ch->scores ? ch->scores + (size_t)i * c->n_heads * s->ctx : NULL;
        if (cap && hcap) hcap = cap;  // one capture serves both
        size_t off = (size_t)i * n * q_dim;
        kv_pages pg = { ch->views[i].trunk->table, ch->views[i].trunk->block_shift };
        attend(s, s->att + off, s->q + off, span, pg, n, cap ? cap : hcap);
        if (cap) ch->keys[i] = span.n_trunk + span.n_tail;
        if (hcap) s->hooks->on_attn(s->hooks->ud, l, hcap, span.n_trunk + span.n_tail);
    }
}

static void attention_block(forward_state *s, const layer_weights *w, int l, const chunk *ch, int T) {
    const model_config *c = &s->m->cfg;
    const tp_shard *tp = &s->m->tp;  // this rank's heads (all of them in one process)
    int q_dim = tp->n_heads * c->head_dim, kv_dim = tp->n_kv_heads * c->head_dim, batch = ch->n_seq > 1;
    // One sequence's new keys and values are written straight into the fp32 cache rows
    // they belong to; a batch's, a bf16 cache's or a paged one's go to scratch first, then
    // each row to its own sequence and place.
    kv_cache *dst = write_target(&ch->views[0]);
    int direct = !batch && !dst->bf16 && !dst->table;
    float *kdst = direct ? (float *)kv_cache_k(dst, l) + (size_t)dst->len * kv_dim : s->k;
    float *vdst = direct ? (float *)kv_cache_v(dst, l) + (size_t)dst->len * kv_dim : s->v;

    cpu_rmsnorm(s->xb, s->x, w->attn_norm, T, c->dim, c->norm_eps);
    mm(s, s->q, s->xb, w->wq, T, c->dim, q_dim);
    mm(s, kdst, s->xb, w->wk, T, c->dim, kv_dim);
    mm(s, vdst, s->xb, w->wv, T, c->dim, kv_dim);
    if (s->n_lora) {
        lora_apply(s->lora, s->n_lora, l, LORA_Q, s->q, s->xb, T, c->dim, q_dim, s->lora_tmp, s->lora_dy, s->rows_exact);
        lora_apply(s->lora, s->n_lora, l, LORA_K, kdst, s->xb, T, c->dim, kv_dim, s->lora_tmp, s->lora_dy, s->rows_exact);
        lora_apply(s->lora, s->n_lora, l, LORA_V, vdst, s->xb, T, c->dim, kv_dim, s->lora_tmp, s->lora_dy, s->rows_exact);
    }
    if (c->attn_bias) {
        cpu_add_bias(s->q, w->bq, T, q_dim);
        cpu_add_bias(kdst, w->bk, T, kv_dim);
        cpu_add_bias(vdst, w->bv, T, kv_dim);
    }
    if (c->qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
        cpu_rmsnorm(s->q, s->q, w->q_norm, T * tp->n_heads, c->head_dim, c->norm_eps);
        cpu_rmsnorm(kdst, kdst, w->k_norm, T * tp->n_kv_heads, c->head_dim, c->norm_eps);
    }
    cpu_rope(s->q, s->pos, T, tp->n_heads, c->head_dim, s->m->inv_freq, 0);
    cpu_rope(kdst, s->pos, T, tp->n_kv_heads, c->head_dim, s->m->inv_freq, 0);
    for (int t = 0; !direct && t < T; t++) {  // row t: sequence t of a batch, else position len + t
        kv_cache *d = batch ? write_target(&ch->views[t]) : dst;
        store_kv_row(d, l, d->len + (batch ? 0 : t), s->k + (size_t)t * kv_dim, s->v + (size_t)t * kv_dim);
    }

    // a batch's decode rows together, in one parallel region (the bits of one call per row)
    if (!batch || s->comm || T != ch->n_seq || !attend_rows(s, ch, l)) attend_each(s, ch, l, T);
    if (s->hooks && s->hooks->ablate) ablate_heads(s, l, s->att, T);
    mm(s, s->xb, s->att, w->wo, T, q_dim, c->dim);  // the block's output; the caller adds it
    if (s->n_lora) lora_apply(s->lora, s->n_lora, l, LORA_O, s->xb, s->att, T, q_dim, c->dim, s->lora_tmp, s->lora_dy, s->rows_exact);
    tp_sum(s, s->xb, (size_t)T * c->dim);
}

static void mlp_block(forward_state *s, const layer_weights *w, int l, int T) {
    const model_config *c = &s->m->cfg;
    int hid = s->m->tp.n_ffn;  // this rank's intermediate columns
    cpu_rmsnorm(s->xb, s->x, w->ffn_norm, T, c->dim, c->norm_eps);
    mm(s, s->hb, s->xb, w->w_gate, T, c->dim, hid);
    mm(s, s->hb2, s->xb, w->w_up, T, c->dim, hid);
    if (s->n_lora) {
        lora_apply(s->lora, s->n_lora, l, LORA_GATE, s->hb, s->xb, T, c->dim, hid, s->lora_tmp, s->lora_dy, s->rows_exact);
        lora_apply(s->lora, s->n_lora, l, LORA_UP, s->hb2, s->xb, T, c->dim, hid, s->lora_tmp, s->lora_dy, s->rows_exact);
    }
    cpu_swiglu(s->hb, s->hb, s->hb2, (size_t)T * hid);
    mm(s, s->xb, s->hb, w->w_down, T, hid, c->dim);  // the caller adds it
    if (s->n_lora) lora_apply(s->lora, s->n_lora, l, LORA_DOWN, s->xb, s->hb, T, hid, c->dim, s->lora_tmp, s->lora_dy, s->rows_exact);
    tp_sum(s, s->xb, (size_t)T * c->dim);
}

// One decoder block on the residual stream s->x, with the hooks' interventions and captures.
static void block(forward_state *s, const chunk *ch, int l, int T) {
    const forward_hooks *h = s->hooks;
    const model_config *c = &s->m->cfg;
    const layer_weights *w = &s->m->layers[l];
    size_t n = (size_t)T * c->dim;
    emit(s, ch, l, HOOK_RESID_PRE, s->x, T);
    if (h && h->skip && h->skip[l]) {  // the identity: both branches contribute zero
        memset(s->xb, 0, sizeof(float) * n);
        emit(s, ch, l, HOOK_ATTN_OUT, s->xb, T);
        emit(s, ch, l, HOOK_RESID_MID, s->x, T);
        emit(s, ch, l, HOOK_MLP_OUT, s->xb, T);
    } else {
        attention_block(s, w, l, ch, T);
        emit(s, ch, l, HOOK_ATTN_OUT, s->xb, T);
        cpu_add(s->x, s->xb, n);
        emit(s, ch, l, HOOK_RESID_MID, s->x, T);
        mlp_block(s, w, l, T);
        emit(s, ch, l, HOOK_MLP_OUT, s->xb, T);
        cpu_add(s->x, s->xb, n);
    }
    if (h && h->cvec && h->cvec_on[l])
        for (int t = 0; t < T; t++) cpu_add(s->x + (size_t)t * c->dim, h->cvec + (size_t)l * c->dim, (size_t)c->dim);
    emit(s, ch, l, HOOK_RESID_POST, s->x, T);
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

// A collective of this pass failed: the group is out of step, so the pass is an error.
static int tp_failed(forward_state *s, verr *err) {
    if (!s->tp_failed) return 0;
    s->tp_failed = 0;
    return verr_set(err, "tensor parallelism (rank %d of %d): %.900s", s->comm->rank, s->comm->size, s->tp_err.msg);
}

// out[T, vocab] = the logits of normed rows x[T, dim]; a shard computes its vocabulary
// rows and gathers the rest, TP_ROWS rows per collective.
static void lm_head(forward_state *s, float *out, const float *x, int T) {
    const model_config *c = &s->m->cfg;
    const tp_shard *tp = &s->m->tp;
    if (!s->comm) {
        mm(s, out, x, s->m->lm_head, T, c->dim, c->vocab_size);
        return;
    }
    for (int t = 0; t < T; t += TP_ROWS) {
        int n = T - t < TP_ROWS ? T - t : TP_ROWS;
        mm(s, s->tp_logits, x + (size_t)t * c->dim, s->m->lm_head, n, c->dim, tp->n_vocab);
        for (int i = n - 1; i > 0; i--)  // rows [n, n_vocab] spread to the gather's [n, max_vocab]
            memmove(s->tp_logits + (size_t)i * tp->max_vocab, s->tp_logits + (size_t)i * tp->n_vocab,
                    sizeof(float) * (size_t)tp->n_vocab);
        tp_gather_rows(s, s->tp_logits, n, (size_t)tp->max_vocab, 0, 1, out + (size_t)t * c->vocab_size,
                       (size_t)c->vocab_size);
    }
}

int forward_lm_head(forward_state *s, float *out, const float *x, int T, verr *err) {
    lm_head(s, out, x, T);
    return tp_failed(s, err);
}

// One chunk of at most max_T rows; the caller has validated ids and room. Returns the
// first layer after which the hidden states hold a NaN or inf (a cheap scan of T x dim
// floats per layer, for the error message), or -1.
static int forward_chunk(forward_state *s, const chunk *ch, const int *ids, int T) {
    const model *m = s->m;
    const model_config *c = &m->cfg;
    int n = T / ch->n_seq;
    for (int t = 0; t < T; t++) s->pos[t] = kv_view_len(&ch->views[t / n]) + t % n;
    cpu_embed(s->x, m->embed, ids, T, c->dim);
    int bad_layer = -1;
    for (int l = 0; l < c->n_layers; l++) {
        block(s, ch, l, T);
        if (bad_layer < 0 && !all_finite(s->x, (size_t)T * c->dim)) bad_layer = l;
    }
    for (int i = 0; i < ch->n_seq; i++) {
        kv_view *kv = &ch->views[i];
        write_target(kv)->len += n;
        if (!kv->tail) kv->n_trunk = kv->trunk->len;
    }
    if (ch->out) {  // scoring and batches: every row
        cpu_rmsnorm(s->x, s->x, m->final_norm, T, c->dim, c->norm_eps);
        lm_head(s, ch->out, s->x, T);
        memcpy(s->logits, ch->out + (size_t)(T - 1) * c->vocab_size, sizeof(float) * (size_t)c->vocab_size);
        return bad_layer;
    }
    // Generation needs only the last token's logits.
    float *last = s->x + (size_t)(T - 1) * c->dim;
    cpu_rmsnorm(last, last, m->final_norm, 1, c->dim, c->norm_eps);
    lm_head(s, s->logits, last, 1);
    return bad_layer;
}

// Non-finite logits (weights of 3e38, NaN or inf) are an error naming the position and
// where they first appeared, never something to sample from. rows logits rows of
// positions pos, pos + step, ...
static int check_logits(const forward_state *s, const float *logits, int rows, int pos, int step, int bad_layer,
                        verr *err) {
    size_t V = (size_t)s->m->cfg.vocab_size;
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * V;
        if (all_finite(row, V)) continue;
        size_t i = 0;
        while (isfinite(row[i])) i++;
        char where[160];
        if (bad_layer >= 0)
            snprintf(where, sizeof where, "the hidden state is first non-finite after layer %d of %d", bad_layer,
                     s->m->cfg.n_layers);
        else
            snprintf(where, sizeof where, "the hidden states are finite through every layer: the final norm or "
                     "lm_head overflows");
        return verr_set(err, "non-finite logits at position %d (logit %zu is %g): %s (weights of NaN, inf or near "
                        "FLT_MAX?)", pos + r * step, i, row[i], where);
    }
    return 0;
}

static int check_id(const forward_state *s, int id, int at, verr *err) {
    int vocab = s->m->cfg.vocab_size;
    if (id >= 0 && id < vocab) return 0;
    return verr_set(err, "token id %d at index %d is out of range (vocab_size %d)", id, at, vocab);
}


static int forward_run(forward_state *s, kv_view *kv, const int *ids, int T, float *all, verr *err) {
    const model_config *c = &s->m->cfg;
    if (T <= 0) return verr_set(err, "forward: no tokens to process");
    for (int t = 0; t < T; t++)
        if (check_id(s, ids[t], t, err)) return -1;
    if (kv->tail && kv->tail->table) return verr_set(err, "forward: a branch tail cannot be paged (only a trunk)");
    if (T > kv_view_room(kv) || kv_view_len(kv) + T > s->ctx)
        return verr_set(err, "%d tokens do not fit: %d of the %d-token context are used (raise --ctx)", T,
                        kv_view_len(kv), s->ctx);
    for (int done = 0; done < T; done += s->max_T) {
        int n = T - done < s->max_T ? T - done : s->max_T, pos = kv_view_len(kv);
        float *out = all ? all + (size_t)done * c->vocab_size : NULL;
        chunk ch = { kv, 1, s->attn_scores, &s->attn_keys, out, 1, done + n == T };
        int bad_layer = forward_chunk(s, &ch, ids + done, n);
        if (tp_failed(s, err)) return -1;
        if (out ? check_logits(s, out, n, pos, 1, bad_layer, err)
                : check_logits(s, s->logits, 1, pos + n - 1, 0, bad_layer, err))
            return -1;
    }
    return 0;
}

int forward(forward_state *s, kv_view *kv, const int *ids, int T, verr *err) {
    return forward_run(s, kv, ids, T, NULL, err);
}

int forward_all(forward_state *s, kv_view *kv, const int *ids, int T, float *out, verr *err) {
    return forward_run(s, kv, ids, T, out, err);
}

int forward_batch(forward_state *s, kv_view *views, const int *ids, int B, float *logits, float *scores, int *keys,
                  verr *err) {
    if (B <= 0 || B > s->max_T)
        return verr_set(err, "forward_batch: %d rows, want 1..%d (the forward's max batch)", B, s->max_T);
    for (int b = 0; b < B; b++) {
        if (check_id(s, ids[b], b, err)) return -1;
        if (views[b].tail && views[b].tail->table)
            return verr_set(err, "forward_batch: row %d's tail is paged (only a trunk may be)", b);
        int len = kv_view_len(&views[b]);
        if (kv_view_room(&views[b]) < 1 || len + 1 > s->ctx)
            return verr_set(err, "forward_batch: row %d does not fit: %d of the %d-token context are used, %d free in "
                            "its cache", b, len, s->ctx, kv_view_room(&views[b]));
        for (int a = 0; a < b; a++)
            if (write_target(&views[a]) == write_target(&views[b]))
                return verr_set(err, "forward_batch: rows %d and %d write to the same KV cache (give each its own tail)",
                                a, b);
    }
    chunk ch = { views, B, scores, keys, logits, 0, 1 };
    s->rows_exact = 1;
    int bad_layer = forward_chunk(s, &ch, ids, B);
    s->rows_exact = 0;
    if (tp_failed(s, err)) return -1;
    for (int b = 0; b < B; b++) {
        verr why;
        if (check_logits(s, logits + (size_t)b * s->m->cfg.vocab_size, 1, kv_view_len(&views[b]) - 1, 0, bad_layer,
                         &why))
            return verr_set(err, "row %d: %.900s", b, why.msg);
    }
    return 0;
}
