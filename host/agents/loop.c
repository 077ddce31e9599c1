// loop.c: see loop.h. The caller's thread decides (winner, critic, rollback);
// each replica's thread only runs forwards and samplings on its own session.
#include "host/agents/loop.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/decode/generate.h"
#include "host/runtime/probe.h"

int agents_default(sampler_params *out, sampler_params base) {
    for (int i = 0; i < 8; i++) {
        out[i] = base;
        out[i].temperature = (float)((int)((0.3 + 1.2 * i / 7) * 100 + 0.5) / 100.0);  // 0.30 .. 1.50
        out[i].top_k = (int)(10 + 90.0 * i / 7 + 0.5);                               // 10 .. 100
    }
    return 8;
}

int agents_parse(const char *spec, sampler_params *out, sampler_params base, verr *err) {
    int n = 0;
    const char *p = spec;
    if (!spec || !*spec) return verr_set(err, "--agents: empty list (want T:K,T:K,...)");
    for (;;) {
        char *end;
        double t = strtod(p, &end);
        long k = -1;
        if (end != p && *end == ':') {
            const char *ks = end + 1;
            k = strtol(ks, &end, 10);
            if (end == ks) k = -1;
        }
        if (k < 0 || !(t >= 0 && t <= 100) || k > 1000000 || (*end && *end != ','))
            return verr_set(err, "--agents '%s': entry %d at offset %ld is not T:K with T >= 0 and K >= 0 (0: no top-k)",
                            spec, n + 1, (long)(p - spec));
        if (n == AGENTS_MAX) return verr_set(err, "--agents: more than %d agents", AGENTS_MAX);
        out[n] = base;
        out[n].temperature = (float)t, out[n].top_k = (int)k;
        n++;
        if (!*end) return n;
        p = end + 1;
    }
}

// splitmix64: a per-agent stream from one seed.
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The step's top logits: every agent with 0 < top_k < k draws from these alone.
// For T > 0 the order by probability is the order by logit (ties: lower id), so the
// top-k of the vocab are the top-k of this set, and sampler_distribution on the
// compact vector, kept in ascending id order, does the same arithmetic on the same
// candidates as on the whole vocab: one O(V) pass per step instead of one per agent.
// k = the largest agent top-k + 1 keeps "top_k < n" true, as on the whole vocab.
typedef struct {
    int k, cap;
    int *ids;          // [k] ascending
    float *logits;     // [k] logits[ids[i]]
    float max, min;    // over the vocab / over the set
} topset;

// a worse than b in (logit desc, id asc) order
static int worse(const float *x, int a, int b) { return x[a] < x[b] || (x[a] == x[b] && a > b); }

static void heap_down(int *h, int n, int i, const float *x) {
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < n && worse(x, h[l], h[m])) m = l;
        if (l + 1 < n && worse(x, h[l + 1], h[m])) m = l + 1;
        if (m == i) return;
        int t = h[i];
        h[i] = h[m], h[m] = t, i = m;
    }
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

// The cap best ids of x[n] (a min-heap of the best so far), then sorted by id.
static void topset_build(topset *t, const float *x, int n) {
    int k = 0, *h = t->ids;
    t->max = x[0];
    for (int i = 0; i < n; i++) {
        if (x[i] > t->max) t->max = x[i];
        if (k < t->cap) {
            h[k++] = i;
            if (k == t->cap)
                for (int j = k / 2 - 1; j >= 0; j--) heap_down(h, k, j, x);
        } else if (worse(x, h[0], i)) {
            h[0] = i;
            heap_down(h, k, 0, x);
        }
    }
    qsort(h, (size_t)k, sizeof *h, cmp_int);
    t->k = k, t->min = x[h[0]];
    for (int i = 0; i < k; i++) {
        t->logits[i] = x[h[i]];
        if (t->logits[i] < t->min) t->min = t->logits[i];
    }
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    sampler smp;       // this agent's candidate buffer
    sampler small;     // over the step's topset
    rng r;             // its own counter-based stream: draws never depend on other agents
    kv_cache tail;     // lookahead: its private branch positions (W - 1)
    int *tok;          // [W] its branch
    int n_tok;
    double entropy;    // mean over the branch
} agent;

