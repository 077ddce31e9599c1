// session_tpl.c: tensor parallelism in one process over several GPUs (varent run
// --devices 0,1 --tp 2; docs/distributed.md). The session is rank 0: s->m is rank
// 0's shard, s->fw / s->cu its forward, s->kv its KV cache, so everything that reads a
// session (the sampler, the metrics, the logits) reads rank 0's, which hold the whole
// model's results. Ranks 1.. live here, each with its shard, forward and device, and
// their KV caches hang off the session's caches as peers (kv_cache.peer), so the
// callers' views, branch tails (kv_cache_init_like) and commits cover every rank. A
// forward call runs every rank's forward at once, each on its device's thread (dev_pool),
// and they meet in NCCL collectives; the session's caches give every rank's lengths.
// A second context on the model (critic, server slot: session_tpl_open_shared) has its
// own ranks' forwards and KV shares, borrowing the base's weights, threads and NCCL
// communicators; the base's lock makes the contexts' calls one at a time, so the
// collectives on each communicator come in the same order on every rank.
// LoRA adapters go to every rank's forward (session_tpl_set_lora).
#include "host/runtime/session.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "host/runtime/devices.h"
#include "host/runtime/session_cuda.h"
#include "model/forward_cuda.h"

typedef struct {
    model m;                 // ranks >= 1: a shallow copy of the loaded model, cut to the rank's share
    forward_state fw;
    struct cuda_forward *cu;
    int device;
    kv_view *views;          // [cap] the call's views, translated to this rank's caches
    float *logits;           // [cap, vocab] a batch's logits (ranks >= 1: scratch)
    forward_hooks hooks;     // ranks >= 1: the session's hooks, their callbacks silenced
    int cap;
    int rc;
    verr err;
} tpl_rank;

struct session_tpl {
    int n;
    tpl_rank r[DEVICES_MAX];  // r[0] lends its device and error only: its state is the session's
    dev_pool *pool;
    struct session_tpl *lead; // a second context's: the base's (its pool, weights, communicators)
    pthread_mutex_t mu;       // the lead's: one forward call of any of its contexts at a time
    // the call in flight
    session *s;
    const int *ids;
    int T, batch;
    float *stats;
    double timeout;
    unsigned char id[CUDA_TP_ID_BYTES];
    const lora_use *lora;    // session_tpl_set_lora's adapters
    int n_lora;
};

// --devices as GPU indices, at least --tp of them, no GPU twice.
static int tpl_devices(const session_opts *o, int *dev, verr *err) {
    device_spec spec[DEVICES_MAX];
    int n = devices_parse(o->tp_devices, spec, err), have = session_cuda_devices();
    if (n < 0) return -1;
    if (o->tp > n)
        return verr_set(err, "--tp %d needs %d GPUs, --devices %s lists %d (or launch one rank per GPU: mpirun -np %d "
                        "varent ... --device cuda)", o->tp, o->tp, o->tp_devices, n, o->tp);
    if (have == 0) return session_cuda_parse(spec[0].name, &dev[0], err);  // no CUDA build, or no GPU: say which
    if (o->tp > have)
        return verr_set(err, "--tp %d needs %d GPUs, %d CUDA device%s found", o->tp, o->tp, have, have == 1 ? "" : "s");
    for (int r = 0; r < o->tp; r++) {
        if (strncmp(spec[r].name, "cuda", 4) != 0)
            return verr_set(err, "--devices %s --tp %d: tensor parallelism in one process runs on GPUs; on the CPU, "
                            "launch one rank per process: mpirun -np %d varent ... --tp %d", o->tp_devices, o->tp,
                            o->tp, o->tp);
        if (session_cuda_parse(spec[r].name, &dev[r], err)) return -1;
        for (int q = 0; q < r; q++)
            if (dev[q] == dev[r])
                return verr_set(err, "--devices %s: cuda:%d twice (one GPU per rank)", o->tp_devices, dev[r]);
    }
    return 0;
}

