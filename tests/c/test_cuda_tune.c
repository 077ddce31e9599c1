// test_cuda_tune.c: --decode-kernel auto (model/cuda/tune.c). The choice itself, on
// planted times: the lower median wins, a tie keeps the graph path, one slow outlier
// does not decide. Then on llama3-tiny (bf16) against a graph-path session fed the same
// tokens, 16 greedy steps each:
//   - the tokens and logits are the graph path's, bit for bit, at every step;
//   - the first 8 steps alternate the kernels (graph first): 4 persistent steps, the
//     choice made at the 8th with one extra host wait, both medians above zero;
//   - every later step takes the chosen kernel (the persistent steps' count says which);
//   - setting the decode kernel again starts the timing afresh;
//   - with forward hooks the persistent kernel cannot take its first step: the choice
//     is the graph path, untimed, and says why.
// The emulated device's times are the host's, so which kernel wins here means nothing;
// the bookkeeping around the choice is what is checked.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "host/runtime/session.h"
#include "model/forward_cuda.h"
#include "cuda_steps.h"
#include "test_models.h"

static char nm[256];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)


#define STEPS 16
#define TIMING_STEPS (2 + 2 * CUDA_TUNE_TIMED)

static void test_pick(void) {
    float g[3] = { 1.0f, 1.2f, 0.9f }, p[3] = { 0.8f, 0.7f, 0.95f }, med[2];
    int pick = cuda_tune_pick(g, p, med);
    CHECK(pick == 1 && med[0] == 1.0f && med[1] == 0.8f, "cuda_tune_pick: the lower median wins (persistent)",
          "pick %d, medians %g %g", pick, med[0], med[1]);
    pick = cuda_tune_pick(p, g, med);
    CHECK(pick == 0 && med[0] == 0.8f && med[1] == 1.0f, "cuda_tune_pick: the lower median wins (graph)",
          "pick %d, medians %g %g", pick, med[0], med[1]);
    float same[3] = { 2.f, 2.f, 2.f };
    pick = cuda_tune_pick(same, same, med);
    CHECK(pick == 0, "cuda_tune_pick: a tie keeps the graph path", "pick %d", pick);
    float outlier[3] = { 0.5f, 9.0f, 0.6f }, steady[3] = { 0.7f, 0.7f, 0.7f };  // mean 3.4, median 0.6
    pick = cuda_tune_pick(steady, outlier, med);
    CHECK(pick == 1 && med[1] == 0.6f, "cuda_tune_pick: one slow step does not decide (a median, not a mean)",
          "pick %d, medians %g %g", pick, med[0], med[1]);
    float two[2] = { 3.f, 1.f };
    CHECK(cuda_tune_median(two, 2) == 2.f && cuda_tune_median(two, 0) == 0.f,
          "cuda_tune_median: an even count averages the middle two; none is 0", "%g %g", cuda_tune_median(two, 2),
          cuda_tune_median(two, 0));
}

#ifndef VARENT_CUDA
int main(void) {
    test_pick();
    SKIP("cuda_tune", "built without CUDA");
    CHECK_DONE();
}
#else

typedef struct {
    int bad_tok, bad_bits, extra_syncs, wrong_kernel;
    int tune_at;  // the step whose counts first said "chosen" (-1: never)
    long persist_at_choice;
} run_tally;

// STEPS greedy steps of g (graph) and a (auto) fed the same tokens from tok.
static int run_steps(session *g, kv_view *kg, session *a, kv_view *ka, int tok, run_tally *y, verr *err) {
    int V = g->m.cfg.vocab_size;
    memset(y, 0, sizeof *y);
    y->tune_at = -1;
    cuda_step_counts c0, c1;
    for (int j = 0; j < STEPS; j++) {
        int ng = 0, na = 0;
        cuda_forward_counts(a->cu, &c0);
        if (greedy_step(g, kg, tok, &ng, err) || greedy_step(a, ka, tok, &na, err)) return -1;
        cuda_forward_counts(a->cu, &c1);
        y->bad_tok += ng != na;
        y->bad_bits += memcmp(g->fw.logits, a->fw.logits, sizeof(float) * (size_t)V) != 0;
        long waits = c1.syncs - c0.syncs, want_waits = j == TIMING_STEPS - 1 ? 2 : 1;
        y->extra_syncs += waits != want_waits;
        if (c1.tune == 2 && y->tune_at < 0) {
            y->tune_at = j;
            y->persist_at_choice = c1.persist_steps;
        }
        // the schedule (odd steps persistent), then the choice
        int want = j < TIMING_STEPS ? (j & 1) : c1.tune_pick;
        y->wrong_kernel += c1.persistent != want;
        tok = ng;
    }
    return 0;
}

