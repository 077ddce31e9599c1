// gen_step.c: see gen_step.h. Each step turns the forward's logits into one token
// (or, for a committed LEHV branch, several); generate() and the scheduler emit them.
#include "host/decode/gen_step.h"

#include <stdlib.h>
#include <string.h>

// What arm_step arms: nothing, an entropix step (decided and drawn on the device), or
// the standard sampler's one draw.
enum { ARM_NONE, ARM_EX, ARM_STD };

// The draws read the forward's own logits: no penalty or bias rewrites them.
int gen_raw_draws(const gen_opts *o) { return !sampler_penalties_active(&o->pen) && o->n_bias <= 0; }

void gen_ctx_free(gen_ctx *c) {
    free(c->hist), free(c->work), free(c->count), free(c->cfg), free(c->drawn), free(c->u);
    metrics_ws_free(&c->ws);
    branch_free(&c->bs);
}

int gen_capture_layer(const session *s, const gen_opts *o, int *layer, verr *err) {
    int last = s->m.cfg.n_layers - 1;
    *layer = o->attn_layer_given ? o->attn_layer : last;
    if (*layer < 0 || *layer > last)
        return verr_set(err, "--attn-layer %d is out of range: the model has layers 0..%d", *layer, last);
    return 0;
}

int gen_ctx_init(gen_ctx *c, session *s, const gen_opts *o, const int *prompt, int n_prompt, int rows, verr *err) {
    memset(c, 0, sizeof *c);
    c->s = s, c->o = o, c->r = (rng){ o->seed, 0 };
    int vocab = s->m.cfg.vocab_size, branching = o->sampler == GEN_ENTROPIX && o->branch_k > 0 && o->branch_b > 0;
    c->metrics = o->ex && (o->sampler == GEN_ENTROPIX || o->want_metrics);
    // The loop reads logits only through session_sample, the device statistics and
    // session_logits, so on CUDA they need not cross the bus every token, unless an
    // on_record callback reads s->fw.logits itself. Rows are host logits already.
    c->lazy = s->cu && !o->need_logits && !rows;
    if (o->sampler == GEN_ENTROPIX && !o->ex) return verr_set(err, "the entropix sampler needs a profile");
    if (rows && branching) return verr_set(err, "LEHV branching forks the session's own cache: run it with generate()");
    if (logit_bias_check(o->bias, o->n_bias, vocab, err)) return -1;
    // the history: the context, the prompt and what is generated, which a full context ends
    int n_ctx = o->context ? o->n_context : 0, gen_max = o->max_new < s->ctx ? o->max_new : s->ctx;
    c->hist = malloc(sizeof(int) * ((size_t)n_ctx + n_prompt + gen_max + o->branch_b + 1));
    c->work = malloc(sizeof(float) * (size_t)vocab);
    c->count = calloc((size_t)vocab, sizeof *c->count);
    c->n_draw = o->ex ? entropix_n_samples(o->ex) : 1;
    c->cfg = malloc(sizeof *c->cfg * (size_t)c->n_draw);
    c->drawn = malloc(sizeof *c->drawn * (size_t)c->n_draw);
    c->u = malloc(sizeof *c->u * (size_t)c->n_draw);
    if (!c->hist || !c->work || !c->count || !c->cfg || !c->drawn || !c->u)
        return gen_ctx_free(c), verr_set(err, "out of memory");
    if (n_ctx) memcpy(c->hist, o->context, sizeof(int) * (size_t)n_ctx);
    memcpy(c->hist + n_ctx, prompt, sizeof(int) * (size_t)n_prompt);
    c->n_hist = n_ctx + n_prompt;
    if (branching && branch_init(&c->bs, &s->m, o->branch_k, o->branch_b, err)) return gen_ctx_free(c), -1;
    int layer;
    if (gen_capture_layer(s, o, &layer, err)) return gen_ctx_free(c), -1;
    if (!rows) s->fw.attn_layer = c->metrics ? layer : -1;  // the scheduler sets it for every row
    // The draws read the forward's own logits unless penalties or a bias rewrite them
    // (draw_logits): then the device can make them right after the step (an entropix
    // step's after its statistics).
    if (c->lazy && gen_raw_draws(o)) c->arm = o->sampler != GEN_ENTROPIX ? ARM_STD : c->metrics ? ARM_EX : ARM_NONE;
    return 0;
}