// Rank r's copy of the whole model (it shares the mapped files and tables) cut to its share.
static int cut_rank(const model *whole, int r, int n, model *out, verr *err) {
    tp_shard plan;
    if (tp_shard_plan(&whole->cfg, r, n, &plan, err)) return -1;
    *out = *whole;
    out->layers = malloc(sizeof *out->layers * (size_t)whole->cfg.n_layers);
    if (!out->layers) return verr_set(err, "out of memory");
    memcpy(out->layers, whole->layers, sizeof *out->layers * (size_t)whole->cfg.n_layers);
    out->tp_owned = NULL;
    return model_shard(out, &plan, err);
}

int session_tpl_shard(session *s, const session_opts *o, int *cuda_dev, verr *err) {
    int dev[DEVICES_MAX];
    if (tpl_devices(o, dev, err)) return -1;
    struct session_tpl *t = calloc(1, sizeof *t);
    if (!t) return verr_set(err, "out of memory");
    s->tpl = t;
    pthread_mutex_init(&t->mu, NULL);
    t->n = o->tp;
    for (int r = 0; r < t->n; r++) t->r[r].device = dev[r];
    for (int r = 1; r < t->n; r++)  // before rank 0's cut, which cuts s->m in place
        if (cut_rank(&s->m, r, t->n, &t->r[r].m, err)) return -1;
    tp_shard plan;
    if (tp_shard_plan(&s->m.cfg, 0, t->n, &plan, err) || model_shard(&s->m, &plan, err)) return -1;
    *cuda_dev = dev[0];
    return dev_pool_start(&t->pool, t->n, err);
}

// ---- opening the other ranks, then the NCCL group, every rank on its own thread ----
static void open_job(void *ud, int r) {
    struct session_tpl *t = ud;
    session *s = t->s;
    tpl_rank *R = &t->r[r];
    R->rc = 0;
    if (r == 0) return;  // the session's own forward and cache are open
    kv_cache *peer = &s->kv;
    for (int i = 0; i < r; i++) peer = peer->peer;
    kv_cache *next = peer->peer;  // the init clears the cache, link included
    cuda_forward *lead = t->lead ? t->lead->r[r].cu : NULL;  // a second context: the base's rank r
    R->rc = forward_init(&R->fw, &R->m, s->fw.max_T, s->ctx, &R->err) ||
            cuda_forward_open(&R->cu, &R->m, &R->fw, R->device, lead, &R->err) ||
            kv_cache_init_cuda(peer, cuda_forward_ctx(R->cu), R->m.cfg.n_layers, s->ctx, model_kv_dim(&R->m),
                               &R->err) ||
            (lead && cuda_forward_tp_share(R->cu, lead, &R->err));
    peer->peer = next;
    const char *g = getenv("VARENT_CUDA_GRAPHS");
    if (R->rc == 0 && g && !strcmp(g, "0")) cuda_forward_set_graphs(R->cu, 0);
}

// Joining blocks until every rank has joined, so every rank joins at once.
static void join_job(void *ud, int r) {
    struct session_tpl *t = ud;
    tpl_rank *R = &t->r[r];
    R->rc = cuda_forward_tp_join(r ? R->cu : t->s->cu, t->id, t->timeout, &R->err);
}

// The first failing rank's message.
static int first_error(struct session_tpl *t, verr *err) {
    for (int r = 0; r < t->n; r++)
        if (t->r[r].rc) return verr_set(err, "tensor parallelism, rank %d (cuda:%d): %.900s", r, t->r[r].device,
                                        t->r[r].err.msg);
    return 0;
}

// The chain of peer caches behind s->kv, filled on the ranks' threads.
static int chain(session *s, int n, verr *err) {
    kv_cache *c = &s->kv;
    for (int r = 1; r < n; r++, c = c->peer)
        if (!(c->peer = calloc(1, sizeof *c->peer))) return verr_set(err, "out of memory");
    return 0;
}

int session_tpl_open(session *s, const session_opts *o, verr *err) {
    struct session_tpl *t = s->tpl;
    if (chain(s, t->n, err) || cuda_forward_tp_id(t->id, err)) return -1;
    t->s = s, t->timeout = o->tp_timeout;
    dev_pool_run(t->pool, (1u << t->n) - 1, open_job, t);
    if (first_error(t, err)) return -1;
    dev_pool_run(t->pool, (1u << t->n) - 1, join_job, t);
    if (first_error(t, err)) return -1;
    return s->n_adapters ? session_tpl_set_lora(s, s->lora, s->n_adapters, err) : 0;  // rank 0 has them already
}

