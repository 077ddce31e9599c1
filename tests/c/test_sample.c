// test_sample.c: the exact sampler's two implementations against independent ones.
//  - CPU twin (kernels/cpu/sample.c, fixed-point masses, sorted walk) against
//    host/runtime/sampler.c (double-precision masses, quickselect + sort): same token for the
//    same uniform, same entropy, on flat, peaked, tied and masked rows.
//  - Device kernel (kernels/cuda/sample.cu, radix descent, all configurations in one
//    launch) against the twin, bit for bit, when a GPU is present; SKIP otherwise.
// Usage: test_sample [--bench]   (--bench times cuda_sample at real vocab sizes)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "check.h"
#include "host/decode/entropix.h"
#include "host/runtime/sampler.h"
#include "kernels/ops.h"

static uint64_t prng = 0x2545f4914f6cdd1dull;
static double urand(void) {
    prng ^= prng << 13, prng ^= prng >> 7, prng ^= prng << 17;
    return (double)(prng >> 11) * 0x1.0p-53;
}

enum { ROW_FLAT, ROW_PEAKED, ROW_TIED, ROW_MASKED, ROW_KINDS, ROW_CONST = ROW_KINDS, ROW_MODEL, DEV_ROW_KINDS };
static const char *row_name[] = { "flat", "peaked", "tied", "masked", "constant", "model-like" };

static void make_row(float *x, int n, int kind) {
    for (int i = 0; i < n; i++) {
        double v = urand() * 2 - 1;
        if (kind == ROW_FLAT) x[i] = (float)v;
        else if (kind == ROW_PEAKED) x[i] = (float)(v * 20 + (i % 97 == 5 ? 25 : 0));
        else if (kind == ROW_TIED) x[i] = (float)(floor(v * 6) * 0.5);  // many exact ties
        else if (kind == ROW_MASKED) x[i] = urand() < 0.3 ? -INFINITY : (float)(v * 8);
        else if (kind == ROW_CONST) x[i] = 0.25f;
        else x[i] = (float)(v * v * v * 12 + (i % 1009 == 3 ? 14 : 0));  // dense tail, a few heads
    }
}

// The agents' default spread plus every truncation alone and together, and greedy.
static const sampler_params cfgs[] = {
    { 0.3f, 10, 1, 0 }, { 0.7f, 40, 1, 0 }, { 1.0f, 0, 1, 0 }, { 1.5f, 100, 1, 0 },
    { 1.0f, 0, 0.9f, 0 }, { 0.8f, 0, 1, 0.05f }, { 0.9f, 9, 0.8f, 0.05f }, { 2.0f, 0, 0.5f, 0 },
    { 0.666f, 27, 0.9f, 0.03f }, { 0, 0, 1, 0 }, { 1.0f, 1, 1, 0 }, { 1.2f, 0, 0.0f, 0 },
};
enum { N_CFG = sizeof cfgs / sizeof cfgs[0] };

// The device runs these too: the edges of each truncation (min-p 1 keeps only the ties of
// the top, top-k beyond the vocabulary, a top-k cut followed by a top-p cut in the same
// bucket) and temperatures that squeeze every token into one bucket or spread them.
static const sampler_params dev_extra[] = {
    { 1.0f, 0, 1, 1.0f }, { 1.0f, 1000000, 1, 0 }, { 1.0f, 1, 0.5f, 0.5f }, { 1e-3f, 0, 0.9f, 0 },
    { 100.0f, 0, 0.9f, 0 }, { 1.0f, 2000, 0.95f, 0 }, { 0.5f, 0, 1e-9f, 0 }, { 1.0f, 3, 0.99f, 0 },
};
enum { N_DEV_CFG = N_CFG + sizeof dev_extra / sizeof dev_extra[0] };
static sampler_params dev_cfg(int i) { return i < N_CFG ? cfgs[i] : dev_extra[i - N_CFG]; }

static sample_cfg to_cfg(sampler_params p, double u) { return (sample_cfg){ p.temperature, p.top_k, p.top_p, p.min_p, u }; }

