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

// The types and the decision itself live in kernels/entropix_core.h, which the device
// shares (a CUDA step decides and draws there; docs/entropix.md).
#include "kernels/entropix_core.h"

const char *entropix_quadrant_name(entropix_quadrant q);
// The profile's base draw (T0, K0, P0, M0) and ADAPTIVE draw count as the sampler takes
// them: every float->int conversion here and in entropix_decide is range-checked (NaN
// gives the default, anything else is clipped: top-k into 0..2^30, 0 = off; draws into
// 1..ENTROPIX_MAX_SAMPLES), so non-finite metrics or constants never reach a cast.
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

// m's six metrics in M_* order (the decision's input).
void entropix_metric_vector(const token_metrics *m, double x[M_COUNT]);
// The quadrant the metrics fall in, by the profile's boxes and order.
entropix_quadrant entropix_classify(const entropix_config *c, const token_metrics *m);
// The quadrant and the parameters. prev_token: the sequence's last token (-1: none).
entropix_step entropix_decide(const entropix_config *c, const token_metrics *m, int prev_token, int clarifier);
// ADAPTIVE's score of a drawn token: log-softmax of the raw logits at it plus the
// confidence term (the same for every draw).
double entropix_score(const entropix_config *c, const token_metrics *m, double logit);

#endif
