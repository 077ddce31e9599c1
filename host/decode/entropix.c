// entropix.c: see entropix.h. The formulas follow the entropix reference sampler; the
// constants live in the profile so none is hidden here.
#include "host/decode/entropix.h"

#include <math.h>

static const char *QUADRANT_NAMES[Q_COUNT] = { "LELV", "HELV", "LEHV", "HEHV", "ADAPTIVE", "BRANCH", "STANDARD" };

const char *entropix_quadrant_name(entropix_quadrant q) {
    return q >= 0 && q < Q_COUNT ? QUADRANT_NAMES[q] : "?";
}

static void metric_vector(const token_metrics *m, double x[M_COUNT]) {
    x[M_ENT] = m->entropy, x[M_VENT] = m->varentropy, x[M_AENT] = m->attn_entropy;
    x[M_AVENT] = m->attn_varentropy, x[M_AGREE] = m->agreement, x[M_INTER] = m->interaction_strength;
}

entropix_quadrant entropix_classify(const entropix_config *c, const token_metrics *m) {
    double x[M_COUNT];
    metric_vector(m, x);
    for (int k = 0; k < ENTROPIX_N_BOXES; k++) {
        int q = c->order[k], in = 1;
        if (q < 0 || q >= ENTROPIX_N_BOXES) continue;
        for (int i = 0; i < M_COUNT && in; i++) in = x[i] > c->box[q].lo[i] && x[i] < c->box[q].hi[i];
        if (in) return (entropix_quadrant)q;
    }
    return Q_ADAPTIVE;
}

static double clip(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

// Every float->int conversion goes through here: NaN (non-finite metrics) gives dflt,
// and anything outside [lo, hi] (inf included) is clipped, so the cast is always defined.
static int to_int(double x, int lo, int hi, int dflt) { return isnan(x) ? dflt : (int)clip(x, lo, hi); }

sampler_params entropix_base_params(const entropix_config *c) {
    return (sampler_params){ (float)c->temp, to_int(c->top_k, 0, 1 << 30, 0), (float)c->top_p, (float)c->min_p };
}

int entropix_n_samples(const entropix_config *c) { return to_int(c->n_samples, 1, ENTROPIX_MAX_SAMPLES, 1); }

static void adaptive_params(const entropix_config *c, const token_metrics *m, entropix_step *st) {
    double H = m->entropy, V = m->varentropy, ae = m->attn_entropy, av = m->attn_varentropy;
    double ag = m->agreement, is = m->interaction_strength;
    st->sp.temperature = (float)(c->temp * (1 + c->ad_t_logits * (H + V) + c->ad_t_attn * (ae + av) - c->ad_t_agree * ag));
    st->sp.top_p = (float)clip(c->top_p * (1 + c->ad_p_avent * av), 0.1, 1.0);
    st->sp.top_k = to_int(round(c->top_k * (1 + c->ad_k_inter * is - c->ad_k_agree * ag)), 1, 100, 1);
    st->sp.min_p = (float)clip(c->min_p * (1 - c->ad_m_unc * (H + V)), 0.01, 0.5);
    st->n_samples = entropix_n_samples(c);
}

entropix_step entropix_decide(const entropix_config *c, const token_metrics *m, int prev_token, int clarifier) {
    entropix_step st = { .q = entropix_classify(c, m), .sp = entropix_base_params(c), .n_samples = 1 };
    switch (st.q) {
    case Q_LELV:
        st.greedy = 1;
        st.sp = (sampler_params){ 0, 1, 1, 0 };
        break;
    case Q_HELV:
        if (clarifier >= 0 && prev_token != clarifier) {  // never twice in a row
            st.clarify = 1;
            st.sp = (sampler_params){ 0, 1, 1, 0 };
        } else {
            st.sp.temperature = (float)fmin(c->helv_t_max, c->temp * (c->helv_t_off + c->helv_t_coef * m->attn_entropy));
        }
        break;
    case Q_LEHV:
        st.sp.temperature = (float)fmin(c->lehv_t_max, c->temp * (c->lehv_t_off + c->lehv_t_coef * m->interaction_strength));
        st.sp.top_k = to_int(fmax(c->lehv_k_min, floor(c->top_k * (1 + c->lehv_k_coef * (1 - m->agreement)))), 0,
                             1 << 30, 0);
        break;
    case Q_HEHV:
        st.sp.temperature = (float)fmax(c->hehv_t_min, c->temp * (c->hehv_t_off + c->hehv_t_coef * m->attn_varentropy));
        st.sp.top_p = (float)fmax(c->hehv_p_min, c->top_p - c->hehv_p_coef * m->attn_entropy);
        break;
    default:
        adaptive_params(c, m, &st);
        break;
    }
    return st;
}

double entropix_score(const entropix_config *c, const token_metrics *m, double logit) {
    double x[M_COUNT];
    metric_vector(m, x);
    // 1 - metric for the uncertainties, the metric itself for agreement and interaction
    double conf = c->score_w[M_ENT] * (1 - x[M_ENT]) + c->score_w[M_AENT] * (1 - x[M_AENT]) +
                  c->score_w[M_VENT] * (1 - x[M_VENT]) + c->score_w[M_AVENT] * (1 - x[M_AVENT]) +
                  c->score_w[M_AGREE] * x[M_AGREE] + c->score_w[M_INTER] * x[M_INTER];
    return (logit - m->log_z) + conf;
}
