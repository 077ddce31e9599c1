// generate.c: see generate.h. Each step turns the forward's logits into one token
// (or, for a committed LEHV branch, several), emits them in order and feeds the last.
#include "host/decode/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/decode/branch.h"

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

// What arm_step arms: nothing, an entropix step (decided and drawn on the device), or
// the standard sampler's one draw.
enum { ARM_NONE, ARM_EX, ARM_STD };

// What the loop carries between steps.
typedef struct {
    session *s;
    const gen_opts *o;
    rng r;
    int *hist, n_hist;     // the context, this call's prompt and the generated ids (penalties, clarifier)
    float *work;           // [vocab] penalised logits
    int *count;            // [vocab] zeroed scratch of sampler_penalize
    metrics_ws ws;
    branch_set bs;
    int metrics;           // compute metrics at every step
    sample_cfg *cfg;       // [n_draw] one step's draws
    sample_out *drawn;     // [n_draw] their results
    int n_draw;
    int lazy;              // CUDA: steps leave their logits on the device (lazy_logits)
    int arm;               // CUDA: each step draws on the device (arm_step): ARM_NONE, ARM_EX, ARM_STD
    double *u;             // [n_draw] arm_step's peeked uniforms
} gen_ctx;

// The draws read the forward's own logits: no penalty or bias rewrites them.
static int raw_draws(const gen_opts *o) { return !sampler_penalties_active(&o->pen) && o->n_bias <= 0; }

static void ctx_free(gen_ctx *c) {
    free(c->hist), free(c->work), free(c->count), free(c->cfg), free(c->drawn), free(c->u);
    metrics_ws_free(&c->ws);
    branch_free(&c->bs);
}

static int ctx_init(gen_ctx *c, session *s, const gen_opts *o, const int *prompt, int n_prompt, verr *err) {
    memset(c, 0, sizeof *c);
    c->s = s, c->o = o, c->r = (rng){ o->seed, 0 };
    int vocab = s->m.cfg.vocab_size, branching = o->sampler == GEN_ENTROPIX && o->branch_k > 0 && o->branch_b > 0;
    c->metrics = o->ex && (o->sampler == GEN_ENTROPIX || o->want_metrics);
    // The loop reads logits only through session_sample, the device statistics and
    // session_logits, so on CUDA they need not cross the bus every token, unless an
    // on_record callback reads s->fw.logits itself.
    c->lazy = s->cu && !o->need_logits;
    if (o->sampler == GEN_ENTROPIX && !o->ex) return verr_set(err, "the entropix sampler needs a profile");
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
        return ctx_free(c), verr_set(err, "out of memory");
    if (n_ctx) memcpy(c->hist, o->context, sizeof(int) * (size_t)n_ctx);
    memcpy(c->hist + n_ctx, prompt, sizeof(int) * (size_t)n_prompt);
    c->n_hist = n_ctx + n_prompt;
    if (branching && branch_init(&c->bs, &s->m, o->branch_k, o->branch_b, err)) return ctx_free(c), -1;
    int last = s->m.cfg.n_layers - 1, layer = o->attn_layer_given ? o->attn_layer : last;
    if (layer < 0 || layer > last) {
        ctx_free(c);
        return verr_set(err, "--attn-layer %d is out of range: the model has layers 0..%d", layer, last);
    }
    s->fw.attn_layer = c->metrics ? layer : -1;
    // The draws read the forward's own logits unless penalties or a bias rewrite them
    // (draw_logits): then the device can make them right after the step (an entropix
    // step's after its statistics).
    if (c->lazy && raw_draws(o)) c->arm = o->sampler != GEN_ENTROPIX ? ARM_STD : c->metrics ? ARM_EX : ARM_NONE;
    return 0;
}

// The standard sampler's parameters a step records (greedy at temperature 0 or below).
static sampler_params std_params(const gen_opts *o) {
    return o->sp.temperature <= 0 ? (sampler_params){ 0, 1, 1, 0 } : o->sp;
}

// A draw's configuration; its uniform (none when greedy) from the stream r.
static sample_cfg draw_cfg(sampler_params p, rng *r) {
    return (sample_cfg){ p.temperature, p.top_k, p.top_p, p.min_p, p.temperature > 0 ? rng_uniform(r) : 0 };
}

