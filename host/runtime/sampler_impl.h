// sampler_impl.h: what sampler_dist.c (building distributions) and sampler_lazy.c (drawing
// from lazy ones) share; not part of the sampler's interface.
#ifndef VARENT_SAMPLER_IMPL_H
#define VARENT_SAMPLER_IMPL_H

#include "host/runtime/sampler.h"

#define HEAD_TAU 1e-3         // the nucleus prefilter's first threshold (kept as it was)
#define FAST_EXP_ERR 0x1p-40  // the relative error the decisions allow sampler_exp_fast

// Sorts candidates most probable first, ties to the lower id (a total order).
void sampler_sort_cands(sampler_cand *c, int n);
// Gathers the kept candidates (p >= keep_min) with p >= thr from s->p into cand, index order.
int sampler_gather(sampler *s, double keep_min, double thr);
// The sort's path on cand[0..n), sorted: total, nucleus, normalisation, entropy.
double sampler_finish_sorted(sampler *s, int n, double kept, float top_p);
// The exact (libm) mass of logit i of a lazy set built on approximate masses.
double sampler_exact_mass(const sampler *s, int i);
// cand_cmp: most probable first, ties to the lower id.
int sampler_cand_cmp(const void *a, const void *b);
// A lazy top-p nucleus on the fast pass's masses (sampler_lazy.c); 0 when undecided.
int sampler_lazy_nucleus(sampler *s, float top_p, double kept_approx, double *h);
// The sort's top-p path on s->x (a lazy nucleus's logits), materialised in full.
void sampler_exact_top_p(sampler *s);

#endif
