// branch.c: see branch.h. Each step's logits and metrics come back per row from
// session_forward_batch and are consumed before the next step's batch.
#include "host/decode/branch.h"

#include <stdlib.h>
#include <string.h>

int branch_init(branch_set *bs, const model *mdl, int k, int b, verr *err) {
    const model_config *c = &mdl->cfg;
    memset(bs, 0, sizeof *bs);
    bs->k = k, bs->b = b;
    size_t cells = (size_t)k * (b + 1), K = (size_t)k;
    bs->tails = calloc(K, sizeof *bs->tails);
    bs->tok = malloc(cells * sizeof *bs->tok);
    bs->rec = malloc(cells * sizeof *bs->rec);
    bs->len = malloc(K * sizeof *bs->len);
    bs->mean_h = malloc(K * sizeof *bs->mean_h);
    bs->row = malloc(K * sizeof *bs->row);
    bs->views = malloc(K * sizeof *bs->views);
    bs->ids = malloc(K * sizeof *bs->ids);
    bs->logits = malloc(K * (size_t)c->vocab_size * sizeof *bs->logits);
    bs->m = malloc(K * sizeof *bs->m);
    bs->live = malloc(K);
    if (!bs->tails || !bs->tok || !bs->rec || !bs->len || !bs->mean_h || !bs->row || !bs->views || !bs->ids ||
        !bs->logits || !bs->m || !bs->live) {
        branch_free(bs);
        return verr_set(err, "out of memory allocating %d branches", k);
    }
    for (int i = 0; i < k; i++)
        if (kv_cache_init(&bs->tails[i], c->n_layers, b + 1, model_kv_dim(mdl), err)) {
            branch_free(bs);
            return -1;
        }
    return 0;
}

void branch_free(branch_set *bs) {
    for (int i = 0; bs->tails && i < bs->k; i++) kv_cache_free(&bs->tails[i]);
    free(bs->tails), free(bs->tok), free(bs->rec), free(bs->len), free(bs->mean_h);
    free(bs->row), free(bs->views), free(bs->ids), free(bs->logits), free(bs->m), free(bs->live);
    batch_ws_free(&bs->bw);
    memset(bs, 0, sizeof *bs);
}

// The logits a branch draw sees: its row's raw logits, or those penalised by the
// history plus the branch's first j tokens.
static const float *branch_logits(const float *logits, int vocab, const branch_penalty *pen, const int *tok, int j) {
    if (!pen || (!sampler_penalties_active(pen->pen) && pen->n_bias <= 0)) return logits;
    memcpy(pen->hist + pen->n_hist, tok, sizeof(int) * (size_t)j);
    memcpy(pen->work, logits, sizeof(float) * (size_t)vocab);
    logit_bias_apply(pen->work, vocab, pen->bias, pen->n_bias);
    sampler_penalize(pen->work, vocab, pen->hist, pen->n_hist + j, pen->pen, pen->count);
    return pen->work;
}

// The live branches' rows of step j: each feeds its token j-1 on its own tail.
static int gather_rows(branch_set *bs, int k, session *s, int j) {
    int n = 0;
    for (int i = 0; i < k; i++) {
        if (!bs->live[i]) continue;
        bs->row[n] = i;
        bs->views[n] = (kv_view){ &s->kv, s->kv.len, &bs->tails[i] };
        bs->ids[n] = bs->tok[(size_t)i * (bs->b + 1) + j - 1];
        n++;
    }
    return n;
}

// Extends branches 0..k-1 from their candidates, step-major: step j of every live
// branch is one batch, then each row in branch order records its metrics and draws with
// the base sampler. A branch that draws a stop id drops out.
static int extend_all(branch_set *bs, int k, session *s, sampler_params base, int steps, metrics_ws *ws, rng *r,
                      const branch_penalty *pen, verr *err) {
    int vocab = s->m.cfg.vocab_size;
    for (int i = 0; i < k; i++) bs->tails[i].len = 0, bs->len[i] = 1, bs->mean_h[i] = 0, bs->live[i] = 1;
    for (int j = 1; j <= steps; j++) {
        int n = gather_rows(bs, k, s, j);
        if (n == 0) break;
        if (session_forward_batch(s, bs->views, bs->ids, n, bs->logits, bs->m, ws, &bs->bw, err)) return -1;
        bs->fed += n;
        for (int q = 0; q < n; q++) {
            int i = bs->row[q], *tok = bs->tok + (size_t)i * (bs->b + 1);
            gen_record *g = &bs->rec[(size_t)i * (bs->b + 1) + j];
            memset(g, 0, sizeof *g);
            g->m = bs->m[q];
            bs->mean_h[i] += g->m.entropy;  // the sum until the end
            g->q = Q_BRANCH, g->sp = base, g->pos = bs->rec[(size_t)i * (bs->b + 1)].pos + j;
            const float *lg = branch_logits(bs->logits + (size_t)q * vocab, vocab, pen, tok, j);
            g->token = tok[j] = sampler_sample(&s->smp, lg, base, r);
            bs->len[i] = j + 1;
            if (session_is_stop(s, tok[j])) bs->live[i] = 0;
        }
    }
    for (int i = 0; i < k; i++) bs->mean_h[i] = bs->len[i] > 1 ? bs->mean_h[i] / (bs->len[i] - 1) : 0;
    return 0;
}

// The tails live where the session's cache does, in its element type: branch_init makes
// fp32 host tails, and a session on the GPU or with a bf16 cache swaps them for ones like
// its own (same geometry) on first use.
static int tails_on_backend(branch_set *bs, const session *s, verr *err) {
    for (int i = 0; i < bs->k; i++) {
        kv_cache *t = &bs->tails[i];
        if (t->ctx == bs->b + 1 && t->cu == s->kv.cu && !t->dk == !s->kv.dk && t->bf16 == s->kv.bf16) continue;
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
    for (int i = 0; i < k; i++) {
        gen_record *rec = bs->rec + (size_t)i * (bs->b + 1);
        rec[0] = *root;
        rec[0].logits = NULL;  // the branches' forwards overwrite them
        rec[0].q = Q_BRANCH, rec[0].token = bs->tok[(size_t)i * (bs->b + 1)] = cand[i];
    }
    if (extend_all(bs, k, s, base, steps, ws, r, pen, err)) return -1;
    int best = 0;
    for (int i = 1; i < k; i++)
        if (bs->mean_h[i] < bs->mean_h[best]) best = i;  // ties: the earlier (likelier) draw
    if (kv_cache_commit(&s->kv, &bs->tails[best], bs->len[best] - 1, err)) return -1;
    return best;
}
