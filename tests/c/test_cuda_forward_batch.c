// test_cuda_forward_batch.c: the CUDA batched decode (cuda_forward_batch, through
// session_forward_batch: B sequences, one token each, one device step for up to 64 rows) on
// random checkpoints of tools/gen_random_checkpoint.py's tiny presets. Per model, 11 rows
// (a 16-row bucket with 5 padding rows under graphs): row 0 appends to the trunk, rows 1..10 to their own device tails
// holding 0..3 tokens over a shared 12-token trunk. Checks:
//   - each row's logits and entropix metrics equal a one-token session_forward +
//     session_metrics on that row alone, bit for bit (the same kernels sum every row
//     alike), with CUDA graphs and with eager launches;
//   - against the CPU backend's session_forward_batch on the same state: logits within the
//     bf16 tolerance of test_cuda_forward, metrics within its bf16 bound;
//   - lengths advance by one; a draw after the batch reads the last row's logits;
//   - bad input (two rows on one tail, an id out of range, a host cache, a full tail)
//     fails and leaves every length untouched;
//   - every row bucket (llama3-tiny): 9 to 64 rows padded under graphs equal the eager
//     batch, one capture per bucket, and the 64-row batch's rows at tile and bucket
//     edges equal the row decoded alone.
// Needs a GPU: prints "SKIP cuda_forward_batch: ..." without one.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "test_models.h"
#include "host/runtime/session.h"
#include "model/forward_cuda.h"
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_forward_batch", "built without CUDA");
    CHECK_DONE();
}
#else

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

enum { R = 11, P_LEN = 12, CTX = 64 };

static char workdir[512];

static int gen_model(const char *preset, const char *dtype, char *dir, size_t n) {
    return gen_random_model(workdir, preset, dtype, 5, dir, n);
}

// One backend's state: a session, its trunk holding the prompt, R views (row 0 on the
// trunk, row b its own tail holding (b - 1) % 4 tokens).
typedef struct {
    session s;
    kv_cache tails[R];
    kv_view views[R];
    int len0[R];       // each row's target length before the batch
    float *logits;     // [R, vocab]
    token_metrics m[R];
    metrics_ws ws;
    batch_ws bw;
} side;

static kv_cache *target(kv_view *v) { return v->tail ? v->tail : v->trunk; }

static int side_open(side *d, const char *dir, const char *device, const int *prompt, verr *err) {
    memset(d, 0, sizeof *d);
    session_opts o = { .model_dir = dir, .ctx = CTX, .max_batch = 16, .device = device };
    if (session_open(&d->s, &o, err)) return -1;
    d->s.fw.attn_layer = d->s.m.cfg.n_layers - 1;
    kv_view trunk = kv_view_of(&d->s.kv);
    if (session_forward(&d->s, &trunk, prompt, P_LEN, err)) return -1;
    d->logits = malloc(sizeof(float) * (size_t)R * d->s.m.cfg.vocab_size);
    if (!d->logits) return verr_set(err, "out of memory");
    d->views[0] = kv_view_of(&d->s.kv);
    for (int b = 1; b < R; b++) {
        if (kv_cache_init_like(&d->tails[b], &d->s.kv, 16, err)) return -1;
        d->views[b] = (kv_view){ &d->s.kv, P_LEN, &d->tails[b] };
        for (int t = 0; t < (b - 1) % 4; t++) {
            int id = (7 * b + 3 * t) % d->s.m.cfg.vocab_size;
            if (session_forward(&d->s, &d->views[b], &id, 1, err)) return -1;
        }
    }
    for (int b = 0; b < R; b++) d->len0[b] = target(&d->views[b])->len;
    return 0;
}

static void side_close(side *d) {
    for (int b = 1; b < R; b++) kv_cache_free(&d->tails[b]);
    free(d->logits);
    metrics_ws_free(&d->ws);
    batch_ws_free(&d->bw);
    session_close(&d->s);
}

// Every row back to its length before the batch.
static void rewind_rows(side *d) {
    for (int b = 0; b < R; b++) {
        kv_cache_truncate(target(&d->views[b]), d->len0[b]);
        if (!d->views[b].tail) d->views[b].n_trunk = d->len0[b];
    }
}

static int lengths_are(side *d, int delta) {
    for (int b = 0; b < R; b++) {
        kv_cache *t = target(&d->views[b]);
        if (t->len != d->len0[b] + delta || (!d->views[b].tail && d->views[b].n_trunk != t->len)) return 0;
    }
    return 1;
}

