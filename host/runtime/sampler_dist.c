// sampler_dist.c: sampler_distribution in O(vocab), with the results of a full sort
// (tests/c/sampler_ref.h keeps the sort-based original as the reference; docs/sampler.md).
//  - min-p and top-k decide in logit space: masses are monotone in the logit up to an
//    ulp, so only a window above the threshold (or above the k-th largest logit) needs
//    exact masses; the short kept list then goes through the sort's steps.
//  - top-p and temperature alone take a vectorised approximate exp over the vocabulary
//    (sampler_exp_fast), exact masses for the head (p >= HEAD_TAU, the sort's first
//    prefilter threshold) and error-bounded decisions: the head is sorted and the
//    nucleus walked as the sort did; a large untruncated set (or a nucleus in a large
//    head) stays lazy and the draw walks it by buckets (sampler_lazy.c).
//  - Wherever a bound cannot decide, one exact pass of libm masses and the sort's own
//    steps follow.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/runtime/sampler.h"
#include "host/runtime/sampler_impl.h"

#define EAGER_MAX 1024 // untruncated kept sets up to this size are sorted at once
#define HEAD_SORT_MAX 1024 // a lazy set's head is sorted at once up to this size
#define NUCLEUS_SORT_MAX 2048 // top-p sorts a head up to this size; a larger one walks lazily