typedef struct {
    float *root;       // [vocab] the step's shared logits (forwards of branches overwrite fw.logits)
    float *draw;       // what the agents draw from: root, or its copy with the -l biases added
    topset top;        // of root
    // lookahead: one batch of branch rows (session_forward_batch)
    float *logits;     // [rows, vocab] each row's logits
    kv_view views[AGENTS_MAX];
    int ids[AGENTS_MAX], row[AGENTS_MAX];
    int rc;
    verr err;
} replica;

typedef struct {
    session *reps;
    dev_pool *pool;
    const agents_opts *o;
    int D, W;              // replicas running agents here; tokens per branch
    int G, g;              // MPI: replica groups (ranks of o->ranks) and this one (1, 0: one process)
    unsigned active;       // mask of replicas that hold the text
    agent *ag;
    replica rp[DEVICES_MAX];
    int *ids, n, n_prompt; // the text
    int pending;           // ids[n-1] is not in the trunks yet
    int w, winner;         // this step's branch width and winner
    int roll_to;           // rollback target length
    char *text;            // critic input
    critic_verdict verdict;
    int rows;              // lookahead: branch rows per batch (--max-parallel)
    int *rb_at;            // [ctx + 1] rollbacks at each text length
    int step_cap;          // of res->step_s
} run;

static int job_fail(run *r, int d) { return r->rp[d].rc = -1; }

// The first agent of local replica d and the stride to its next: agents go round the
// replicas of every rank (lookahead) or round the ranks (one token per step).
static int first_agent(const run *r, int d) { return r->g * r->D + d; }
static int agent_stride(const run *r) { return r->G * r->D; }
static int agent_here(const run *r, int a, int d) { return a % agent_stride(r) == first_agent(r, d); }

// Appends ids to the trunk one at a time (the same arithmetic as a branch step).
static int feed_trunk(run *r, int d, const int *ids, int n) {
    session *s = &r->reps[d];
    for (int i = 0; i < n; i++) {
        kv_view kv = kv_view_of(&s->kv);
        if (session_forward(s, &kv, &ids[i], 1, &r->rp[d].err)) return job_fail(r, d);
    }
    return 0;
}

static void job_prefill(void *ud, int d) {
    run *r = ud;
    session *s = &r->reps[d];
    kv_cache_truncate(&s->kv, 0);
    kv_view kv = kv_view_of(&s->kv);
    if (r->n > 1 && session_forward(s, &kv, r->ids, r->n - 1, &r->rp[d].err)) job_fail(r, d);
}

// Agent a's proposal from the shared logits: its entropy; its token in g->tok[0].
static double propose(run *r, int d, int a) {
    agent *g = &r->ag[a];
    sampler_params sp = r->o->agents[a];
    const topset *t = &r->rp[d].top;
    // exp(-700) is far from underflow: no zero probabilities whose order would fall to the id
    if (sp.temperature > 0 && sp.top_k > 0 && sp.top_k < t->k &&
        ((double)t->max - t->min) / sp.temperature < 700) {
        double h = sampler_distribution(&g->small, t->logits, sp);
        g->tok[0] = t->ids[sampler_draw(&g->small, &g->r)];
        return h;
    }
    double h = sampler_distribution(&g->smp, r->rp[d].draw, sp);
    g->tok[0] = sampler_draw(&g->smp, &g->r);
    return h;
}

