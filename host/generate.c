// generate.c: see generate.h.
#include "host/generate.h"

#include <string.h>
#include <time.h>

double gen_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int generate(session *s, const int *prompt, int n_prompt, const gen_opts *o, gen_stats *st, verr *err) {
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    if (n_prompt <= 0) return verr_set(err, "empty prompt");
    if (n_prompt >= s->ctx)
        return verr_set(err, "the prompt is %d tokens but the context holds %d (raise --ctx, up to %d)", n_prompt,
                        s->ctx, s->m.cfg.max_pos);
    kv_view kv = kv_view_of(&s->kv);
    double t0 = gen_now();
    if (forward(&s->fw, &kv, prompt, n_prompt, err)) return -1;
    st->prefill_s = gen_now() - t0;
    rng r = { o->seed, 0 };
    t0 = gen_now();
    while (st->n_gen < o->max_new) {
        int next = sampler_sample(&s->smp, s->fw.logits, o->sp, &r);
        if (session_is_stop(s, next)) {
            st->hit_eos = 1;
            break;
        }
        st->n_gen++;
        if (o->on_token && o->on_token(o->ud, next)) break;
        if (st->n_gen == o->max_new) break;
        if (kv_view_len(&kv) >= s->ctx) {
            st->hit_ctx = 1;
            break;
        }
        if (forward(&s->fw, &kv, &next, 1, err)) return -1;
    }
    st->decode_s = gen_now() - t0;
    return 0;
}
