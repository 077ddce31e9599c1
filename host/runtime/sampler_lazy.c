// sampler_lazy.c: draws from a lazy distribution (see sampler_dist.c), which sorts only
// what the draw reaches: the head, then the rest in buckets of p's high bits, skipping
// whole buckets by their masses and narrowing the one the draw lands in by further
// 8-bit digits until few candidates are left to sort. Decisions are taken only where
// error bounds prove the full sort's rounded sums would take them; otherwise the set is
// sorted in full and walked as the sort did.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "host/runtime/sampler_impl.h"

#define SORT_MAX 48    // ranges up to this size are sorted outright
#define EDGE_W 0x1p-38 // approximate masses this close to a bucket edge get their exact mass

double sampler_exact_mass(const sampler *s, int i) {
    return isnan(s->x[i]) ? 0 : exp(((double)s->x[i] - s->mx) * s->inv_t);
}

static void exact_masses(sampler *s) {
    if (!s->approx) return;
    for (int i = 0; i < s->n; i++) s->p[i] = sampler_exact_mass(s, i);
    s->approx = 0;
}

void sampler_materialize(sampler *s) {
    if (!s->lazy) return;
    if (s->nucleus) {
        sampler_exact_top_p(s);
        return;
    }
    exact_masses(s);
    int n = sampler_gather(s, s->keep_min, 0);
    sampler_sort_cands(s->cand, n);
    sampler_finish_sorted(s, n, -1, 1);
}

static inline uint64_t bits_of(double p) {
    uint64_t b;
    memcpy(&b, &p, sizeof b);
    return b;
}

// Buckets of p's top 15 bits (sign, exponent and 3 mantissa bits: a factor 2^(1/8) each),
// counted down from p = 1: SAMPLER_BUCKETS of them cover p >= 2^-64.
static inline uint64_t bucket_of(double p) { return (bits_of(1.0) >> 49) - (bits_of(p) >> 49); }

// Buckets the kept candidates the sorted head does not hold (all of them when there is
// none): each one's bucket in s->bidx (SAMPLER_BUCKETS when outside the tail or below
// the last bucket: a draw that reaches those falls back to the full sort), and each
// bucket's count and mass. On approximate masses only those near an edge need their
// exact mass: the others lie in the bucket their exact mass would pick.
static void bucket_tail(sampler *s) {
    enum { NB = SAMPLER_BUCKETS, H = 4 };
    int n = s->n, cnt[H][NB + 1];
    uint16_t *bi = s->bidx;
    double *p = s->p, lo = fmax(s->keep_min, 1e-300), hi = s->n_head > 0 ? HEAD_TAU : INFINITY, mass[H][NB + 1];
    int approx = s->approx;
#pragma omp simd
    for (int i = 0; i < n; i++) {  // vectorised (no short circuits); NB + 1 marks a mass near an edge
        double pi = p[i], a = pi * (1 - EDGE_W), c = pi * (1 + EDGE_W);
        int64_t b = (int64_t)bucket_of(pi);
        int edge = approx & (pi > 0) & (((int64_t)bucket_of(a) != (int64_t)bucket_of(c)) | ((a < lo) != (c < lo)) |
                                        ((a < hi) != (c < hi)));
        int64_t in = (pi >= lo) & (pi < hi) & (b < NB), v = in * b + (1 - in) * NB;
        bi[i] = (uint16_t)(edge * (NB + 1) + (1 - edge) * v);
    }
    for (int i = 0; approx && i < n; i += 16) {
        int any = 0, e = i + 16 < n ? i + 16 : n;
        for (int j = i; j < e; j++) any |= bi[j] == NB + 1;
        for (int j = i; any && j < e; j++) {
            if (bi[j] != NB + 1) continue;
            p[j] = sampler_exact_mass(s, j);
            uint64_t b = bucket_of(p[j]);
            bi[j] = (uint16_t)(p[j] >= lo && p[j] < hi && b < NB ? b : NB);
        }
    }
    memset(cnt, 0, sizeof cnt), memset(mass, 0, sizeof mass);
    for (int i = 0; i < n; i++) cnt[i % H][bi[i]]++, mass[i % H][bi[i]] += p[i];  // H chains, not one
    for (int b = 0; b < NB; b++) {
        s->bucket_end[b] = cnt[0][b] + cnt[1][b] + cnt[2][b] + cnt[3][b];
        s->bucket_mass[b] = (mass[0][b] + mass[1][b]) + (mass[2][b] + mass[3][b]);
    }
    if (s->bucket_pd) {  // a nucleus's entropy: sum of p d per bucket, d = ln p as computed
        memset(mass, 0, sizeof mass);
        for (int i = 0; i < n; i++)
            if (bi[i] < NB) mass[i % H][bi[i]] += p[i] * (((double)s->x[i] - s->mx) * s->inv_t);
        for (int b = 0; b < NB; b++) s->bucket_pd[b] = (mass[0][b] + mass[1][b]) + (mass[2][b] + mass[3][b]);
    }
    s->bucketed = 1;
}

