// branch.c: see branch.h. The forward's logits and attention capture are overwritten
// by every branch step, so each step's metrics are taken before the next forward.
#include "host/branch.h"

#include <stdlib.h>
#include <string.h>

int branch_init(branch_set *bs, const model_config *c, int k, int b, verr *err) {
    memset(bs, 0, sizeof *bs);
    bs->k = k, bs->b = b;
    size_t cells = (size_t)k * (b + 1);
    bs->tails = calloc((size_t)k, sizeof *bs->tails);
    bs->tok = malloc(cells * sizeof *bs->tok);
    bs->rec = malloc(cells * sizeof *bs->rec);
    bs->len = malloc((size_t)k * sizeof *bs->len);
    bs->mean_h = malloc((size_t)k * sizeof *bs->mean_h);
    if (!bs->tails || !bs->tok || !bs->rec || !bs->len || !bs->mean_h) {
        branch_free(bs);
        return verr_set(err, "out of memory allocating %d branches", k);
    }
    for (int i = 0; i < k; i++)
        if (kv_cache_init(&bs->tails[i], c->n_layers, b + 1, c->n_kv_heads * c->head_dim, err)) {
            branch_free(bs);
            return -1;
        }
    return 0;
}

void branch_free(branch_set *bs) {
    for (int i = 0; bs->tails && i < bs->k; i++) kv_cache_free(&bs->tails[i]);
    free(bs->tails), free(bs->tok), free(bs->rec), free(bs->len), free(bs->mean_h);
    memset(bs, 0, sizeof *bs);
}

// The logits a branch draw sees: raw, or penalised by the history plus the branch's
// first j tokens.
static const float *branch_logits(session *s, const branch_penalty *pen, const int *tok, int j) {
    if (!pen || (pen->no_repeat_ngram <= 0 && !(pen->repeat_penalty > 0 && pen->repeat_penalty != 1)))
        return s->fw.logits;
    int vocab = s->m.cfg.vocab_size;
    memcpy(pen->hist + pen->n_hist, tok, sizeof(int) * (size_t)j);
    memcpy(pen->work, s->fw.logits, sizeof(float) * (size_t)vocab);
    sampler_penalize(pen->work, vocab, pen->hist, pen->n_hist + j, pen->no_repeat_ngram, pen->repeat_penalty, pen->seen);
    return pen->work;
}

// Extends branch i from its candidate: feed, measure, draw with the base sampler.
static int extend(branch_set *bs, int i, session *s, sampler_params base, int steps, metrics_ws *ws, rng *r,
                  const branch_penalty *pen, verr *err) {
    int *tok = bs->tok + (size_t)i * (bs->b + 1);
    gen_record *rec = bs->rec + (size_t)i * (bs->b + 1);
    kv_cache *tail = &bs->tails[i];
    tail->len = 0;
    kv_view kv = { &s->kv, s->kv.len, tail };
    const model_config *c = &s->m.cfg;
    double sum_h = 0;
    int n = 1;
    for (int j = 1; j <= steps; j++) {
        if (session_forward(s, &kv, &tok[j - 1], 1, err)) return -1;
        gen_record *g = &rec[j];
        memset(g, 0, sizeof *g);
        if (metrics_logits(ws, s->fw.logits, c->vocab_size, &g->m) ||
            metrics_attention(ws, s->fw.attn_scores, c->n_heads, s->fw.attn_keys, &g->m))
            return verr_set(err, "out of memory computing metrics");
        sum_h += g->m.entropy;
        g->q = Q_BRANCH, g->sp = base, g->pos = rec[0].pos + j;
        g->token = tok[j] = sampler_sample(&s->smp, branch_logits(s, pen, tok, j), base, r);
        n = j + 1;
        if (session_is_stop(s, tok[j])) break;
    }
    bs->len[i] = n;
    bs->mean_h[i] = n > 1 ? sum_h / (n - 1) : 0;
    return 0;
}

// The tails live where the session's cache does: branch_init makes host tails, and a
// session on the GPU swaps them for device ones (same geometry) on first use.
static int tails_on_backend(branch_set *bs, const session *s, verr *err) {
    for (int i = 0; i < bs->k; i++) {
        kv_cache *t = &bs->tails[i];
        if (t->ctx == bs->b + 1 && t->cu == s->kv.cu && !t->dk == !s->kv.dk) continue;
        kv_cache_free(t);
        if (kv_cache_init_like(t, &s->kv, bs->b + 1, err)) return -1;
    }
    return 0;
}

int branch_run(branch_set *bs, session *s, const gen_record *root, sampler_params base, int steps, metrics_ws *ws,
               rng *r, const branch_penalty *pen, verr *err) {
    if (tails_on_backend(bs, s, err)) return -1;
    if (steps > bs->b) steps = bs->b;
    int cand[64], k = bs->k < 64 ? bs->k : 64;
    // All candidates first: the branches' own draws reuse the sampler's buffer.
    k = sampler_draw_distinct(&s->smp, r, k, cand);
    int best = 0;
    for (int i = 0; i < k; i++) {
        gen_record *rec = bs->rec + (size_t)i * (bs->b + 1);
        rec[0] = *root;
        rec[0].q = Q_BRANCH, rec[0].token = bs->tok[(size_t)i * (bs->b + 1)] = cand[i];
        if (extend(bs, i, s, base, steps, ws, r, pen, err)) return -1;
        if (bs->mean_h[i] < bs->mean_h[best]) best = i;  // ties: the earlier (likelier) draw
    }
    if (kv_cache_commit(&s->kv, &bs->tails[best], bs->len[best] - 1, err)) return -1;
    return best;
}