// LoRA: every open rank's forward takes the same uses; each device cuts its own share
// of the adapters (model/cuda/lora.c).
static void lora_job(void *ud, int r) {
    struct session_tpl *t = ud;
    tpl_rank *R = &t->r[r];
    struct cuda_forward *cu = r ? R->cu : t->s->cu;
    R->rc = cu ? cuda_forward_set_lora(cu, t->lora, t->n_lora, &R->err) : 0;
}

int session_tpl_set_lora(session *s, const lora_use *u, int n, verr *err) {
    struct session_tpl *t = s->tpl;
    pthread_mutex_t *mu = t->lead ? &t->lead->mu : &t->mu;  // the pool's threads may be running another context
    pthread_mutex_lock(mu);
    t->s = s, t->lora = u, t->n_lora = n;
    dev_pool_run(t->pool, (1u << t->n) - 1, lora_job, t);
    pthread_mutex_unlock(mu);
    return first_error(t, err);
}

int session_tpl_open_shared(session *s, const session *base, verr *err) {
    struct session_tpl *b = base->tpl, *t = calloc(1, sizeof *t);
    if (!t) return verr_set(err, "out of memory");
    s->tpl = t;
    t->n = b->n, t->pool = b->pool, t->lead = b;
    for (int r = 0; r < t->n; r++) t->r[r].device = b->r[r].device, t->r[r].m = b->r[r].m;  // shallow: the base's
    if (chain(s, t->n, err)) return -1;
    t->s = s;
    pthread_mutex_lock(&b->mu);  // the pool's threads are the base's
    dev_pool_run(t->pool, (1u << t->n) - 1, open_job, t);
    pthread_mutex_unlock(&b->mu);
    return first_error(t, err);
}

static void leave_job(void *ud, int r) {
    struct session_tpl *t = ud;
    cuda_forward_tp_leave(r ? t->r[r].cu : t->s->cu);
}

void session_tpl_leave(session *s) {
    struct session_tpl *t = s->tpl;
    if (!t || !t->pool) return;
    if (t->lead) {  // a second context borrows the base's communicators: nothing to leave
        for (int r = 1; r < t->n; r++) cuda_forward_tp_leave(t->r[r].cu);
        return;
    }
    t->s = s;
    dev_pool_run(t->pool, (1u << t->n) - 1, leave_job, t);
}

void session_tpl_close(session *s) {
    struct session_tpl *t = s->tpl;
    if (!t) return;
    for (int r = 1; r < t->n; r++) {
        tpl_rank *R = &t->r[r];
        cuda_forward_close(R->cu);  // after the session's caches (their peers) are freed
        forward_free(&R->fw);
        if (t->lead) continue;  // the model's shares and the pool are the base's
        free(R->m.layers);
        free(R->m.tp_owned);
    }
    for (int r = 0; r < t->n; r++) free(t->r[r].views), free(t->r[r].logits);
    if (!t->lead) {
        if (t->pool) dev_pool_stop(t->pool);
        pthread_mutex_destroy(&t->mu);
    }
    free(t);
    s->tpl = NULL;
}

// ---- a forward call on every rank ----
static kv_cache *peer_of(kv_cache *c, int r) {
    for (int i = 0; c && i < r; i++) {
        kv_cache *p = c->peer;
        if (p) p->len = c->len;  // the rank's share holds as many positions as rank 0's
        c = p;
    }
    return c;
}

// Room for B views and (batches) B rows of logits on every rank.
static int fit(struct session_tpl *t, int B, int vocab, verr *err) {
    for (int r = 0; r < t->n; r++) {
        tpl_rank *R = &t->r[r];
        if (B <= R->cap) continue;
        free(R->views), free(R->logits);
        R->views = malloc(sizeof *R->views * (size_t)B);
        R->logits = malloc(sizeof(float) * (size_t)B * vocab);
        R->cap = R->views && R->logits ? B : 0;
        if (!R->cap) return verr_set(err, "out of memory");
    }
    return 0;
}

