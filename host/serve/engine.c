// engine.c: the server on the scheduler (host/decode/sched.h). One thread takes requests
// from the queue while the scheduler has rows for them, submits each of a request's
// choices (n for each of its prompts) as a sequence (a prompt's choice i: seed + i; the
// later choices map the first one's prompt), steps the scheduler (one forward for every running choice of every request,
// with all the forward threads), and answers each request once its choices have ended.
// The per-token output (text, stop strings, logprobs, metrics, SSE events) is jobs.c's,
// called from the sequences' callbacks. /metrics reads a snapshot of the statistics.
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/decode/sched.h"
#include "host/serve/internal.h"
#include "kernels/ops.h"

typedef struct ejob ejob;
typedef struct server_engine server_engine;

// One choice of a running request.
typedef struct {
    ejob *x;
    int index;
    server_choice *c;
} echoice;

// A running request.
struct ejob {
    server_job *j;
    int n_ch;               // n per prompt, prompt by prompt (jobs.c's choice index)
    echoice *ch;            // [n_ch]
    sbuf *out;              // [n_ch] each choice's JSON (not streamed), joined in order at the end
    int left;               // choices not ended yet
    int ran, failed, cut;
    verr err;
    ejob *next;
};

struct server_engine {
    server *s;
    sched *q;
    volatile sig_atomic_t halt;  // the server stops: every sequence ends at its next step
    pthread_t th;
    int started;
    ejob *jobs;
    int rows;
    // /metrics: a snapshot taken after every step, under mu
    pthread_mutex_t mu;
    sched_stats snap;
    double rate;            // generated tokens per second over the last few seconds
    double rate_t;          // when the rate was last updated
    long rate_tokens;       // generated tokens then
};

int server_engine_usable(const server *s) {
    const session *b = s->base;
    // On CUDA one sequence decodes faster through generate(), whose draws stay on the
    // device; the scheduler brings each row's logits back (docs/cuda.md, Many streams).
    if (b->cu && s->o.parallel == 1) return 0;
    return !s->o.tp && !b->tpl && b->m.tp.size <= 1 && !probe_spec_active(s->o.probe);
}

// ---- requests ---------------------------------------------------------------------

// Every choice has ended: the answer, in choice order.
static void job_done(server_engine *e, ejob *x) {
    server_job *j = x->j;
    sbuf choices = { 0 };
    for (int i = 0; i < x->n_ch && !j->req.stream; i++) {
        if (!x->out[i].len) continue;
        if (choices.len) sb_puts(&choices, ",");
        sb_put(&choices, x->out[i].p, x->out[i].len);
    }
    server_job_finish(j, &choices, x->ran, x->failed, x->cut, &x->err);
    sb_free(&choices);
    for (int i = 0; i < x->n_ch; i++) sb_free(&x->out[i]);
    for (ejob **at = &e->jobs; *at; at = &(*at)->next)
        if (*at == x) {
            *at = x->next;
            break;
        }
    server *s = e->s;
    pthread_mutex_lock(&s->mu);
    s->busy--;
    pthread_mutex_unlock(&s->mu);
    server_job_release(j);
    free(x->ch), free(x->out);
    free(x);
}

// Choice ch ended (rc, its statistics in the choice, why when it failed).
static void choice_done(ejob *x, echoice *ch, int rc, const char *why, server_engine *e) {
    verr err = { { 0 } };
    if (rc) snprintf(err.msg, sizeof err.msg, "%s", why);
    int cut = 0, n = server_choice_end(ch->c, rc, &x->out[ch->index], &cut, &err);
    ch->c = NULL;
    if (n < 0 && !x->failed) x->failed = 1, x->err = err;
    if (n > 0) x->j->completion_tokens += n;
    x->cut |= cut;
    if (--x->left == 0) job_done(e, x);
}

static void on_seq_done(void *ud, int rc, const gen_stats *st, const char *why) {
    echoice *ch = ud;
    *server_choice_stats(ch->c) = *st;
    choice_done(ch->x, ch, rc, why, ch->x->j->srv->engine);
}

