// arm.c: see arm.h.
#include "host/eval/arm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode/generate.h"
#include "host/decode/perplexity.h"
#include "host/eval/match.h"

// ---- the list of arms ----

static int parse_arm(const char *spec, const eval_arm_opts *o, eval_arm *a, verr *err) {
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", spec);
    const char *colon = strchr(spec, ':'), *profile = o->profile ? o->profile : "seed";
    size_t head = colon ? (size_t)(colon - spec) : strlen(spec);
    if (colon) profile = colon + 1;
    if (!strncmp(spec, "greedy", head) && head == 6) a->kind = ARM_STANDARD, a->greedy = 1;
    else if (!strncmp(spec, "standard", head) && head == 8) a->kind = ARM_STANDARD;
    else if (!strncmp(spec, "entropix", head) && head == 8) a->kind = ARM_ENTROPIX;
    else if (!strncmp(spec, "branch", head) && head == 6) a->kind = ARM_ENTROPIX, a->branch = 1;
    else if (!strncmp(spec, "agents", head) && head == 6) a->kind = ARM_AGENTS;
    else
        return verr_set(err, "--samplers: unknown arm '%s' (use greedy, standard, entropix[:PROFILE], "
                             "branch[:PROFILE] or agents)", spec);
    if (colon && a->kind != ARM_ENTROPIX) return verr_set(err, "--samplers: '%s': only entropix and branch take a :PROFILE", spec);
    if (!colon && a->kind != ARM_ENTROPIX) profile = "seed";  // only classifies; no decision uses it
    if (entropix_profile_load(profile, &a->ex, err)) return verr_set(err, "--samplers: '%s': %.900s", spec, err->msg);
    if (a->branch && (o->branch_k < 1 || o->branch_b < 1)) return verr_set(err, "--samplers: '%s' needs --branch K:B", spec);
    return 0;
}

int eval_arms_parse(const char *list, const eval_arm_opts *o, eval_arm *arms, verr *err) {
    char buf[4096];
    if (strlen(list) >= sizeof buf) return verr_set(err, "--samplers: list too long");
    snprintf(buf, sizeof buf, "%s", list);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        for (size_t k = strlen(t); k > 0 && t[k - 1] == ' ';) t[--k] = 0;
        if (!*t) continue;
        if (n == EVAL_MAX_ARMS) return verr_set(err, "--samplers: at most %d arms", EVAL_MAX_ARMS);
        if (parse_arm(t, o, &arms[n], err)) return -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(arms[i].name, arms[n].name)) return verr_set(err, "--samplers: '%s' is listed twice", t);
        n++;
    }
    if (n == 0) return verr_set(err, "--samplers: empty list");
    return n;
}


// ---- the runner ----

int eval_runner_open(eval_runner *r, session *s, const eval_arm_opts *o, int need_agents, verr *err) {
    memset(r, 0, sizeof *r);
    r->s = s, r->o = o;
    r->clarifier = gen_find_clarifier(s);
    if (!need_agents) return 0;
    if (dev_pool_start(&r->pool, 1, err)) return -1;
    if (o->check_every <= 0) return 0;
    int ctx = s->ctx + 128 < s->m.cfg.max_pos ? s->ctx + 128 : s->m.cfg.max_pos;  // room for the question
    if (critic_open_shared(&r->cr, s, ctx, err)) return eval_runner_close(r), -1;
    r->has_critic = 1;
    return 0;
}

void eval_runner_close(eval_runner *r) {
    if (r->has_critic) critic_close(&r->cr);
    if (r->pool) dev_pool_stop(r->pool);
    metrics_ws_free(&r->ws);
    r->has_critic = 0, r->pool = NULL;
}

void eval_gen_free(eval_gen *g) {
    free(g->text), free(g->ids);
    memset(g, 0, sizeof *g);
}

// ---- standard and entropix arms ----

static int append_text(eval_job *c, const char *t, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = (c->len + n + 1) * 2;
        char *b = realloc(c->g->text, cap);
        if (!b) return c->oom = 1;
        c->g->text = b, c->cap = cap;
    }
    memcpy(c->g->text + c->len, t, n);
    c->len += n;
    c->g->text[c->len] = 0;
    return 0;
}

static int push_id(eval_gen *g, int *cap, int id) {
    if (g->n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        int *p = realloc(g->ids, sizeof(int) * (size_t)c);
        if (!p) return -1;
        g->ids = p, *cap = c;
    }
    g->ids[g->n++] = id;
    return 0;
}

static int on_token(void *ud, int id) {
    eval_job *c = ud;
    if (push_id(c->g, &c->cap_ids, id)) return c->oom = 1;
    const char *t;
    verr err;
    int k = c->ts ? tokenizer_stream_push(c->ts, id, &t, &err) : 0;
    if (k > 0 && append_text(c, t, (size_t)k)) return 1;
    if (c->it->n_stop && c->g->text && eval_cut(c->it, c->g->text) < c->len) return c->hit_stop = 1;
    return 0;
}