// Twin vs host/runtime/sampler.c over rows x configurations x draws.
static void test_twin_vs_sampler(void) {
    static const int sizes[] = { 7, 513, 50001 };
    for (int si = 0; si < 3; si++)
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            int n = sizes[si], bad_tok = 0, bad_h = 0, bad_kept = 0, draws = 0;
            float *x = malloc((size_t)n * sizeof *x);
            sampler s;
            sampler_init(&s, n);
            make_row(x, n, kind);
            float lo = INFINITY, hi = -INFINITY;
            for (int i = 0; i < n; i++)
                if (x[i] > -INFINITY) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
            char detail[160] = "";
            for (int c = 0; c < N_CFG; c++) {
                sampler_params p = cfgs[c];
                double h_ref = sampler_distribution(&s, x, p);
                int reps = n > 10000 ? 20 : 200;
                for (int d = 0; d < reps; d++, draws++) {
                    rng r = { 99, (uint64_t)d }, r2 = r;
                    double u = rng_uniform(&r2);
                    int want = p.temperature > 0 ? sampler_draw(&s, &r) : sampler_argmax(x, n);
                    sample_cfg sc = to_cfg(p, u);
                    sample_out o;
                    cpu_sample(&o, x, n, &sc, 1);
                    if (o.token != want && !bad_tok++)
                        snprintf(detail, sizeof detail, "cfg %d draw %d: twin %d sampler %d", c, d, o.token, want);
                    if (!(fabs(o.entropy - h_ref) <= 1e-6 + 1e-6 * h_ref) && !bad_h++)
                        snprintf(detail, sizeof detail, "cfg %d: entropy twin %.12g sampler %.12g", c, o.entropy, h_ref);
                    // Without tokens below 2^-44 of the top (and no -inf), both keep the same set.
                    int all_in = kind != ROW_MASKED && (hi - lo) < 30 * p.temperature;
                    if (p.temperature > 0 && all_in && o.n_kept != s.n_cand && !bad_kept++)
                        snprintf(detail, sizeof detail, "cfg %d: kept twin %d sampler %d", c, o.n_kept, s.n_cand);
                    if (o.logit != x[o.token] && !bad_tok++) snprintf(detail, sizeof detail, "logit of %d", o.token);
                }
            }
            char name[96];
            snprintf(name, sizeof name, "twin_vs_sampler n=%d %s", n, row_name[kind]);
            CHECK(!bad_tok && !bad_h && !bad_kept, name, "%d/%d token, %d entropy, %d kept mismatches; first: %s",
                  bad_tok, draws, bad_h, bad_kept, detail);
            sampler_free(&s);
            free(x);
        }
}

// Top-p is a share of all the mass after min-p/top-k, including the tail the CPU
// sampler's prefilter skips: head 1, .9, ..., .1 (sum 5.5) plus 5000 tokens at 2e-4 of
// the top (sum 1). top_p .75 of 6.5 = 4.875 needs 7 head tokens (4.9); a nucleus taken
// of the head alone would stop at 6 (4.5).
static void test_top_p_counts_the_tail(void) {
    int n = 5010;
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < 10; i++) x[i] = (float)log(1.0 - 0.1 * i);
    for (int i = 10; i < n; i++) x[i] = (float)log(2e-4);
    sampler s;
    sampler_init(&s, n);
    sampler_params p = { 1.0f, 0, 0.75f, 0 };
    sampler_distribution(&s, x, p);
    CHECK(s.n_cand == 7, "sampler_top_p_counts_the_tail", "kept %d, want 7", s.n_cand);
    sample_cfg c = to_cfg(p, 0.5);
    sample_out o;
    cpu_sample(&o, x, n, &c, 1);
    CHECK(o.n_kept == 7, "twin_top_p_counts_the_tail", "kept %d, want 7", o.n_kept);
    sampler_free(&s);
    free(x);
}

