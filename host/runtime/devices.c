// devices.c: see devices.h. The pool is a generation counter under one mutex: the
// caller publishes a job and bumps the generation, each selected thread runs it once
// and counts itself done; the caller waits for the count.
#include "host/runtime/devices.h"

#include "host/formats/model_path.h"

#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

// One entry of the list: [start, end) of list.
static int parse_entry(const char *list, const char *s, const char *e, device_spec *d, verr *err) {
    size_t n = (size_t)(e - s);
    char buf[32];
    if (n == 0)
        return verr_set(err, "--devices '%s': empty entry at offset %ld (use e.g. cpu, 0,1 or cuda:0)", list,
                        (long)(s - list));
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, s, n), buf[n] = 0;
    const char *idx = NULL;
    if (!strcmp(buf, "cpu") || !strcmp(buf, "cuda")) {
        snprintf(d->name, sizeof d->name, "%s", buf);
        return 0;
    }
    if (!strncmp(buf, "cuda:", 5)) idx = buf + 5;
    else if (isdigit((unsigned char)buf[0])) idx = buf;
    int ok = idx && *idx && strlen(idx) <= 3;
    for (const char *q = idx; ok && *q; q++) ok = isdigit((unsigned char)*q);
    if (!ok)
        return verr_set(err, "--devices '%s': entry '%.*s' at offset %ld is not cpu, cuda, cuda:N or a GPU index N",
                        list, (int)(e - s), s, (long)(s - list));
    snprintf(d->name, sizeof d->name, "cuda:%d", atoi(idx));
    return 0;
}

int devices_parse(const char *list, device_spec *out, verr *err) {
    if (!list || !*list) return verr_set(err, "--devices: empty list (use e.g. cpu, 0,1 or cuda:0)");
    int n = 0;
    for (const char *s = list;; n++) {
        const char *e = strchr(s, ',');
        if (!e) e = s + strlen(s);
        if (n == DEVICES_MAX) return verr_set(err, "--devices '%s': more than %d entries", list, DEVICES_MAX);
        if (parse_entry(list, s, e, &out[n], err)) return -1;
        if (!*e) return n + 1;
        s = e + 1;
    }
}

struct dev_pool {
    int n;
    pthread_t th[DEVICES_MAX];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen;  // bumped per job
    unsigned mask;
    int pending, quit;
    dev_job fn;
    void *ud;
    struct worker {
        dev_pool *p;
        int dev;
    } w[DEVICES_MAX];
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    dev_pool *p = w->p;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        if (!(p->mask & (1u << w->dev))) continue;
        dev_job fn = p->fn;
        void *ud = p->ud;
        pthread_mutex_unlock(&p->mu);
        fn(ud, w->dev);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int dev_pool_start(dev_pool **out, int n, verr *err) {
    if (n < 1 || n > DEVICES_MAX) return verr_set(err, "device pool: %d devices (1..%d)", n, DEVICES_MAX);
    dev_pool *p = calloc(1, sizeof *p);
    if (!p) return verr_set(err, "out of memory");
    p->n = n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int d = 0; n > 1 && d < n; d++) {
        p->w[d] = (struct worker){ p, d };
        if (pthread_create(&p->th[d], NULL, worker_main, &p->w[d])) {
            p->n = d;  // stop the ones started
            dev_pool_stop(p);
            return verr_set(err, "cannot start the thread of device %d", d);
        }
    }
    *out = p;
    return 0;
}

int dev_pool_size(const dev_pool *p) { return p->n; }

void dev_pool_run(dev_pool *p, unsigned mask, dev_job fn, void *ud) {
    mask &= p->n >= 32 ? ~0u : (1u << p->n) - 1;
    if (!mask) return;
    if (p->n == 1) {
        fn(ud, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn, p->ud = ud, p->mask = mask;
    p->pending = __builtin_popcount(mask);
    p->gen++;
    pthread_cond_broadcast(&p->go);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void dev_pool_stop(dev_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int d = 0; p->n > 1 && d < p->n; d++) pthread_join(p->th[d], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p);
}

typedef struct {
    const device_spec *specs;
    const session_opts *o;
    session *sessions;
    int rc[DEVICES_MAX];
    verr err[DEVICES_MAX];
} open_job;

static void open_one(void *ud, int d) {
    open_job *j = ud;
    session_opts o = *j->o;
    o.device = j->specs[d].name;
    j->rc[d] = session_open(&j->sessions[d], &o, &j->err[d]);
}

static void close_one(void *ud, int d) {
    open_job *j = ud;
    if (j->rc[d] == 0) session_close(&j->sessions[d]);
}

int devices_open(dev_pool *p, unsigned mask, const device_spec *specs, const session_opts *o, session *sessions,
                 verr *err) {
    // -m resolved once: a GGUF's first use is hashed and converted once, not by every
    // device at the same time into one temporary directory
    model_path mp;
    if (model_path_resolve(o->model_dir, o->progress, &mp, err)) return -1;
    session_opts one = *o;
    one.model_dir = mp.dir;
    open_job *j = calloc(1, sizeof *j);
    if (!j) return verr_set(err, "out of memory");
    j->specs = specs, j->o = &one, j->sessions = sessions;
    for (int d = 0; d < DEVICES_MAX; d++) j->rc[d] = -1;
    dev_pool_run(p, mask, open_one, j);
    int bad = -1;
    for (int d = 0; d < p->n && bad < 0; d++)
        if ((mask & (1u << d)) && j->rc[d]) bad = d;
    if (bad >= 0) {
        verr_set(err, "device %s (--devices entry %d): %s", specs[bad].name, bad + 1, j->err[bad].msg);
        dev_pool_run(p, mask, close_one, j);
    }
    free(j);
    return bad >= 0 ? -1 : 0;
}
