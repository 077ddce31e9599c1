// devloop.c: see devloop.h. Step j of the device loop feeds token t_j (t_0: the token
// generate() drew from the prompt) and draws t_{j+1}; reading step j's ring entry is
// the per-token loop's step that draws t_{j+1} from the logits of t_j. Up to
// lookahead steps are queued past the last one read, and a read waits for half of them
// at once. A stop (a stop id, a callback, max_new, a full context, an interrupt) keeps
// the steps the per-token loop would have run and truncates the rest.
#include "host/decode/devloop.h"

#include <string.h>

#include "model/forward_cuda.h"

const char *gen_devloop_blocker(const gen_ctx *c) {
    const session *s = c->s;
    const gen_opts *o = c->o;
    if (!s->cu) return "not a CUDA session";
    if (s->lookahead <= 0) return "--lookahead 0";
    if (s->tpl || s->fw.comm || s->turn) return "tensor parallelism";
    if (o->sampler == GEN_ENTROPIX) return "the entropix sampler (it decides and scores its draws on the host)";
    if (!gen_raw_draws(o)) return "penalties or a logit bias (the draws read a host copy of the logits)";
    if (o->need_logits || !c->lazy) return "the logits read on the host every token";
    if (o->feed_last) return "feeding the last token (activation captures)";
    return cuda_forward_loop_blocker(s->cu, &s->fw);
}

// The per-token loop's record of the token step j drew (entry e).
static void record_of(const gen_ctx *c, const loop_entry *e, gen_record *r) {
    memset(r, 0, sizeof *r);
    r->pos = e->pos, r->token = e->token, r->q = Q_STANDARD;
    r->sp = gen_std_params(c->o);
    if (c->metrics) {
        metrics_from_stats(&r->m, e->stats, e->stats + 4);
        r->q = entropix_classify(c->o->ex, &r->m);
    }
}

// Reads steps in order and emits their tokens; *kept: the steps the per-token loop
// would have run when it stopped. 0, or -1 with err.
static int consume(gen_ctx *c, gen_stats *st, int depth, int limit, int p0, int *kept, verr *err) {
    session *s = c->s;
    const gen_opts *o = c->o;
    rng peek = c->r;  // the uniforms of the queued draws, taken from the stream ahead of the reads
    int ahead = depth > 1 ? depth / 2 : 1, queued = 0, done = 0;
    for (;;) {
        for (; queued < limit && queued - done < depth; queued++) {
            sample_cfg cfg = gen_draw_cfg(o->sp, &peek);
            if (cuda_forward_loop_queue(s->cu, &cfg, err)) return *kept = done, -1;
        }
        if (o->interrupt && *o->interrupt) {  // the per-token loop had fed t_done: step done ran
            st->interrupted = 1;
            *kept = done + 1;
            return 0;
        }
        loop_entry e;
        if (cuda_forward_loop_read(s->cu, done, ahead, &e, err)) return *kept = done, -1;
        gen_draw_cfg(o->sp, &c->r);  // the uniform this draw took (none when greedy)
        gen_record rec;
        record_of(c, &e, &rec);
        int tok = e.token, r = gen_ctx_emit(c, st, &tok, &rec, 1);
        *kept = ++done;  // t_{done} is fed by the next step, unless this was the end
        if (r != 0) return r < 0 ? -1 : 0;
        if (p0 + done >= s->ctx) {
            st->hit_ctx = 1;
            return 0;
        }
    }
}

int gen_devloop_run(gen_ctx *c, gen_stats *st, int tok, verr *err) {
    session *s = c->s;
    const gen_opts *o = c->o;
    int depth = s->lookahead < CUDA_LOOP_DEPTH ? s->lookahead : CUDA_LOOP_DEPTH;
    kv_view kv = kv_view_of(&s->kv);
    int p0 = kv_view_len(&kv), limit = s->ctx - p0;  // step j feeds position p0 + j
    if (o->max_new - st->n_gen < limit) limit = o->max_new - st->n_gen;  // the last step's draw ends it
    if (cuda_forward_loop_begin(s->cu, &s->fw, &kv, tok, !(o->sp.temperature > 0), depth, err)) return -1;
    cuda_loop_counts c0, c1;
    cuda_forward_loop_counts(s->cu, &c0);
    int kept = 0, rc = consume(c, st, depth, limit, p0, &kept, err);
    verr end_err;
    int rc_end = cuda_forward_loop_end(s->cu, &s->fw, &kv, kept, rc ? &end_err : err);
    cuda_forward_loop_counts(s->cu, &c1);
    st->loop_steps += (int)(c1.steps - c0.steps);
    st->loop_discarded += (int)(c1.discarded - c0.discarded);
    return rc || rc_end ? -1 : 0;
}
