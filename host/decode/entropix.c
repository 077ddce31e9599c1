// entropix.c: see entropix.h. The formulas follow the entropix reference sampler; the
// constants live in the profile so none is hidden here.
#include "host/decode/entropix.h"

#include <math.h>

static const char *QUADRANT_NAMES[Q_COUNT] = { "LELV", "HELV", "LEHV", "HEHV", "ADAPTIVE", "BRANCH", "STANDARD" };

const char *entropix_quadrant_name(entropix_quadrant q) {
    return q >= 0 && q < Q_COUNT ? QUADRANT_NAMES[q] : "?";
}

void entropix_metric_vector(const token_metrics *m, double x[M_COUNT]) {
    x[M_ENT] = m->entropy, x[M_VENT] = m->varentropy, x[M_AENT] = m->attn_entropy;
    x[M_AVENT] = m->attn_varentropy, x[M_AGREE] = m->agreement, x[M_INTER] = m->interaction_strength;
}

entropix_quadrant entropix_classify(const entropix_config *c, const token_metrics *m) {
    double x[M_COUNT];
    entropix_metric_vector(m, x);
    return ex_classify(c, x);
}

sampler_params entropix_base_params(const entropix_config *c) { return ex_base_params(c); }

int entropix_n_samples(const entropix_config *c) { return ex_n_samples(c); }

entropix_step entropix_decide(const entropix_config *c, const token_metrics *m, int prev_token, int clarifier) {
    double x[M_COUNT];
    entropix_metric_vector(m, x);
    return ex_decide(c, x, prev_token, clarifier);
}

double entropix_score(const entropix_config *c, const token_metrics *m, double logit) {
    double x[M_COUNT];
    entropix_metric_vector(m, x);
    // 1 - metric for the uncertainties, the metric itself for agreement and interaction
    double conf = c->score_w[M_ENT] * (1 - x[M_ENT]) + c->score_w[M_AENT] * (1 - x[M_AENT]) +
                  c->score_w[M_VENT] * (1 - x[M_VENT]) + c->score_w[M_AVENT] * (1 - x[M_AVENT]) +
                  c->score_w[M_AGREE] * x[M_AGREE] + c->score_w[M_INTER] * x[M_INTER];
    return (logit - m->log_z) + conf;
}