// Agents ag[0..n) of replica d extend their branches together: each one's first token
// from the shared logits, then up to w - 1 more on its tail (the last token is never
// fed: the winner's is fed next step), step j of every live branch in one session_forward_batch
// (the weights are read once per step, not once per branch). Every agent draws from its
// own stream, so which rows share a batch never changes a draw.
static int branch_group(run *r, int d, const int *ag, int n) {
    session *s = &r->reps[d];
    replica *rp = &r->rp[d];
    size_t V = (size_t)s->m.cfg.vocab_size;
    double sum[AGENTS_MAX];
    for (int i = 0; i < n; i++) {
        sum[i] = propose(r, d, ag[i]);
        r->ag[ag[i]].n_tok = 1, r->ag[ag[i]].tail.len = 0;
    }
    for (int step = 1; step < r->w; step++) {
        int rows = 0;
        for (int i = 0; i < n; i++) {
            agent *g = &r->ag[ag[i]];
            if (g->n_tok != step || session_is_stop(s, g->tok[step - 1])) continue;  // stopped
            rp->row[rows] = i, rp->ids[rows] = g->tok[step - 1];
            rp->views[rows++] = (kv_view){ &s->kv, s->kv.len, &g->tail };
        }
        if (rows == 0) break;
        if (session_forward_batch(s, rp->views, rp->ids, rows, rp->logits, NULL, NULL, NULL, &rp->err))
            return job_fail(r, d);
        for (int q = 0; q < rows; q++) {
            int i = rp->row[q];
            agent *g = &r->ag[ag[i]];
            logit_bias_apply(rp->logits + q * V, (int)V, r->o->bias, r->o->n_bias);
            sum[i] += sampler_distribution(&g->smp, rp->logits + q * V, r->o->agents[ag[i]]);
            g->tok[g->n_tok++] = sampler_draw(&g->smp, &g->r);
        }
    }
    for (int i = 0; i < n; i++) r->ag[ag[i]].entropy = sum[i] / r->ag[ag[i]].n_tok;
    return 0;
}

// Every agent's proposal in one launch on the device (CUDA replicas): the draws
// propose() makes on the host (one uniform per agent from its own stream), the entropy
// of each agent's truncated distribution with them; only ids and entropies come back.
static void propose_on_device(run *r, int d) {
    sample_cfg cfg[AGENTS_MAX] = { { 0 } };
    sample_out out[AGENTS_MAX];
    int n = r->o->n_agents;
    for (int a = 0; a < n; a++) {
        sampler_params sp = r->o->agents[a];
        cfg[a] = (sample_cfg){ sp.temperature, sp.top_k, sp.top_p, sp.min_p, rng_uniform(&r->ag[a].r) };
    }
    if (session_sample(&r->reps[d], cfg, n, out, &r->rp[d].err)) {
        job_fail(r, d);
        return;
    }
    for (int a = 0; a < n; a++) r->ag[a].tok[0] = out[a].token, r->ag[a].entropy = out[a].entropy, r->ag[a].n_tok = 1;
}

// One step on replica d: the shared forward of the pending id, then its agents.
static void job_round(void *ud, int d) {
    run *r = ud;
    session *s = &r->reps[d];
    if (d == 0) probe_pause(r->o->probe, 0);  // branches and commits are outside the captured sequence
    int fed = r->pending ? feed_trunk(r, d, &r->ids[r->n - 1], 1) : 0;
    if (d == 0) probe_pause(r->o->probe, 1);
    if (fed) return;
    int V = s->m.cfg.vocab_size;
    memcpy(r->rp[d].root, s->fw.logits, sizeof(float) * (size_t)V);
    const agents_opts *o = r->o;
    if (r->W <= 1 && s->cu && o->n_bias == 0) {  // the device draws from the raw logits
        propose_on_device(r, d);
        return;
    }
    if (o->n_bias > 0) {
        memcpy(r->rp[d].draw, r->rp[d].root, sizeof(float) * (size_t)V);
        logit_bias_apply(r->rp[d].draw, V, o->bias, o->n_bias);
    }
    topset_build(&r->rp[d].top, r->rp[d].draw, V);
    if (r->W <= 1) {  // every agent samples the same logits: bounded by --max-parallel threads
        int par = o->max_parallel > 0 && o->max_parallel < o->n_agents ? o->max_parallel : o->n_agents, full = 0;
        for (int a = 0; a < o->n_agents; a++) full += !(o->agents[a].top_k > 0 && o->agents[a].top_k < r->rp[d].top.k);
        if (par > omp_get_max_threads()) par = omp_get_max_threads();
        if ((long)V * full < 65536) par = 1;  // threads cost more than they save
#pragma omp parallel for num_threads(par) schedule(static, 1) if (par > 1)
        for (int a = 0; a < o->n_agents; a++) {
            if (!agent_here(r, a, d)) continue;
            r->ag[a].entropy = propose(r, d, a);
            r->ag[a].n_tok = 1;
        }
        return;
    }
    int grp[AGENTS_MAX], n = 0;  // this replica's agents, r->rows per batch
    for (int a = first_agent(r, d); a < o->n_agents; a += agent_stride(r)) {
        grp[n++] = a;
        if (n == r->rows && branch_group(r, d, grp, n)) return;
        if (n == r->rows) n = 0;
    }
    if (n) branch_group(r, d, grp, n);
}