// Forward hooks on every step: the first step meant for the persistent kernel falls
// back, and the choice is the graph path, untimed, with the reason.
static void check_hooks(session *a, kv_view *ka, int tok) {
    verr err = { { 0 } };
    int L = a->m.cfg.n_layers, calls = 0, rc = 0;
    unsigned char *layers = calloc((size_t)L, 1);
    layers[0] = 1;
    forward_hooks h;
    memset(&h, 0, sizeof h);
    h.act_layers = layers, h.points = 1u << HOOK_RESID_PRE, h.on_act = count_act, h.ud = &calls;
    cuda_forward_set_decode_kernel(a->cu, 2, 4);
    cuda_step_counts c;
    a->fw.hooks = &h;
    for (int j = 0; rc == 0 && j < 4; j++) rc = session_forward(a, ka, &tok, 1, &err);
    a->fw.hooks = NULL;
    cuda_forward_counts(a->cu, &c);
    CHECK(rc == 0 && calls == 4 && c.tune == 2 && c.tune_pick == 0 && c.tune_why &&
              strstr(c.tune_why, "forward hooks") && c.tune_ms[0] == 0.f,
          "cuda_tune: with forward hooks the choice is the graph path, untimed, with the reason",
          "rc %d (%s), %d hook calls, tune %d pick %d why '%s'", rc, err.msg, calls, c.tune, c.tune_pick,
          c.tune_why ? c.tune_why : "");
    free(layers);
}

static void run_model(const char *dir) {
    verr err = { { 0 } };
    session g, a;
    session_opts o = { .model_dir = dir, .device = "cuda", .ctx = 96 };
    if (session_open(&g, &o, &err)) {
        CHECK(0, "cuda_tune: open", "%s", err.msg);
        return;
    }
    if (session_open_shared(&a, &g, 0, &err)) {
        CHECK(0, "cuda_tune: open a second context", "%s", err.msg);
        session_close(&g);
        return;
    }
    cuda_forward_set_decode_kernel(a.cu, 2, 4);  // auto, a 4-block grid (the emulated device)
    kv_view kg = kv_view_of(&g.kv), ka = kv_view_of(&a.kv);
    int prompt[5] = { 1, 403, 407, 261, 378 };
    run_tally y;
    int rc = session_forward(&g, &kg, prompt, 5, &err) || session_forward(&a, &ka, prompt, 5, &err) ||
             run_steps(&g, &kg, &a, &ka, 22, &y, &err);
    cuda_step_counts c;
    cuda_forward_counts(a.cu, &c);
    CHECK(rc == 0 && y.bad_tok == 0 && y.bad_bits == 0,
          NAME("cuda_tune: %d greedy steps under auto, the graph path's tokens and logits bit for bit", STEPS),
          "rc %d (%s), %d tokens and %d logit rows differ", rc, err.msg, y.bad_tok, y.bad_bits);
    CHECK(rc == 0 && y.tune_at == TIMING_STEPS - 1 && y.persist_at_choice == 1 + CUDA_TUNE_TIMED && !c.tune_why &&
              c.tune_ms[0] > 0.f && c.tune_ms[1] > 0.f,
          NAME("cuda_tune: the choice made at step %d, after %d persistent steps, both timed", TIMING_STEPS,
               1 + CUDA_TUNE_TIMED),
          "chosen at step %d after %ld persistent steps, medians %g %g ms, why '%s'", y.tune_at + 1,
          y.persist_at_choice, c.tune_ms[0], c.tune_ms[1], c.tune_why ? c.tune_why : "");
    long want = 1 + CUDA_TUNE_TIMED + (c.tune_pick ? STEPS - TIMING_STEPS : 0);
    CHECK(rc == 0 && y.wrong_kernel == 0 && c.persist_steps == want && c.persist_fallbacks == 0,
          "cuda_tune: the schedule, then every step on the chosen kernel",
          "%d steps on the other kernel; %ld persistent steps (want %ld, chose %s), %ld fallbacks", y.wrong_kernel,
          c.persist_steps, want, c.tune_pick ? "persistent" : "graph", c.persist_fallbacks);
    CHECK(rc == 0 && y.extra_syncs == 0, "cuda_tune: one host wait a step, and one more for the choice",
          "%d steps off", y.extra_syncs);
    cuda_forward_set_decode_kernel(a.cu, 2, 4);
    cuda_forward_counts(a.cu, &c);
    CHECK(c.tune == 1, "cuda_tune: setting the decode kernel again starts the timing afresh", "tune %d", c.tune);
    if (rc == 0) check_hooks(&a, &ka, 22);
    session_close(&a);
    session_close(&g);
}

int main(void) {
    test_pick();
    if (cuda_device_count() == 0) {
        SKIP("cuda_tune", "no CUDA device");
        CHECK_DONE();
    }
    char work[512], dir[600];
    snprintf(work, sizeof work, "%s/cuda_tune", env_or("TESTTMP", "tests/tmp"));
    mkdir(work, 0755);
    if (gen_random_model(work, "llama3-tiny", "bf16", 13, dir, sizeof dir)) {
        CHECK(0, "cuda_tune: checkpoint", "tools/gen_random_checkpoint.py failed");
        CHECK_DONE();
    }
    run_model(dir);
    CHECK_DONE();
}
#endif