// Hand-checked draws: two tokens with masses 3:1 at T = 1 (logits ln 3, 0).
static void test_hand_draws(void) {
    float x[2] = { (float)log(3.0), 0 };
    double q0 = floor(1.0 * 17592186044416.0), q1 = floor(exp(-(double)x[0]) * 17592186044416.0);
    double split = q0 / (q0 + q1);  // first token while u * Q < q0
    sample_cfg c[4] = { { 1, 0, 1, 0, 0.0 }, { 1, 0, 1, 0, split - 1e-9 }, { 1, 0, 1, 0, split + 1e-9 },
                        { 1, 0, 1, 0, 0.999999 } };
    sample_out o[4];
    int rc = cpu_sample(o, x, 2, c, 4);
    double h = -(0.75 * log2(0.75) + 0.25 * log2(0.25));
    CHECK(rc == 0 && o[0].token == 0 && o[1].token == 0 && o[2].token == 1 && o[3].token == 1, "twin_hand_draws",
          "rc %d tokens %d %d %d %d", rc, o[0].token, o[1].token, o[2].token, o[3].token);
    CHECK(fabs(o[0].entropy - h) < 1e-7 && o[0].n_kept == 2, "twin_hand_entropy", "H %.12g want %.12g kept %d",
          o[0].entropy, h, o[0].n_kept);
    sample_cfg g = { 0, 0, 1, 0, 0.5 };
    float y[5] = { 1, NAN, 3, 3, -INFINITY };
    cpu_sample(o, y, 5, &g, 1);
    CHECK(o[0].token == 2 && o[0].entropy == 0, "twin_greedy_first_max_nan_never_wins", "token %d", o[0].token);
    CHECK(cpu_sample(o, y, 0, &g, 1) == -1 && cpu_sample(o, y, (1 << 19) + 1, &g, 1) == -1, "twin_bad_shapes",
          "accepted a bad vocab size");
}

#ifndef VARENT_CUDA
static void test_device(int bench) {
    (void)bench;
    SKIP("cuda_sample", "built without CUDA");
}
#else
#include "kernels/ops_cuda.h"

static int dev_fail(cuda_ctx *C, const char *what) {
    CHECK(0, what, "%s", C->err.msg);
    return -1;
}

// Draws that differ from the twin's (token, kept count and logit exactly, entropy within
// 1e-9); *first: the first of them.
static int count_mismatches(const sample_out *got, const sample_out *want, int n, int *first) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int ok = got[i].token == want[i].token && got[i].n_kept == want[i].n_kept && got[i].logit == want[i].logit &&
                 fabs(got[i].entropy - want[i].entropy) <= 1e-9 + 1e-9 * want[i].entropy;
        if (!ok && !bad++) *first = i;
    }
    return bad;
}

// All configurations x draws of one row in one launch, against the twin. The sampler's
// scratch (histograms, buckets) is poisoned first: every launch must clear what it sums.
// draws: configurations per draw of the table (16 on a GPU, fewer on the emulated one)
static int device_row(cuda_ctx *C, const float *x, int n, const char *label, int draws) {
    enum { DRAWS = 16 };
    int nc = N_DEV_CFG * draws;
    sample_cfg cfg[N_DEV_CFG * DRAWS];
    sample_out want[N_DEV_CFG * DRAWS], got[N_DEV_CFG * DRAWS];
    for (int i = 0; i < nc; i++) cfg[i] = to_cfg(dev_cfg(i % N_DEV_CFG), urand());
    cpu_sample(want, x, n, cfg, nc);
    float *dx;
    sample_cfg *dc;
    sample_out *dout;
    verr e;
    if (cuda_malloc((void **)&dx, (size_t)n * 4, "logits", &e) || cuda_malloc((void **)&dc, sizeof cfg, "cfg", &e) ||
        cuda_malloc((void **)&dout, sizeof got, "out", &e)) {
        CHECK(0, "cuda_sample alloc", "%s", e.msg);
        return -1;
    }
    if (cuda_upload(C, dx, x, (size_t)n * 4) || cuda_upload(C, dc, cfg, (size_t)nc * sizeof *cfg) ||
        cuda_reserve_sample(C, n, nc) || cuda_memset(C, C->sample_buf, 0xFF, C->sample_bytes) ||
        cuda_memset(C, dout, 0xFF, sizeof got) || cuda_sample(C, dout, dx, n, dc, nc) ||
        cuda_download(C, got, dout, sizeof got))
        return dev_fail(C, "cuda_sample run");
    int first = -1, bad = count_mismatches(got, want, nc, &first);
    char name[96];
    snprintf(name, sizeof name, "cuda_sample %s n=%d (%d configs, one launch)", label, n, nc);
    if (first >= 0)
        CHECK(0, name, "%d mismatches; first cfg %d: gpu %d/%d/%.12g twin %d/%d/%.12g", bad, first, got[first].token,
              got[first].n_kept, got[first].entropy, want[first].token, want[first].n_kept, want[first].entropy);
    else CHECK(1, name, "%s", "");
    cuda_free(dx), cuda_free(dc), cuda_free(dout);
    return 0;
}