// The winner's fed tokens into every trunk: its own replica copies the tail, the
// others replay the ids (devices exchange ids, never keys or weights).
static void job_commit(void *ud, int d) {
    run *r = ud;
    agent *g = &r->ag[r->winner];
    int fed = g->n_tok - 1;
    if (agent_here(r, r->winner, d)) {
        if (kv_cache_commit(&r->reps[d].kv, &g->tail, fed, &r->rp[d].err)) job_fail(r, d);
    } else {
        feed_trunk(r, d, g->tok, fed);
    }
}

static void job_truncate(void *ud, int d) {
    run *r = ud;
    kv_cache_truncate(&r->reps[d].kv, r->roll_to - 1);
}

static void job_critic(void *ud, int d) {
    run *r = ud;
    if (critic_judge(r->o->cr, r->text, &r->verdict, &r->rp[d].err)) job_fail(r, d);
}

// Each agent's branch tail next to its replica's trunk (host or device memory), made
// on the replica's thread.
static void job_tails(void *ud, int d) {
    run *r = ud;
    for (int a = first_agent(r, d); a < r->o->n_agents; a += agent_stride(r))
        if (kv_cache_init_like(&r->ag[a].tail, &r->reps[d].kv, r->W - 1, &r->rp[d].err)) {
            job_fail(r, d);
            return;
        }
}

static void job_free_tails(void *ud, int d) {
    run *r = ud;
    for (int a = first_agent(r, d); a < r->o->n_agents; a += agent_stride(r)) kv_cache_free(&r->ag[a].tail);
}

// Runs a job on the replicas in mask; -1 with the first failing replica's message.
static int dispatch(run *r, unsigned mask, dev_job fn, verr *err) {
    for (int d = 0; d < DEVICES_MAX; d++) r->rp[d].rc = 0;
    dev_pool_run(r->pool, mask, fn, r);
    for (int d = 0; d < DEVICES_MAX; d++)
        if ((mask & (1u << d)) && r->rp[d].rc) {
            if (dev_pool_size(r->pool) > 1) return verr_set(err, "replica %d: %s", d, r->rp[d].err.msg);
            return verr_set(err, "%s", r->rp[d].err.msg);
        }
    return 0;
}

static void run_free(run *r) {
    if (r->ag) dev_pool_run(r->pool, r->active, job_free_tails, r);
    for (int a = 0; r->ag && a < r->o->n_agents; a++) {
        sampler_free(&r->ag[a].smp);
        sampler_free(&r->ag[a].small);
        free(r->ag[a].tok);
    }
    free(r->ag);
    for (int d = 0; d < DEVICES_MAX; d++) {
        if (r->rp[d].draw != r->rp[d].root) free(r->rp[d].draw);
        free(r->rp[d].root), free(r->rp[d].top.ids), free(r->rp[d].top.logits), free(r->rp[d].logits);
    }
    free(r->rb_at), free(r->text);
}