// Gathers bucket b's candidates (exact masses) into cand after the head; their count.
static int gather_bucket(sampler *s, int b) {
    const uint16_t *bi = s->bidx;
    int n = s->n, m = s->n_head;
    for (int i = 0; i < n; i += 16) {
        int any = 0, e = i + 16 < n ? i + 16 : n;
        for (int j = i; j < e; j++) any |= bi[j] == b;
        for (int j = i; any && j < e; j++)
            if (bi[j] == b) s->cand[m++] = (sampler_cand){ s->approx ? sampler_exact_mass(s, j) : s->p[j], j };
    }
    return m - s->n_head;
}

// A walk through the sorted order without sorting it: cum (and, for a nucleus, n and
// the sum of p d) of the candidates passed so far, and the target t, within +- e, that
// the sort's own rounded cumulative sum crosses.
typedef struct {
    double t, e, cum, pd;
    int n, want_pd;
} walk;

enum { W_PAST = -2, W_UNSURE = -1 };

// 1 when the sort's cumulative sum through a candidate surely stays below the target
// (walk on), 0 when it surely reaches it (this candidate), -1 when too close to tell.
static int past(const walk *w, double cum) { return cum < w->t - w->e ? 1 : cum >= w->t + w->e ? 0 : -1; }

static double d_of(const sampler *s, int i) { return ((double)s->x[i] - s->mx) * s->inv_t; }

// The walk within cand[a..b) (exact masses whose bits above `shift` + 8 agree): sorted
// outright when small, else split by the 8 bits at `shift` (descending), skipping whole
// digits by their masses. The index in cand it stops at, W_PAST when the target lies
// beyond the range, W_UNSURE.
static int walk_range(sampler *s, int a, int b, int shift, walk *w) {
    sampler_cand *c = s->cand;
    if (b - a <= SORT_MAX || shift < 0) {
        sampler_sort_cands(c + a, b - a);
        for (int k = a; k < b; k++) {
            int r = past(w, w->cum += c[k].p);
            w->n++;
            if (w->want_pd && c[k].p > 0) w->pd += c[k].p * d_of(s, c[k].id);
            if (r <= 0) return r == 0 ? k : W_UNSURE;
        }
        return W_PAST;
    }
    int cnt[257] = { 0 };
    double mass[256] = { 0 }, pd[256] = { 0 };
    for (int k = a; k < b; k++) {
        int d = 255 - (int)((bits_of(c[k].p) >> shift) & 255);
        cnt[d + 1]++, mass[d] += c[k].p;
        if (w->want_pd && c[k].p > 0) pd[d] += c[k].p * d_of(s, c[k].id);
    }
    for (int d = 0; d < 256; d++) cnt[d + 1] += cnt[d];  // cnt[d]: start of digit d
    sampler_cand *tmp = s->scratch;
    int at[256];
    memcpy(at, cnt, sizeof at);
    for (int k = a; k < b; k++) tmp[at[255 - (int)((bits_of(c[k].p) >> shift) & 255)]++] = c[k];
    memcpy(c + a, tmp, sizeof *c * (size_t)(b - a));
    for (int d = 0; d < 256; d++) {
        if (cnt[d + 1] == cnt[d]) continue;
        if (past(w, w->cum + mass[d]) == 1) {
            w->cum += mass[d], w->pd += pd[d], w->n += cnt[d + 1] - cnt[d];
            continue;
        }
        int r = walk_range(s, a + cnt[d], a + cnt[d + 1], shift - 8, w);
        if (r != W_PAST) return r;
    }
    return W_PAST;
}

