// sampler.h: stock decoding. The order is fixed: temperature, then min-p, top-k and
// top-p truncation, then an exact categorical draw (double-precision inverse CDF)
// from a seeded counter-based generator, so a seed always gives the same tokens.
#ifndef VARENT_SAMPLER_H
#define VARENT_SAMPLER_H

#include <stdint.h>

#include "kernels/ops.h"

typedef struct {
    float temperature;  // 0: greedy argmax
    int top_k;          // 0: off
    float top_p;        // 1: off
    float min_p;        // 0: off
} sampler_params;

// Counter-based: draw i is a pure function of (seed, i), as on the device.
typedef struct {
    uint64_t seed, counter;
} rng;

typedef struct {
    double p;
    int id;
} sampler_cand;

typedef struct {
    int n;               // vocab size
    sampler_cand *cand;  // [n] kept candidates, most probable first (ties: lower id)
    int n_cand;          // candidates kept by the last truncation
} sampler;

int sampler_init(sampler *s, int vocab);
void sampler_free(sampler *s);
double rng_uniform(rng *r);  // [0, 1), 53 bits
// The first index of the largest logit; NaN never wins; 0 when every logit is NaN.
int sampler_argmax(const float *logits, int n);
// Builds the truncated, renormalised distribution in s->cand and returns its
// entropy in bits. Temperature <= 0 (or NaN) gives the one-hot argmax distribution, and
// so do logits whose largest is +-inf (or all NaN): the sampler never draws from zero
// candidates, s->n_cand >= 1 afterwards. NaN logits are never drawn. (The CPU forward
// already refuses non-finite logits, naming the position; this is the last line.)
double sampler_distribution(sampler *s, const float *logits, sampler_params p);
// Draws from the distribution last built by sampler_distribution (-1 when none was built).
int sampler_draw(const sampler *s, rng *r);
// The same with the uniform u in [0, 1) given (one rng_uniform of the caller's stream).
int sampler_draw_u(const sampler *s, double u);
// Draws up to k distinct ids without replacement from that distribution (each draw
// renormalised over what is left); returns how many (fewer when fewer candidates).
int sampler_draw_distinct(const sampler *s, rng *r, int k, int *out);
// HF-style stock extras on logits[n] in place, given the ids so far: with
// repeat_penalty R (> 0, != 1) each seen id's logit is divided by R when positive and
// multiplied by R otherwise; no_repeat_ngram N (> 0) bans every id that would repeat an
// N-gram already in hist. seen: scratch [n] of zeros, left zeroed.
void sampler_penalize(float *logits, int n, const int *hist, int n_hist, int no_repeat_ngram, float repeat_penalty,
                      unsigned char *seen);
// sampler_distribution + sampler_draw.
int sampler_sample(sampler *s, const float *logits, sampler_params p, rng *r);
// n draws from logits[s->n], each with its own truncation and uniform (cfg[i].u, read
// when temperature > 0); consecutive draws with the same truncation share one
// distribution. The host twin of the device's cuda_sample (kernels/ops.h).
void sampler_sample_n(sampler *s, const float *logits, const sample_cfg *cfg, int n, sample_out *out);

#endif
