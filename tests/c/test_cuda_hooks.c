// test_cuda_hooks.c: forward hooks (model/hooks.h) changed between the decode steps of
// one CUDA session, whose steps replay a captured CUDA graph: each change must
// re-capture it (model/forward_cuda_hooks.c bumps hk.gen). The reference is a second
// session on the same checkpoint with graphs off, given the same hooks at the same
// steps: it launches the same kernels one by one, so every step's logits and captured
// rows must be bit-identical. A graph left stale would replay the old launches (a
// skipped layer run, an ablated head kept) and its logits would differ. Also checked:
// the launches a step counts (a skipped layer launches nothing, a control vector rides
// on the down projection's store) and that the hooks did move the logits.
// The checkpoint is tools/gen_random_checkpoint.py's llama3-tiny (bf16), written here.
// Needs a CUDA device (or the emulated one); prints SKIP without.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "host/runtime/session.h"
#include "host/runtime/session_cuda.h"
#include "model/forward_cuda.h"
#include "model/hooks.h"
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_hooks", "built without CUDA");
    CHECK_DONE();
}
#else

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

// The rows the activation hook received in the last step: layer 0's resid_post.
typedef struct {
    float row[4096];
    int n, calls;
} capture;

static void on_act(void *ud, int layer, int point, const float *x, int T, int pos0) {
    capture *c = ud;
    (void)layer, (void)point, (void)pos0;
    memcpy(c->row, x + (size_t)(T - 1) * c->n, sizeof(float) * (size_t)c->n);
    c->calls++;
}

static int gen_model(const char *dir) {
    const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
    const char *root = getenv("ROOT") ? getenv("ROOT") : ".";
    char cmd[12288];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' tools/gen_random_checkpoint.py --preset llama3-tiny '%s' --seed 31 "
             "--dtype bf16 >/dev/null", root, py, dir);
    return system(cmd) == 0 ? 0 : -1;
}

// One hook setting of the sequence: what the step before it did not have.
typedef struct {
    const char *name;
    int skip1, ablate01, cvec, cvec_scale2, capture;
} setting;

static const setting SEQ[] = {
    { "none", 0, 0, 0, 0, 0 },          { "skip layer 1", 1, 0, 0, 0, 0 },
    { "ablate 0:1", 0, 1, 0, 0, 0 },    { "control vector", 0, 0, 1, 0, 0 },
    { "new vector values", 0, 0, 1, 1, 0 }, { "capture resid_post 0", 0, 1, 0, 0, 1 },
    { "none again", 0, 0, 0, 0, 0 },
};

typedef struct {
    unsigned char skip[2], ablate[8], cvec_on[2], act[2];
    float cvec[2 * 128];
    forward_hooks h;
    capture cap;
} hook_set;

// s's hooks for setting t (NULL for "none": the plain pass).
static void apply(session *s, hook_set *hs, const setting *t) {
    const model_config *c = &s->m.cfg;
    memset(hs, 0, sizeof *hs);
    hs->cap.n = c->dim;
    hs->skip[1] = (unsigned char)t->skip1;
    hs->ablate[0 * c->n_heads + 1] = (unsigned char)t->ablate01;
    hs->cvec_on[1] = (unsigned char)t->cvec;
    for (int i = 0; i < c->dim; i++) hs->cvec[c->dim + i] = (t->cvec_scale2 ? 2.f : 1.f) * (float)((i % 7) - 3) * 0.5f;
    hs->act[0] = 1;
    forward_hooks *h = &hs->h;
    if (t->skip1) h->skip = hs->skip;
    if (t->ablate01) h->ablate = hs->ablate;
    if (t->cvec) h->cvec = hs->cvec, h->cvec_on = hs->cvec_on;
    if (t->capture) h->act_layers = hs->act, h->points = 1u << HOOK_RESID_POST, h->on_act = on_act;
    h->ud = &hs->cap;
    s->fw.hooks = t->skip1 || t->ablate01 || t->cvec || t->capture ? h : NULL;
}

static int open_one(session *s, const char *dir, int graphs, verr *err) {
    session_opts so = { 0 };
    so.model_dir = dir, so.device = "cuda", so.ctx = 64;
    if (session_open(s, &so, err)) return -1;
    cuda_forward_set_graphs(s->cu, graphs);
    return 0;
}