// cuda_sample_rows: one draw from each row of a batch (the scheduler's device draws),
// rows of every kind with a stride past n, each configuration its own, against the twin
// on that row alone. The scratch is poisoned first, as above.
static int device_rows(cuda_ctx *C, int n) {
    enum { PER_KIND = 3, ROWS = DEV_ROW_KINDS * PER_KIND };
    size_t ld = (size_t)n + 5;
    float *x = malloc(sizeof(float) * ld * ROWS);
    sample_cfg cfg[ROWS];
    sample_out want[ROWS], got[ROWS];
    for (int r = 0; r < ROWS; r++) {
        make_row(x + r * ld, n, r % DEV_ROW_KINDS);
        for (size_t j = n; j < ld; j++) x[r * ld + j] = 1e30f;  // past the row: would win every draw if read
        cfg[r] = to_cfg(dev_cfg((r * 7) % N_DEV_CFG), urand());
        cpu_sample(&want[r], x + r * ld, n, &cfg[r], 1);
    }
    float *dx;
    sample_cfg *dc;
    sample_out *dout;
    verr e;
    if (cuda_malloc((void **)&dx, sizeof(float) * ld * ROWS, "logits", &e) ||
        cuda_malloc((void **)&dc, sizeof cfg, "cfg", &e) || cuda_malloc((void **)&dout, sizeof got, "out", &e)) {
        CHECK(0, "cuda_sample_rows alloc", "%s", e.msg);
        return -1;
    }
    if (cuda_upload(C, dx, x, sizeof(float) * ld * ROWS) || cuda_upload(C, dc, cfg, sizeof cfg) ||
        cuda_reserve_sample(C, n, ROWS) || cuda_memset(C, C->sample_buf, 0xFF, C->sample_bytes) ||
        cuda_memset(C, dout, 0xFF, sizeof got) || cuda_sample_rows(C, dout, dx, ld, n, dc, ROWS) ||
        cuda_download(C, got, dout, sizeof got))
        return dev_fail(C, "cuda_sample_rows run");
    int first = -1, bad = count_mismatches(got, want, ROWS, &first);
    char name[96];
    snprintf(name, sizeof name, "cuda_sample_rows n=%d, %d rows of every kind, one draw each", n, ROWS);
    if (first >= 0)
        CHECK(0, name, "%d mismatches; first row %d (%s): gpu %d/%d twin %d/%d", bad, first,
              row_name[first % DEV_ROW_KINDS], got[first].token, got[first].n_kept, want[first].token,
              want[first].n_kept);
    else CHECK(1, name, "%s", "");
    CHECK(cuda_sample_rows(C, dout, dx, 0, n, dc, ROWS) != 0 && strstr(C->err.msg, "stride"),
          "cuda_sample_rows: a row stride of 0 is refused", "%s", C->err.msg);
    cuda_free(dx), cuda_free(dc), cuda_free(dout);
    free(x);
    return 0;
}