static int run_init(run *r, session *reps, dev_pool *pool, const agents_opts *o, verr *err) {
    memset(r, 0, sizeof *r);
    r->reps = reps, r->pool = pool, r->o = o;
    r->W = o->lookahead > 1 ? o->lookahead : 1;
    r->D = r->W > 1 ? dev_pool_size(pool) : 1;
    r->G = o->ranks ? o->ranks->size : 1, r->g = o->ranks ? o->ranks->rank : 0;
    r->active = (1u << r->D) - 1;
    int per_rep = (o->n_agents + agent_stride(r) - 1) / agent_stride(r);
    r->rows = o->max_parallel > 0 && o->max_parallel < per_rep ? o->max_parallel : per_rep;
    const model_config *c = &reps[0].m.cfg;
    r->ag = calloc((size_t)o->n_agents, sizeof *r->ag);
    r->rb_at = calloc((size_t)reps[0].ctx + 1, sizeof *r->rb_at);
    if (!r->ag || !r->rb_at) return verr_set(err, "out of memory");
    int kmax = 0;
    for (int a = 0; a < o->n_agents; a++)
        if (o->agents[a].top_k > kmax) kmax = o->agents[a].top_k;
    kmax = kmax + 1 < c->vocab_size ? kmax + 1 : c->vocab_size;
    for (int d = 0; d < r->D; d++) {
        topset *t = &r->rp[d].top;
        t->cap = kmax;
        t->ids = malloc(sizeof(int) * (size_t)kmax);
        t->logits = malloc(sizeof(float) * (size_t)kmax);
        r->rp[d].root = malloc(sizeof(float) * (size_t)c->vocab_size);
        r->rp[d].draw = o->n_bias > 0 ? malloc(sizeof(float) * (size_t)c->vocab_size) : r->rp[d].root;
        r->rp[d].logits = r->W > 1 ? malloc(sizeof(float) * (size_t)c->vocab_size * r->rows) : NULL;
        if (!r->rp[d].root || !r->rp[d].draw || !t->ids || !t->logits || (r->W > 1 && !r->rp[d].logits))
            return verr_set(err, "out of memory");
    }
    for (int a = 0; a < o->n_agents; a++) {
        agent *g = &r->ag[a];
        g->r = (rng){ mix64(o->seed ^ mix64((uint64_t)a + 1)), 0 };
        g->tok = malloc(sizeof(int) * (size_t)r->W);
        if (!g->tok || sampler_init(&g->smp, c->vocab_size) || sampler_init(&g->small, kmax))
            return verr_set(err, "out of memory");
    }
    return r->W > 1 ? dispatch(r, r->active, job_tails, err) : 0;
}

// MPI: every rank's proposals to every rank (agent, branch, entropy), in one all-gather
// of a fixed-size record per agent slot; afterwards r->ag holds all of them everywhere.
typedef struct {
    int agent, n_tok;  // agent -1: the slot is another rank's
    double entropy;
} wire_head;

static int exchange(run *r, verr *err) {
    if (r->G <= 1) return 0;
    int n = r->o->n_agents;
    size_t rec = sizeof(wire_head) + sizeof(int) * (size_t)r->W, mine = rec * (size_t)n;
    char *buf = calloc((size_t)r->G + 1, mine);
    if (!buf) return verr_set(err, "out of memory exchanging proposals");
    for (int a = 0; a < n; a++) {
        wire_head h = { -1, 0, 0 };
        for (int d = 0; d < r->D; d++)
            if (agent_here(r, a, d)) h = (wire_head){ a, r->ag[a].n_tok, r->ag[a].entropy };
        memcpy(buf + (size_t)a * rec, &h, sizeof h);
        if (h.agent >= 0) memcpy(buf + (size_t)a * rec + sizeof h, r->ag[a].tok, sizeof(int) * (size_t)h.n_tok);
    }
    char *all = buf + mine;
    int rc = r->o->ranks->gather(r->o->ranks, buf, mine, all, err);
    for (int k = 0; rc == 0 && k < r->G * n; k++) {
        const char *p = all + (size_t)k * rec;
        wire_head h;
        memcpy(&h, p, sizeof h);
        if (h.agent < 0) continue;
        agent *g = &r->ag[h.agent];
        g->n_tok = h.n_tok, g->entropy = h.entropy;
        memcpy(g->tok, p + sizeof h, sizeof(int) * (size_t)h.n_tok);
    }
    free(buf);
    return rc;
}

