// follow.c: `varent serve` under mpirun with tensor parallelism. Rank 0 serves HTTP;
// before running a request it sends the body, the chat flag, the seed and its slot to
// the other ranks, which parse it with the same code and run the same generation with
// their share of the model, writing nothing. Whether a choice or a token goes on is rank
// 0's decision (a client gone, a stop string, shutdown), shared at every step, so every
// rank makes the same forward passes and collectives.
// With --parallel N > 1 every rank runs N slots, and the slots take turns: each forward
// call and agreement of a slot is a turn. Rank 0's slot holds tp_mu through its turn and
// first tells the others whose turn it is; their dispatcher (server_follow) lets the
// slot of that index make its next collectives and waits until it has. So the calls
// reach every rank's communicator in the same order (docs/distributed.md).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/serve/internal.h"
#include "host/runtime/tp_mpi.h"

enum { RECIPE_STOP = 0, RECIPE_JOB = 1, RECIPE_TURN = 2 };

typedef struct {
    int32_t kind, chat, slot, pad;
    uint64_t seed;
    uint64_t len;  // body bytes that follow
} recipe;

// Rank 0's recipe on every rank (the others wait here between requests: idle gather).
static int exchange_recipe(server *s, recipe *r, verr *err) {
    tp_comm *c = s->o.tp;
    recipe *all = calloc((size_t)c->size, sizeof *all);
    if (!all) return verr_set(err, "out of memory");
    int rc = c->gather_idle(c, r, sizeof *r, all, err);
    if (rc == 0) *r = all[0];
    free(all);
    return rc;
}

// Rank 0's len bytes of body on every rank; *body malloc'd and NUL-terminated.
static int exchange_body(server *s, const char *mine, size_t len, char **body, verr *err) {
    tp_comm *c = s->o.tp;
    char *all = calloc((size_t)c->size, len + 1), *own = calloc(1, len + 1);
    if (!all || !own) {
        free(all), free(own);
        return verr_set(err, "out of memory receiving a %zu-byte request", len);
    }
    if (mine) memcpy(own, mine, len);
    int rc = c->gather(c, own, len + 1, all, err);
    free(own);
    if (rc) return free(all), -1;
    all[len] = 0;
    *body = all;  // rank 0's block is the first
    return 0;
}

int server_tp_announce(server *s, server_job *j, verr *err) {
    recipe r = { RECIPE_JOB, j->raw_chat, j->slot, 0, j->seed, j->raw_len };
    char *echo = NULL;
    pthread_mutex_lock(&s->tp_mu);  // between two turns of the other slots
    int rc = exchange_recipe(s, &r, err) || exchange_body(s, j->raw, j->raw_len, &echo, err) ? -1 : 0;
    pthread_mutex_unlock(&s->tp_mu);
    free(echo);
    return rc;
}

void server_tp_stop(server *s) {
    recipe r = { RECIPE_STOP, 0, 0, 0, 0, 0 };
    verr err;
    pthread_mutex_lock(&s->tp_mu);
    if (exchange_recipe(s, &r, &err)) fprintf(stderr, "varent serve: telling the other ranks to stop: %s\n", err.msg);
    pthread_mutex_unlock(&s->tp_mu);
}

int server_tp_agree(server_job *j, int mine) {
    server *s = j->srv;
    tp_comm *c = s->o.tp;
    session *ss = &s->slots[j->slot].s;
    int32_t v = mine, *all = calloc((size_t)c->size, sizeof *all);
    verr err;
    int turn = all && !session_turn_begin(ss, &err);
    if (!turn || c->gather(c, &v, sizeof v, all, &err)) {
        fprintf(stderr, "varent serve: rank %d: agreeing with rank 0: %s\n", c->rank, all ? err.msg : "out of memory");
        if (turn) session_turn_end(ss);
        free(all);
        return 1;  // stop: the group is broken
    }
    session_turn_end(ss);
    v = all[0];
    free(all);
    return v;
}

// ---- turns (--parallel > 1) ----
static int turn_begin(void *ud, verr *err) {
    server_slot *sl = ud;
    server *s = sl->srv;
    int me = (int)(sl - s->slots);
    pthread_mutex_lock(&s->tp_mu);
    if (s->o.tp->rank == 0) {  // held until turn_end
        recipe r = { RECIPE_TURN, 0, me, 0, 0, 0 };
        if (exchange_recipe(s, &r, err)) {
            pthread_mutex_unlock(&s->tp_mu);
            return -1;
        }
        return 0;
    }
    while (s->tp_turn != me && !s->tp_stop) pthread_cond_wait(&s->tp_cv, &s->tp_mu);
    int stopped = s->tp_turn != me;
    pthread_mutex_unlock(&s->tp_mu);
    return stopped ? verr_set(err, "rank 0 stopped the server") : 0;
}

static void turn_end(void *ud) {
    server_slot *sl = ud;
    server *s = sl->srv;
    if (s->o.tp->rank > 0) {
        pthread_mutex_lock(&s->tp_mu);
        s->tp_turn = -1;  // the dispatcher goes on
        pthread_cond_broadcast(&s->tp_cv);
    }
    pthread_mutex_unlock(&s->tp_mu);
}

