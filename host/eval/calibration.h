// calibration.h: an entropix profile fitted to a model's own uncertainty. The six
// metrics (host/runtime/metrics.h) are sampled over a corpus, teacher-forced, or over
// the model's own generations; the profile's boxes are cut at quantiles of entropy H
// and varentropy V (defaults low = 0.25, high = 0.75):
//   LELV  H < H_low  and V < V_low        HELV  H > H_high and V < V_low
//   LEHV  H < H_low  and V > V_high       HEHV  H > H_high and V > V_high
// checked in seed's order (LELV, LEHV, HELV, HEHV); everything else is ADAPTIVE. The
// other constants are seed's. The profile file also records the quantiles of every
// metric, where each absolute threshold of the stock profiles falls on this model and
// the share of tokens in each quadrant under each profile.
#ifndef VARENT_EVAL_CALIBRATION_H
#define VARENT_EVAL_CALIBRATION_H

#include <stdint.h>
#include <stdio.h>

#include "host/decode/entropix.h"
#include "host/runtime/session.h"

typedef struct {
    token_metrics *m;
    long n, cap;
} calib_samples;

void calib_samples_free(calib_samples *c);
// Teacher-forced: ids in windows of the session's context, each from an empty cache,
// fed one token at a time; after each token but a window's first, the metrics of the
// next-token distribution (attention at the last layer). At most max samples (0: all).
int calib_corpus(session *s, const int *ids, int n, long max, calib_samples *out, verr *err);
// The metrics of each token the model generates from prompt with the stock sampler at
// temperature 1 (its own distribution), up to max_new tokens.
int calib_generate(session *s, const int *prompt, int n_prompt, int max_new, uint64_t seed, calib_samples *out,
                   verr *err);

#define CALIB_N_Q 7
extern const double CALIB_QS[CALIB_N_Q];  // 0.05 0.10 0.25 0.50 0.75 0.90 0.95

typedef struct {
    long n;
    double q[M_COUNT][CALIB_N_Q], mean[M_COUNT];
    double lo_q, hi_q;
    double h_lo, h_hi, v_lo, v_hi;     // the cut points
    entropix_config profile;
    double *sorted[M_COUNT];           // each metric's samples, sorted
} calib_fit;

// Fits the profile (name: its "name"); -1 with err when there are fewer than 2 samples
// or the quantiles are not 0 < lo < hi < 1.
int calib_fit_run(const calib_samples *c, double lo_q, double hi_q, const char *name, calib_fit *f, verr *err);
void calib_fit_free(calib_fit *f);
// The profile file: entropix_load_json keys plus "calibration" (metadata). source
// says where the samples came from.
void calib_write_profile(FILE *f, const calib_fit *fit, const calib_samples *c, const char *model_dir, const char *source);
// The same facts as a markdown report.
void calib_report_md(FILE *f, const calib_fit *fit, const calib_samples *c, const char *model_dir, const char *source);

#endif