// The walk over the sorted head, then the buckets: the index in cand it stops at.
static int lazy_walk(sampler *s, walk *w) {
    for (int k = 0; k < s->n_head; k++) {
        int r = past(w, w->cum += s->cand[k].p);
        if (r <= 0) return r == 0 ? k : W_UNSURE;
    }
    if (!s->bucketed) bucket_tail(s);
    for (int b = 0; b < SAMPLER_BUCKETS; b++) {
        if (s->bucket_end[b] == 0 || past(w, w->cum + s->bucket_mass[b]) == 1) {
            w->cum += s->bucket_mass[b], w->n += s->bucket_end[b];
            if (w->want_pd) w->pd += s->bucket_pd[b];
            continue;
        }
        int m = gather_bucket(s, b), r = walk_range(s, s->n_head, s->n_head + m, 41, w);
        if (r != W_PAST) return r;
    }
    return W_UNSURE;  // past every bucket: only the full sort knows
}

// Top-p without sorting: the nucleus is the sorted prefix whose cumulative mass first
// reaches need = top_p * kept, found by the same walk in raw masses (sampler_dist.c's
// fast_top_p says why the sort's prefilter does not change it). The sort's sums
// (kept in index order, the prefix in sorted order) are each within n ulps of exact
// and kept_approx within FAST_EXP_ERR more. Its size and total and the entropy from
// the raw masses; 0 when the walk cannot tell (the caller takes the exact path).
int sampler_lazy_nucleus(sampler *s, float top_p, double kept_approx, double *h) {
    double need = top_p * kept_approx;
    walk w = { need, need * ((4.0 * s->n + 64) * 0x1p-53 + 4 * FAST_EXP_ERR), 0, 0, 0, 1 };
    s->n_head = 0, s->bucketed = 0, s->bucket_pd = s->bucket_pd_buf;
    int k = lazy_walk(s, &w);
    s->bucket_pd = NULL;
    if (k < 0) return 0;
    s->lazy = 1, s->nucleus = 1, s->last = s->cand[k];
    s->n_cand = w.n, s->total = w.cum, s->keep_min = 0;
    double hh = (log(w.cum) - w.pd / w.cum) / log(2.0);
    *h = hh > 0 ? hh : 0;
    return 1;
}

// The sort's draw (first candidate whose rounded cumulative normalised mass exceeds u)
// on a lazy distribution. Its cumulative sums are within e of cum, where cum sums the
// same masses in any order and total is the index-order sum (of masses within
// FAST_EXP_ERR when approximate; a nucleus's total is the walk's): each sum of up to
// n_cand terms is off by at most n_cand ulps (relative), the sort's normalisation adds
// as many again, and e doubles that and adds the masses' error. A nucleus ends at its
// last candidate: a draw that would pass it falls back.
static int lazy_draw(sampler *s, double u) {
    double margin = (4.0 * s->n_cand + 64) * 0x1p-53 + 2 * FAST_EXP_ERR;
    if (!(u < 1 - margin)) return W_UNSURE;  // the sort may walk off its rounded end
    walk w = { u * s->total, margin * s->total, 0, 0, 0, 0 };
    int k = lazy_walk(s, &w);
    if (k < 0) return W_UNSURE;
    if (s->nucleus && sampler_cand_cmp(&s->cand[k], &s->last) > 0) return W_UNSURE;
    return s->cand[k].id;
}

int sampler_draw_u(sampler *s, double u) {
    if (s->n_cand <= 0) return -1;  // no distribution built
    if (s->lazy) {
        int id = lazy_draw(s, u);
        if (id >= 0) return id;
        sampler_materialize(s);
    }
    double cum = 0;
    for (int i = 0; i < s->n_cand; i++) {
        cum += s->cand[i].p;
        if (u < cum) return s->cand[i].id;
    }
    return s->cand[s->n_cand - 1].id;  // u beyond the rounded total
}