// One timed configuration: the median of 31 launches of cuda_sample over logits x[n].
static double bench_one(cuda_ctx *C, const float *x, int n, const sample_cfg *cfg, int n_cfg) {
    float *dx;
    sample_cfg *dc;
    sample_out *dout;
    verr e;
    if (cuda_malloc((void **)&dx, (size_t)n * 4, "logits", &e) || cuda_malloc((void **)&dc, sizeof(sample_cfg) * 8, "cfg", &e) ||
        cuda_malloc((void **)&dout, 8 * sizeof(sample_out), "out", &e) || cuda_upload(C, dx, x, (size_t)n * 4) ||
        cuda_upload(C, dc, cfg, sizeof(sample_cfg) * (size_t)n_cfg))
        return -1;
    double t[31];
    for (int r = 0; r < 31; r++) {
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        cudaEventRecord(a, C->stream);
        cuda_sample(C, dout, dx, n, dc, n_cfg);
        cudaEventRecord(b, C->stream);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        t[r] = ms * 1e3;
        cudaEventDestroy(a), cudaEventDestroy(b);
    }
    for (int i = 1; i < 31; i++)  // insertion sort for the median
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double s = t[j];
            t[j] = t[j - 1], t[j - 1] = s;
        }
    cuda_free(dx), cuda_free(dc), cuda_free(dout);
    return t[15];
}

// The decode step's draw (one configuration: temperature 1, then 0.7 with top-p 0.9) and
// 8 draws in one launch (the agents), on near-flat rows (uniform in [-1, 1): every token
// a candidate, the hard case) and peaked ones, at real vocabulary sizes.
static void bench_device(cuda_ctx *C) {
    static const int vocabs[] = { 49152, 128256, 151936 };
    static const sampler_params one[] = { { 1.0f, 0, 1, 0 }, { 0.7f, 0, 0.9f, 0 } };
    for (int v = 0; v < 3; v++) {
        int n = vocabs[v];
        float *x = malloc((size_t)n * 4);
        for (int kind = ROW_FLAT; kind <= ROW_PEAKED; kind++) {
            make_row(x, n, kind);
            for (int k = 0; k < 2; k++) {
                sample_cfg c1 = to_cfg(one[k], urand());
                printf("BENCH cuda_sample vocab %d %s rows, 1 draw (temp %g top-p %g): median %.1f us\n", n,
                       kind == ROW_FLAT ? "near-flat" : "peaked", one[k].temperature, one[k].top_p, bench_one(C, x, n, &c1, 1));
            }
            sample_cfg cfg[8];
            for (int i = 0; i < 8; i++) cfg[i] = to_cfg(cfgs[i % 4], urand());
            printf("BENCH cuda_sample vocab %d %s rows, 8 configs in one launch: median %.1f us\n", n,
                   kind == ROW_FLAT ? "near-flat" : "peaked", bench_one(C, x, n, cfg, 8));
        }
        free(x);
    }
}

// The entropix decision on the device (cuda_entropix_arm) against the host's
// entropix_decide, bit for bit, on every stock profile: random metrics, each box's exact
// bounds and their neighbours, NaN and inf, with and without the clarifier before.
// A metric is a float on both sides (the device statistics), widened to double.
static float metric_value(const entropix_config *c, int i, int k) {
    int q = (int)(urand() * ENTROPIX_N_BOXES);
    double lo = c->box[q].lo[i], hi = c->box[q].hi[i];
    switch (k % 6) {
    case 0: return isfinite(lo) ? (float)lo : 0.f;
    case 1: return isfinite(hi) ? nextafterf((float)hi, -INFINITY) : 9.f;
    case 2: return k % 37 == 2 ? NAN : k % 41 == 2 ? INFINITY : (float)(urand() * 12);
    default: return (float)(urand() * (i == M_AGREE ? 1.2 : i == M_INTER ? 30 : 8));
    }
}

