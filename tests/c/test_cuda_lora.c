// test_cuda_lora.c: LoRA adapters on the CUDA device changed between the decode steps
// of one session, whose steps replay a captured CUDA graph: each change of the adapters
// or a scale must capture it again (dev_lora.gen). The reference is a second session on
// the same checkpoint with graphs off, given the same adapters at the same steps: it
// launches the same kernels one by one, so every step's logits must be bit-identical; a
// stale graph would replay the old adapters' deltas. Also checked:
//   - scale 0 and no adapter launch exactly the plain step's kernels, and an adapter
//     moves the logits (its delta is applied);
//   - batched decode rows (session_forward_batch, rows on their own tails) equal each
//     row's one-token step bit for bit with two adapters stacked, as without adapters;
//   - the adapter is uploaded once per device: a second context sharing the weights
//     (session_open_shared) reuses it and gives the same logits.
// The values themselves are checked against the CPU (and so numpy) in
// tests/py/test_lora_cuda.py. Checkpoint and adapters: tools/gen_random_checkpoint.py's
// llama3-tiny (bf16) and tests/py/test_lora.py's write_adapter, written here.
// Needs a CUDA device (or the emulated one); prints SKIP without.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "host/runtime/session.h"
#include "host/runtime/session_cuda.h"
#include "model/forward_cuda.h"
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_lora", "built without CUDA");
    CHECK_DONE();
}
#else

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

