// tune.c: --decode-kernel auto (model/forward_cuda.h, docs/cuda.md "Choosing the decode
// kernel"). The first one-row decode steps of a forward alternate the graph path and the
// persistent kernel: one untimed step of each (the graph's capture, the kernel's fit
// check), then CUDA_TUNE_TIMED of each, in turn, each timed on the device between two events.
// Once the last of them is queued, one host wait reads the times, and every later step
// takes the kernel with the lower median. The two kernels give the same bits (the tests'
// and the GPU window's stress stage's claim), so the choice changes a step's time only.
// A step meant for the persistent kernel that falls back (hooks, LoRA, a paged cache)
// settles the choice on the graph path, with the reason.
#include "model/forward_cuda.h"

#include <stdio.h>
#include <string.h>

float cuda_tune_median(const float *v, int n) {
    float s[CUDA_TUNE_TIMED];
    if (n < 1 || n > CUDA_TUNE_TIMED) return 0.f;
    memcpy(s, v, sizeof *s * (size_t)n);
    for (int i = 1; i < n; i++)  // insertion sort: n is 3
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            float t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : 0.5f * (s[n / 2 - 1] + s[n / 2]);
}

int cuda_tune_pick(const float graph_ms[CUDA_TUNE_TIMED], const float persist_ms[CUDA_TUNE_TIMED], float med[2]) {
    med[0] = cuda_tune_median(graph_ms, CUDA_TUNE_TIMED);
    med[1] = cuda_tune_median(persist_ms, CUDA_TUNE_TIMED);
    return med[1] < med[0];  // a tie keeps the graph path, the fallback of every step
}

#ifdef VARENT_CUDA

#include "model/cuda/internal.h"

#define TUNE_STEPS (2 + 2 * CUDA_TUNE_TIMED)  // the warm-ups, then the timed steps

void cuda_tune_reset(dev_tune *t) {
    t->step = 0;
    t->want = 0;
    t->decided = 0;
    t->pick = 0;
    memset(t->ms, 0, sizeof t->ms);
    memset(t->med, 0, sizeof t->med);
    t->why[0] = 0;
}

void cuda_tune_free(dev_tune *t) {
    for (int i = 0; i < t->n_ev; i++) cudaEventDestroy(t->ev[i]);
    t->n_ev = 0;
}

int cuda_tune_wants(const cuda_forward *d) {
    const dev_persist *p = &d->persist;
    if (p->on != 2) return p->on != 0;
    return p->tune.decided ? p->tune.pick : p->tune.want;
}

static void settle(dev_tune *t, int pick, const char *why) {
    t->decided = 1;
    t->pick = pick;
    snprintf(t->why, sizeof t->why, "%s", why);
}

int cuda_tune_begin(cuda_forward *d, verr *err) {
    dev_tune *t = &d->persist.tune;
    if (d->persist.on != 2 || t->decided) return 0;
    t->want = t->step & 1;  // graph, persistent, graph, ...
    if (t->step < 2) return 0;  // the warm-ups are not timed
    for (; t->n_ev < 2 * 2 * CUDA_TUNE_TIMED; t->n_ev++) CK(cudaEventCreate(&t->ev[t->n_ev]));
    CK(cudaEventRecord(t->ev[2 * (t->step - 2)], d->core.ctx.stream));
    return 0;
}

// The timed steps' device times, their medians and the choice (one host wait).
static int decide(cuda_forward *d, verr *err) {
    dev_tune *t = &d->persist.tune;
    cuda_core *f = &d->core;
    f->ctx.n_syncs++;
    CK(cudaEventSynchronize(t->ev[2 * (TUNE_STEPS - 2) - 1]));
    for (int k = 0; k < 2 * CUDA_TUNE_TIMED; k++)
        CK(cudaEventElapsedTime(&t->ms[k & 1][k / 2], t->ev[2 * k], t->ev[2 * k + 1]));
    settle(t, cuda_tune_pick(t->ms[0], t->ms[1], t->med), "");
    return 0;
}

int cuda_tune_end(cuda_forward *d, int ran, verr *err) {
    dev_tune *t = &d->persist.tune;
    if (d->persist.on != 2 || t->decided) return 0;
    if (t->want && !ran) {
        char why[sizeof t->why];
        snprintf(why, sizeof why, "the persistent kernel did not take a step (%s)",
                 d->persist.fallbacks ? d->persist.why : "a paged KV cache");
        settle(t, 0, why);
        return 0;
    }
    if (t->step >= 2) CK(cudaEventRecord(t->ev[2 * (t->step - 2) + 1], d->core.ctx.stream));
    t->step++;
    return t->step == TUNE_STEPS ? decide(d, err) : 0;
}

#endif