static int device_entropix(cuda_ctx *C) {
    static const char *profiles[] = { "seed", "jax", "frog" };
    enum { CASES = 400, K = 8 };
    float *ds;
    entropix_config *dc;
    double *du;
    sample_cfg *dcfg;
    int *dtok;  // {prev_token, clarifier}
    verr e;
    if (cuda_malloc((void **)&ds, 8 * sizeof(float), "stats", &e) ||
        cuda_malloc((void **)&dtok, 2 * sizeof(int), "tokens", &e) || cuda_malloc((void **)&dc, sizeof *dc, "profile", &e) ||
        cuda_malloc((void **)&du, K * sizeof(double), "uniforms", &e) ||
        cuda_malloc((void **)&dcfg, K * sizeof(sample_cfg), "cfg", &e)) {
        CHECK(0, "cuda_entropix_arm alloc", "%s", e.msg);
        return -1;
    }
    for (int p = 0; p < 3; p++) {
        entropix_config c;
        if (entropix_profile(profiles[p], &c, &e) || cuda_upload(C, dc, &c, sizeof c)) return dev_fail(C, "profile");
        int bad = 0, quadrants[Q_COUNT] = { 0 };
        char detail[200] = "";
        for (int k = 0; k < CASES; k++) {
            float st[8] = { 0, 0, metric_value(&c, M_ENT, k), metric_value(&c, M_VENT, k), metric_value(&c, M_AENT, k),
                            metric_value(&c, M_AVENT, k), metric_value(&c, M_AGREE, k), metric_value(&c, M_INTER, k) };
            double u[K];
            for (int i = 0; i < K; i++) u[i] = urand();
            int prev = k % 3 == 0 ? 99 : 7, tok[2] = { prev, 99 };
            sample_cfg got[K], want[K];
            if (cuda_upload(C, ds, st, sizeof st) || cuda_upload(C, dtok, tok, sizeof tok) ||
                cuda_upload(C, du, u, sizeof u) || cuda_memset(C, dcfg, 0xFF, sizeof got) ||
                cuda_entropix_arm(C, dcfg, K, ds, ds + 4, dc, du, dtok) || cuda_download(C, got, dcfg, sizeof got))
                return dev_fail(C, "cuda_entropix_arm run");
            token_metrics m = { 0 };
            float ls[4] = { st[0], st[1], st[2], st[3] };
            metrics_from_stats(&m, ls, st + 4);
            entropix_step step = entropix_decide(&c, &m, prev, 99);
            int n = ex_draws(&step, u, want);
            for (int i = n; i < K; i++) want[i] = (sample_cfg){ 0.f, 1, 1.f, 0.f, 0.0 };
            quadrants[step.q]++;
            if (memcmp(got, want, sizeof got) && !bad++)
                snprintf(detail, sizeof detail, "case %d (%s): device T %.9g k %d p %.9g, host T %.9g k %d p %.9g", k,
                         entropix_quadrant_name(step.q), got[0].temperature, got[0].top_k, got[0].top_p,
                         want[0].temperature, want[0].top_k, want[0].top_p);
        }
        char name[96];
        snprintf(name, sizeof name, "cuda_entropix_arm_%s_matches_host_decide", profiles[p]);
        CHECK(!bad && quadrants[Q_LELV] && quadrants[Q_ADAPTIVE], name, "%d of %d differ: %s (LELV %d, ADAPTIVE %d)",
              bad, CASES, detail, quadrants[Q_LELV], quadrants[Q_ADAPTIVE]);
    }
    cuda_free(ds), cuda_free(dc), cuda_free(du), cuda_free(dcfg), cuda_free(dtok);
    return 0;
}

