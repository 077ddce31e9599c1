// generate.c: see generate.h. Each step (host/decode/gen_step.c) turns the forward's
// logits into one token (or, for a committed LEHV branch, several); the loop emits them
// in order and feeds the last.
#include "host/decode/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/decode/devloop.h"
#include "host/decode/gen_step.h"

double gen_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int gen_find_clarifier(const session *s) {
    if (!s->tok) return -1;
    int *ids = NULL;
    verr err;
    int n = tokenizer_encode(s->tok, " ...", 4, 0, &ids, &err), id = n > 0 ? ids[n - 1] : -1;
    free(ids);
    return id;
}

// The prompt into the cache: one forward, or with on_prefill (a single-process session)
// one per chunk of the forward's own size, the last one armed as the one forward was.
static int prefill(gen_ctx *c, const int *prompt, int n_prompt, verr *err) {
    session *s = c->s;
    const gen_opts *o = c->o;
    int chunk = s->fw.max_T, done = 0, chunked = o->on_prefill && !s->tpl && !s->fw.comm && chunk > 0;
    for (; chunked && n_prompt - done > chunk; done += chunk) {
        kv_view kv = kv_view_of(&s->kv);
        if (session_forward(s, &kv, prompt + done, chunk, err)) return -1;
        o->on_prefill(o->prefill_ud, done + chunk, n_prompt);
    }
    kv_view kv = kv_view_of(&s->kv);
    int rc = gen_ctx_arm(c, err) ? -1 : session_forward(s, &kv, prompt + done, n_prompt - done, err);
    if (rc == 0 && chunked) o->on_prefill(o->prefill_ud, n_prompt, n_prompt);
    return rc;
}

int generate(session *s, const int *prompt, int n_prompt, const gen_opts *o, gen_stats *st, verr *err) {
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    if (n_prompt <= 0) return verr_set(err, "empty prompt");
    if (n_prompt >= s->ctx)
        return verr_set(err, "the prompt is %d tokens but the context holds %d (raise --ctx, up to %d)", n_prompt,
                        s->ctx, s->m.cfg.max_pos);
    gen_ctx c;
    if (gen_ctx_init(&c, s, o, prompt, n_prompt, 0, err)) return -1;
    double t0 = gen_now();
    s->fw.lazy_logits = c.lazy;
    int rc = prefill(&c, prompt, n_prompt, err);
    kv_view kv = kv_view_of(&s->kv);
    st->prefill_s = gen_now() - t0;
    t0 = gen_now();
    int unfed = -1;  // the last emitted token when the model has not seen it
    st->loop_why = gen_devloop_blocker(&c);  // NULL: after the first token, the device's loop
    while (rc == 0 && st->n_gen < o->max_new) {
        if (o->interrupt && *o->interrupt) {
            st->interrupted = 1;
            break;
        }
        int *toks = NULL, one_tok;
        gen_record *recs = NULL, one;
        int n = gen_ctx_step(&c, st->n_gen, &toks, &recs, &one, &one_tok, err), n_before = st->n_gen;
        if (n < 0 || (rc = gen_ctx_emit(&c, st, toks, recs, n)) != 0) {
            if (n > 0 && rc > 0 && st->n_gen > n_before) unfed = toks[st->n_gen - n_before - 1];
            rc = n < 0 || rc < 0 ? -1 : 0;
            break;
        }
        kv = kv_view_of(&s->kv);  // a committed branch moved the trunk
        if (kv_view_len(&kv) >= s->ctx) {
            st->hit_ctx = 1;
            break;
        }
        if (!st->loop_why) {  // the rest, exactly as below, queued ahead on the device
            rc = gen_devloop_run(&c, st, toks[n - 1], err);
            break;
        }
        rc = gen_ctx_arm(&c, err) ? -1 : session_forward(s, &kv, &toks[n - 1], 1, err);
    }
    if (rc == 0 && o->feed_last && unfed >= 0 && s->kv.len < s->ctx) {
        kv = kv_view_of(&s->kv);
        rc = session_forward(s, &kv, &unfed, 1, err);
    }
    st->decode_s = gen_now() - t0;
    st->branch_fed = c.bs.fed;
    s->fw.lazy_logits = 0;
    gen_ctx_free(&c);
    return rc;
}
