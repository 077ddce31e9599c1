// sampler.c: see sampler.h. The generator, the argmax, the extras and the draws that
// take whole candidate lists; the distribution and the draw are in sampler_dist.c.
#include "host/runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sampler_init(sampler *s, int vocab) {
    memset(s, 0, sizeof *s);
    s->n = vocab;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->p = malloc((size_t)vocab * sizeof *s->p);
    s->bucket_end = malloc(SAMPLER_BUCKETS * sizeof *s->bucket_end);
    s->bucket_mass = malloc(SAMPLER_BUCKETS * sizeof *s->bucket_mass);
    s->x = malloc((size_t)vocab * sizeof *s->x);
    s->scratch = malloc((size_t)vocab * sizeof *s->scratch);
    s->bidx = malloc((size_t)vocab * sizeof *s->bidx);
    s->bucket_pd_buf = malloc(SAMPLER_BUCKETS * sizeof *s->bucket_pd_buf);
    if (s->cand && s->p && s->bucket_end && s->bucket_mass && s->x && s->scratch && s->bidx && s->bucket_pd_buf)
        return 0;
    sampler_free(s);
    return -1;
}

void sampler_free(sampler *s) {
    free(s->cand), free(s->p), free(s->bucket_end), free(s->bucket_mass), free(s->x), free(s->scratch);
    free(s->bidx), free(s->bucket_pd_buf);
    s->cand = NULL, s->p = NULL, s->bucket_end = NULL, s->bucket_mass = NULL, s->x = NULL, s->scratch = NULL;
    s->bidx = NULL, s->bucket_pd_buf = NULL;
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

// NaN never wins (as in kernels/cpu/sample.c); 0 when every logit is NaN. The largest
// value first, in 16 lanes the compiler vectorises (x > m is false for NaN), then the
// first index that holds it: the first largest, as a scan with > finds it.
int sampler_argmax(const float *logits, int n) {
    float lane[16], mx = -INFINITY;
    for (int j = 0; j < 16; j++) lane[j] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
    for (; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int j = 0; j < 16; j++) mx = lane[j] > mx ? lane[j] : mx;
    for (i = 0; i < n; i++)
        if (logits[i] == mx) return i;
    return 0;
}

int sampler_draw(sampler *s, rng *r) { return sampler_draw_u(s, rng_uniform(r)); }

static int taken(const int *out, int n, int id) {
    for (int i = 0; i < n; i++)
        if (out[i] == id) return 1;
    return 0;
}

int sampler_draw_distinct(sampler *s, rng *r, int k, int *out) {
    int n = 0;
    sampler_materialize(s);
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

int sampler_penalties_active(const sampler_penalties *p) {
    if (!p) return 0;
    int window = p->last_n != 0 && ((p->repeat > 0 && p->repeat != 1) || p->presence != 0 || p->frequency != 0);
    return window || p->no_repeat_ngram > 0;
}

// The penalties that count the ids of the window.
static void penalize_window(float *logits, int n, const int *win, int n_win, const sampler_penalties *p, int *count) {
    for (int i = 0; i < n_win; i++)
        if (win[i] >= 0 && win[i] < n) count[win[i]]++;
    int repeat = p->repeat > 0 && p->repeat != 1;
    for (int i = 0; i < n_win; i++) {
        int id = win[i];
        if (id < 0 || id >= n || count[id] == 0) continue;  // out of range, or done
        float x = logits[id];
        if (repeat) x = x > 0 ? x / p->repeat : x * p->repeat;
        x -= (float)count[id] * p->frequency + p->presence;
        logits[id] = x;
        count[id] = 0;  // each id once; the scratch is zeroed as it goes
    }
}

void sampler_penalize(float *logits, int n, const int *hist, int n_hist, const sampler_penalties *p, int *count) {
    if (!sampler_penalties_active(p)) return;
    int n_win = p->last_n < 0 || p->last_n > n_hist ? n_hist : p->last_n;
    if (n_win > 0) penalize_window(logits, n, hist + n_hist - n_win, n_win, p, count);
    int N = p->no_repeat_ngram;
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