static void run(const char *dir) {
    session g, e;  // graphs on, graphs off
    verr err = { { 0 } };
    if (open_one(&g, dir, 1, &err) || open_one(&e, dir, 0, &err)) {
        CHECK(0, "cuda_hooks open sessions", "%s", err.msg);
        return;
    }
    const model_config *c = &g.m.cfg;
    int V = c->vocab_size, prompt[5] = { 1, 17, 42, 99, 5 }, next = 7;
    kv_view kg = kv_view_of(&g.kv), ke = kv_view_of(&e.kv);
    float *base = malloc(sizeof(float) * (size_t)V);
    hook_set hg, he;
    int ok = base && session_forward(&g, &kg, prompt, 5, &err) == 0 && session_forward(&e, &ke, prompt, 5, &err) == 0;
    CHECK(ok, "cuda_hooks prefill", "%s", err.msg);
    long plain_launches = -1;
    for (size_t i = 0; ok && i < sizeof SEQ / sizeof *SEQ; i++) {
        apply(&g, &hg, &SEQ[i]), apply(&e, &he, &SEQ[i]);
        for (int step = 0; ok && step < 2; step++, next = (next * 31 + 5) % V) {
            if (session_forward(&g, &kg, &next, 1, &err) || session_forward(&e, &ke, &next, 1, &err)) {
                CHECK(0, NAME("cuda_hooks %s step %d", SEQ[i].name, step), "%s", err.msg);
                ok = 0;
                break;
            }
            int same = !memcmp(g.fw.logits, e.fw.logits, sizeof(float) * (size_t)V);
            CHECK(same, NAME("cuda_hooks %s step %d: graph replay == kernels one by one", SEQ[i].name, step),
                  "logits differ: the graph was not re-captured for the new hooks");
            if (SEQ[i].capture)
                CHECK(hg.cap.calls == step + 1 && he.cap.calls == step + 1 &&
                          !memcmp(hg.cap.row, he.cap.row, sizeof(float) * (size_t)c->dim),
                      NAME("cuda_hooks capture step %d: the graph's rows == one by one", step),
                      "calls %d / %d", hg.cap.calls, he.cap.calls);
        }
        cuda_step_counts n;
        session_cuda_counts(&g, &n);
        if (i == 0) plain_launches = n.launches, memcpy(base, g.fw.logits, sizeof(float) * (size_t)V);
        if (SEQ[i].skip1)
            CHECK(n.launches == plain_launches - 5, "cuda_hooks skipped layer launches nothing (5 per layer)",
                  "%ld launches, plain %ld",
                  n.launches, plain_launches);
        if (SEQ[i].cvec)
            CHECK(n.launches == plain_launches, "cuda_hooks control vector costs no launch in decode",
                  "%ld launches, plain %ld", n.launches, plain_launches);
    }
    // The hooks must have mattered: a step with them against the same step without.
    apply(&g, &hg, &SEQ[1]);
    kv_cache_truncate(&g.kv, 5), kg = kv_view_of(&g.kv);
    int id = 7;
    ok = ok && session_forward(&g, &kg, &id, 1, &err) == 0;
    float moved = 0;
    apply(&g, &hg, &SEQ[0]);
    kv_cache_truncate(&g.kv, 5), kg = kv_view_of(&g.kv);
    float *skipped = malloc(sizeof(float) * (size_t)V);
    if (ok && skipped) {
        memcpy(skipped, g.fw.logits, sizeof(float) * (size_t)V);
        ok = session_forward(&g, &kg, &id, 1, &err) == 0;
        for (int i = 0; ok && i < V; i++) moved = fmaxf(moved, fabsf(skipped[i] - g.fw.logits[i]));
    }
    CHECK(ok && moved > 1e-2f, "cuda_hooks skipping layer 1 moves the logits", "max |diff| %g (%s)", moved, err.msg);
    free(skipped), free(base);
    g.fw.hooks = NULL, e.fw.hooks = NULL;
    session_close(&g), session_close(&e);
}

int main(void) {
    if (cuda_device_count() == 0) {
        SKIP("cuda_hooks", "no CUDA device");
        CHECK_DONE();
    }
    const char *root = getenv("TESTTMP");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/cuda_hooks_llama3_tiny", root && *root ? root : "/tmp");
    if (gen_model(dir)) {
        CHECK(0, "cuda_hooks checkpoint", "tools/gen_random_checkpoint.py failed for %s", dir);
        CHECK_DONE();
    }
    run(dir);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    CHECK_DONE();
}
#endif
