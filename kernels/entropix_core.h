// entropix_core.h: the entropix decision, shared word for word by the host
// (host/decode/entropix.c) and the device (kernels/cuda/entropix.cu), as sample_core.h
// is for the draw. From one step's six metrics it picks a quadrant by the profile's
// boxes and order, and that quadrant's sampling parameters.
//
// Why on both: a CUDA decode step decides on the device, right after the statistics,
// and draws there, so the token comes back with them in one host round trip; the host
// decides again for its records and takes the device's draws only when its own
// parameters are the same to the bit. Both sides compile this with no contracted
// multiply-adds (-ffp-contract=off, nvcc -fmad=false; the Makefile), so IEEE double
// arithmetic in the same order gives the same bits.
#ifndef VARENT_ENTROPIX_CORE_H
#define VARENT_ENTROPIX_CORE_H

#include <math.h>

#include "kernels/ops.h"

#ifdef __CUDACC__
#define EX_HD __host__ __device__ __forceinline__
#else
#define EX_HD static inline
#endif

typedef enum { Q_LELV, Q_HELV, Q_LEHV, Q_HEHV, Q_ADAPTIVE, Q_BRANCH, Q_STANDARD, Q_COUNT } entropix_quadrant;
#define ENTROPIX_N_BOXES 4  // LELV..HEHV have boxes; the rest are outcomes

enum { M_ENT, M_VENT, M_AENT, M_AVENT, M_AGREE, M_INTER, M_COUNT };

// A quadrant matches when lo[i] < metric[i] < hi[i] for every metric (strict, as in
// entropix; +-inf leaves a metric unconstrained).
typedef struct {
    double lo[M_COUNT], hi[M_COUNT];
} entropix_box;

typedef struct entropix_config_s {
    char name[32];
    double temp, top_p, min_p, top_k;  // T0, P0, M0, K0
    double n_samples;                  // ADAPTIVE draws
    entropix_box box[ENTROPIX_N_BOXES];
    int order[ENTROPIX_N_BOXES];       // quadrants in the order they are checked
    // HELV: T = min(helv_t_max, T0 (helv_t_off + helv_t_coef * attn_entropy))
    double helv_t_off, helv_t_coef, helv_t_max;
    // LEHV: T = min(lehv_t_max, T0 (lehv_t_off + lehv_t_coef * inter)),
    //       top_k = max(lehv_k_min, floor(K0 (1 + lehv_k_coef (1 - agreement))))
    double lehv_t_off, lehv_t_coef, lehv_t_max, lehv_k_coef, lehv_k_min;
    // HEHV: T = max(hehv_t_min, T0 (hehv_t_off + hehv_t_coef * attn_varentropy)),
    //       top_p = max(hehv_p_min, P0 - hehv_p_coef * attn_entropy)
    double hehv_t_off, hehv_t_coef, hehv_t_min, hehv_p_coef, hehv_p_min;
    // ADAPTIVE temperature, top-p, top-k and min-p coefficients (see entropix_decide)
    double ad_t_logits, ad_t_attn, ad_t_agree, ad_p_avent, ad_k_inter, ad_k_agree, ad_m_unc;
    // ADAPTIVE sample score weights: H, attn_entropy, V, attn_varentropy, agreement, inter
    double score_w[M_COUNT];
} entropix_config;

// What one step decided.
typedef struct {
    entropix_quadrant q;
    int greedy;        // LELV: argmax
    int clarify;       // HELV: emit the clarifier token as is
    sampler_params sp; // parameters of the draw (when neither greedy nor clarify)
    int n_samples;     // draws to score (ADAPTIVE), else 1
} entropix_step;

#define ENTROPIX_MAX_SAMPLES 1024

