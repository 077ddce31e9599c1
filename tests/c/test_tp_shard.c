// test_tp_shard.c: tensor parallelism's plan, shards and forward pass (model/tp.h), with
// the ranks as threads of this process over a shared-memory communicator, so that the
// sharding runs under make test-asan with leak detection (the MPI launches of
// tests/py/test_tp_mpi.py cannot: Open MPI leaks at exit).
//   - the plan: every rank's heads, KV heads, columns and rows tile the model; refused
//     degrees name the ones that work;
//   - every rank's logits ([T, vocab], chunked prefill) and attention capture equal the
//     one-process forward within fp32 tolerance, and are the same bits on every rank;
//   - a communicator that does not match the shard is an error.
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "model/forward.h"
#include "test_models.h"

#define MAX_RANKS 8
#define T_IDS 21
static char workdir[512];

// ---- a shared-memory communicator: ranks are threads --------------------------------

typedef struct {
    pthread_barrier_t bar;
    const void *in[MAX_RANKS];
} shm_group;

typedef struct {
    tp_comm pub;
    shm_group *g;
} shm_comm;

// Every element summed once in rank order (as the MPI all-reduce does), copied to all.
static int shm_sum(tp_comm *c, float *x, size_t n, verr *err) {
    shm_group *g = ((shm_comm *)c)->g;
    float *acc = malloc(sizeof(float) * n);
    if (!acc) return verr_set(err, "out of memory");
    g->in[c->rank] = x;
    pthread_barrier_wait(&g->bar);
    for (size_t i = 0; i < n; i++) {
        float s = ((const float *)g->in[0])[i];
        for (int r = 1; r < c->size; r++) s += ((const float *)g->in[r])[i];
        acc[i] = s;
    }
    pthread_barrier_wait(&g->bar);  // everyone has read every x
    memcpy(x, acc, sizeof(float) * n);
    free(acc);
    c->n_sum++;
    return 0;
}

static int shm_gather(tp_comm *c, const void *x, size_t bytes, void *out, verr *err) {
    shm_group *g = ((shm_comm *)c)->g;
    g->in[c->rank] = x;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < c->size; r++) memcpy((char *)out + (size_t)r * bytes, g->in[r], bytes);
    pthread_barrier_wait(&g->bar);
    c->n_gather++;
    return 0;
}

// ---- one rank ------------------------------------------------------------------------

typedef struct {
    const char *dir;
    int rank, size, layer;
    shm_group *g;
    const int *ids;
    float *logits;  // [T_IDS, vocab]
    float *scores;  // [n_heads, T_IDS] the last query's capture at layer
    int rc;
    verr err;
} rank_job;

static void *run_rank(void *arg) {
    rank_job *j = arg;
    cpu_set_threads(1);
    shm_comm c = { { .rank = j->rank, .size = j->size, .sum = shm_sum, .gather = shm_gather, .gather_idle = shm_gather },
                   j->g };
    model m;
    forward_state fw = { 0 };
    kv_cache kv = { 0 };
    tp_shard plan;
    j->rc = model_load(&m, j->dir, &j->err);
    if (j->rc) return NULL;
    j->rc = tp_shard_plan(&m.cfg, j->rank, j->size, &plan, &j->err) || model_shard(&m, &plan, &j->err) ||
            forward_init(&fw, &m, 8, 64, &j->err) || forward_set_comm(&fw, &c.pub, &j->err) ||
            kv_cache_init(&kv, m.cfg.n_layers, 64, model_kv_dim(&m), &j->err);
    if (j->rc == 0) {
        fw.attn_layer = j->layer;
        kv_view v = kv_view_of(&kv);
        j->rc = forward_all(&fw, &v, j->ids, T_IDS, j->logits, &j->err);  // chunks of 8: 3 passes
        memcpy(j->scores, fw.attn_scores, sizeof(float) * (size_t)m.cfg.n_heads * fw.attn_keys);
    }
    kv_cache_free(&kv);
    forward_free(&fw);
    model_free(&m);
    return NULL;
}

// ---- the checks -----------------------------------------------------------------------

static void check_plan(const char *tag, const model_config *c, int n) {
    int heads = 0, ffn = 0, vocab = 0, ok = 1;
    for (int r = 0; r < n; r++) {
        tp_shard s;
        verr err;
        if (tp_shard_plan(c, r, n, &s, &err)) {
            CHECK(0, tag, "rank %d: %s", r, err.msg);
            return;
        }
        ok &= s.head0 == heads && s.ffn0 == ffn && s.vocab0 == vocab && s.n_heads <= s.max_heads &&
              s.n_vocab <= s.max_vocab && s.kv_head0 * (c->n_heads / c->n_kv_heads) <= s.head0 &&
              (s.head0 + s.n_heads - 1) / (c->n_heads / c->n_kv_heads) < s.kv_head0 + s.n_kv_heads;
        heads += s.n_heads, ffn += s.n_ffn, vocab += s.n_vocab;
    }
    CHECK(ok && heads == c->n_heads && ffn == c->hidden_dim && vocab == c->vocab_size, tag,
          "the ranks' shares do not tile the model (heads %d ffn %d vocab %d)", heads, ffn, vocab);
}