// A request leaves the queue: its choices become sequences (a cancelled one ends at once).
static void start_job(server_engine *e, server_job *j) {
    int total = j->req.n * j->n_prompts;
    ejob *x = calloc(1, sizeof *x);
    if (x && (!(x->ch = calloc((size_t)total, sizeof *x->ch)) || !(x->out = calloc((size_t)total, sizeof *x->out)))) {
        free(x->ch), free(x);
        x = NULL;
    }
    if (!x) {  // no memory to run it: answered as failed by the slot code's path
        server_job_start(j, 0);
        verr err = { { 0 } };
        snprintf(err.msg, sizeof err.msg, "out of memory");
        sbuf none = { 0 };
        server_job_finish(j, &none, 0, 1, 0, &err);
        pthread_mutex_lock(&e->s->mu);
        e->s->busy--;
        pthread_mutex_unlock(&e->s->mu);
        server_job_release(j);
        return;
    }
    x->j = j, x->n_ch = total, x->next = e->jobs, e->jobs = x;
    server_job_start(j, 0);
    int n = j->started && !atomic_load(&e->s->stopping) ? total : 0;
    x->left = n + 1;  // + 1 until every choice is submitted
    int i = 0;
    for (; i < n && !x->failed; i++) {
        echoice *ch = &x->ch[i];
        ch->x = x, ch->index = i;
        verr err = { { 0 } };
        session *b = e->s->base;
        // the request's adapters for its echo's scoring pass; the scheduler applies them to its rows
        int rc = server_choice_begin(j, i, b, NULL, j->n_lora > 0, &ch->c, &err);
        if (j->n_lora > 0 && session_set_lora(b, b->lora, b->n_adapters, &err) && rc == 0) rc = -1;
        x->ran++;
        if (!ch->c) {
            x->failed = 1, x->err = err;
            break;
        }
        gen_opts *g = server_choice_opts(ch->c);
        const job_prompt *p = &j->prompts[i / j->req.n];
        sched_seq r = { p->ids, p->n_ids, g, j->lora, j->n_lora, on_seq_done, ch };
        if (rc == 0 && g->max_new > 0 && sched_submit(e->q, &r, &err) == 0) continue;
        choice_done(x, ch, rc, err.msg, e);  // failed to start, or max_tokens 0: the echo alone
    }
    x->left -= n - i;  // after a failure, the choices never begun
    if (--x->left == 0) job_done(e, x);
}

// ---- the thread -------------------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void snapshot(server_engine *e) {
    sched_stats st;
    sched_get_stats(e->q, &st);
    double t = now_s();
    pthread_mutex_lock(&e->mu);
    e->snap = st;
    if (t - e->rate_t >= 2) {  // tokens per second over windows of at least 2 s
        e->rate = e->rate_t > 0 ? (st.generated - e->rate_tokens) / (t - e->rate_t) : 0;
        e->rate_t = t, e->rate_tokens = st.generated;
    }
    pthread_mutex_unlock(&e->mu);
}

static void nap_ms(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static void *engine_main(void *arg) {
    server_engine *e = arg;
    server *s = e->s;
    cpu_set_threads(s->o.threads > 0 ? s->o.threads : 0);  // every forward thread, whatever runs
    for (;;) {
        int busy = e->jobs != NULL || sched_pending(e->q) > 0;
        server_job *j;
        while (sched_pending(e->q) < e->rows && (j = server_queue_pop(s, !busy))) {
            start_job(e, j);
            busy = 1;
        }
        if (!busy) {
            if (atomic_load(&s->stopping)) break;
            continue;
        }
        if (atomic_load(&s->stopping)) e->halt = 1;  // as the slots stop at their next token
        verr err;
        if (sched_pending(e->q) > 0) sched_step(e->q, &err);  // only running out of memory fails it
        snapshot(e);
        if (s->o.token_delay_ms > 0) nap_ms(s->o.token_delay_ms);  // once per step: every choice's token
    }
    snapshot(e);
    return NULL;
}

int server_engine_start(server *s, verr *err) {
    server_engine *e = calloc(1, sizeof *e);
    if (!e) return verr_set(err, "out of memory");
    e->s = s, e->rows = s->o.parallel;
    pthread_mutex_init(&e->mu, NULL);
    // The pool holds --parallel whole contexts unless told (the memory of as many slots).
    long tokens = s->o.kv_pool_tokens || s->o.kv_pool_mb ? s->o.kv_pool_tokens : (long)s->o.parallel * s->base->ctx;
    sched_opts so = { .parallel = s->o.parallel, .pool_mb = s->o.kv_pool_mb, .pool_tokens = tokens,
                      .no_reuse = s->o.no_prefix_cache, .interrupt = &e->halt };
    if (sched_open(&e->q, s->base, &so, err)) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        return -1;
    }
    s->engine = e;
    s->n_slots = s->o.parallel;  // /health's slots: sequences decoded together
    if (pthread_create(&e->th, NULL, engine_main, e) != 0) return verr_set(err, "cannot start the engine thread");
    e->started = 1;
    return 0;
}