// MPI: the critic runs on rank 0's replica group; its verdict goes to every rank.
static int share_verdict(run *r, int rc, verr *err) {
    if (r->G <= 1) return rc;
    struct { int rc; critic_verdict v; char msg[512]; } mine = { rc, r->verdict, "" }, *all;
    if (rc) snprintf(mine.msg, sizeof mine.msg, "%.500s", err->msg);
    if (!(all = calloc((size_t)r->G, sizeof *all))) return verr_set(err, "out of memory");
    if (r->o->ranks->gather(r->o->ranks, &mine, sizeof mine, all, err)) {
        free(all);
        return -1;
    }
    r->verdict = all[0].v;
    rc = all[0].rc ? verr_set(err, "%s", all[0].msg) : 0;
    free(all);
    return rc;
}

// Lowest entropy wins; ties go to the lower index.
static int pick(const run *r) {
    int best = 0;
    for (int a = 1; a < r->o->n_agents; a++)
        if (r->ag[a].entropy < r->ag[best].entropy) best = a;
    return best;
}

static int emit(run *r, agents_event *e) { return r->o->on_event ? r->o->on_event(r->o->ud, e) : 0; }

static int emit_step(run *r, int step) {
    agents_proposal props[AGENTS_MAX];
    for (int a = 0; a < r->o->n_agents; a++) {
        const agent *g = &r->ag[a];
        props[a] = (agents_proposal){ a, r->o->agents[a], g->tok, g->n_tok, g->entropy };
    }
    agents_event e = { .kind = AGENTS_STEP, .step = step, .pos = r->n, .props = props, .n_props = r->o->n_agents,
                       .chosen = r->winner, .logits = r->rp[0].root };
    return emit(r, &e);
}

// The critic's verdict and what it causes. Returns 1 when the text was rolled back.
static int check(run *r, int step, agents_result *res, verr *err) {
    const agents_opts *o = r->o;
    free(r->text);
    r->text = tokenizer_decode(r->reps[0].tok, r->ids + r->n_prompt, r->n - r->n_prompt, 1, err);
    if (!r->text) return -1;
    double t0 = gen_now(), c0 = cpu_now();
    int judged = r->g == 0 ? dispatch(r, 1u << o->critic_dev, job_critic, err) : 0;
    if (share_verdict(r, judged, err)) return -1;
    res->critic_s += gen_now() - t0;
    res->critic_cpu += cpu_now() - c0;
    res->critic_fed += r->verdict.n_fed;
    res->checks++;
    agents_event e = { .kind = AGENTS_CRITIC, .step = step, .pos = r->n, .verdict = r->verdict };
    int removable = r->n - r->n_prompt;
    if (!r->verdict.good)
        e.action = r->rb_at[r->n] >= AGENTS_ROLLBACK_GUARD || removable == 0 ? CRITIC_ACCEPT : CRITIC_ROLLBACK;
    int stop = emit(r, &e);  // a stop request still lets the verdict's rollback happen: the log stays consistent
    if (e.action != CRITIC_ROLLBACK) return stop ? -2 : 0;
    r->rb_at[r->n]++;
    r->roll_to = r->n - (o->rollback < removable ? o->rollback : removable);
    if (dispatch(r, r->active, job_truncate, err)) return -1;
    agents_event rb = { .kind = AGENTS_ROLLBACK, .step = step, .pos = r->n, .from_pos = r->n, .to_pos = r->roll_to };
    r->n = r->roll_to;
    r->pending = 1;
    res->rollbacks++;
    return emit(r, &rb) || stop ? -2 : 1;
}

