// session_sample.c: see session_sample in session.h.
#include "host/runtime/session.h"
#include "host/runtime/session_cuda.h"

int session_sample(session *s, const sample_cfg *cfg, int n, sample_out *out, verr *err) {
    if (n <= 0) return 0;
    if (s->cu) return session_cuda_sample(s, cfg, n, out, err);
    sampler_sample_n(&s->smp, s->fw.logits, cfg, n, out);
    return 0;
}

int session_arm_entropix(session *s, const struct entropix_config_s *c, const double *u, int k, int prev_token,
                         int clarifier, verr *err) {
    if (!s->cu || s->m.tp.size > 1) return 0;
    return cuda_forward_arm_entropix(s->cu, c, u, k, prev_token, clarifier, err);
}

int session_arm_sample(session *s, const sample_cfg *cfg, int n, verr *err) {
    if (!s->cu || s->m.tp.size > 1) return 0;
    return cuda_forward_arm_sample(s->cu, cfg, n, err);
}
