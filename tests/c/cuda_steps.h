// cuda_steps.h: steps the whole-model CUDA tests share (test_cuda_persist.c,
// test_cuda_tune.c): an armed greedy step of a session, and a forward hook that counts
// its calls.
#ifndef VARENT_TEST_CUDA_STEPS_H
#define VARENT_TEST_CUDA_STEPS_H
#include "host/runtime/session.h"

// One greedy step of a CUDA session: the draw armed, the forward, the draw taken.
static inline int greedy_step(session *s, kv_view *kv, int tok, int *next, verr *err) {
    sample_cfg cfg = { 0.f, 0, 1.f, 0.f, 0.0 };
    sample_out o;
    if (session_arm_sample(s, &cfg, 1, err) || session_forward(s, kv, &tok, 1, err) ||
        session_sample(s, &cfg, 1, &o, err))
        return -1;
    *next = o.token;
    return 0;
}

// An activation hook (forward_hooks.on_act) that counts its calls in *(int *)ud.
static inline void count_act(void *ud, int layer, int point, const float *x, int T, int pos0) {
    (void)layer, (void)point, (void)x, (void)T, (void)pos0;
    ++*(int *)ud;
}

#endif