// Before a forward whose logits the next step draws from: on CUDA, arm it to draw on the
// device inside the step (session_arm_sample; session_arm_entropix decides first) with
// the uniforms the step will take from the run's stream, peeked (the step consumes them
// itself, so the stream is unchanged).
static int arm_step(gen_ctx *c, verr *err) {
    if (!c->arm) return 0;
    rng peek = c->r;
    if (c->arm == ARM_STD) {  // the draw step() makes (draw_n with o->sp), to the bit
        sample_cfg cfg = draw_cfg(c->o->sp, &peek);
        return session_arm_sample(c->s, &cfg, 1, err);
    }
    for (int i = 0; i < c->n_draw; i++) c->u[i] = rng_uniform(&peek);
    return session_arm_entropix(c->s, c->o->ex, c->u, c->n_draw, c->hist[c->n_hist - 1], c->o->clarifier, err);
}

// The logits the draw sees: the forward's own (s->fw.logits, which on CUDA may still be
// on the device: draw_n samples them there), or a biased and penalised host copy (on
// CUDA the step's logits cross the bus then). NULL on error.
static const float *draw_logits(gen_ctx *c, verr *err) {
    const gen_opts *o = c->o;
    int vocab = c->s->m.cfg.vocab_size;
    if (raw_draws(o)) return c->s->fw.logits;
    const float *raw = session_logits(c->s, err);
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
    for (int i = 0; i < n; i++) c->cfg[i] = draw_cfg(p, &c->r);
    if (lg == c->s->fw.logits) return session_sample(c->s, c->cfg, n, c->drawn, err);
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
        float raw = lg == c->s->fw.logits ? c->drawn[i].logit : c->s->fw.logits[id];
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
static int step(gen_ctx *c, int n_gen, int **toks, gen_record **recs, gen_record *one, int *one_tok, verr *err) {
    session *s = c->s;
    const gen_opts *o = c->o;
    memset(one, 0, sizeof *one);
    one->pos = s->kv.len, one->q = Q_STANDARD;
    if (c->metrics) {
        if (session_metrics(s, &c->ws, &one->m)) return verr_set(err, "out of memory computing metrics");
        one->q = entropix_classify(o->ex, &one->m);
    }
    const float *lg = draw_logits(c, err);
    if (!lg) return -1;
    *toks = one_tok, *recs = one;
    if (o->sampler != GEN_ENTROPIX) {
        one->sp = std_params(o);
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

static void count(gen_stats *st, const gen_ctx *c, const gen_record *r) {
    if (!c->metrics) return;
    st->quadrant_count[r->q]++;
    st->sum_entropy += r->m.entropy;
    st->n_metrics++;
}

// Emits step tokens in order. Returns 1 when generation is over, 0 to go on, -1 on error.
static int emit(gen_ctx *c, gen_stats *st, const int *toks, gen_record *recs, int n) {
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
    int rc = arm_step(c, err) ? -1 : session_forward(s, &kv, prompt + done, n_prompt - done, err);
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
    if (ctx_init(&c, s, o, prompt, n_prompt, err)) return -1;
    double t0 = gen_now();
    s->fw.lazy_logits = c.lazy;
    int rc = prefill(&c, prompt, n_prompt, err);
    kv_view kv = kv_view_of(&s->kv);
    st->prefill_s = gen_now() - t0;
    t0 = gen_now();
    int unfed = -1;  // the last emitted token when the model has not seen it
    while (rc == 0 && st->n_gen < o->max_new) {
        if (o->interrupt && *o->interrupt) {
            st->interrupted = 1;
            break;
        }
        int *toks = NULL, one_tok;
        gen_record *recs = NULL, one;
        int n = step(&c, st->n_gen, &toks, &recs, &one, &one_tok, err), n_before = st->n_gen;
        if (n < 0 || (rc = emit(&c, st, toks, recs, n)) != 0) {
            if (n > 0 && rc > 0 && st->n_gen > n_before) unfed = toks[st->n_gen - n_before - 1];
            rc = n < 0 || rc < 0 ? -1 : 0;
            break;
        }
        kv = kv_view_of(&s->kv);  // a committed branch moved the trunk
        if (kv_view_len(&kv) >= s->ctx) {
            st->hit_ctx = 1;
            break;
        }
        rc = arm_step(&c, err) ? -1 : session_forward(s, &kv, &toks[n - 1], 1, err);
    }
    if (rc == 0 && o->feed_last && unfed >= 0 && s->kv.len < s->ctx) {
        kv = kv_view_of(&s->kv);
        rc = session_forward(s, &kv, &unfed, 1, err);
    }
    st->decode_s = gen_now() - t0;
    st->branch_fed = c.bs.fed;
    s->fw.lazy_logits = 0;
    ctx_free(&c);
    return rc;
}
