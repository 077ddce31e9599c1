// session_sample.c: see session_sample in session.h.
#include "host/runtime/session.h"
#include "host/runtime/session_cuda.h"

int session_sample(session *s, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    if (n <= 0) return 0;
    if (s->cu) return session_cuda_sample(s, cfg, n, out, err);
    sampler_sample_n(&s->smp, s->fw.logits, cfg, n, out);
    return 0;
}