// Every rank's views of the same positions (on the caller's thread, before any rank moves them).
static int translate(struct session_tpl *t, const kv_view *views, int B, verr *err) {
    for (int r = 1; r < t->n; r++)
        for (int b = 0; b < B; b++) {
            kv_view v = { peer_of(views[b].trunk, r), views[b].n_trunk,
                          views[b].tail ? peer_of(views[b].tail, r) : NULL };
            if (!v.trunk || (views[b].tail && !v.tail))
                return verr_set(err, "a KV cache without the other ranks' shares (allocate it with kv_cache_init_like)");
            t->r[r].views[b] = v;
        }
    return 0;
}

// Ranks >= 1 make the session's interventions and captures (the captures' gathers are
// collective) but only rank 0, the session, hands them to the callbacks.
static void quiet_act(void *ud, int layer, int point, const float *x, int T, int pos0) {
    (void)ud, (void)layer, (void)point, (void)x, (void)T, (void)pos0;
}
static void quiet_attn(void *ud, int layer, const float *scores, int keys) {
    (void)ud, (void)layer, (void)scores, (void)keys;
}

static const forward_hooks *quiet(tpl_rank *R, const forward_hooks *h) {
    if (!h) return NULL;
    R->hooks = *h;
    R->hooks.on_act = h->on_act ? quiet_act : NULL;
    R->hooks.on_attn = h->on_attn ? quiet_attn : NULL;
    R->hooks.attn_buf = NULL, R->hooks.ud = NULL;
    return &R->hooks;
}

static void forward_job(void *ud, int r) {
    struct session_tpl *t = ud;
    session *s = t->s;
    tpl_rank *R = &t->r[r];
    if (r == 0) {
        R->rc = t->batch ? cuda_forward_batch(s->cu, &s->fw, R->views, t->ids, t->T, R->logits, t->stats, &R->err)
                         : cuda_forward_run(s->cu, &s->fw, R->views, t->ids, t->T, &R->err);
        return;
    }
    R->fw.attn_layer = s->fw.attn_layer, R->fw.lazy_logits = 1, R->fw.copy_scores = 0;
    R->fw.hooks = quiet(R, s->fw.hooks);
    R->rc = t->batch ? cuda_forward_batch(R->cu, &R->fw, R->views, t->ids, t->T, R->logits, NULL, &R->err)
                     : cuda_forward_run(R->cu, &R->fw, R->views, t->ids, t->T, &R->err);
}

static int run_all(session *s, kv_view *views, const int *ids, int n, int batch, float *stats, verr *err) {
    struct session_tpl *t = s->tpl;
    if (fit(t, batch ? n : 1, s->m.cfg.vocab_size, err)) return -1;
    int B = batch ? n : 1;
    memcpy(t->r[0].views, views, sizeof *views * (size_t)B);
    if (translate(t, views, B, err)) return -1;
    t->s = s, t->ids = ids, t->T = n, t->batch = batch, t->stats = stats;
    pthread_mutex_t *mu = t->lead ? &t->lead->mu : &t->mu;  // contexts on other threads (server slots) wait here
    pthread_mutex_lock(mu);
    dev_pool_run(t->pool, (1u << t->n) - 1, forward_job, t);
    pthread_mutex_unlock(mu);
    if (first_error(t, err)) return -1;
    memcpy(views, t->r[0].views, sizeof *views * (size_t)B);  // rank 0 advanced its views
    return 0;
}

int session_tpl_forward(session *s, kv_view *kv, const int *ids, int T, verr *err) {
    return run_all(s, kv, ids, T, 0, NULL, err);
}

int session_tpl_batch(session *s, kv_view *views, const int *ids, int B, float *logits, float *stats, verr *err) {
    if (run_all(s, views, ids, B, 1, stats, err)) return -1;
    memcpy(logits, s->tpl->r[0].logits, sizeof(float) * (size_t)B * s->m.cfg.vocab_size);
    return 0;
}