void server_tp_init(server *s) {
    pthread_mutex_init(&s->tp_mu, NULL);
    pthread_cond_init(&s->tp_cv, NULL);
    s->tp_turns = s->o.tp && s->o.parallel > 1;
    s->tp_turn = -1;
}

void server_tp_free(server *s) {
    pthread_mutex_destroy(&s->tp_mu);
    pthread_cond_destroy(&s->tp_cv);
}

void server_tp_slot(server_slot *sl) {
    if (!sl->srv->tp_turns) return;
    sl->turn = (session_turn){ turn_begin, turn_end, sl };
    sl->s.turn = &sl->turn;
}

void *server_tp_slot_main(void *arg) {
    server_slot *sl = arg;
    server *s = sl->srv;
    cpu_set_threads(s->threads_per_slot);
    pthread_mutex_lock(&s->tp_mu);
    for (;;) {
        while (!sl->job && !s->tp_stop) pthread_cond_wait(&s->tp_cv, &s->tp_mu);
        server_job *j = sl->job;
        if (!j) break;
        sl->job = NULL;
        pthread_cond_broadcast(&s->tp_cv);  // the dispatcher may wait to hand over the next
        pthread_mutex_unlock(&s->tp_mu);
        server_run_job(sl, j);
        server_job_release(j);
        pthread_mutex_lock(&s->tp_mu);
    }
    pthread_mutex_unlock(&s->tp_mu);
    return NULL;
}

// The dispatcher: slot k's turn, until it has made its collectives.
static int give_turn(server *s, int k, verr *err) {
    if (k < 0 || k >= s->n_slots) return verr_set(err, "rank 0 gave a turn to slot %d of %d", k, s->n_slots);
    pthread_mutex_lock(&s->tp_mu);
    s->tp_turn = k;
    pthread_cond_broadcast(&s->tp_cv);
    while (s->tp_turn != -1) pthread_cond_wait(&s->tp_cv, &s->tp_mu);
    pthread_mutex_unlock(&s->tp_mu);
    return 0;
}

// The dispatcher: a job for slot k, once the slot took its last one.
static void hand_over(server *s, server_job *j, int k) {
    server_slot *sl = &s->slots[k];
    pthread_mutex_lock(&s->tp_mu);
    while (sl->job) pthread_cond_wait(&s->tp_cv, &s->tp_mu);
    sl->job = j;
    pthread_cond_broadcast(&s->tp_cv);
    pthread_mutex_unlock(&s->tp_mu);
}

static void stop_turns(server *s) {
    pthread_mutex_lock(&s->tp_mu);
    s->tp_stop = 1;
    pthread_cond_broadcast(&s->tp_cv);
    pthread_mutex_unlock(&s->tp_mu);
}

// One request from rank 0, run here as rank 0 runs it (with turns: on its slot's thread).
static int follow_one(server *s, const recipe *r, verr *err) {
    if (r->slot < 0 || r->slot >= s->n_slots) return verr_set(err, "rank 0 sent a job for slot %d", r->slot);
    char *body;
    if (exchange_body(s, NULL, (size_t)r->len, &body, err)) return -1;
    server_job *j = server_job_new(s);
    if (!j) return free(body), verr_set(err, "out of memory");
    char msg[1200];
    const char *param, *code;
    int rc = server_parse_request(body, (size_t)r->len, r->chat, &j->req, err);
    if (rc == 0 && server_prepare_job(s, j, msg, sizeof msg, &param, &code))
        rc = verr_set(err, "rank %d cannot prepare a request rank 0 accepted: %s", s->o.tp->rank, msg);
    free(body);
    if (rc == 0) j->seed = r->seed;  // the one rank 0 drew
    if (rc == 0 && s->tp_turns) {
        hand_over(s, j, r->slot);
        return 0;
    }
    if (rc == 0) server_run_job(&s->slots[0], j);
    server_job_release(j);
    return rc;
}

int server_follow(session *base, const server_opts *o, verr *err) {
    server *s = calloc(1, sizeof *s);
    if (!s) return verr_set(err, "out of memory");
    s->o = *o, s->base = base;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    server_tp_init(s);
    int total = o->threads > 0 ? o->threads : cpu_set_threads(0);
    s->threads_per_slot = total / o->parallel > 0 ? total / o->parallel : 1;  // as rank 0 splits them
    int rc = server_setup_model(s, err) || server_adapters_load(s, err) ||
                     (s->tp_turns ? server_slots_start(s, err) : server_slot_inline(s, err))
                 ? -1
                 : 0;
    if (tp_agree(o->tp, rc == 0, err->msg, err)) rc = -1;  // with rank 0's server_start
    s->tp_live = rc == 0;
    cpu_set_threads(s->threads_per_slot);
    for (recipe r; rc == 0;) {
        memset(&r, 0, sizeof r);
        if (exchange_recipe(s, &r, err)) rc = -1;
        else if (r.kind == RECIPE_STOP) break;
        else rc = r.kind == RECIPE_TURN ? give_turn(s, r.slot, err) : follow_one(s, &r, err);
    }
    stop_turns(s);  // the slots' threads end (server_stop joins them)
    server_stop(s);
    return rc;
}