// One step: shared forward, proposals, winner, commit. Returns 1 at a stop id.
static int step_once(run *r, int step, agents_result *res, verr *err) {
    if (step > r->step_cap) {  // rollbacks make the step count open-ended
        size_t cap = r->step_cap ? 2 * (size_t)r->step_cap : 256;
        double *g = realloc(res->step_s, sizeof(double) * cap);
        if (g) res->step_s = g;
        double *h = g ? realloc(res->step_cpu, sizeof(double) * cap) : NULL;
        if (!g || !h) return verr_set(err, "out of memory");
        res->step_cpu = h, r->step_cap = (int)cap;
    }
    double t0 = gen_now(), c0 = cpu_now();
    if (dispatch(r, r->active, job_round, err) || exchange(r, err)) return -1;
    r->winner = pick(r);
    agent *g = &r->ag[r->winner];
    if (g->n_tok > 1 && dispatch(r, r->active, job_commit, err)) return -1;
    res->step_s[step - 1] = gen_now() - t0;
    res->step_cpu[step - 1] = cpu_now() - c0;
    int halt = emit_step(r, step);  // the step's tokens count even when asked to stop
    int stop = session_is_stop(&r->reps[0], g->tok[g->n_tok - 1]);
    int keep = g->n_tok - stop;
    memcpy(r->ids + r->n, g->tok, sizeof(int) * (size_t)keep);
    r->n += keep;
    r->pending = !stop;
    return halt ? -2 : stop;
}

static int loop(run *r, agents_result *res, verr *err) {
    const agents_opts *o = r->o;
    int ctx = r->reps[0].ctx;
    for (int step = 1;; step++) {
        int left = o->max_new - (r->n - r->n_prompt);
        r->w = r->W < left ? r->W : left;
        if (ctx - r->n < r->w) r->w = ctx - r->n;
        if (left <= 0) break;
        if (r->w <= 0) {
            res->hit_ctx = 1;
            break;
        }
        int rc = step_once(r, step, res, err);
        if (rc != -1) res->steps = step;
        if (rc < 0) return rc == -2 ? 0 : -1;
        res->hit_eos = rc;
        if (o->cr && o->check_every > 0 && step % o->check_every == 0) {
            int c = check(r, step, res, err);
            if (c < 0) return c == -2 ? 0 : -1;
            if (c == 1) res->hit_eos = 0;
        }
        if (res->hit_eos) break;
    }
    return 0;
}

int agents_generate(session *reps, dev_pool *pool, const int *prompt, int n_prompt, const agents_opts *o,
                    agents_result *res, verr *err) {
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    if (o->n_agents < 1 || o->n_agents > AGENTS_MAX) return verr_set(err, "need 1..%d agents", AGENTS_MAX);
    if (n_prompt <= 0) return verr_set(err, "empty prompt");
    if (n_prompt >= reps[0].ctx)
        return verr_set(err, "the prompt is %d tokens but the context holds %d (raise --ctx)", n_prompt, reps[0].ctx);
    if (logit_bias_check(o->bias, o->n_bias, reps[0].m.cfg.vocab_size, err)) return -1;
    if (o->cr && o->check_every > 0 && !reps[0].tok)
        return verr_set(err, "the critic reads text, but %s has no tokenizer.json", reps[0].m.dir);
    run r;
    int rc = run_init(&r, reps, pool, o, err);
    int cap = n_prompt + (o->max_new > 0 ? o->max_new : 0) + r.W + 1;
    res->ids = rc ? NULL : malloc(sizeof(int) * (size_t)cap);
    if (rc == 0 && !res->ids) rc = verr_set(err, "out of memory");
    if (rc == 0) {
        r.ids = res->ids, r.n = r.n_prompt = n_prompt;
        memcpy(r.ids, prompt, sizeof(int) * (size_t)n_prompt);
        r.pending = 1;
        double t0 = gen_now();
        rc = dispatch(&r, r.active, job_prefill, err);
        res->prefill_s = gen_now() - t0;
        t0 = gen_now();
        if (rc == 0) rc = loop(&r, res, err);
        res->gen_s = gen_now() - t0;
    }
    res->n_gen = r.ids ? r.n - n_prompt : 0;
    run_free(&r);
    return rc;
}

void agents_result_free(agents_result *r) {
    free(r->ids), free(r->step_s), free(r->step_cpu);
    memset(r, 0, sizeof *r);
}