static int on_record(void *ud, const gen_record *rec) {
    eval_job *c = ud;
    eval_gen *g = c->g;
    g->sum_h += rec->m.entropy, g->sum_v += rec->m.varentropy, g->n_metrics++;
    return c->r->on_record ? c->r->on_record(c->r->record_ud, rec) : 0;
}

int eval_job_scheduled(const eval_runner *r, const eval_arm *a) {
    return a->kind != ARM_AGENTS && !a->branch && !r->on_record && !r->feed_last;
}

int eval_job_begin(eval_job *j, eval_runner *r, const eval_arm *a, const eval_item *it, uint64_t seed, eval_gen *g,
                   verr *err) {
    session *s = r->s;
    const eval_arm_opts *o = r->o;
    memset(g, 0, sizeof *g);
    *j = (eval_job){ .r = r, .g = g, .it = it, .ts = s->tok ? tokenizer_stream_new(s->tok, 1) : NULL };
    if (s->tok && !j->ts) return verr_set(err, "out of memory");
    j->go = (gen_opts){ .max_new = o->max_new, .sp = o->sp, .seed = seed, .on_token = on_token, .ud = j,
                        .sampler = a->kind == ARM_ENTROPIX ? GEN_ENTROPIX : GEN_STANDARD, .ex = &a->ex,
                        .clarifier = r->clarifier, .want_metrics = 1, .on_record = on_record, .record_ud = j,
                        .bias = o->bias, .n_bias = o->n_bias, .feed_last = r->feed_last };
    if (a->greedy) j->go.sp.temperature = 0;
    if (a->branch) j->go.branch_k = o->branch_k, j->go.branch_b = o->branch_b;
    append_text(j, "", 0);
    if (j->oom) {
        if (j->ts) tokenizer_stream_free(j->ts);
        return verr_set(err, "out of memory");
    }
    return 0;
}

int eval_job_end(eval_job *j, int rc, const gen_stats *st, verr *err) {
    eval_gen *g = j->g;
    if (rc == 0 && j->ts && !j->hit_stop) {
        const char *t;
        int k = tokenizer_stream_flush(j->ts, &t);
        if (k > 0) append_text(j, t, (size_t)k);
    }
    if (j->ts) tokenizer_stream_free(j->ts);
    j->ts = NULL;
    if (rc == 0 && j->oom) rc = verr_set(err, "out of memory collecting the output");
    if (rc == 0) {
        g->compute = st->n_gen + st->branch_fed;
        g->wall_s = st->prefill_s + st->decode_s;
        g->stop = j->hit_stop ? "stop" : st->hit_eos ? "eos" : st->hit_ctx ? "context" : "length";
        if (g->text) g->text[eval_cut(j->it, g->text)] = 0;
    }
    if (rc) eval_gen_free(g);
    return rc ? -1 : 0;
}

void eval_job_drop(eval_job *j) {
    if (j->ts) tokenizer_stream_free(j->ts);
    j->ts = NULL;
}

static int run_decode(eval_runner *r, const eval_arm *a, const eval_item *it, const int *prompt, int n_prompt,
                      uint64_t seed, eval_gen *g, verr *err) {
    eval_job j;
    if (eval_job_begin(&j, r, a, it, seed, g, err)) return -1;
    kv_cache_truncate(&r->s->kv, 0);
    gen_stats st;
    int rc = generate(r->s, prompt, n_prompt, &j.go, &st, err);
    return eval_job_end(&j, rc, &st, err);
}

// ---- the agents arm ----

typedef struct {
    eval_runner *r;
    const eval_item *it;
    int n_prompt, n, cap;   // kept ids so far
    int *ids;
    double *h, *v;          // per kept position
    int hit_stop, failed;
} agents_track;

static int track_grow(agents_track *t, int need) {
    if (need <= t->cap) return 0;
    int cap = need * 2;
    int *ids = realloc(t->ids, sizeof(int) * (size_t)cap);
    if (ids) t->ids = ids;
    double *h = realloc(t->h, sizeof(double) * (size_t)cap);
    if (h) t->h = h;
    double *v = realloc(t->v, sizeof(double) * (size_t)cap);
    if (v) t->v = v;
    if (!ids || !h || !v) return -1;
    t->cap = cap;
    return 0;
}

// Has the text so far reached one of the item's stop strings?
static int reached_stop(agents_track *t) {
    session *s = t->r->s;
    verr err;
    char *text = s->tok ? tokenizer_decode(s->tok, t->ids, t->n, 1, &err) : NULL;
    int hit = text && eval_cut(t->it, text) < strlen(text);
    free(text);
    return hit;
}