// One process's logits and capture, then n ranks', compared.
static void check_degree(const char *preset, const char *dir, const model *whole, int n, const float *ref,
                         const float *ref_scores) {
    const model_config *c = &whole->cfg;
    size_t V = (size_t)c->vocab_size, cap = (size_t)c->n_heads * T_IDS;
    char name[160];
    snprintf(name, sizeof name, "%s tp %d: plan tiles the model", preset, n);
    check_plan(name, c, n);
    static int ids[T_IDS];
    for (int i = 0; i < T_IDS; i++) ids[i] = (i * 37 + 5) % c->vocab_size;
    shm_group g;
    pthread_barrier_init(&g.bar, NULL, (unsigned)n);
    rank_job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){ .dir = dir, .rank = r, .size = n, .layer = 1, .g = &g, .ids = ids,
                              .logits = malloc(sizeof(float) * V * T_IDS), .scores = malloc(sizeof(float) * cap) };
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g.bar);
    for (int r = 0; r < n; r++) {
        snprintf(name, sizeof name, "%s tp %d rank %d: logits and capture vs one process", preset, n, r);
        long bad = jobs[r].rc ? 0 : check_close(jobs[r].logits, ref, (long)(V * T_IDS), 1e-4f, 1e-4f);
        long bad_s = jobs[r].rc ? 0 : check_close(jobs[r].scores, ref_scores, (long)cap, 1e-4f, 1e-4f);
        CHECK(!jobs[r].rc && bad < 0 && bad_s < 0, name, "%s logit %ld score %ld", jobs[r].rc ? jobs[r].err.msg : "",
              bad, bad_s);
        snprintf(name, sizeof name, "%s tp %d rank %d: the same bits as rank 0", preset, n, r);
        CHECK(!jobs[r].rc && !memcmp(jobs[r].logits, jobs[0].logits, sizeof(float) * V * T_IDS) &&
              !memcmp(jobs[r].scores, jobs[0].scores, sizeof(float) * cap), name, "ranks differ");
    }
    for (int r = 0; r < n; r++) free(jobs[r].logits), free(jobs[r].scores);
}

static void test_preset(const char *preset) {
    char dir[600];
    if (gen_random_model(workdir, preset, "f32", 7, dir, sizeof dir)) {
        CHECK(0, preset, "gen_random_checkpoint.py failed (PYTHON=%s)", env_or("PYTHON", "python3"));
        return;
    }
    model m;
    forward_state fw;
    kv_cache kv;
    verr err;
    if (model_load(&m, dir, &err)) {
        CHECK(0, preset, "%s", err.msg);
        return;
    }
    size_t V = (size_t)m.cfg.vocab_size, cap = (size_t)m.cfg.n_heads * T_IDS;
    float *ref = malloc(sizeof(float) * V * T_IDS), *ref_scores = malloc(sizeof(float) * cap);
    int ids[T_IDS];
    for (int i = 0; i < T_IDS; i++) ids[i] = (i * 37 + 5) % m.cfg.vocab_size;
    int rc = forward_init(&fw, &m, 8, 64, &err) || kv_cache_init(&kv, m.cfg.n_layers, 64, model_kv_dim(&m), &err);
    if (rc == 0) {
        fw.attn_layer = 1;
        kv_view v = kv_view_of(&kv);
        rc = forward_all(&fw, &v, ids, T_IDS, ref, &err);
        memcpy(ref_scores, fw.attn_scores, sizeof(float) * cap);
        kv_cache_free(&kv);
        forward_free(&fw);
    }
    CHECK(rc == 0, preset, "one-process forward: %s", err.msg);
    for (int n = 2; rc == 0 && n <= 4; n++) {
        tp_shard s;
        if (tp_shard_plan(&m.cfg, 0, n, &s, &err) == 0) {
            check_degree(preset, dir, &m, n, ref, ref_scores);
            continue;
        }
        char name[160];
        snprintf(name, sizeof name, "%s tp %d: refused, naming the degrees that work", preset, n);
        CHECK(strstr(err.msg, "cannot be split") && strstr(err.msg, "Degrees that work: 1, 2"), name, "%s", err.msg);
    }
    free(ref), free(ref_scores);
    model_free(&m);
}

static void test_mismatch(void) {
    char dir[600];
    model m;
    forward_state fw;
    verr err;
    if (gen_random_model(workdir, "llama3-tiny", "f32", 7, dir, sizeof dir) || model_load(&m, dir, &err)) {
        CHECK(0, "mismatched communicator", "cannot load llama3-tiny");
        return;
    }
    tp_shard s;
    tp_shard_plan(&m.cfg, 1, 2, &s, &err);
    model_shard(&m, &s, &err);
    shm_comm c = { { .rank = 0, .size = 2, .sum = shm_sum, .gather = shm_gather, .gather_idle = shm_gather }, NULL };
    int rc = forward_init(&fw, &m, 4, 16, &err);
    CHECK(rc == 0 && forward_set_comm(&fw, &c.pub, &err) && strstr(err.msg, "rank 1 of 2's share"),
          "mismatched communicator: an error", "%s", err.msg);
    if (rc == 0) forward_free(&fw);
    CHECK(model_shard(&m, &s, &err) && strstr(err.msg, "already sharded"), "a shard cannot be sharded again", "%s",
          err.msg);
    model_free(&m);
}

int main(void) {
    snprintf(workdir, sizeof workdir, "%s/tps-XXXXXX", env_or("TESTTMP", "tests/tmp"));
    if (!mkdtemp(workdir)) {
        CHECK(0, "work directory", "mkdtemp %s failed", workdir);
        CHECK_DONE();
    }
    const char *presets[] = { "llama3-tiny", "llama-mha-untied", "qwen2-tiny", "qwen3-tiny" };
    for (int p = 0; p < 4; p++) test_preset(presets[p]);
    test_mismatch();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", workdir);
    CHECK_DONE();
}
