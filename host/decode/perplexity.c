// perplexity.c: see perplexity.h.
#include "host/decode/perplexity.h"
#include "host/runtime/metrics.h"

#include <math.h>
#include <stdlib.h>

// Feeds ids[0..n-1) from position 0 and hands rows from..n-1 to fn: the prefix as one
// batch and the scored tokens in batches of up to 64, or (each) every position in its own
// forward, so that per-query captures (attention rows, the logit lens) see each one.
static int score_rows(session *s, const int *ids, int n, int from, int each, ppl_row_fn fn, void *ud, verr *err) {
    if (from < 1 || from > n || n - 1 > s->ctx)
        return verr_set(err, "cannot score tokens %d..%d of %d in a %d-token context", from, n - 1, n, s->ctx);
    int vocab = s->m.cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) return verr_set(err, "token id %d at %d is outside the vocab (%d)", ids[i], i, vocab);
    kv_cache_truncate(&s->kv, 0);
    s->fw.attn_layer = -1;  // no attention capture needed
    kv_view kv = kv_view_of(&s->kv);
    for (int t = 0, T = each ? 1 : from - 1; t < from - 1; t += T) {
        kv = kv_view_of(&s->kv);
        if (session_forward(s, &kv, ids + t, T, err)) return -1;
    }
    // The scored tokens go through in batches, with every position's logits kept.
    int chunk = each ? 1 : s->fw.max_T < 64 ? s->fw.max_T : 64;
    float *all = malloc(sizeof(float) * (size_t)chunk * vocab);
    if (!all) return verr_set(err, "out of memory (%d x %d logits)", chunk, vocab);
    for (int i = from; i < n; i += chunk) {
        int T = n - i < chunk ? n - i : chunk;
        kv = kv_view_of(&s->kv);
        if (session_forward_all(s, &kv, &ids[i - 1], T, all, err)) return free(all), -1;
        for (int t = 0; t < T; t++)
            if (fn(ud, i + t, all + (size_t)t * vocab)) return free(all), verr_set(err, "stopped");
    }
    free(all);
    return 0;
}

int ppl_score_rows(session *s, const int *ids, int n, int from, ppl_row_fn fn, void *ud, verr *err) {
    return score_rows(s, ids, n, from, 0, fn, ud, err);
}

typedef struct {
    const int *ids;
    double *logp;
    int vocab;
    const ppl_watch *w;  // on_token, called with text index i + off
    int off;
} logp_rows;

static int logp_row(void *ud, int i, const float *logits) {
    logp_rows *r = ud;
    r->logp[i] = metrics_log_prob(logits, r->vocab, r->ids[i]);
    return r->w && r->w->on_token ? r->w->on_token(r->w->ud, i + r->off, r->logp[i]) : 0;
}

int ppl_score(session *s, const int *ids, int n, int from, double *logp, verr *err) {
    logp_rows r = { ids, logp, s->m.cfg.vocab_size, NULL, 0 };
    return score_rows(s, ids, n, from, 0, logp_row, &r, err);
}

int ppl_score_each(session *s, const int *ids, int n, int from, double *logp, verr *err) {
    logp_rows r = { ids, logp, s->m.cfg.vocab_size, NULL, 0 };
    return score_rows(s, ids, n, from, 1, logp_row, &r, err);
}

// One window or chunk, ids[0..n) standing for the text from index off: its fed ids to
// on_feed, then the scored tokens (from..n-1) to on_token as they are computed.
static int score_window(session *s, const int *ids, int n, int from, int off, double *logp, const ppl_watch *w,
                        verr *err) {
    if (w && w->on_feed && w->on_feed(w->ud, ids, n - 1, off)) return verr_set(err, "stopped");
    logp_rows r = { ids, logp, s->m.cfg.vocab_size, w, off };
    return score_rows(s, ids, n, from, w && w->each, logp_row, &r, err);
}

int ppl_count_windows(int n, int ctx, int stride, verr *err) {
    if (ctx < 2) return verr_set(err, "--ctx %d: a window needs at least 2 tokens", ctx);
    if (stride < 1 || stride >= ctx)
        return verr_set(err, "--stride %d: must be in 1..%d (less than --ctx %d, so every token is scored)", stride,
                        ctx - 1, ctx);
    if (n < 3) return verr_set(err, "the text is %d token%s; perplexity needs at least 3 (2 scored)", n, n == 1 ? "" : "s");
    int w = 1;
    for (int b = 0; b + ctx < n; b += stride) w++;
    return w;
}