int sampler_cand_cmp(const void *a, const void *b) {
    const sampler_cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

void sampler_sort_cands(sampler_cand *c, int n) { qsort(c, (size_t)n, sizeof *c, sampler_cand_cmp); }

// Moves the k first candidates in cand_cmp order to the front, unsorted (quickselect).
// cand_cmp is a total order, so the k chosen are those of a full sort.
static void select_top(sampler_cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        sampler_cand pivot = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (sampler_cand_cmp(&c[i], &pivot) < 0) i++;
            while (sampler_cand_cmp(&c[j], &pivot) > 0) j--;
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

static double one_hot(sampler *s, const float *logits) {
    s->cand[0] = (sampler_cand){ 1.0, sampler_argmax(logits, s->n) };
    s->n_cand = 1;
    return 0;
}

// Gathers the kept candidates (p >= keep_min) with p >= thr into cand, in index order.
int sampler_gather(sampler *s, double keep_min, double thr) {
    const double *p = s->p;
    double t = fmax(keep_min, thr);
    int m = 0;
    for (int i = 0; i < s->n; i++)
        if (p[i] >= t) s->cand[m++] = (sampler_cand){ p[i], i };
    return m;
}

// The end of the sort's path on cand[0..n), sorted: total (the index-order kept sum
// when top-p was set up on it, else the sorted sum), the nucleus, normalisation and
// the entropy, in the same order of operations.
double sampler_finish_sorted(sampler *s, int n, double kept, float top_p) {
    sampler_cand *c = s->cand;
    double total = 0;
    for (int i = 0; i < n; i++) total += c[i].p;
    if (kept >= 0) total = kept;
    if (top_p < 1) {  // smallest prefix whose mass reaches top_p
        double cum = 0;
        int m = 0;
        while (m < n && cum < top_p * total) cum += c[m++].p;
        n = m > 0 ? m : 1;
        total = 0;
        for (int i = 0; i < n; i++) total += c[i].p;
    }
    double h = 0;
    for (int i = 0; i < n; i++) {
        c[i].p /= total;
        if (c[i].p > 0) h -= c[i].p * log2(c[i].p);
    }
    s->n_cand = n, s->lazy = 0;
    return h;
}

typedef struct {
    int nk, nh;      // kept candidates; those in the head (cand[0..nh), index order)
    double kept, pd; // index-order sum of the kept masses; sum of p d over them
} mass_pass;

// Every mass into s->p (the sort's own expression, so the same bits), and the counts
// and sums above. keep_min 0 keeps every logit (NaN ones with p = 0, as the sort did).
static void run_mass_pass(sampler *s, const float *x, float mx, double inv_t, double keep_min, mass_pass *m) {
    double *p = s->p, kept = 0, pd = 0;
    int nk = 0, nh = 0;
    for (int i = 0; i < s->n; i++) {
        double d = ((double)x[i] - mx) * inv_t, pi = isnan(x[i]) ? 0 : exp(d);
        p[i] = pi;
        if (!(pi >= keep_min)) continue;
        nk++, kept += pi;
        if (pi > 0) pd += pi * d;
        if (pi >= HEAD_TAU) s->cand[nh++] = (sampler_cand){ pi, i };
    }
    *m = (mass_pass){ nk, nh, kept, pd };
}

// Cody-Waite reduction d = k ln 2 + r, |r| <= ln 2 / 2, and e^r by its Taylor series
// to r^13 (remainder under 1e-17): measured within 2 ulps of glibc's exp.
double sampler_exp_fast(double d) {
    double dc = d >= -708 ? d : -708;  // NaN and -inf too
    double kf = nearbyint(dc * 1.4426950408889634);
    double r = (dc - kf * 0x1.62e42fee00000p-1) - kf * 0x1.a39ef35793c76p-33;
    static const double inv_fact[] = { 1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                       1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,       1.0 / 720.0,
                                       1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,          0.5,
                                       1.0,                1.0 };
    double e = inv_fact[0];
    for (int j = 1; j < 14; j++) e = e * r + inv_fact[j];
    uint64_t b = (uint64_t)((int64_t)kf + 1023) << 52;
    double scale;
    memcpy(&scale, &b, sizeof scale);
    return d >= -708 ? e * scale : 0;
}

typedef struct {
    int nh;          // the exact head (kept p >= HEAD_TAU, exact masses) in cand, index order
    double kept, pd; // the approximate masses' sum, and sum of p d (p > 0)
} fast_pass;

// Without min-p or top-k: approximate masses into s->p (vectorised), their sums, and
// the head with exact masses (a wider approximate threshold, then the exact test); nh
// is -1 when more than cap candidates would be in it.
static void run_fast_pass(sampler *s, const float *x, float mx, double inv_t, int cap, fast_pass *f) {
    double kept = 0, pd = 0, *p = s->p, lo = HEAD_TAU * (1 - 2 * FAST_EXP_ERR);
    int n = s->n, nh = 0;
#pragma omp simd reduction(+ : kept, pd)
    for (int i = 0; i < n; i++) {
        double d = ((double)x[i] - mx) * inv_t, pa = sampler_exp_fast(d);
        p[i] = pa, kept += pa, pd += pa > 0 ? pa * d : 0;
    }
    int over = 0;
#pragma omp simd reduction(+ : over)
    for (int i = 0; i < n; i++) over += p[i] >= lo;
    for (int i = 0; i < n && over <= cap; i += 16) {
        int any = 0, e = i + 16 < n ? i + 16 : n;
        for (int j = i; j < e; j++) any |= p[j] >= lo;
        for (int j = i; any && j < e; j++) {
            double pe = p[j] >= lo ? exp(((double)x[j] - mx) * inv_t) : 0;
            if (pe >= HEAD_TAU) s->cand[nh++] = (sampler_cand){ pe, j };
        }
    }
    if (over > cap) nh = -1;
    *f = (fast_pass){ nh, kept, pd };
}

// The relative error of the fast pass's kept sum: n roundings and the exp's error.
static double fast_eps(int n) { return (n + 64.0) * 0x1p-52 + 2 * FAST_EXP_ERR; }

// 1 when the nucleus walk over cand[0..n), sorted, compares cum < top_p * kept the same
// way for every kept within (1 +- eps) of the given one.
static int nucleus_certain(const sampler *s, int n, float top_p, double kept, double eps) {
    double lo = top_p * kept * (1 - eps), hi = top_p * kept * (1 + eps), cum = 0;
    for (int m = 0; m < n; m++) {
        if (cum >= hi) return 1;
        if (!(cum < lo)) return 0;
        cum += s->cand[m].p;
    }
    return 1;
}

// Top-p from the fast pass, when its approximate kept sum decides as the exact one
// would. A head (p >= HEAD_TAU, the sort's first prefilter) of up to NUCLEUS_SORT_MAX
// that surely holds top_p of the mass is sorted and the nucleus walked as the sort did,
// if every step of that walk is clear of the error. Otherwise (a large head, or a
// nucleus reaching below it) the nucleus is found by a lazy walk over every candidate:
// the sort's prefilter set, whichever threshold it stopped at, holds every candidate
// up to the one where the walk surely crosses, so its nucleus is the same. 0 when
// neither can decide.
static int fast_top_p(sampler *s, const float *x, float mx, double inv_t, const fast_pass *f, float top_p,
                      double *h) {
    double eps = fast_eps(s->n), need = top_p * f->kept, mass = 0;
    for (int i = 0; f->nh >= 0 && i < f->nh; i++) mass += s->cand[i].p;
    if (f->nh >= 0 && mass >= need * (1 + eps)) {
        sampler_sort_cands(s->cand, f->nh);
        if (!nucleus_certain(s, f->nh, top_p, f->kept, eps)) return 0;
        *h = sampler_finish_sorted(s, f->nh, f->kept, top_p);
        return 1;
    }
    memcpy(s->x, x, sizeof(float) * (size_t)s->n);
    s->mx = mx, s->inv_t = inv_t, s->approx = 1, s->top_p = top_p;
    return sampler_lazy_nucleus(s, top_p, f->kept, h);
}

// Temperature alone over a large vocabulary: lazy on the fast pass's masses, with the
// logits kept for exact masses should a draw need the tail.
static double fast_lazy(sampler *s, const float *x, float mx, double inv_t, const fast_pass *f) {
    int head = f->nh >= 0 ? f->nh : 0;
    sampler_sort_cands(s->cand, head);
    memcpy(s->x, x, sizeof(float) * (size_t)s->n);
    s->mx = mx, s->inv_t = inv_t, s->approx = 1;
    s->lazy = 1, s->bucketed = 0, s->nucleus = 0;
    s->n_cand = s->n, s->n_head = head;
    s->total = f->kept, s->keep_min = 0;
    double hh = (log(f->kept) - f->pd / f->kept) / log(2.0);
    return hh > 0 ? hh : 0;
}

// Top-k of the kept set (k < nk): the k best lie in the head when it holds k, else
// above the first of a few deeper thresholds that holds k, counted in one pass.
static double dist_top_k(sampler *s, const mass_pass *m, double keep_min, int k, float top_p) {
    int n = m->nh;
    if (n < k) {
        static const double thr[] = { 1e-6, 1e-10, 1e-16, 1e-30, 1e-100 };
        enum { NT = sizeof thr / sizeof thr[0] };
        int cnt[NT] = { 0 }, j = 0;
        for (int i = 0; i < s->n; i++)
            if (s->p[i] >= keep_min)
                for (int t = 0; t < NT; t++) cnt[t] += s->p[i] >= thr[t];
        while (j < NT && cnt[j] < k) j++;
        n = sampler_gather(s, keep_min, j < NT ? thr[j] : 0);
    }
    select_top(s->cand, n, k);
    sampler_sort_cands(s->cand, k);
    return sampler_finish_sorted(s, k, -1, top_p);
}

// Top-p without top-k: the sort's prefilter, the first threshold 1e-3, 1e-6, ... whose
// index-order mass reaches top_p of the kept sum; 1e-3 is the head, summed here in the
// same order, and the deeper ones (flat distributions) are summed as the sort did.
static double dist_top_p(sampler *s, const mass_pass *m, double keep_min, float top_p) {
    double need = top_p * m->kept, mass = 0;
    for (int i = 0; i < m->nh; i++) mass += s->cand[i].p;
    int n = m->nh;
    if (!(mass >= need)) {
        n = -1;
        for (double eps = HEAD_TAU * 1e-3; eps > 1e-300 && n < 0; eps *= 1e-3) {
            mass = 0;
            for (int i = 0; i < s->n; i++)
                if (s->p[i] >= keep_min && s->p[i] >= eps) mass += s->p[i];
            if (mass >= need) n = sampler_gather(s, keep_min, eps);
        }
        if (n < 0) n = sampler_gather(s, keep_min, 0);
    }
    sampler_sort_cands(s->cand, n);
    return sampler_finish_sorted(s, n, m->kept, top_p);
}

void sampler_exact_top_p(sampler *s) {
    mass_pass m;
    run_mass_pass(s, s->x, s->mx, s->inv_t, 0, &m);
    dist_top_p(s, &m, 0, s->top_p);
}

// Temperature (and min-p) alone: sorted in full when small, else lazy, with the
// entropy from the raw masses: H = (ln S - sum(p d) / S) / ln 2, d = ln p.
static double dist_untruncated(sampler *s, const mass_pass *m, double keep_min) {
    if (m->nk <= EAGER_MAX) {
        int n = m->nh == m->nk ? m->nh : sampler_gather(s, keep_min, 0);
        sampler_sort_cands(s->cand, n);
        return sampler_finish_sorted(s, n, -1, 1);
    }
    // A small head (the usual peaked distribution) is sorted now; a large one (flat
    // rows) is left to the buckets with the rest.
    int head = m->nh <= HEAD_SORT_MAX ? m->nh : 0;
    sampler_sort_cands(s->cand, head);
    s->lazy = 1, s->bucketed = 0, s->approx = 0, s->nucleus = 0;
    s->n_cand = m->nk, s->n_head = head;
    s->total = m->kept, s->keep_min = keep_min;
    double h = (log(m->kept) - m->pd / m->kept) / log(2.0);
    return h > 0 ? h : 0;
}

// The sort's path from its kept list on: cand[0..n) holds the candidates that passed
// min-p, in index order, with their masses. Used where that list is short (a min-p
// that keeps few) and for temperatures whose 1/T is 0 or infinite (NaN masses, which
// only the same operations on the same array reproduce).
static double finish_kept(sampler *s, int n, sampler_params p) {
    sampler_cand *c = s->cand;
    double kept = -1;
    if (p.top_p < 1 && !(p.top_k > 0 && p.top_k < n)) {
        kept = 0;
        for (int i = 0; i < n; i++) kept += c[i].p;
        for (double eps = HEAD_TAU; eps > 1e-300; eps *= 1e-3) {
            double mass = 0;
            for (int i = 0; i < n; i++)
                if (c[i].p >= eps) mass += c[i].p;
            if (mass >= p.top_p * kept) {
                int m = 0;
                for (int i = 0; i < n; i++)
                    if (c[i].p >= eps) c[m++] = c[i];
                n = m;
                break;
            }
        }
    }
    if (p.top_k > 0 && p.top_k < n) select_top(c, n, p.top_k), n = p.top_k;
    sampler_sort_cands(c, n);
    return sampler_finish_sorted(s, n, kept, p.top_p);
}

static double dist_degenerate(sampler *s, const float *logits, float mx, sampler_params p) {
    double inv_t = 1.0 / p.temperature;
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        double pi = isnan(logits[i]) ? 0 : exp(((double)logits[i] - mx) * inv_t);
        if (!(p.min_p > 0) || pi >= fmin(p.min_p, 1.0)) s->cand[n++] = (sampler_cand){ pi, i };
    }
    return n == 0 ? one_hot(s, logits) : finish_kept(s, n, p);
}

// Candidates decided in logit space. exp and log err by less than an ulp, so two
// logits whose d = (x - max) / T differ by more than D_SLACK (relative to |d| + 1)
// have masses in the same order; only those within it need their exact mass.
#define D_SLACK 0x1p-30
#define WINDOW_MAX 4096  // larger windows go through the full mass pass

// Gathers every logit with d >= dmin, with its exact mass, into cand in index order;
// -1 when more than cap qualify. A block of 16 is looked at only when one passes.
static int gather_window(sampler *s, const float *x, float mx, double inv_t, double dmin, int cap) {
    int m = 0, n = s->n, i = 0;
    for (; i < n; i += 16) {
        int any = 0, e = i + 16 < n ? i + 16 : n;
        for (int j = i; j < e; j++) any |= ((double)x[j] - mx) * inv_t >= dmin;
        if (!any) continue;
        for (int j = i; j < e; j++) {
            double d = ((double)x[j] - mx) * inv_t;
            if (!(d >= dmin)) continue;
            if (m == cap) return -1;
            s->cand[m++] = (sampler_cand){ exp(d), j };
        }
    }
    return m;
}

// min-p: every mass >= keep_min has d >= ln keep_min, so the kept list is the window
// above it, filtered by exact mass. 0 when the window is too large (a tiny min-p).
static int dist_min_p(sampler *s, const float *x, float mx, double inv_t, sampler_params p, double keep_min,
                      double *h) {
    if (!(keep_min >= 1e-300)) return 0;
    double lk = log(keep_min);
    int m = gather_window(s, x, mx, inv_t, lk - D_SLACK * (1 - lk), WINDOW_MAX), n = 0;
    if (m < 0) return 0;
    for (int i = 0; i < m; i++)
        if (s->cand[i].p >= keep_min) s->cand[n++] = s->cand[i];
    *h = finish_kept(s, n, p);
    return 1;
}

// The k-th largest logit (NaN never counts; -inf when fewer than k are finite), from a
// min-heap of the k best seen. heap: scratch [k].
static float kth_logit(const float *x, int n, int k, float *heap) {
    for (int j = 0; j < k; j++) heap[j] = -INFINITY;
    for (int i = 0; i < n; i += 16) {
        int any = 0, e = i + 16 < n ? i + 16 : n;
        for (int j = i; j < e; j++) any |= x[j] > heap[0];
        for (int j = i; any && j < e; j++) {
            if (!(x[j] > heap[0])) continue;
            int at = 0;  // replace the root and sift it down
            for (;;) {
                int c = 2 * at + 1;
                if (c >= k) break;
                if (c + 1 < k && heap[c + 1] < heap[c]) c++;
                if (!(heap[c] < x[j])) break;
                heap[at] = heap[c], at = c;
            }
            heap[at] = x[j];
        }
    }
    return heap[0];
}

// Top-k without min-p: every one of the k best has d >= d(L), L the k-th largest
// logit, so they lie in the window above it. 0 when L's mass is not a normal double
// (ties at zero mass fall to the id: only the full pass orders them).
static int dist_top_k_window(sampler *s, const float *x, float mx, double inv_t, sampler_params p, double *h) {
    enum { K_MAX = 1024 };
    float heap[K_MAX];
    if (p.top_k > K_MAX) return 0;
    double dl = ((double)kth_logit(x, s->n, p.top_k, heap) - mx) * inv_t;
    if (!(dl > -650)) return 0;
    int m = gather_window(s, x, mx, inv_t, dl - D_SLACK * (1 - dl), WINDOW_MAX);
    if (m < p.top_k) return 0;
    select_top(s->cand, m, p.top_k);
    sampler_sort_cands(s->cand, p.top_k);
    *h = sampler_finish_sorted(s, p.top_k, -1, p.top_p);
    return 1;
}

double sampler_distribution(sampler *s, const float *logits, sampler_params p) {
    s->lazy = 0;
    int am = sampler_argmax(logits, s->n);
    float mx = logits[am];
    if (!(p.temperature > 0) || !isfinite(mx)) return one_hot(s, logits);
    double inv_t = 1.0 / p.temperature;
    if (!(inv_t > 0 && inv_t < INFINITY)) return dist_degenerate(s, logits, mx, p);
    // p_max is exp(0) = 1, so the top always passes min-p; a NaN min-p filters nothing.
    double keep_min = p.min_p > 0 ? fmin(p.min_p, 1.0) : 0, h;
    if (keep_min > 0 && dist_min_p(s, logits, mx, inv_t, p, keep_min, &h)) return h;
    if (keep_min == 0 && p.top_k > 0 && p.top_k < s->n && dist_top_k_window(s, logits, mx, inv_t, p, &h)) return h;
    if (keep_min == 0 && !(p.top_k > 0 && p.top_k < s->n) && (p.top_p < 1 || s->n > EAGER_MAX)) {
        fast_pass f;
        run_fast_pass(s, logits, mx, inv_t, p.top_p < 1 ? NUCLEUS_SORT_MAX : HEAD_SORT_MAX, &f);
        if (!(p.top_p < 1)) return fast_lazy(s, logits, mx, inv_t, &f);
        if (fast_top_p(s, logits, mx, inv_t, &f, p.top_p, &h)) return h;
    }
    mass_pass m;
    run_mass_pass(s, logits, mx, inv_t, keep_min, &m);
    if (m.nk == 0) return one_hot(s, logits);
    if (p.top_k > 0 && p.top_k < m.nk) return dist_top_k(s, &m, keep_min, p.top_k, p.top_p);
    if (p.top_p < 1) return dist_top_p(s, &m, keep_min, p.top_p);
    return dist_untruncated(s, &m, keep_min);
}


