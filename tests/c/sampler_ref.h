// sampler_ref.h: the sort-based host sampler as it was before the O(vocab) rewrite
// (host/runtime/sampler.c at e24de9a), kept word for word under ref_ names as the
// reference the new sampler must match bit for bit (tests/c/test_sampler_exact.c).
// It builds every candidate's mass, sorts what survives the truncations and walks the
// sorted list: slow at large vocabularies, simple to trust.
#ifndef VARENT_SAMPLER_REF_H
#define VARENT_SAMPLER_REF_H

#include <math.h>
#include <stdlib.h>

#include "host/runtime/sampler.h"

typedef struct {
    int n;
    sampler_cand *cand;
    int n_cand;
} ref_sampler;

static int ref_init(ref_sampler *s, int vocab) {
    s->n = vocab, s->n_cand = 0;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    return s->cand ? 0 : -1;
}

static void ref_free(ref_sampler *s) { free(s->cand), s->cand = NULL; }

static int ref_argmax(const float *logits, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best < 0 ? 0 : best;
}

static double ref_one_hot(ref_sampler *s, const float *logits) {
    s->cand[0] = (sampler_cand){ 1.0, ref_argmax(logits, s->n) };
    s->n_cand = 1;
    return 0;
}

static int ref_cand_cmp(const void *a, const void *b) {
    const sampler_cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

static void ref_select_top(sampler_cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        sampler_cand pivot = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (ref_cand_cmp(&c[i], &pivot) < 0) i++;
            while (ref_cand_cmp(&c[j], &pivot) > 0) j--;
            if (i <= j) {
                sampler_cand t = c[i];
                c[i++] = c[j], c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

static int ref_keep_at_least(sampler_cand *c, int n, double thr) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (c[i].p >= thr) c[m++] = c[i];
    return m;
}

static int ref_nucleus_prefilter(sampler_cand *c, int n, double total, double top_p) {
    for (double eps = 1e-3; eps > 1e-300; eps *= 1e-3) {
        double mass = 0;
        for (int i = 0; i < n; i++)
            if (c[i].p >= eps) mass += c[i].p;
        if (mass >= top_p * total) return ref_keep_at_least(c, n, eps);
    }
    return n;
}

static double ref_distribution(ref_sampler *s, const float *logits, sampler_params p) {
    sampler_cand *c = s->cand;
    int n = s->n;
    float mx = logits[ref_argmax(logits, n)];
    if (!(p.temperature > 0) || !isfinite(mx)) return ref_one_hot(s, logits);
    double total = 0, inv_t = 1.0 / p.temperature;
    for (int i = 0; i < n; i++) {
        c[i] = (sampler_cand){ isnan(logits[i]) ? 0 : exp(((double)logits[i] - mx) * inv_t), i };
        total += c[i].p;
    }
    if (p.min_p > 0) n = ref_keep_at_least(c, n, fmin(p.min_p, 1.0));
    if (n == 0) return ref_one_hot(s, logits);
    double kept = -1;
    if (p.top_p < 1 && !(p.top_k > 0 && p.top_k < n)) {
        kept = 0;
        for (int i = 0; i < n; i++) kept += c[i].p;
        n = ref_nucleus_prefilter(c, n, kept, p.top_p);
    }
    if (p.top_k > 0 && p.top_k < n) ref_select_top(c, n, p.top_k), n = p.top_k;
    qsort(c, (size_t)n, sizeof *c, ref_cand_cmp);
    total = 0;
    for (int i = 0; i < n; i++) total += c[i].p;
    if (kept >= 0) total = kept;
    if (p.top_p < 1) {
        double cum = 0;
        int m = 0;
        while (m < n && cum < p.top_p * total) cum += c[m++].p;
        n = m > 0 ? m : 1;
        total = 0;
        for (int i = 0; i < n; i++) total += c[i].p;
    }
    double h = 0;
    for (int i = 0; i < n; i++) {
        c[i].p /= total;
        if (c[i].p > 0) h -= c[i].p * log2(c[i].p);
    }
    s->n_cand = n;
    return h;
}

static int ref_draw_u(const ref_sampler *s, double u) {
    if (s->n_cand <= 0) return -1;
    double cum = 0;
    for (int i = 0; i < s->n_cand; i++) {
        cum += s->cand[i].p;
        if (u < cum) return s->cand[i].id;
    }
    return s->cand[s->n_cand - 1].id;
}

static int ref_taken(const int *out, int n, int id) {
    for (int i = 0; i < n; i++)
        if (out[i] == id) return 1;
    return 0;
}

static int ref_draw_distinct(const ref_sampler *s, rng *r, int k, int *out) {
    int n = 0;
    while (n < k && n < s->n_cand) {
        double left = 0, cum = 0, u;
        for (int i = 0; i < s->n_cand; i++)
            if (!ref_taken(out, n, s->cand[i].id)) left += s->cand[i].p;
        u = rng_uniform(r) * left;
        int pick = -1;
        for (int i = 0; i < s->n_cand; i++) {
            if (ref_taken(out, n, s->cand[i].id)) continue;
            pick = s->cand[i].id, cum += s->cand[i].p;
            if (u < cum) break;
        }
        out[n++] = pick;
    }
    return n;
}

#endif
