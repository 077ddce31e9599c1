// session_batch.c: session_forward_batch (see session.h). Decode is memory-bound, so
// one pass over the weights serves every row: on the CPU the B rows go through
// forward_batch together, max_T at a time; on CUDA through cuda_forward_batch, whose
// steps take up to 64 rows, each with its own KV segments.
#include "host/runtime/session.h"
#include "model/forward_cuda.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

void batch_ws_free(batch_ws *w) {
    free(w->scores), free(w->keys);
    memset(w, 0, sizeof *w);
}

static int batch_ws_fit(batch_ws *w, int rows, long floats, verr *err) {
    if (floats > w->cap) {
        float *p = realloc(w->scores, sizeof(float) * (size_t)floats);
        if (!p) return verr_set(err, "out of memory for %d rows' attention captures", rows);
        w->scores = p, w->cap = floats;
    }
    if (rows > w->rows) {
        int *k = realloc(w->keys, sizeof(int) * (size_t)rows);
        if (!k) return verr_set(err, "out of memory for %d rows' attention captures", rows);
        w->keys = k, w->rows = rows;
    }
    return 0;
}

// The metrics of rows [0, B), spread over the threads: each row's are its own sums, so
// which thread computes them changes nothing. Thread 0 uses ws, the others scratch of
// their own. bw: the attention scores of a capture layer, or NULL.
static int rows_metrics(const model_config *c, const float *logits, token_metrics *m, int B, metrics_ws *ws,
                        const batch_ws *bw, size_t per_row) {
    int failed = 0;
#pragma omp parallel reduction(|: failed) if (B > 1)
    {
        metrics_ws mine = { 0 };
        metrics_ws *w = omp_get_thread_num() == 0 ? ws : &mine;
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            const float *scores = bw ? bw->scores + per_row * b : NULL;
            int keys = bw ? bw->keys[b] : 0;
            if (metrics_logits(w, logits + (size_t)b * c->vocab_size, c->vocab_size, &m[b]) ||
                metrics_attention(w, scores, c->n_heads, keys, &m[b]))
                failed = 1;
        }
        metrics_ws_free(&mine);
    }
    return failed;
}

// Rows [0, B) on the CPU, all at once (B <= max_T).
static int forward_on_cpu(session *s, kv_view *views, const int *ids, int B, float *logits, token_metrics *m,
                          metrics_ws *ws, batch_ws *bw, verr *err) {
    const model_config *c = &s->m.cfg;
    size_t per_row = (size_t)c->n_heads * s->fw.ctx;
    int capture = m && s->fw.attn_layer >= 0;
    if (m && !bw) return verr_set(err, "session_forward_batch: metrics need a batch_ws");
    if (capture && batch_ws_fit(bw, B, (long)(per_row * B), err)) return -1;
    if (forward_batch(&s->fw, views, ids, B, logits, capture ? bw->scores : NULL, capture ? bw->keys : NULL, err))
        return -1;
    if (m && rows_metrics(c, logits, m, B, ws, capture ? bw : NULL, per_row))
        return verr_set(err, "out of memory computing metrics");
    return 0;
}

// All rows in one device batch (cuda_forward_batch: steps of up to 64 rows, one launch
// per matvec); the metrics come from the device's statistics, 8 floats per row.
static int forward_on_device(session *s, kv_view *views, const int *ids, int B, float *logits, token_metrics *m,
                             metrics_ws *ws, batch_ws *bw, verr *err) {
    const model_config *c = &s->m.cfg;
    int capture = m && s->fw.attn_layer >= 0 && s->fw.attn_layer < c->n_layers;
    if (m && !bw) return verr_set(err, "session_forward_batch: metrics need a batch_ws");
    if (capture && batch_ws_fit(bw, B, 8L * B, err)) return -1;
    float *stats = capture ? bw->scores : NULL;  // [B, 8]
    if (s->tpl ? session_tpl_batch(s, views, ids, B, logits, stats, err)
               : cuda_forward_batch(s->cu, &s->fw, views, ids, B, logits, stats, err))
        return -1;
    if (!m) return 0;
    if (capture) {
        for (int b = 0; b < B; b++) metrics_from_stats(&m[b], stats + 8 * b, stats + 8 * b + 4);
        return 0;
    }
    // no capture layer: the logit metrics on the host, attention metrics 0 (as on the CPU)
    if (rows_metrics(c, logits, m, B, ws, NULL, 0)) return verr_set(err, "out of memory computing metrics");
    return 0;
}

static int forward_batch_rows(session *s, kv_view *views, const int *ids, int B, float *logits, token_metrics *m,
                              metrics_ws *ws, batch_ws *bw, verr *err) {
    if (s->cu) return forward_on_device(s, views, ids, B, logits, m, ws, bw, err);
    size_t vocab = (size_t)s->m.cfg.vocab_size;
    for (int done = 0; done < B; done += s->fw.max_T) {
        int n = B - done < s->fw.max_T ? B - done : s->fw.max_T;
        if (forward_on_cpu(s, views + done, ids + done, n, logits + done * vocab, m ? m + done : NULL, ws, bw, err))
            return -1;
    }
    return 0;
}

int session_step_rows(const session *s) { return s->cu && !s->tpl ? cuda_forward_rows(s->cu) : 0; }

int session_batch_draws(const session *s, int B) {
    int rows = session_step_rows(s);
    return rows > 0 && !s->fw.comm && B >= 1 && B <= rows;
}

int session_forward_batch_draw(session *s, kv_view *views, const int *ids, int B, const sample_cfg *cfg,
                               sample_out *out, token_metrics *m, batch_ws *bw, verr *err) {
    if (!session_batch_draws(s, B))
        return verr_set(err, "session_forward_batch_draw: %d rows are not one device step here", B);
    if (m && !(s->fw.attn_layer >= 0 && s->fw.attn_layer < s->m.cfg.n_layers))
        return verr_set(err, "session_forward_batch_draw: metrics without a capture layer read the logits on the host");
    if (session_turn_begin(s, err)) return -1;
    int rc = forward_on_device(s, views, ids, B, NULL, m, NULL, bw, err);
    if (rc == 0) rc = cuda_forward_sample_rows(s->cu, cfg, B, out, err);
    session_turn_end(s);
    return rc;
}

int session_forward_batch(session *s, kv_view *views, const int *ids, int B, float *logits, token_metrics *m,
                          metrics_ws *ws, batch_ws *bw, verr *err) {
    if (B <= 0) return verr_set(err, "session_forward_batch: no rows");
    if (session_turn_begin(s, err)) return -1;
    int rc = forward_batch_rows(s, views, ids, B, logits, m, ws, bw, err);
    session_turn_end(s);
    return rc;
}