void ppl_finish(ppl_result *r) {
    int N = r->n_scored;
    r->nll_mean = N > 0 ? r->sum_nll / N : 0;
    double var = N > 1 ? r->sum_nll2 / N - r->nll_mean * r->nll_mean : 0;
    r->nll_se = N > 1 && var > 0 ? sqrt(var / (N - 1)) : 0;
    r->ppl = exp(r->nll_mean);
    r->ppl_se = r->ppl * r->nll_se;
}

int ppl_eval(session *s, const int *ids, int n, int ctx, int stride, const ppl_watch *wt, ppl_result *r, verr *err) {
    *r = (ppl_result){ .n_tokens = n };
    int n_windows = ppl_count_windows(n, ctx, stride, err);
    if (n_windows < 0) return -1;
    if (ctx > s->ctx) return verr_set(err, "--ctx %d exceeds the session's context (%d)", ctx, s->ctx);
    double *lp = malloc(sizeof(double) * (size_t)n);
    if (!lp) return verr_set(err, "out of memory");
    int rc = 0, end = 1;  // tokens before `end` are scored (token 0 never is)
    for (int w = 0, b = 0; rc == 0 && end < n; w++, b += stride) {
        int e = b + ctx < n ? b + ctx : n;
        rc = score_window(s, ids + b, e - b, end - b, b, lp + b, wt, err);
        for (int i = end; rc == 0 && i < e; i++) r->sum_nll -= lp[i], r->sum_nll2 += lp[i] * lp[i], r->n_scored++;
        end = e;
        r->n_windows = w + 1;
        ppl_finish(r);
        if (rc == 0 && wt && wt->on_window && wt->on_window(wt->ud, w, n_windows, r)) rc = verr_set(err, "stopped");
    }
    free(lp);
    return rc;
}

int ppl_count_chunks(int n, int ctx, int max_chunks, verr *err) {
    if (ctx < 3)
        return verr_set(err, "--ctx %d: --protocol llamacpp scores the second half of each chunk, which needs at "
                        "least 3 tokens", ctx);
    if (n < 2 * ctx)
        return verr_set(err, "the text is %d tokens; --protocol llamacpp needs at least 2 x --ctx = %d (one chunk is "
                        "scored from its second half, and llama-perplexity asks for two)", n, 2 * ctx);
    int c = n / ctx;
    return max_chunks > 0 && max_chunks < c ? max_chunks : c;
}

int ppl_eval_chunks(session *s, const int *ids, int n, int ctx, int bos, int max_chunks, const ppl_watch *wt,
                    ppl_result *r, verr *err) {
    *r = (ppl_result){ .n_tokens = n };
    int n_chunks = ppl_count_chunks(n, ctx, max_chunks, err);
    if (n_chunks < 0) return -1;
    if (ctx > s->ctx) return verr_set(err, "--ctx %d exceeds the session's context (%d)", ctx, s->ctx);
    int *chunk = malloc(sizeof(int) * (size_t)ctx);
    double *lp = malloc(sizeof(double) * (size_t)ctx);
    if (!chunk || !lp) return free(chunk), free(lp), verr_set(err, "out of memory");
    int rc = 0, first = ctx / 2;
    for (int c = 0; rc == 0 && c < n_chunks; c++) {
        const int *src = ids + (size_t)c * ctx;
        for (int j = 0; j < ctx; j++) chunk[j] = src[j];
        if (bos >= 0) chunk[0] = bos;
        rc = score_window(s, chunk, ctx, first + 1, c * ctx, lp, wt, err);
        for (int j = first + 1; rc == 0 && j < ctx; j++) r->sum_nll -= lp[j], r->sum_nll2 += lp[j] * lp[j], r->n_scored++;
        r->n_windows = c + 1;
        ppl_finish(r);
        if (rc == 0 && wt && wt->on_window && wt->on_window(wt->ud, c, n_chunks, r)) rc = verr_set(err, "stopped");
    }
    free(chunk), free(lp);
    return rc;
}
