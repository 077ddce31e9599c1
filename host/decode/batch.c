// batch.c: see batch.h.
#include "host/decode/batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    batch_result *r;
    tokenizer_stream *ts;
    int oom;
    const gen_opts *g;  // the caller's on_record, called after the sums
} collector;

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
    collector *c = ud;
    batch_result *r = c->r;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        int *ids = realloc(r->ids, sizeof(int) * (size_t)cap);
        if (!ids) return c->oom = 1;
        r->ids = ids, r->cap = cap;
    }
    r->ids[r->n++] = id;
    if (!c->ts) return 0;
    const char *t;
    verr err;
    int k = tokenizer_stream_push(c->ts, id, &t, &err);
    if (k > 0 && append_text(r, t, (size_t)k)) return c->oom = 1;
    return 0;
}

static int on_record(void *ud, const gen_record *rec) {
    const collector *c = ud;
    batch_result *r = c->r;
    const token_metrics *m = &rec->m;
    double v[M_COUNT] = { m->entropy, m->varentropy, m->attn_entropy, m->attn_varentropy, m->agreement,
                          m->interaction_strength };
    for (int i = 0; i < M_COUNT; i++) r->sum[i] += v[i];
    r->n_metrics++;
    return c->g->on_record ? c->g->on_record(c->g->record_ud, rec) : 0;
}

int batch_generate(session *s, const int *prompt, int n_prompt, const gen_opts *g, batch_result *r, verr *err) {
    memset(r, 0, sizeof *r);
    if (!g->ex) return verr_set(err, "batch_generate needs an entropix profile for the metrics");
    collector c = { r, s->tok ? tokenizer_stream_new(s->tok, 1) : NULL, 0, g };
    if (s->tok && !c.ts) return verr_set(err, "out of memory");
    if (s->tok && append_text(r, "", 0)) {
        tokenizer_stream_free(c.ts);
        return verr_set(err, "out of memory");
    }
    gen_opts o = *g;
    o.on_token = on_token, o.ud = &c;
    o.on_record = on_record, o.record_ud = &c;
    o.want_metrics = 1;
    kv_cache_truncate(&s->kv, 0);
    int rc = generate(s, prompt, n_prompt, &o, &r->st, err);
    if (rc == 0 && c.ts) {
        const char *t;
        int k = tokenizer_stream_flush(c.ts, &t);
        if (k > 0 && append_text(r, t, (size_t)k)) c.oom = 1;
    }
    if (c.ts) tokenizer_stream_free(c.ts);
    if (rc == 0 && c.oom) rc = verr_set(err, "out of memory collecting the output");
    if (rc) batch_result_free(r);
    return rc;
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
