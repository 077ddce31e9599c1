// batch.c: see batch.h.
#include "host/decode/batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int append_text(batch_result *r, const char *t, size_t n) {
    if (r->len + n + 1 > r->text_cap) {
        size_t cap = (r->len + n + 1) * 2;
        char *b = realloc(r->text, cap);
        if (!b) return -1;
        r->text = b, r->text_cap = cap;
    }
    memcpy(r->text + r->len, t, n);
    r->len += n;
    r->text[r->len] = 0;
    return 0;
}

static int on_token(void *ud, int id) {
    batch_job *c = ud;
    batch_result *r = c->r;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        int *ids = realloc(r->ids, sizeof(int) * (size_t)cap);
        if (!ids) return c->oom = 1;
        r->ids = ids, r->cap = cap;
    }
    r->ids[r->n++] = id;
    if (!isnan(c->logp)) {  // on_record came just before, for this id (a stop id gets no on_token)
        r->sum_logp += c->logp;
        r->n_logp++;
    }
    c->logp = NAN;
    if (!c->ts) return 0;
    const char *t;
    verr err;
    int k = tokenizer_stream_push(c->ts, id, &t, &err);
    if (k > 0 && append_text(r, t, (size_t)k)) return c->oom = 1;
    return 0;
}

static int on_record(void *ud, const gen_record *rec) {
    batch_job *c = ud;
    batch_result *r = c->r;
    // ln p from the step's own log-partition (its metrics are always computed here)
    c->logp = rec->logits     ? (double)rec->logits[rec->token] - rec->m.log_z
              : rec->has_logit ? (double)rec->logit - rec->m.log_z
                               : NAN;
    const token_metrics *m = &rec->m;
    double v[M_COUNT] = { m->entropy, m->varentropy, m->attn_entropy, m->attn_varentropy, m->agreement,
                          m->interaction_strength };
    for (int i = 0; i < M_COUNT; i++) r->sum[i] += v[i];
    r->n_metrics++;
    return c->g->on_record ? c->g->on_record(c->g->record_ud, rec) : 0;
}

int batch_job_begin(batch_job *j, session *s, const gen_opts *g, batch_result *r, verr *err) {
    memset(r, 0, sizeof *r);
    memset(j, 0, sizeof *j);
    if (!g->ex) return verr_set(err, "batch_generate needs an entropix profile for the metrics");
    j->r = r, j->g = g;
    j->logp = NAN;
    j->ts = s->tok ? tokenizer_stream_new(s->tok, 1) : NULL;
    if (s->tok && !j->ts) return verr_set(err, "out of memory");
    if (s->tok && append_text(r, "", 0)) {
        tokenizer_stream_free(j->ts);
        j->ts = NULL;
        return verr_set(err, "out of memory");
    }
    j->o = *g;
    j->o.on_token = on_token, j->o.ud = j;
    j->o.on_record = on_record, j->o.record_ud = j;
    j->o.want_metrics = 1;
    return 0;
}

int batch_job_end(batch_job *j, int rc, const gen_stats *st, verr *err) {
    batch_result *r = j->r;
    if (st) r->st = *st;
    if (rc == 0 && j->ts) {
        const char *t;
        int k = tokenizer_stream_flush(j->ts, &t);
        if (k > 0 && append_text(r, t, (size_t)k)) j->oom = 1;
    }
    if (j->ts) tokenizer_stream_free(j->ts);
    j->ts = NULL;
    if (rc == 0 && j->oom) rc = verr_set(err, "out of memory collecting the output");
    if (rc) batch_result_free(r);
    j->r = NULL;  // ended: batch_job_drop leaves it
    return rc;
}

void batch_job_drop(batch_job *j) {
    if (!j->r) return;
    if (j->ts) tokenizer_stream_free(j->ts);
    j->ts = NULL;
    batch_result_free(j->r);
    j->r = NULL;
}

int batch_generate(session *s, const int *prompt, int n_prompt, const gen_opts *g, batch_result *r, verr *err) {
    batch_job j;
    if (batch_job_begin(&j, s, g, r, err)) return -1;
    kv_cache_truncate(&s->kv, 0);
    gen_stats st;
    int rc = generate(s, prompt, n_prompt, &j.o, &st, err);
    return batch_job_end(&j, rc, &st, err);
}

void batch_result_free(batch_result *r) {
    free(r->ids), free(r->text);
    memset(r, 0, sizeof *r);
}

double batch_tok_s(const batch_result *r) {
    return r->st.n_gen > 1 && r->st.decode_s > 0 ? (r->st.n_gen - 1) / r->st.decode_s : 0.0;
}

const char *batch_stop_reason(const batch_result *r) {
    return r->st.hit_eos ? "eos" : r->st.hit_ctx ? "context" : "length";
}


void batch_json_metrics(FILE *f, const batch_result *r) {
    static const char *const names[M_COUNT] = { "entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement",
                                          "interaction_strength" };
    fputs("\"mean\":{", f);
    for (int i = 0; i < M_COUNT; i++) {
        fprintf(f, "%s\"%s\":", i ? "," : "", names[i]);
        json_out_num(f, r->n_metrics ? r->sum[i] / r->n_metrics : NAN);
    }
    fputs("},\"quadrants\":{", f);
    for (int q = 0, k = 0; q < Q_COUNT; q++)
        if (q != Q_STANDARD)
            fprintf(f, "%s\"%s\":%d", k++ ? "," : "", entropix_quadrant_name((entropix_quadrant)q), r->st.quadrant_count[q]);
    fputc('}', f);
}
