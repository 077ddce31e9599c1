// sampler.c: see sampler.h. Probabilities are computed in double so truncation
// thresholds and the inverse CDF are exact to the last bit that matters.
#include "host/runtime/sampler.h"

#include <math.h>
#include <stdlib.h>

int sampler_init(sampler *s, int vocab) {
    s->n = vocab, s->n_cand = 0;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    return s->cand ? 0 : -1;
}

void sampler_free(sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double rng_uniform(rng *r) {
    uint64_t x = splitmix64(r->seed ^ splitmix64(r->counter++));
    return (double)(x >> 11) * 0x1.0p-53;
}

// NaN never wins (as in kernels/cpu/sample.c); 0 when every logit is NaN.
int sampler_argmax(const float *logits, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best < 0 ? 0 : best;
}

// The one-hot distribution on the argmax: greedy decoding, and the fallback when there
// is nothing to draw from (a non-finite top logit, or a truncation that kept nothing).
static double one_hot(sampler *s, const float *logits) {
    s->cand[0] = (sampler_cand){ 1.0, sampler_argmax(logits, s->n) };
    s->n_cand = 1;
    return 0;
}

static int cand_cmp(const void *a, const void *b) {
    const sampler_cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

// Moves the k first candidates in cand_cmp order to the front, unsorted (quickselect):
// top-k then sorts only k entries instead of the whole vocab. cand_cmp is a total
// order, so the result equals a full sort truncated to k.
static void select_top(sampler_cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        sampler_cand pivot = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp(&c[i], &pivot) < 0) i++;
            while (cand_cmp(&c[j], &pivot) > 0) j--;
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

// Keeps candidates with p >= thr, preserving order.
static int keep_at_least(sampler_cand *c, int n, double thr) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (c[i].p >= thr) c[m++] = c[i];
    return m;
}

// Top-p needs only the head of the sorted list: find a threshold whose survivors
// already hold top_p of the mass, so the sort touches few candidates.
static int nucleus_prefilter(sampler_cand *c, int n, double total, double top_p) {
    for (double eps = 1e-3; eps > 1e-300; eps *= 1e-3) {
        double mass = 0;
        for (int i = 0; i < n; i++)
            if (c[i].p >= eps) mass += c[i].p;
        if (mass >= top_p * total) return keep_at_least(c, n, eps);
    }
    return n;
}

double sampler_distribution(sampler *s, const float *logits, sampler_params p) {
    sampler_cand *c = s->cand;
    int n = s->n;
    float mx = logits[sampler_argmax(logits, n)];
    if (!(p.temperature > 0) || !isfinite(mx)) return one_hot(s, logits);
    double total = 0, inv_t = 1.0 / p.temperature;
    for (int i = 0; i < n; i++) {
        c[i] = (sampler_cand){ isnan(logits[i]) ? 0 : exp(((double)logits[i] - mx) * inv_t), i };
        total += c[i].p;
    }
    if (p.min_p > 0) n = keep_at_least(c, n, fmin(p.min_p, 1.0));  // p_max is exp(0) = 1: the top always stays
    if (n == 0) return one_hot(s, logits);  // a NaN min-p keeps nothing
    // The nucleus is a share of the mass left after min-p and top-k; the prefilter
    // only shortens the sort, so the total is taken before it.
    double kept = -1;
    if (p.top_p < 1 && !(p.top_k > 0 && p.top_k < n)) {
        kept = 0;
        for (int i = 0; i < n; i++) kept += c[i].p;
        n = nucleus_prefilter(c, n, kept, p.top_p);
    }
    if (p.top_k > 0 && p.top_k < n) select_top(c, n, p.top_k), n = p.top_k;
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    total = 0;
    for (int i = 0; i < n; i++) total += c[i].p;
    if (kept >= 0) total = kept;
    if (p.top_p < 1) {  // smallest prefix whose mass reaches top_p
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

int sampler_draw(const sampler *s, rng *r) { return sampler_draw_u(s, rng_uniform(r)); }

int sampler_draw_u(const sampler *s, double u) {
    if (s->n_cand <= 0) return -1;  // no distribution built
    double cum = 0;
    for (int i = 0; i < s->n_cand; i++) {
        cum += s->cand[i].p;
        if (u < cum) return s->cand[i].id;
    }
    return s->cand[s->n_cand - 1].id;  // u beyond the rounded total
}

static int taken(const int *out, int n, int id) {
    for (int i = 0; i < n; i++)
        if (out[i] == id) return 1;
    return 0;
}

int sampler_draw_distinct(const sampler *s, rng *r, int k, int *out) {
    int n = 0;
    while (n < k && n < s->n_cand) {
        double left = 0, cum = 0, u;
        for (int i = 0; i < s->n_cand; i++)
            if (!taken(out, n, s->cand[i].id)) left += s->cand[i].p;
        u = rng_uniform(r) * left;
        int pick = -1;
        for (int i = 0; i < s->n_cand; i++) {
            if (taken(out, n, s->cand[i].id)) continue;
            pick = s->cand[i].id, cum += s->cand[i].p;
            if (u < cum) break;
        }
        out[n++] = pick;
    }
    return n;
}

void sampler_penalize(float *logits, int n, const int *hist, int n_hist, int no_repeat_ngram, float repeat_penalty,
                      unsigned char *seen) {
    if (repeat_penalty > 0 && repeat_penalty != 1) {
        for (int i = 0; i < n_hist; i++) {
            int id = hist[i];
            if (id < 0 || id >= n || seen[id]) continue;
            seen[id] = 1;
            logits[id] = logits[id] > 0 ? logits[id] / repeat_penalty : logits[id] * repeat_penalty;
        }
        for (int i = 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < n) seen[hist[i]] = 0;
    }
    int N = no_repeat_ngram;
    if (N <= 0 || n_hist + 1 < N) return;
    const int *prefix = hist + n_hist - (N - 1);  // the N-1 newest ids
    for (int i = 0; i + N <= n_hist; i++) {
        int match = 1;
        for (int j = 0; j < N - 1 && match; j++) match = hist[i + j] == prefix[j];
        if (match && hist[i + N - 1] >= 0 && hist[i + N - 1] < n) logits[hist[i + N - 1]] = -INFINITY;
    }
}

static int same_truncation(const sample_cfg *a, const sample_cfg *b) {
    return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p && a->min_p == b->min_p;
}

void sampler_sample_n(sampler *s, const float *logits, const sample_cfg *cfg, int n, sample_out *out) {
    int built = -1;
    double h = 0;
    for (int i = 0; i < n; i++) {
        const sample_cfg *c = &cfg[i];
        int id;
        if (!(c->temperature > 0)) {
            id = sampler_argmax(logits, s->n);
            out[i] = (sample_out){ id, 1, logits[id], 0, 0 };
            continue;
        }
        if (built < 0 || !same_truncation(c, &cfg[built])) {
            h = sampler_distribution(s, logits, (sampler_params){ c->temperature, c->top_k, c->top_p, c->min_p });
            built = i;
        }
        id = sampler_draw_u(s, c->u);
        out[i] = (sample_out){ id, s->n_cand, logits[id], 0, h };
    }
}

int sampler_sample(sampler *s, const float *logits, sampler_params p, rng *r) {
    if (!(p.temperature > 0)) return sampler_argmax(logits, s->n);
    sampler_distribution(s, logits, p);
    return sampler_draw(s, r);
}
