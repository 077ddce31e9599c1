// entropix.h: the entropix sampler's decision. From one step's metrics it picks a
// quadrant (LELV, HELV, LEHV, HEHV, or ADAPTIVE when none matches) and the sampling
// parameters that quadrant uses. Quadrants are boxes over the six metrics, checked in
// the profile's order; profiles are rows of a table (host/decode/profiles.c) and
// every constant can be overridden by name (--set KEY=VALUE or a JSON file).
#ifndef VARENT_ENTROPIX_H
#define VARENT_ENTROPIX_H

#include "host/util/err.h"
#include "host/runtime/metrics.h"
#include "host/runtime/sampler.h"

typedef enum { Q_LELV, Q_HELV, Q_LEHV, Q_HEHV, Q_ADAPTIVE, Q_BRANCH, Q_STANDARD, Q_COUNT } entropix_quadrant;
#define ENTROPIX_N_BOXES 4  // LELV..HEHV have boxes; the rest are outcomes

enum { M_ENT, M_VENT, M_AENT, M_AVENT, M_AGREE, M_INTER, M_COUNT };

// A quadrant matches when lo[i] < metric[i] < hi[i] for every metric (strict, as in
// entropix; +-inf leaves a metric unconstrained).
typedef struct {
    double lo[M_COUNT], hi[M_COUNT];
} entropix_box;

typedef struct {
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

const char *entropix_quadrant_name(entropix_quadrant q);
// The profile's base draw (T0, K0, P0, M0) and ADAPTIVE draw count as the sampler takes
// them: every float->int conversion here and in entropix_decide is range-checked (NaN
// gives the default, anything else is clipped: top-k into 0..2^30, 0 = off; draws into
// 1..ENTROPIX_MAX_SAMPLES), so non-finite metrics or constants never reach a cast.
#define ENTROPIX_MAX_SAMPLES 1024
sampler_params entropix_base_params(const entropix_config *c);
int entropix_n_samples(const entropix_config *c);
// Copies the named profile ("seed", "jax", "frog"); -1 with err for an unknown name.
int entropix_profile(const char *name, entropix_config *c, verr *err);
// A stock profile by name, or a profile file: a name that is not a stock profile and
// ends in ".json" or contains '/' is read with entropix_load_json on top of the seed
// profile (`varent calibrate` writes such files). For the CLI only: a file name from
// a network request must never reach it.
int entropix_profile_load(const char *name_or_path, entropix_config *c, verr *err);
// Lists profile names, comma-separated, for error messages.
const char *entropix_profile_names(void);
// Sets one constant by its documented key ("temperature", "HELV.entropy.min",
// "order", ...). -1 with err naming the key when it does not exist or the value is bad.
int entropix_set(entropix_config *c, const char *key, const char *value, verr *err);
// Applies a JSON object of key: value pairs (numbers, or a string for "order"/"profile"
// (a stock name) or "name" (the profile's name)); the key "calibration" is metadata and
// is skipped.
int entropix_load_json(entropix_config *c, const char *path, verr *err);

// The quadrant the metrics fall in, by the profile's boxes and order.
entropix_quadrant entropix_classify(const entropix_config *c, const token_metrics *m);
// The quadrant and the parameters. prev_token: the sequence's last token (-1: none).
entropix_step entropix_decide(const entropix_config *c, const token_metrics *m, int prev_token, int clarifier);
// ADAPTIVE's score of a drawn token: log-softmax of the raw logits at it plus the
// confidence term (the same for every draw).
double entropix_score(const entropix_config *c, const token_metrics *m, double logit);

#endif
