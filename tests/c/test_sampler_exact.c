// test_sampler_exact.c: the O(vocab) host sampler (host/runtime/sampler_dist.c) against
// the sort-based one it replaced (tests/c/sampler_ref.h), bit for bit: kept counts,
// every draw (random uniforms and uniforms placed on the sort's own rounded cumulative
// sums, where an approximate walk would flip), draws without replacement, the full
// candidate list after sampler_materialize, and the entropy (bit-identical when the
// kept set is sorted in full; within the two sums' rounding, n ulps, when it is lazy). Rows: LM-like, flat,
// tied, masked with -inf, NaN, wide, near-zero logits; vocabularies of 32K, 49K, 128K
// and 152K and small odd ones; temperature, top-k, top-p, min-p alone and together.
// Usage: test_sampler_exact [--bench]   (--bench: microseconds per token, old and new)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "sampler_ref.h"

static uint64_t prng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    prng ^= prng << 13, prng ^= prng >> 7, prng ^= prng << 17;
    return (double)(prng >> 11) * 0x1.0p-53;
}

static double gauss(void) {
    double u = urand() + 1e-300, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

enum { R_LM, R_FLAT, R_TIED, R_MASKED, R_NAN, R_WIDE, R_TINY, R_EQUAL, R_KINDS };
static const char *row_name[] = { "lm", "flat", "tied", "masked", "nan", "wide", "tiny", "equal" };

// R_LM: a trained model's shape (a few tokens far above a Gaussian bulk).
static void make_row(float *x, int n, int kind) {
    for (int i = 0; i < n; i++) {
        double g = gauss();
        switch (kind) {
        case R_LM: x[i] = (float)(3 * g - 7 + (urand() < 2e-4 ? 12 + 6 * urand() : 0)); break;
        case R_FLAT: x[i] = (float)(urand() * 2 - 1); break;
        case R_TIED: x[i] = (float)(floor(g * 4) * 0.5); break;
        case R_MASKED: x[i] = urand() < 0.4 ? -INFINITY : (float)(3 * g); break;
        case R_NAN: x[i] = urand() < 0.01 ? NAN : (float)(4 * g); break;
        case R_WIDE: x[i] = (float)(g * 400); break;
        case R_TINY: x[i] = (float)(g * 1e-12); break;  // distinct logits, equal masses
        default: x[i] = 0.25f; break;
        }
    }
    if (kind == R_LM) x[(int)(urand() * n)] = 14;
}

static const sampler_params cfgs[] = {
    { 1.0f, 0, 1, 0 },      { 0.7f, 0, 0.9f, 0 },     { 0.8f, 40, 1, 0 },      { 1.0f, 0, 1, 0.05f },
    { 0.3f, 10, 1, 0 },     { 1.5f, 100, 0.95f, 0 },  { 1.0f, 0, 0.999f, 0 },  { 2.0f, 0, 0.5f, 0 },
    { 0.9f, 9, 0.8f, 0.05f }, { 1.0f, 5000, 1, 0 },   { 1.0f, 0, 1, 1e-7f },   { 3.0f, 0, 1, 0 },
    { 1.2f, 0, 0.0f, 0 },   { 1.0f, 1, 1, 0 },        { 0.05f, 0, 1, 0 },      { 1e-45f, 0, 0.9f, 0 },
    { INFINITY, 0, 1, 0 },  { 1.0f, 0, NAN, NAN },    { 1.0f, 200000, 1, 0 },  { 5.0f, 0, 0.99f, 0.001f },
};
enum { N_CFG = sizeof cfgs / sizeof cfgs[0] };

typedef struct {
    int rows, draws, bad_kept, bad_h, bad_tok, bad_list, bad_distinct, lazy;
    char first[240];
} tally;

static void note(tally *t, int *counter, const char *fmt, int cfg, double a, double b) {
    if ((*counter)++ == 0 && !t->first[0]) snprintf(t->first, sizeof t->first, fmt, cfg, a, b);
}

// A lazy set's entropy and the sort's each sum n terms in a different order: both are
// within n ulps (relative) of the exact value, so they agree within twice that.
static double lazy_tol(int n, double h) { return 2.0 * (n + 16) * 0x1p-52 * fmax(1, h); }

static int same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

// Uniforms for one distribution: random ones, 0, the largest below 1, and the sort's
// own rounded cumulative sums at a few ranks with their neighbours.
static int uniforms(const ref_sampler *r, double *u, int cap) {
    int m = 0;
    for (int i = 0; i < 8; i++) u[m++] = urand();
    u[m++] = 0, u[m++] = 0x1.fffffffffffffp-1;
    double cum = 0;
    int ranks[] = { 0, 1, 2, 5, r->n_cand / 3, r->n_cand / 2, r->n_cand - 2, r->n_cand - 1 };
    int next = 0;
    for (int i = 0; i < r->n_cand && next < 8 && m + 3 <= cap; i++) {
        cum += r->cand[i].p;
        while (next < 8 && ranks[next] < i) next++;
        if (next < 8 && ranks[next] == i) {
            u[m++] = cum, u[m++] = nextafter(cum, 0), u[m++] = nextafter(cum, 1);
            next++;
        }
    }
    return m;
}

static void check_one(tally *t, sampler *s, ref_sampler *r, const float *x, int n, int ci) {
    sampler_params p = cfgs[ci];
    double h_ref = ref_distribution(r, x, p), h = sampler_distribution(s, x, p);
    t->rows++;
    int lazy = s->lazy;
    t->lazy += lazy;
    if (s->n_cand != r->n_cand) note(t, &t->bad_kept, "cfg %d: kept %.0f, sort %.0f", ci, s->n_cand, r->n_cand);
    int h_ok = lazy ? fabs(h - h_ref) <= lazy_tol(s->n_cand, h_ref) : same_double(h, h_ref);
    if (!h_ok) note(t, &t->bad_h, "cfg %d: entropy %.17g, sort %.17g", ci, h, h_ref);
    double u[40];
    int nu = uniforms(r, u, 40);
    for (int i = 0; i < nu; i++, t->draws++) {
        int got = sampler_draw_u(s, u[i]), want = ref_draw_u(r, u[i]);
        if (got != want) note(t, &t->bad_tok, "cfg %d: drew %.0f, sort %.0f", ci, got, want);
    }
    rng a = { 7, (uint64_t)ci }, b = a;
    int got_k[8], want_k[8], kg = sampler_draw_distinct(s, &a, 8, got_k), kw = ref_draw_distinct(r, &b, 8, want_k);
    if (kg != kw || memcmp(got_k, want_k, sizeof(int) * (size_t)kw))
        note(t, &t->bad_distinct, "cfg %d: %.0f distinct draws, sort %.0f", ci, kg, kw);
    sampler_materialize(s);
    for (int i = 0; i < r->n_cand && i < s->n_cand; i++)
        if (s->cand[i].id != r->cand[i].id || !same_double(s->cand[i].p, r->cand[i].p)) {
            note(t, &t->bad_list, "cfg %d: candidate %.0f differs (id %.0f)", ci, i, s->cand[i].id);
            break;
        }
    (void)n;
}

static void test_vocab(int n, int kinds_mask) {
    sampler s;
    ref_sampler r;
    float *x = malloc(sizeof(float) * (size_t)n);
    if (!x || sampler_init(&s, n) || ref_init(&r, n)) {
        CHECK(0, "sampler_exact alloc", "n=%d", n);
        return;
    }
    for (int kind = 0; kind < R_KINDS; kind++) {
        if (!(kinds_mask >> kind & 1)) continue;
        tally t = { 0 };
        make_row(x, n, kind);
        for (int ci = 0; ci < N_CFG; ci++) check_one(&t, &s, &r, x, n, ci);
        char name[96];
        snprintf(name, sizeof name, "sampler_exact n=%d %s", n, row_name[kind]);
        CHECK(!t.bad_kept && !t.bad_h && !t.bad_tok && !t.bad_list && !t.bad_distinct, name,
              "%d configs (%d lazy), %d draws: %d kept, %d entropy, %d token, %d list, %d distinct mismatches; first: %s",
              t.rows, t.lazy, t.draws, t.bad_kept, t.bad_h, t.bad_tok, t.bad_list, t.bad_distinct, t.first);
    }
    free(x), sampler_free(&s), ref_free(&r);
}

// Many LM-like rows at one vocab under the settings people use, draws from the run's
// stream: the same tokens as the sort, row after row.
static void test_many_rows(int n, int rows) {
    sampler s;
    ref_sampler r;
    float *x = malloc(sizeof(float) * (size_t)n);
    sampler_init(&s, n), ref_init(&r, n);
    static const sampler_params use[] = { { 1.0f, 0, 1, 0 }, { 0.7f, 0, 0.9f, 0 }, { 0.8f, 40, 0.95f, 0.05f } };
    int bad = 0, draws = 0, lazy = 0;
    rng a = { 11, 0 }, b = a;
    for (int row = 0; row < rows; row++) {
        make_row(x, n, row % 4 == 3 ? R_FLAT : R_LM);
        for (int c = 0; c < 3; c++) {
            double h_ref = ref_distribution(&r, x, use[c]), h = sampler_distribution(&s, x, use[c]);
            lazy += s.lazy;
            bad += s.n_cand != r.n_cand || !(fabs(h - h_ref) <= lazy_tol(s.n_cand, h_ref));
            for (int d = 0; d < 16; d++, draws++) bad += sampler_draw(&s, &a) != ref_draw_u(&r, rng_uniform(&b));
        }
    }
    char name[96];
    snprintf(name, sizeof name, "sampler_exact_many_rows n=%d", n);
    CHECK(!bad, name, "%d mismatches in %d rows x 3 settings (%d lazy), %d draws", bad, rows, lazy, draws);
    free(x), sampler_free(&s), ref_free(&r);
}

// The vectorised exp the fast pass uses against libm's: within 2^-45 relative over
// d in [-708, 0] (the sampler's decisions allow 2^-40), and 0 for -inf, NaN and below.
static void test_exp_fast(void) {
    double worst = 0, at = 0;
    for (int i = 0; i < 4000000; i++) {
        double d = i % 3 == 0 ? -urand() * 708 : i % 3 == 1 ? -urand() * 30 : -urand() * 1e-3;
        double rel = fabs(sampler_exp_fast(d) - exp(d)) / exp(d);
        if (rel > worst) worst = rel, at = d;
    }
    int specials = sampler_exp_fast(0) == 1 && sampler_exp_fast(-INFINITY) == 0 && sampler_exp_fast(NAN) == 0 &&
                   sampler_exp_fast(-800) == 0;
    CHECK(worst <= 0x1p-45 && specials, "sampler_exp_fast_accuracy", "worst relative error %.3g at %.17g; specials %d",
          worst, at, specials);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Mean and median microseconds per token (distribution + one draw) over LM-like rows,
// the new sampler and the sort interleaved.
static void bench(void) {
    static const int vocabs[] = { 32000, 49152, 128256, 151936 };
    static const sampler_params set[] = { { 1.0f, 0, 1, 0 }, { 0.7f, 0, 0.9f, 0 }, { 0.8f, 40, 1, 0 }, { 1.0f, 0, 1, 0.05f } };
    static const char *set_name[] = { "temp 1.0", "temp 0.7 top-p 0.9", "temp 0.8 top-k 40", "temp 1.0 min-p 0.05" };
    enum { ROWS = 9, REPS = 45 };
    for (int v = 0; v < 4; v++) {
        int n = vocabs[v];
        float *x = malloc(sizeof(float) * (size_t)n * ROWS);
        sampler s;
        ref_sampler r;
        sampler_init(&s, n), ref_init(&r, n);
        for (int i = 0; i < ROWS; i++) make_row(x + (size_t)i * n, n, R_LM);
        for (int c = 0; c < 4; c++) {
            double tn[REPS], tr[REPS], sn = 0, sr = 0;
            rng g = { 5, 0 };
            for (int k = 0; k < REPS; k++) {  // interleaved: new, then the sort
                const float *row = x + (size_t)(k % ROWS) * n;
                double u = rng_uniform(&g), t0 = now();
                sampler_distribution(&s, row, set[c]);
                sampler_draw_u(&s, u);
                sn += tn[k] = now() - t0, t0 = now();
                ref_distribution(&r, row, set[c]);
                ref_draw_u(&r, u);
                sr += tr[k] = now() - t0;
            }
            qsort(tn, REPS, sizeof *tn, cmp_d), qsort(tr, REPS, sizeof *tr, cmp_d);
            printf("bench sampler vocab %6d %-22s mean %7.1f us/token, median %7.1f (sort: mean %8.1f, median %8.1f; "
                   "%.0fx)\n", n, set_name[c], sn / REPS * 1e6, tn[REPS / 2] * 1e6, sr / REPS * 1e6, tr[REPS / 2] * 1e6,
                   sr / sn);
        }
        free(x), sampler_free(&s), ref_free(&r);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        bench();
        return 0;
    }
    test_exp_fast();
    static const int small[] = { 1, 2, 7, 513, 1025, 4099 };
    for (int i = 0; i < 6; i++) test_vocab(small[i], 0xff);
    test_vocab(32000, 0xff);
    test_vocab(49152, 1 << R_LM | 1 << R_FLAT | 1 << R_MASKED | 1 << R_TINY);
    test_vocab(128256, 1 << R_LM | 1 << R_NAN);
    test_vocab(151936, 1 << R_LM | 1 << R_TIED);
    test_many_rows(49152, 24);
    CHECK_DONE();
}