void server_engine_stop(server *s) {
    server_engine *e = s->engine;
    if (!e) return;
    if (e->started) pthread_join(e->th, NULL);
    sched_close(e->q);  // what is left ends (nothing, after a drain)
    while (e->jobs) job_done(e, e->jobs);
    pthread_mutex_destroy(&e->mu);
    free(e);
    s->engine = NULL;
    s->n_slots = 0;
}

// ---- /metrics -----------------------------------------------------------------------

static void metric(sbuf *b, const char *name, const char *type, const char *help, double v) {
    sb_printf(b, "# HELP varent_%s %s\n# TYPE varent_%s %s\nvarent_%s %.17g\n", name, help, name, type, name, v);
}

void server_metrics(server *s, sbuf *b) {
    pthread_mutex_lock(&s->mu);
    int queued = s->queued, busy = s->busy;
    long requests = s->n_requests, cancelled = s->n_cancelled, rejected = s->n_rejected;
    pthread_mutex_unlock(&s->mu);
    metric(b, "requests_running", "gauge", "Requests being answered.", busy);
    metric(b, "requests_queued", "gauge", "Requests waiting for the scheduler.", queued);
    metric(b, "requests_total", "counter", "Completion requests received.", requests);
    metric(b, "requests_cancelled_total", "counter", "Requests whose client went away.", cancelled);
    metric(b, "requests_rejected_total", "counter", "Requests refused because the queue was full (503).", rejected);
    server_engine *e = s->engine;
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    sched_stats st = e->snap;
    double rate = e->rate;
    pthread_mutex_unlock(&e->mu);
    metric(b, "sequences_running", "gauge", "Choices decoding or prefilling together.", st.running);
    metric(b, "sequences_queued", "gauge", "Choices waiting for KV pool blocks or a row.", st.queued);
    metric(b, "kv_pool_blocks", "gauge", "Blocks of the paged KV pool.", st.pool_blocks);
    metric(b, "kv_pool_block_positions", "gauge", "Positions per block.", st.block);
    metric(b, "kv_pool_blocks_used", "gauge", "Blocks mapped by sequences and kept prompts.", st.pool_used);
    metric(b, "kv_pool_usage_ratio", "gauge", "Used blocks over all blocks.",
           st.pool_blocks ? (double)st.pool_used / st.pool_blocks : 0);
    metric(b, "prompt_tokens_total", "counter", "Prompt positions admitted.", (double)st.prompt_tokens);
    metric(b, "prefix_cache_hit_tokens_total", "counter", "Prompt positions found in the caches, not computed.",
           (double)st.reused_tokens);
    metric(b, "prefix_cache_hit_rate", "gauge", "Reused over admitted prompt positions.",
           st.prompt_tokens ? (double)st.reused_tokens / st.prompt_tokens : 0);
    metric(b, "kv_pool_evictions_total", "counter", "Idle prefix blocks handed out again.", (double)st.evictions);
    metric(b, "generation_tokens_total", "counter", "Tokens generated.", (double)st.generated);
    metric(b, "tokens_per_second", "gauge", "Tokens generated per second, over the last seconds.", rate);
    metric(b, "decode_steps_total", "counter", "Batched forward passes of the decode.", (double)st.steps);
    metric(b, "decode_rows_total", "counter", "Rows of those passes (rows / steps: the mean batch).", (double)st.rows);
}
