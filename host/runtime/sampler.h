// sampler.h: stock decoding. The order is fixed: temperature, then min-p, top-k and
// top-p truncation, then an exact categorical draw (double-precision inverse CDF)
// from a seeded counter-based generator, so a seed always gives the same tokens.
#ifndef VARENT_SAMPLER_H
#define VARENT_SAMPLER_H

#include <stdint.h>

#include "kernels/ops.h"

// Counter-based: draw i is a pure function of (seed, i), as on the device.
typedef struct {
    uint64_t seed, counter;
} rng;

typedef struct {
    double p;
    int id;
} sampler_cand;

// The distribution left by sampler_distribution. Kept sets that a truncation made small
// (top-k, the top-p nucleus, min-p, or a small vocab) are sorted in full: cand[0..n_cand)
// holds them, normalised. A large untruncated set (temperature alone, or a min-p that
// keeps many) is "lazy": cand[0..n_head) holds its most probable candidates sorted,
// with raw masses, and a draw walks them with error bounds (sampler_dist.c);
// sampler_materialize sorts the rest when a caller needs the whole list.
#define SAMPLER_BUCKETS 512
typedef struct {
    int n;               // vocab size
    sampler_cand *cand;  // [n] kept candidates, most probable first (ties: lower id)
    int n_cand;          // candidates kept by the last truncation
    double *p;           // [n] every logit's mass exp((x - max) / T), 0 for NaN
    int lazy;            // 1: only cand[0..n_head) is sorted, with raw masses
    int approx;          // lazy: p holds masses within 2^-40 (a vectorised exp), not exact
    float *x, mx;        // lazy: a copy of the logits and their max, for exact masses later
    double inv_t;        // lazy: 1 / T
    int n_head;          // lazy: candidates with p >= the head threshold
    int bucketed;        // lazy: the tail below the head is in buckets
    double total;        // lazy: index-order sum of the kept masses
    double keep_min;     // lazy: the kept set is p >= keep_min (0: every logit)
    int *bucket_end;     // [SAMPLER_BUCKETS] lazy tail: each bucket's count
    double *bucket_mass; // [SAMPLER_BUCKETS] lazy tail: each bucket's mass
    uint16_t *bidx;      // [n] lazy tail: each logit's bucket (SAMPLER_BUCKETS: none)
    double *bucket_pd;   // lazy nucleus: bucket_pd_buf while its entropy is summed, else NULL
    double *bucket_pd_buf; // [SAMPLER_BUCKETS]
    int nucleus;         // lazy: a top-p nucleus, ending at `last`
    float top_p;         // lazy nucleus: its top-p
    sampler_cand last;   // lazy nucleus: its last candidate
    sampler_cand *scratch; // [n] lazy draws: room to split a bucket
} sampler;

int sampler_init(sampler *s, int vocab);
void sampler_free(sampler *s);
double rng_uniform(rng *r);  // [0, 1), 53 bits
// The first index of the largest logit; NaN never wins; 0 when every logit is NaN.
int sampler_argmax(const float *logits, int n);
// Builds the truncated, renormalised distribution in s->cand and returns its
// entropy in bits. O(vocab): one exp per logit, then only what the truncations keep
// (or, lazily, what a draw reaches) is sorted. Tokens, kept counts and candidate
// lists are bit-identical to a full sort (tests/c/sampler_ref.h); so is the entropy of
// a fully sorted set, and a lazy set's is ln S - sum(p ln p) / S over its raw masses,
// equal to the sorted sum within their rounding (n_cand ulps, relative). Temperature <= 0 (or NaN) gives the one-hot argmax distribution, and
// so do logits whose largest is +-inf (or all NaN): the sampler never draws from zero
// candidates, s->n_cand >= 1 afterwards. NaN logits are never drawn. (The CPU forward
// already refuses non-finite logits, naming the position; this is the last line.)
double sampler_distribution(sampler *s, const float *logits, sampler_params p);
// Draws from the distribution last built by sampler_distribution (-1 when none was built).
int sampler_draw(sampler *s, rng *r);
// The same with the uniform u in [0, 1) given (one rng_uniform of the caller's stream).
int sampler_draw_u(sampler *s, double u);
// Draws up to k distinct ids without replacement from that distribution (each draw
// renormalised over what is left); returns how many (fewer when fewer candidates).
int sampler_draw_distinct(sampler *s, rng *r, int k, int *out);
// e^d within 2^-45 relative for d <= 0 (0 below -708, for -inf and for NaN), in
// straight-line code the compiler vectorises. Exposed for tests/c/test_sampler_exact.c.
double sampler_exp_fast(double d);
// Sorts and normalises a lazy distribution in full, so that cand[0..n_cand) holds it
// (a no-op otherwise). O(n log n): for callers that read the whole candidate list.
void sampler_materialize(sampler *s);
// The stock penalties on the logits, before temperature and truncation:
//   repeat (HF and llama.cpp's repetition penalty R): a logit of an id in the window is
//     divided by R when positive and multiplied by R otherwise (<= 0 or 1: off);
//   presence and frequency (OpenAI's): c[id], the count of id in the window, takes
//     c[id] * frequency + (c[id] > 0) * presence off its logit (0: off);
//   last_n: the window, the newest last_n ids of the history (< 0: all of it; 0: none),
//     llama.cpp's --repeat-last-n;
//   no_repeat_ngram N (HF's; over the whole history): bans every id that would repeat
//     an N-gram already in it (0: off).
typedef struct {
    float repeat, presence, frequency;
    int last_n;
    int no_repeat_ngram;
} sampler_penalties;

// 1 when p (NULL: none) changes any logit.
int sampler_penalties_active(const sampler_penalties *p);
// The penalties on logits[n] in place, given the ids so far hist[n_hist]. count:
// scratch [n] of zeros, left zeroed.
void sampler_penalize(float *logits, int n, const int *hist, int n_hist, const sampler_penalties *p, int *count);
// sampler_distribution + sampler_draw.
int sampler_sample(sampler *s, const float *logits, sampler_params p, rng *r);
// n draws from logits[s->n], each with its own truncation and uniform (cfg[i].u, read
// when temperature > 0); consecutive draws with the same truncation share one
// distribution. The host twin of the device's cuda_sample (kernels/ops.h).
void sampler_sample_n(sampler *s, const float *logits, const sample_cfg *cfg, int n, sample_out *out);

#endif