static int on_agents_event(void *ud, const agents_event *e) {
    agents_track *t = ud;
    if (e->kind == AGENTS_ROLLBACK) {
        t->n = e->to_pos - t->n_prompt;
        return 0;
    }
    if (e->kind != AGENTS_STEP) return 0;
    const agents_proposal *p = &e->props[e->chosen];
    int at = e->pos - t->n_prompt;
    if (track_grow(t, at + p->n_tok)) return t->failed = 1;
    token_metrics m;
    if (metrics_logits(&t->r->ws, e->logits, t->r->s->m.cfg.vocab_size, &m)) return t->failed = 1;
    for (int j = 0; j < p->n_tok; j++) {
        t->ids[at + j] = p->tok[j];
        t->h[at + j] = j == 0 ? m.entropy : NAN;  // later lookahead tokens have no shared logits
        t->v[at + j] = j == 0 ? m.varentropy : NAN;
    }
    t->n = at + p->n_tok;
    if (t->it->n_stop && reached_stop(t)) return t->hit_stop = 1;
    return 0;
}

static int run_agents(eval_runner *r, const eval_item *it, const int *prompt, int n_prompt, uint64_t seed,
                      eval_gen *g, verr *err) {
    const eval_arm_opts *o = r->o;
    agents_track t = { .r = r, .it = it, .n_prompt = n_prompt };
    agents_opts ao = { .agents = o->agents, .n_agents = o->n_agents, .max_new = o->max_new, .seed = seed,
                       .cr = r->has_critic ? &r->cr : NULL, .check_every = o->check_every, .rollback = o->rollback,
                       .on_event = on_agents_event, .ud = &t, .bias = o->bias, .n_bias = o->n_bias };
    agents_result res;
    double t0 = gen_now();
    int rc = agents_generate(r->s, r->pool, prompt, n_prompt, &ao, &res, err);
    g->wall_s = gen_now() - t0;
    if (rc == 0 && t.failed) rc = verr_set(err, "out of memory tracking the agents");
    if (rc == 0) {
        g->n = res.n_gen;
        g->ids = malloc(sizeof(int) * (size_t)(res.n_gen + 1));
        if (!g->ids) rc = verr_set(err, "out of memory");
    }
    if (rc == 0) {
        memcpy(g->ids, res.ids + n_prompt, sizeof(int) * (size_t)res.n_gen);
        for (int i = 0; i < res.n_gen && i < t.n; i++)
            if (isfinite(t.h[i])) g->sum_h += t.h[i], g->sum_v += t.v[i], g->n_metrics++;
        g->text = r->s->tok ? tokenizer_decode(r->s->tok, g->ids, g->n, 1, err) : strdup("");
        if (!g->text) rc = -1;
        g->compute = res.steps + res.critic_fed;
        g->rollbacks = res.rollbacks;
        g->stop = t.hit_stop ? "stop" : res.hit_eos ? "eos" : res.hit_ctx ? "context" : "length";
    }
    agents_result_free(&res);
    free(t.ids), free(t.h), free(t.v);
    return rc;
}

int eval_generate(eval_runner *r, const eval_arm *a, const eval_item *it, const int *prompt, int n_prompt,
                  uint64_t seed, eval_gen *g, verr *err) {
    memset(g, 0, sizeof *g);
    if (a->kind != ARM_AGENTS) return run_decode(r, a, it, prompt, n_prompt, seed, g, err);  // cut by eval_job_end
    int rc = run_agents(r, it, prompt, n_prompt, seed, g, err);
    if (rc == 0 && g->text) g->text[eval_cut(it, g->text)] = 0;
    if (rc) eval_gen_free(g);
    return rc;
}

// ---- multiple choice ----

int eval_choices(session *s, const eval_item *it, const int *prompt, int n_prompt, const eval_choice_hooks *h,
                 double *ll, int *n_tok, verr *err) {
    if (!s->tok) return verr_set(err, "scoring choices needs the model's tokenizer.json");
    int rc = 0;
    for (int c = 0; rc == 0 && c < it->n_choices; c++) {
        int *cont = NULL, k = tokenizer_encode(s->tok, it->choices[c], strlen(it->choices[c]), 0, &cont, err);
        if (k < 0) return -1;
        if (k == 0) rc = verr_set(err, "choice %d (\"%s\") encodes to no tokens", c, it->choices[c]);
        int n = n_prompt + k;
        int *all = rc ? NULL : malloc(sizeof(int) * (size_t)n);
        double *lp = rc ? NULL : malloc(sizeof(double) * (size_t)n);
        if (rc == 0 && (!all || !lp)) rc = verr_set(err, "out of memory");
        if (rc == 0) {
            memcpy(all, prompt, sizeof(int) * (size_t)n_prompt);
            memcpy(all + n_prompt, cont, sizeof(int) * (size_t)k);
            rc = h && h->begin ? h->begin(h->ud, c, err) : 0;
            if (rc == 0) rc = (h && h->each ? ppl_score_each : ppl_score)(s, all, n, n_prompt, lp, err);
            if (h && h->end) {
                verr e2;
                if (h->end(h->ud, c, rc == 0, all, n, rc ? &e2 : err) && rc == 0) rc = -1;
            }
        }
        double sum = 0;
        for (int i = n_prompt; rc == 0 && i < n; i++) sum += lp[i];
        ll[c] = sum, n_tok[c] = k;
        free(cont), free(all), free(lp);
    }
    return rc;
}