static double rel_l2(const float *got, const float *ref, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void mvec(const token_metrics *m, double v[6]) {
    v[0] = m->entropy, v[1] = m->varentropy, v[2] = m->attn_entropy, v[3] = m->attn_varentropy;
    v[4] = m->agreement, v[5] = m->interaction_strength;
}

// The bf16 bound of test_cuda_forward's run_metrics: XB_ABS + 10%.
static const double XB_ABS[6] = { 0.1, 0.2, 0.02, 0.03, 5e-4, 0.02 };

static int metrics_equal(const token_metrics *a, const token_metrics *b) {
    double x[6], y[6];
    mvec(a, x), mvec(b, y);
    for (int i = 0; i < 6; i++)
        if (x[i] != y[i]) return 0;
    return a->log_z == b->log_z;
}

// Each row alone (one-token session_forward + session_metrics) against the batch's row.
static void check_rows_alone(const char *tag, side *g, const int *ids) {
    size_t V = (size_t)g->s.m.cfg.vocab_size;
    int same_logits = 1, same_m = 1, worst = -1;
    verr err = { 0 };
    rewind_rows(g);
    for (int b = 0; b < R; b++) {
        token_metrics m;
        if (session_forward(&g->s, &g->views[b], &ids[b], 1, &err) || session_metrics(&g->s, &g->ws, &m)) {
            CHECK(0, NAME("%s: row %d alone runs", tag, b), "%s", err.msg);
            return;
        }
        if (memcmp(g->s.fw.logits, g->logits + b * V, V * sizeof(float)) != 0) same_logits = 0, worst = b;
        if (!metrics_equal(&m, &g->m[b])) same_m = 0, worst = b;
    }
    CHECK(same_logits, NAME("%s: batch logits equal each row decoded alone, bit for bit", tag), "row %d differs",
          worst);
    CHECK(same_m, NAME("%s: batch metrics equal each row's session_metrics", tag), "row %d differs", worst);
}

// Metrics only for bf16 checkpoints: the GPU rounds f32 matrices to bf16, beyond the bound.
static void check_vs_cpu(const char *tag, side *g, side *c, double tol, int metrics) {
    size_t V = (size_t)g->s.m.cfg.vocab_size;
    double worst = 0, mworst = 0;
    int worst_row = 0, mrow = 0, mi = 0;
    for (int b = 0; b < R; b++) {
        double e = rel_l2(g->logits + b * V, c->logits + b * V, (long)V);
        if (e > worst) worst = e, worst_row = b;
        double x[6], y[6];
        mvec(&g->m[b], x), mvec(&c->m[b], y);
        for (int i = 0; i < 6; i++) {
            double over = fabs(x[i] - y[i]) / (XB_ABS[i] + 0.1 * fabs(y[i]));
            if (over > mworst) mworst = over, mrow = b, mi = i;
        }
    }
    printf("note: %s: worst CPU/GPU logits rel err %.2e (row %d), worst metric at %.2f of its bound (row %d, #%d)\n",
           tag, worst, worst_row, mworst, mrow, mi);
    CHECK(worst <= tol, NAME("%s: batch logits match the CPU batch (rel err <= %g)", tag, tol), "row %d: %.3e",
          worst_row, worst);
    if (metrics)
        CHECK(mworst <= 1, NAME("%s: batch metrics within the bf16 bound of the CPU batch's", tag),
              "row %d metric %d at %.2f of its bound", mrow, mi, mworst);
}

// Bad batches fail and leave every length as it was.
static void check_errors(const char *tag, side *g, const int *ids) {
    verr err = { 0 };
    kv_view two[2] = { g->views[1], g->views[1] };
    int bad[2] = { ids[0], ids[1] };
    int rc = session_forward_batch(&g->s, two, bad, 2, g->logits, NULL, NULL, NULL, &err);
    CHECK(rc != 0 && strstr(err.msg, "same KV cache") && lengths_are(g, 0),
          NAME("%s: two rows on one tail are refused", tag), "rc %d, '%s'", rc, err.msg);
    int oob[R];
    memcpy(oob, ids, sizeof oob);
    oob[R - 1] = g->s.m.cfg.vocab_size;
    err.msg[0] = 0;
    rc = session_forward_batch(&g->s, g->views, oob, R, g->logits, NULL, NULL, NULL, &err);
    CHECK(rc != 0 && strstr(err.msg, "out of range") && lengths_are(g, 0),
          NAME("%s: an id out of range is refused, nothing appended", tag), "rc %d, '%s'", rc, err.msg);
    kv_cache host;
    if (kv_cache_init(&host, g->s.m.cfg.n_layers, 8, g->s.m.cfg.n_kv_heads * g->s.m.cfg.head_dim, &err) == 0) {
        kv_view mixed[2] = { g->views[1], { &g->s.kv, P_LEN, &host } };
        err.msg[0] = 0;
        rc = session_forward_batch(&g->s, mixed, bad, 2, g->logits, NULL, NULL, NULL, &err);
        CHECK(rc != 0 && strstr(err.msg, "host memory") && lengths_are(g, 0) && host.len == 0,
              NAME("%s: a host cache in a device batch is refused", tag), "rc %d, '%s'", rc, err.msg);
        kv_cache_free(&host);
    }
    kv_cache *t = &g->tails[2];
    int len = t->len;
    t->len = t->ctx;  // full
    err.msg[0] = 0;
    rc = session_forward_batch(&g->s, g->views, ids, R, g->logits, NULL, NULL, NULL, &err);
    t->len = len;
    CHECK(rc != 0 && strstr(err.msg, "does not fit") && lengths_are(g, 0),
          NAME("%s: a full tail is refused, nothing appended", tag), "rc %d, '%s'", rc, err.msg);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_model(const char *tag, const char *dir, double tol, int bf16) {
    verr err = { 0 };
    int prompt[P_LEN], ids[R];
    side g, c;
    memset(&g, 0, sizeof g), memset(&c, 0, sizeof c);
    session_opts o = { .model_dir = dir, .ctx = CTX };
    if (session_open(&c.s, &o, &err)) {  // the vocab first: the ids below depend on it
        CHECK(0, NAME("%s: model opens", tag), "%s", err.msg);
        return;
    }
    int vocab = c.s.m.cfg.vocab_size;
    session_close(&c.s);
    for (int t = 0; t < P_LEN; t++) prompt[t] = (31 * t + 5) % vocab;
    for (int b = 0; b < R; b++) ids[b] = (97 * b + 11) % vocab;
    if (side_open(&c, dir, "cpu", prompt, &err) || side_open(&g, dir, "cuda", prompt, &err)) {
        CHECK(0, NAME("%s: sessions open", tag), "%s", err.msg);
        side_close(&g), side_close(&c);
        return;
    }
    int rc = session_forward_batch(&c.s, c.views, ids, R, c.logits, c.m, &c.ws, &c.bw, &err), cpu_ok = rc == 0;
    CHECK(cpu_ok, NAME("%s: CPU batch runs", tag), "%s", err.msg);
    rc = session_forward_batch(&g.s, g.views, ids, R, g.logits, g.m, &g.ws, &g.bw, &err);
    CHECK(rc == 0, NAME("%s: CUDA batch of %d rows runs", tag, R), "%s", err.msg);
    if (rc == 0) {
        CHECK(lengths_are(&g, 1), NAME("%s: every row advanced by one", tag), "a length is off");
        sample_cfg greedy = { 0 };
        sample_out so = { 0 };
        size_t V = (size_t)vocab;
        rc = session_sample(&g.s, &greedy, 1, &so, &err);
        CHECK(rc == 0 && so.token == argmax(g.logits + (R - 1) * V, vocab),
              NAME("%s: a draw after the batch reads the last row", tag), "token %d vs %d", so.token,
              argmax(g.logits + (R - 1) * V, vocab));
        if (cpu_ok) check_vs_cpu(tag, &g, &c, tol, bf16);
        // eager launches reproduce the graph replay
        float *graph = malloc(sizeof(float) * R * V);
        if (graph) {
            memcpy(graph, g.logits, sizeof(float) * R * V);
            rewind_rows(&g);
            cuda_forward_set_graphs(g.s.cu, 0);
            rc = session_forward_batch(&g.s, g.views, ids, R, g.logits, g.m, &g.ws, &g.bw, &err);
            cuda_forward_set_graphs(g.s.cu, 1);
            CHECK(rc == 0 && memcmp(graph, g.logits, sizeof(float) * R * V) == 0,
                  NAME("%s: eager batch equals the graph replay", tag), "rc %d %s", rc, err.msg);
            free(graph);
        }
        check_rows_alone(tag, &g, ids);
        rewind_rows(&g);
        check_errors(tag, &g, ids);
    }
    side_close(&g), side_close(&c);
}

// Every row bucket: batches of 9 to 64 rows (padded to 16, 32, 48 and 64 rows under
// graphs, forward.c's step_rows) equal the eager, unpadded batch of the same rows bit for
// bit, with one capture per bucket; rows of the 64-row batch equal each row decoded alone.
enum { WIDE = 64 };
static void test_buckets(const char *tag, const char *dir) {
    verr err = { 0 };
    session s;
    session_opts o = { .model_dir = dir, .ctx = CTX, .max_batch = WIDE, .device = "cuda" };
    if (session_open(&s, &o, &err)) {
        CHECK(0, NAME("%s buckets: session opens", tag), "%s", err.msg);
        return;
    }
    s.fw.attn_layer = s.m.cfg.n_layers - 1;  // the padding rows' captures too
    size_t V = (size_t)s.m.cfg.vocab_size;
    kv_cache *tails = calloc(WIDE, sizeof *tails);
    kv_view *views = calloc(WIDE, sizeof *views);
    float *graph = malloc(sizeof(float) * WIDE * V), *eager = malloc(sizeof(float) * WIDE * V);
    int prompt[P_LEN], ids[WIDE], rc = !tails || !views || !graph || !eager;
    for (int t = 0; t < P_LEN; t++) prompt[t] = (31 * t + 5) % (int)V;
    kv_view trunk = kv_view_of(&s.kv);
    if (rc == 0) rc = session_forward(&s, &trunk, prompt, P_LEN, &err);
    for (int r = 0; rc == 0 && r < WIDE; r++) {
        rc = kv_cache_init_like(&tails[r], &s.kv, 4, &err);
        views[r] = (kv_view){ &s.kv, P_LEN, &tails[r] };
        ids[r] = (13 * r + 7) % (int)V;
    }
    CHECK(rc == 0, NAME("%s buckets: %d rows set up", tag, WIDE), "%s", err.msg);
    static const int widths[] = { 9, 16, 17, 33, WIDE };
    cuda_step_counts c0, c1;
    cuda_forward_counts(s.cu, &c0);
    int same = 1, worst = 0;
    for (int i = 0; rc == 0 && i < 5; i++) {
        int w = widths[i];
        rc = session_forward_batch(&s, views, ids, w, graph, NULL, NULL, NULL, &err);
        for (int r = 0; r < w; r++) kv_cache_truncate(&tails[r], 0);
        cuda_forward_set_graphs(s.cu, 0);
        if (rc == 0) rc = session_forward_batch(&s, views, ids, w, eager, NULL, NULL, NULL, &err);
        cuda_forward_set_graphs(s.cu, 1);
        if (i + 1 < 5)
            for (int r = 0; r < w; r++) kv_cache_truncate(&tails[r], 0);
        if (rc == 0 && memcmp(graph, eager, sizeof(float) * w * V) != 0) same = 0, worst = w;
    }
    cuda_forward_counts(s.cu, &c1);
    CHECK(rc == 0 && same, NAME("%s buckets: 9, 16, 17, 33, 64 rows padded equal the unpadded batch", tag),
          "rc %d, %d rows differ: %s", rc, worst, err.msg);
    CHECK(c1.captures - c0.captures == 4, NAME("%s buckets: one graph per bucket (16, 32, 48, 64)", tag),
          "%ld captures", c1.captures - c0.captures);
    int alone = 1, bad = -1;
    static const int probe[] = { 0, 8, 15, 16, 31, 33, 47, 48, 63 };  // tile and bucket edges
    for (int i = 0; rc == 0 && i < 9; i++) {
        int r = probe[i];
        kv_cache_truncate(&tails[r], 0);
        rc = session_forward(&s, &views[r], &ids[r], 1, &err);
        if (rc == 0 && memcmp(s.fw.logits, graph + r * V, V * sizeof(float)) != 0) alone = 0, bad = r;
    }
    CHECK(rc == 0 && alone, NAME("%s buckets: rows at the tile and bucket edges of 64 equal each row decoded alone", tag), "rc %d, row %d: %s",
          rc, bad, err.msg);
    for (int r = 0; tails && r < WIDE; r++) kv_cache_free(&tails[r]);
    free(tails), free(views), free(graph), free(eager);
    session_close(&s);
}

int main(void) {
    if (cuda_device_count() == 0) {
        SKIP("cuda_forward_batch", "no CUDA device");
        return 0;
    }
    snprintf(workdir, sizeof workdir, "%s/cfb-XXXXXX", env_or("TESTTMP", "tests/tmp"));
    if (!mkdtemp(workdir)) {
        CHECK(0, "work directory", "mkdtemp %s failed", workdir);
        CHECK_DONE();
    }
    const char *presets[] = { "llama3-tiny", "llama-mha-untied", "qwen2-tiny", "qwen3-tiny" };
    for (int p = 0; p < 4; p++)
        for (int f32 = 0; f32 <= 1; f32++) {
            char dir[600], tag[64];
            snprintf(tag, sizeof tag, "%s %s", presets[p], f32 ? "f32" : "bf16");
            if (gen_model(presets[p], f32 ? "f32" : "bf16", dir, sizeof dir)) {
                CHECK(0, NAME("%s: gen_random_checkpoint.py", tag), "failed (PYTHON=%s)", env_or("PYTHON", "python3"));
                continue;
            }
            test_model(tag, dir, f32 ? 2e-2 : 1e-2, !f32);  // f32 matrices are rounded to bf16 on the GPU
            if (p == 0 && !f32) test_buckets(tag, dir);
        }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", workdir);
    CHECK_DONE();
}
#endif