EX_HD double ex_clip(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

// Every float->int conversion goes through here: NaN (non-finite metrics) gives dflt,
// and anything outside [lo, hi] (inf included) is clipped, so the cast is always defined.
EX_HD int ex_to_int(double x, int lo, int hi, int dflt) { return isnan(x) ? dflt : (int)ex_clip(x, lo, hi); }

// x: the metrics in M_* order.
EX_HD entropix_quadrant ex_classify(const entropix_config *c, const double *x) {
    for (int k = 0; k < ENTROPIX_N_BOXES; k++) {
        int q = c->order[k], in = 1;
        if (q < 0 || q >= ENTROPIX_N_BOXES) continue;
        for (int i = 0; i < M_COUNT && in; i++) in = x[i] > c->box[q].lo[i] && x[i] < c->box[q].hi[i];
        if (in) return (entropix_quadrant)q;
    }
    return Q_ADAPTIVE;
}

EX_HD sampler_params ex_base_params(const entropix_config *c) {
    sampler_params p = { (float)c->temp, ex_to_int(c->top_k, 0, 1 << 30, 0), (float)c->top_p, (float)c->min_p };
    return p;
}

EX_HD int ex_n_samples(const entropix_config *c) { return ex_to_int(c->n_samples, 1, ENTROPIX_MAX_SAMPLES, 1); }

EX_HD void ex_adaptive(const entropix_config *c, const double *x, entropix_step *st) {
    double H = x[M_ENT], V = x[M_VENT], ae = x[M_AENT], av = x[M_AVENT], ag = x[M_AGREE], is = x[M_INTER];
    st->sp.temperature = (float)(c->temp * (1 + c->ad_t_logits * (H + V) + c->ad_t_attn * (ae + av) - c->ad_t_agree * ag));
    st->sp.top_p = (float)ex_clip(c->top_p * (1 + c->ad_p_avent * av), 0.1, 1.0);
    st->sp.top_k = ex_to_int(round(c->top_k * (1 + c->ad_k_inter * is - c->ad_k_agree * ag)), 1, 100, 1);
    st->sp.min_p = (float)ex_clip(c->min_p * (1 - c->ad_m_unc * (H + V)), 0.01, 0.5);
    st->n_samples = ex_n_samples(c);
}

// The quadrant and the parameters. prev_token: the sequence's last token (-1: none).
EX_HD entropix_step ex_decide(const entropix_config *c, const double *x, int prev_token, int clarifier) {
    entropix_step st;
    st.q = ex_classify(c, x), st.greedy = 0, st.clarify = 0, st.sp = ex_base_params(c), st.n_samples = 1;
    const sampler_params argmax = { 0, 1, 1, 0 };
    switch (st.q) {
    case Q_LELV:
        st.greedy = 1;
        st.sp = argmax;
        break;
    case Q_HELV:
        if (clarifier >= 0 && prev_token != clarifier) {  // never twice in a row
            st.clarify = 1;
            st.sp = argmax;
        } else {
            st.sp.temperature = (float)fmin(c->helv_t_max, c->temp * (c->helv_t_off + c->helv_t_coef * x[M_AENT]));
        }
        break;
    case Q_LEHV:
        st.sp.temperature = (float)fmin(c->lehv_t_max, c->temp * (c->lehv_t_off + c->lehv_t_coef * x[M_INTER]));
        st.sp.top_k = ex_to_int(fmax(c->lehv_k_min, floor(c->top_k * (1 + c->lehv_k_coef * (1 - x[M_AGREE])))), 0,
                                1 << 30, 0);
        break;
    case Q_HEHV:
        st.sp.temperature = (float)fmax(c->hehv_t_min, c->temp * (c->hehv_t_off + c->hehv_t_coef * x[M_AVENT]));
        st.sp.top_p = (float)fmax(c->hehv_p_min, c->top_p - c->hehv_p_coef * x[M_AENT]);
        break;
    default:
        ex_adaptive(c, x, &st);
        break;
    }
    return st;
}

// The draws the host's decode loop makes for step st (host/decode/generate.c): none for
// the clarifier, else st.n_samples (1 unless ADAPTIVE) of st.sp, each with the next
// uniform of the run's stream when the temperature is positive (u[i]: the stream's
// next values, peeked). Returns the count; cfg has room for ex_n_samples(c).
EX_HD int ex_draws(const entropix_step *st, const double *u, sample_cfg *cfg) {
    if (st->clarify) return 0;
    int n = st->greedy ? 1 : st->n_samples;
    for (int i = 0; i < n; i++) {
        cfg[i].temperature = st->sp.temperature, cfg[i].top_k = st->sp.top_k;
        cfg[i].top_p = st->sp.top_p, cfg[i].min_p = st->sp.min_p;
        cfg[i].u = st->sp.temperature > 0 ? u[i] : 0;
    }
    return n;
}

#endif