// The checkpoint and two adapters (all projections, r 4; q/v/down of layer 1, r 3, bf16).
static int gen_files(const char *dir) {
    const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
    const char *root = getenv("ROOT") ? getenv("ROOT") : ".";
    static char cmd[65536];  // room for every path at its longest
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' tools/gen_random_checkpoint.py --preset llama3-tiny '%s/m' --seed 41 --dtype bf16 "
             ">/dev/null && '%s' -c \"import sys; sys.path[:0] = ['tests/py', 'tests/reference', 'tools']; "
             "import test_lora as t; t.write_adapter('%s/a1', '%s/m', seed=5); t.write_adapter('%s/a2', '%s/m', "
             "targets=['q_proj', 'v_proj', 'down_proj'], layers=[1], r=3, alpha=5, seed=6, dtype='BF16')\" >/dev/null",
             root, py, dir, py, dir, dir, dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

// A setting of the sequence: scales of adapters 1 and 2 (NAN: not in use).
typedef struct {
    const char *name;
    float s1, s2;
} setting;

static const setting SEQ[] = {
    { "none", NAN, NAN },        { "a1", 1.f, NAN },           { "a1 scale 0.5", .5f, NAN },
    { "a1 + a2", 1.f, -1.5f },   { "a2", NAN, 1.f },           { "a1 scale 0", 0.f, NAN },
    { "a1 again", 1.f, NAN },    { "none again", NAN, NAN },
};

static int use(session *s, lora_adapter *ad, const setting *t, lora_use *u, verr *err) {
    int n = 0;
    if (!isnan(t->s1)) u[n++] = (lora_use){ &ad[0], t->s1 };
    if (!isnan(t->s2)) u[n++] = (lora_use){ &ad[1], t->s2 };
    return session_set_lora(s, u, n, err);
}

static int open_one(session *s, const char *dir, int graphs, verr *err) {
    session_opts so = { 0 };
    so.model_dir = dir, so.device = "cuda", so.ctx = 64, so.max_batch = 16;
    if (session_open(s, &so, err)) return -1;
    cuda_forward_set_graphs(s->cu, graphs);
    return 0;
}

static void switching(session *g, session *e, lora_adapter *ad) {
    const model_config *c = &g->m.cfg;
    int V = c->vocab_size, prompt[5] = { 1, 17, 42, 99, 5 }, next = 7, ok = 1;
    verr err = { { 0 } };
    kv_view kg = kv_view_of(&g->kv), ke = kv_view_of(&e->kv);
    lora_use ug[2], ue[2];
    ok = session_forward(g, &kg, prompt, 5, &err) == 0 && session_forward(e, &ke, prompt, 5, &err) == 0;
    CHECK(ok, "cuda_lora prefill", "%s", err.msg);
    long plain = -1;
    for (size_t i = 0; ok && i < sizeof SEQ / sizeof *SEQ; i++) {
        if (use(g, ad, &SEQ[i], ug, &err) || use(e, ad, &SEQ[i], ue, &err)) {
            CHECK(0, NAME("cuda_lora set %s", SEQ[i].name), "%s", err.msg);
            return;
        }
        for (int step = 0; ok && step < 2; step++, next = (next * 31 + 5) % V) {
            if (session_forward(g, &kg, &next, 1, &err) || session_forward(e, &ke, &next, 1, &err)) {
                CHECK(0, NAME("cuda_lora %s step %d", SEQ[i].name, step), "%s", err.msg);
                ok = 0;
                break;
            }
            CHECK(!memcmp(g->fw.logits, e->fw.logits, sizeof(float) * (size_t)V),
                  NAME("cuda_lora %s step %d: graph replay == kernels one by one", SEQ[i].name, step),
                  "logits differ: the graph was not captured again for the new adapters");
        }
        cuda_step_counts n;
        session_cuda_counts(g, &n);
        int adapted = (!isnan(SEQ[i].s1) && SEQ[i].s1 != 0) || !isnan(SEQ[i].s2);
        printf("cuda_lora %s: %ld launches per decode step\n", SEQ[i].name, n.launches);
        if (i == 0) plain = n.launches;
        else if (!adapted)
            CHECK(n.launches == plain, NAME("cuda_lora %s launches the plain step's kernels", SEQ[i].name),
                  "%ld launches, plain %ld", n.launches, plain);
        else
            CHECK(n.launches > plain, NAME("cuda_lora %s adds launches", SEQ[i].name), "%ld launches, plain %ld",
                  n.launches, plain);
    }
    // The adapter must matter: one step with a1 against the same step without.
    float *with = malloc(sizeof(float) * (size_t)V), moved = 0;
    int id = 7;
    kv_cache_truncate(&g->kv, 5), kg = kv_view_of(&g->kv);
    ok = ok && with && use(g, ad, &SEQ[1], ug, &err) == 0 && session_forward(g, &kg, &id, 1, &err) == 0;
    if (ok) memcpy(with, g->fw.logits, sizeof(float) * (size_t)V);
    kv_cache_truncate(&g->kv, 5), kg = kv_view_of(&g->kv);
    ok = ok && use(g, ad, &SEQ[0], ug, &err) == 0 && session_forward(g, &kg, &id, 1, &err) == 0;
    for (int i = 0; ok && i < V; i++) moved = fmaxf(moved, fabsf(with[i] - g->fw.logits[i]));
    CHECK(ok && moved > 0.1f, "cuda_lora adapter a1 moves the logits", "max |diff| %g (%s)", moved, err.msg);
    free(with);
}

// Rows on their own tails (0..2 tokens each) over a shared trunk, with a1 + a2.
static void batch_rows(session *g, lora_adapter *ad) {
    enum { B = 5 };
    const model_config *c = &g->m.cfg;
    int V = c->vocab_size, prompt[6] = { 1, 3, 5, 7, 11, 13 }, ids[B], ok;
    verr err = { { 0 } };
    lora_use u[2];
    kv_cache tails[B];
    kv_view views[B];
    float *rows = malloc(sizeof(float) * (size_t)B * V), *one = malloc(sizeof(float) * (size_t)B * V);
    memset(tails, 0, sizeof tails);
    kv_cache_truncate(&g->kv, 0);
    kv_view trunk = kv_view_of(&g->kv);
    ok = rows && one && use(g, ad, &SEQ[3], u, &err) == 0 && session_forward(g, &trunk, prompt, 6, &err) == 0;
    for (int b = 0; ok && b < B; b++) {
        ok = kv_cache_init_like(&tails[b], &g->kv, 16, &err) == 0;
        views[b] = (kv_view){ &g->kv, 6, &tails[b] };
        for (int t = 0; ok && t < b % 3; t++) {
            int id = 20 + 3 * b + t;
            ok = session_forward(g, &views[b], &id, 1, &err) == 0;
        }
        ids[b] = (17 * b + 2) % V;
    }
    for (int b = 0; ok && b < B; b++) {  // each row alone, then its tail back
        ok = session_forward(g, &views[b], &ids[b], 1, &err) == 0;
        if (ok) memcpy(one + (size_t)b * V, g->fw.logits, sizeof(float) * (size_t)V);
        tails[b].len--;
    }
    ok = ok && session_forward_batch(g, views, ids, B, rows, NULL, NULL, NULL, &err) == 0;
    CHECK(ok, "cuda_lora batch runs", "%s", err.msg);
    for (int b = 0; ok && b < B; b++)
        CHECK(!memcmp(rows + (size_t)b * V, one + (size_t)b * V, sizeof(float) * (size_t)V),
              NAME("cuda_lora batch row %d == its one-token step, bit for bit", b), "logits differ");
    for (int b = 0; b < B; b++) kv_cache_free(&tails[b]);
    free(rows), free(one);
}

// A second context on the same weights: the same logits, no second upload needed.
static void shared(session *g, lora_adapter *ad) {
    session s2;
    verr err = { { 0 } };
    lora_use u[2], u2[2];
    int V = g->m.cfg.vocab_size, prompt[4] = { 1, 9, 8, 7 };
    if (session_open_shared(&s2, g, 32, &err)) {
        CHECK(0, "cuda_lora shared context opens", "%s", err.msg);
        return;
    }
    kv_cache_truncate(&g->kv, 0);
    kv_view a = kv_view_of(&g->kv), b = kv_view_of(&s2.kv);
    int ok = use(g, ad, &SEQ[3], u, &err) == 0 && use(&s2, ad, &SEQ[3], u2, &err) == 0 &&
             session_forward(g, &a, prompt, 4, &err) == 0 && session_forward(&s2, &b, prompt, 4, &err) == 0;
    CHECK(ok && !memcmp(g->fw.logits, s2.fw.logits, sizeof(float) * (size_t)V),
          "cuda_lora shared context == its base with the same adapters", "%s", err.msg);
    session_close(&s2);
}

int main(void) {
    if (cuda_device_count() == 0) {
        SKIP("cuda_lora", "no CUDA device");
        CHECK_DONE();
    }
    const char *root = getenv("TESTTMP");
    char dir[4096], m[4200], a1[4200], a2[4200];
    snprintf(dir, sizeof dir, "%s/cuda_lora", root && *root ? root : "/tmp");
    if (gen_files(dir)) {
        CHECK(0, "cuda_lora checkpoint and adapters", "the generators failed for %s", dir);
        CHECK_DONE();
    }
    snprintf(m, sizeof m, "%s/m", dir), snprintf(a1, sizeof a1, "%s/a1", dir), snprintf(a2, sizeof a2, "%s/a2", dir);
    session g, e;
    lora_adapter ad[2];
    verr err = { { 0 } };
    if (open_one(&g, m, 1, &err) || open_one(&e, m, 0, &err) || lora_load(&ad[0], &g.m, a1, &err) ||
        lora_load(&ad[1], &g.m, a2, &err)) {
        CHECK(0, "cuda_lora open", "%s", err.msg);
        CHECK_DONE();
    }
    switching(&g, &e, ad);
    batch_rows(&g, ad);
    shared(&g, ad);
    session_set_lora(&g, NULL, 0, &err), session_set_lora(&e, NULL, 0, &err);
    session_close(&g), session_close(&e);
    lora_free(&ad[0]), lora_free(&ad[1]);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    CHECK_DONE();
}
#endif