static void test_device(int bench) {
    if (cuda_device_count() == 0) {
        SKIP("cuda_sample", "no CUDA device");
        return;
    }
    cuda_ctx C;
    verr e;
    if (cuda_init(&C, 0, &e)) {
        CHECK(0, "cuda_init", "%s", e.msg);
        return;
    }
    // The emulated device (docs/cuda.md) runs every CUDA thread on the CPU: there the
    // largest vocabularies and most draws give way to odd mid-size rows.
    char desc[256] = "";
    int emu = cuda_describe(&C, desc, sizeof desc) == 0 && strstr(desc, "emulated");
    static const int sizes[] = { 7, 513, 32000, 49152, 50001, 128256, 151936 }, emu_sizes[] = { 7, 513, 1025, 20011 };
    int n_sizes = emu ? 4 : 7;
    for (int si = 0; si < n_sizes; si++) {
        int n = emu ? emu_sizes[si] : sizes[si];
        float *x = malloc((size_t)n * 4);
        for (int kind = 0; kind < DEV_ROW_KINDS; kind++) {
            if (emu && kind == ROW_CONST && n > 1025) continue;  // n = 1025 has one bucket of 1025 ties already
            make_row(x, n, kind);
            if (device_row(&C, x, n, row_name[kind], emu ? 2 : 16)) break;
        }
        free(x);
    }
    for (int i = 0; i < (emu ? 2 : 3); i++) device_rows(&C, (int[]){ 513, 20011, 128256 }[i]);
    device_entropix(&C);
    if (bench) bench_device(&C);
    cuda_destroy(&C);
}
#endif

// Non-finite rows (issue 22, row 5): all NaN, all -inf, +inf, NaN beside finite values,
// under min-p, top-k and top-p. The sampler never draws from zero candidates and never
// returns an id outside the vocab (the old code read cand[-1] under min-p: an ASan
// heap overflow in make test-asan).
static void test_nonfinite_rows(void) {
    enum { N = 64 };
    float x[N];
    const char *names[] = { "all_nan", "all_neg_inf", "pos_inf", "nan_and_finite", "huge" };
    int bad = 0;
    char detail[200] = "";
    sampler s;
    sampler_init(&s, N);
    for (int kind = 0; kind < 5; kind++)
        for (int ci = 0; ci < N_CFG; ci++) {
            for (int i = 0; i < N; i++) {
                x[i] = kind == 0 ? NAN : kind == 1 ? -INFINITY : kind == 2 ? (i == 9 ? INFINITY : 1.0f)
                     : kind == 3 ? (i % 3 ? NAN : (float)i) : (i % 2 ? 3e38f : -3e38f);
            }
            sampler_params p = cfgs[ci];
            p.min_p = p.min_p > 0 ? p.min_p : 0.1f;
            sampler_distribution(&s, x, p);
            int id = sampler_draw_u(&s, 0.999), id0 = sampler_draw_u(&s, 0);
            int ok = s.n_cand >= 1 && s.n_cand <= N && id >= 0 && id < N && id0 >= 0 && id0 < N &&
                     (kind != 3 || (id % 3 == 0 && id0 % 3 == 0)) && (kind != 2 || id == 9);
            if (!ok && !bad++)
                snprintf(detail, sizeof detail, "%s cfg %d: n_cand %d ids %d %d", names[kind], ci, s.n_cand, id, id0);
        }
    CHECK(!bad, "sampler_nonfinite_never_empty", "%d bad: %s", bad, detail);
    sampler fresh;
    sampler_init(&fresh, N);
    CHECK(sampler_draw_u(&fresh, 0.5) == -1, "sampler_draw_without_distribution", "got %d", sampler_draw_u(&fresh, 0.5));
    float nan_t[N];
    for (int i = 0; i < N; i++) nan_t[i] = (float)i;
    sampler_distribution(&s, nan_t, (sampler_params){ NAN, 0, 1, 0.1f });
    CHECK(s.n_cand == 1 && s.cand[0].id == N - 1, "sampler_nan_temperature_is_argmax", "n_cand %d id %d", s.n_cand,
          s.cand[0].id);
    sampler_distribution(&s, nan_t, (sampler_params){ 1, 0, 1, NAN });
    CHECK(s.n_cand >= 1 && s.cand[0].id == N - 1, "sampler_nan_min_p", "n_cand %d", s.n_cand);
    sampler_free(&fresh);
    sampler_free(&s);
}

int main(int argc, char **argv) {
    int bench = argc > 1 && !strcmp(argv[1], "--bench");
    if (!bench) {
        test_hand_draws();
        test_nonfinite_rows();
        test_top_p_counts_the_tail();
        test_twin_vs_sampler();
    }
    test_device(bench);
    CHECK_DONE();
}
