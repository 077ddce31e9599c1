// follow.c: `varent serve` under mpirun with tensor parallelism. Rank 0 serves HTTP on
// one slot; before running a request it sends the body, the chat flag and the seed to
// the other ranks, which parse it with the same code and run the same generation with
// their share of the model, writing nothing. Whether a choice or a token goes on is rank
// 0's decision (a client gone, a stop string, shutdown), shared at every step, so every
// rank makes the same forward passes and collectives.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/serve/internal.h"
#include "host/runtime/tp_mpi.h"

enum { RECIPE_STOP = 0, RECIPE_JOB = 1 };

typedef struct {
    int32_t kind, chat;
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
    recipe r = { RECIPE_JOB, j->raw_chat, j->seed, j->raw_len };
    char *echo = NULL;
    if (exchange_recipe(s, &r, err) || exchange_body(s, j->raw, j->raw_len, &echo, err)) return -1;
    free(echo);
    return 0;
}

void server_tp_stop(server *s) {
    recipe r = { RECIPE_STOP, 0, 0, 0 };
    verr err;
    if (exchange_recipe(s, &r, &err)) fprintf(stderr, "varent serve: telling the other ranks to stop: %s\n", err.msg);
}

int server_tp_agree(server *s, int mine) {
    tp_comm *c = s->o.tp;
    int32_t v = mine, *all = calloc((size_t)c->size, sizeof *all);
    verr err;
    if (!all || c->gather(c, &v, sizeof v, all, &err)) {
        fprintf(stderr, "varent serve: rank %d: agreeing with rank 0: %s\n", c->rank, all ? err.msg : "out of memory");
        free(all);
        return 1;  // stop: the group is broken
    }
    v = all[0];
    free(all);
    return v;
}

// One request from rank 0, run here as rank 0 runs it.
static int follow_one(server *s, const recipe *r, verr *err) {
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
    if (rc == 0) {
        j->seed = r->seed;  // the one rank 0 drew
        server_run_job(&s->slots[0], j);
    }
    server_job_release(j);
    return rc;
}

int server_follow(session *base, const server_opts *o, verr *err) {
    server *s = calloc(1, sizeof *s);
    if (!s) return verr_set(err, "out of memory");
    s->o = *o, s->base = base;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->threads_per_slot = o->threads > 0 ? o->threads : cpu_set_threads(0);
    int rc = server_setup_model(s, err) || server_adapters_load(s, err) || server_slot_inline(s, err) ? -1 : 0;
    if (tp_agree(o->tp, rc == 0, err->msg, err)) rc = -1;  // with rank 0's server_start
    s->tp_live = rc == 0;
    cpu_set_threads(s->threads_per_slot);
    for (recipe r; rc == 0;) {
        memset(&r, 0, sizeof r);
        if (exchange_recipe(s, &r, err)) rc = -1;
        else if (r.kind == RECIPE_STOP) break;
        else rc = follow_one(s, &r, err);
    }
    server_stop(s);
    return rc;
}