// The standard sampler's parameters a step records (greedy at temperature 0 or below).
sampler_params gen_std_params(const gen_opts *o) {
    return o->sp.temperature <= 0 ? (sampler_params){ 0, 1, 1, 0 } : o->sp;
}

// A draw's configuration; its uniform (none when greedy) from the stream r.
sample_cfg gen_draw_cfg(sampler_params p, rng *r) {
    return (sample_cfg){ p.temperature, p.top_k, p.top_p, p.min_p, p.temperature > 0 ? rng_uniform(r) : 0 };
}

// Before a forward whose logits the next step draws from: on CUDA, arm it to draw on the
// device inside the step (session_arm_sample; session_arm_entropix decides first) with
// the uniforms the step will take from the run's stream, peeked (the step consumes them
// itself, so the stream is unchanged).
int gen_ctx_arm(gen_ctx *c, verr *err) {
    if (!c->arm) return 0;
    rng peek = c->r;
    if (c->arm == ARM_STD) {  // the draw step() makes (draw_n with o->sp), to the bit
        sample_cfg cfg = gen_draw_cfg(c->o->sp, &peek);
        return session_arm_sample(c->s, &cfg, 1, err);
    }
    for (int i = 0; i < c->n_draw; i++) c->u[i] = rng_uniform(&peek);
    return session_arm_entropix(c->s, c->o->ex, c->u, c->n_draw, c->hist[c->n_hist - 1], c->o->clarifier, err);
}

// The step's raw logits: its row, or the session's last forward's (on CUDA maybe still
// on the device).
static const float *raw_logits(const gen_ctx *c) { return c->row ? c->row : c->s->fw.logits; }

// The logits the draw sees: the forward's own (s->fw.logits, which on CUDA may still be
// on the device: draw_n samples them there; or the row), or a biased and penalised host
// copy (on CUDA the step's logits cross the bus then). NULL on error.
static const float *draw_logits(gen_ctx *c, verr *err) {
    const gen_opts *o = c->o;
    int vocab = c->s->m.cfg.vocab_size;
    if (gen_raw_draws(o)) return raw_logits(c);
    const float *raw = c->row ? c->row : session_logits(c->s, err);
    if (!raw) return NULL;
    memcpy(c->work, raw, sizeof(float) * (size_t)vocab);
    logit_bias_apply(c->work, vocab, o->bias, o->n_bias);  // llama.cpp's order: the bias, then the penalties
    sampler_penalize(c->work, vocab, c->hist, c->n_hist, &o->pen, c->count);
    return c->work;
}

// n draws with p from lg into c->drawn, uniforms from the run's stream (none when
// greedy): on the session's backend when lg is the forward's own logits (one launch on
// the device on CUDA), on the host for a penalised copy.
static int draw_n(gen_ctx *c, const float *lg, sampler_params p, int n, verr *err) {
    for (int i = 0; i < n; i++) c->cfg[i] = gen_draw_cfg(p, &c->r);
    if (!c->row && lg == c->s->fw.logits) return session_sample(c->s, c->cfg, n, c->drawn, err);
    sampler_sample_n(&c->s->smp, lg, c->cfg, n, c->drawn);
    return 0;
}

// ADAPTIVE: n draws from one distribution (lg); the best score, on the raw logits, wins
// (ties: the first). A draw's own logit is raw unless lg is a penalised copy, and then
// the raw logits are on the host.
static int best_of(gen_ctx *c, const float *lg, const entropix_step *st, gen_record *rec) {
    int best = -1;
    for (int i = 0; i < st->n_samples; i++) {
        int id = c->drawn[i].token;
        float raw = lg == raw_logits(c) ? c->drawn[i].logit : raw_logits(c)[id];
        double sc = entropix_score(c->o->ex, &rec->m, raw);
        if (best < 0 || sc > rec->score) best = id, rec->score = sc;
    }
    return best;
}

// Room for a branch of B steps: tokens left to generate and positions left in the context.
static int branch_steps(gen_ctx *c, int n_gen) {
    int b = c->o->branch_b, left = c->o->max_new - n_gen - 1, room = c->s->ctx - c->s->kv.len - 1;
    if (left < b) b = left;
    if (room < b) b = room;
    return b;
}

// One step: fills toks/recs and returns how many (> 1 only for a committed branch).
int gen_ctx_step(gen_ctx *c, int n_gen, int **toks, gen_record **recs, gen_record *one, int *one_tok, verr *err) {
    session *s = c->s;
    const gen_opts *o = c->o;
    memset(one, 0, sizeof *one);
    one->pos = c->row ? c->row_pos : s->kv.len, one->q = Q_STANDARD;
    one->logits = c->row ? c->row : c->lazy ? NULL : s->fw.logits;
    if (c->metrics) {
        if (c->row) one->m = c->row_m;  // the batch computed them from the row
        else if (session_metrics(s, &c->ws, &one->m)) return verr_set(err, "out of memory computing metrics");
        one->q = entropix_classify(o->ex, &one->m);
    }
    const float *lg = draw_logits(c, err);
    if (!lg) return -1;
    *toks = one_tok, *recs = one;
    if (o->sampler != GEN_ENTROPIX) {
        one->sp = gen_std_params(o);
        if (draw_n(c, lg, o->sp, 1, err)) return -1;
        *one_tok = c->drawn[0].token;
        return 1;
    }
    entropix_step st = entropix_decide(o->ex, &one->m, c->hist[c->n_hist - 1], o->clarifier);
    one->q = st.q, one->sp = st.sp;
    if (st.greedy) {  // argmax, on the device when the logits are there
        if (draw_n(c, lg, (sampler_params){ 0, 1, 1, 0 }, 1, err)) return -1;
        *one_tok = c->drawn[0].token;
    } else if (st.clarify) *one_tok = o->clarifier;
    else {
        int b = st.q == Q_LEHV && c->bs.k > 0 ? branch_steps(c, n_gen) : 0;
        if (b > 0) {  // the forks are drawn on the host from this distribution
            if (lg == s->fw.logits && !(lg = session_logits(s, err))) return -1;
            sampler_distribution(&s->smp, lg, st.sp);
            sampler_params base = entropix_base_params(o->ex);
            branch_penalty pen = { c->hist, c->n_hist, &o->pen, c->work, c->count, o->bias, o->n_bias };
            int w = branch_run(&c->bs, s, one, base, b, &c->ws, &c->r, &pen, err);
            if (w < 0) return -1;
            *toks = c->bs.tok + (size_t)w * (c->bs.b + 1), *recs = c->bs.rec + (size_t)w * (c->bs.b + 1);
            return c->bs.len[w];
        }
        if (draw_n(c, lg, st.sp, st.n_samples, err)) return -1;
        *one_tok = st.n_samples > 1 ? best_of(c, lg, &st, one) : c->drawn[0].token;
    }
    one->token = *one_tok;
    return 1;
}

int gen_ctx_device_draw(const gen_ctx *c) {
    const gen_opts *o = c->o;
    return o->sampler != GEN_ENTROPIX && gen_raw_draws(o) && !o->need_logits;
}

sample_cfg gen_ctx_next_cfg(gen_ctx *c) { return gen_draw_cfg(c->o->sp, &c->r); }

void gen_ctx_step_drawn(gen_ctx *c, const sample_out *d, gen_record *one, int *one_tok) {
    memset(one, 0, sizeof *one);
    one->pos = c->row_pos, one->q = Q_STANDARD;
    if (c->metrics) {
        one->m = c->row_m;
        one->q = entropix_classify(c->o->ex, &one->m);
    }
    one->sp = gen_std_params(c->o);
    one->token = *one_tok = d->token;
    one->has_logit = 1, one->logit = d->logit;  // the row's raw logit, as logits[token] would be
}

static void count(gen_stats *st, const gen_ctx *c, const gen_record *r) {
    if (!c->metrics) return;
    st->quadrant_count[r->q]++;
    st->sum_entropy += r->m.entropy;
    st->n_metrics++;
}

// Emits step tokens in order. Returns 1 when generation is over, 0 to go on, -1 on error.
int gen_ctx_emit(gen_ctx *c, gen_stats *st, const int *toks, gen_record *recs, int n) {
    const gen_opts *o = c->o;
    for (int i = 0; i < n; i++) {
        recs[i].token = toks[i];
        if (!o->ignore_eos && session_is_stop(c->s, toks[i])) {
            if (o->record_stop && o->on_record) o->on_record(o->record_ud, &recs[i]);
            return st->hit_eos = 1;
        }
        st->n_gen++;
        c->hist[c->n_hist++] = toks[i];
        count(st, c, &recs[i]);
        if (o->on_record && o->on_record(o->record_ud, &recs[i])) return 1;
        if (o->on_token && o->on_token(o->ud, toks[i])) return 1;
        if (st->n_gen == o->max_new) return 1;
    }
    return 0;
}

