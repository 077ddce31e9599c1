// test_entropix: the metric formulas on hand-computed inputs, the quadrant decision
// and its parameters for every profile, overriding constants, the stock sampler's
// statistics (chi-square against the truncated distribution computed here
// independently), distinct draws, and the repeat penalty / no-repeat-ngram rules.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host/decode/entropix.h"
#include "host/runtime/metrics.h"
#include "host/runtime/sampler.h"
#include "tests/c/check.h"

static int near(double a, double b, double tol) { return fabs(a - b) <= tol * (1 + fabs(b)); }

static void test_logit_metrics(void) {
    metrics_ws ws = { 0 };
    token_metrics m;
    float uni[4] = { 3, 3, 3, 3 };
    metrics_logits(&ws, uni, 4, &m);
    CHECK(near(m.entropy, 2, 1e-12) && fabs(m.varentropy) < 1e-12, "metrics_uniform", "H %g V %g", m.entropy, m.varentropy);
    float two[2] = { 0, (float)log(3.0) };  // p = 1/4, 3/4
    metrics_logits(&ws, two, 2, &m);
    double H = 0.25 * 2 + 0.75 * log2(4.0 / 3), V = 0.25 * pow(-2 + H, 2) + 0.75 * pow(log2(0.75) + H, 2);
    CHECK(near(m.entropy, H, 1e-6) && near(m.varentropy, V, 1e-6), "metrics_two_tokens", "H %g (%g) V %g (%g)", m.entropy,
          H, m.varentropy, V);
    CHECK(near(m.log_z, log(4.0), 1e-6), "metrics_log_z", "%g", m.log_z);
    // 2 heads x 2 keys: head 0 uniform, head 1 scores (0, ln 3) -> (1/4, 3/4)
    float sc[4] = { 0, 0, 0, (float)log(3.0) };
    metrics_attention(&ws, sc, 2, 2, &m);
    double e0 = 1, e1 = H, mean = (e0 + e1) / 2, var = ((e0 - mean) * (e0 - mean) + (e1 - mean) * (e1 - mean)) / 2;
    // mean probs (3/8, 5/8): |1/2-3/8|+|1/2-5/8|+|1/4-3/8|+|3/4-5/8| = 4/8, over 4 cells
    CHECK(near(m.attn_entropy, mean, 1e-6) && near(m.attn_varentropy, var, 1e-6), "metrics_attn_entropy",
          "%g (%g) %g (%g)", m.attn_entropy, mean, m.attn_varentropy, var);
    CHECK(near(m.agreement, 0.125, 1e-6) && near(m.interaction_strength, log(3.0) / 4, 1e-6), "metrics_agreement_interaction",
          "%g %g", m.agreement, m.interaction_strength);
    metrics_ws_free(&ws);
}

static token_metrics tm(double H, double V, double ae, double av, double ag, double is) {
    return (token_metrics){ H, V, ae, av, ag, is, 0 };
}

static void test_quadrants_seed_jax(void) {
    entropix_config seed, jax;
    verr err;
    entropix_profile("seed", &seed, &err), entropix_profile("jax", &jax, &err);
    struct { double H, V; entropix_quadrant s, j; } cases[] = {
        { 0.05, 0.05, Q_LELV, Q_LELV }, { 1, 6, Q_LEHV, Q_LEHV },  { 4, 0.05, Q_HELV, Q_ADAPTIVE },
        { 6, 0.05, Q_HELV, Q_HELV },    { 6, 6, Q_HEHV, Q_HEHV },  { 4, 6, Q_LEHV, Q_LEHV },
        { 1, 1, Q_ADAPTIVE, Q_ADAPTIVE }, { 5, 6, Q_ADAPTIVE, Q_HEHV },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        token_metrics m = tm(cases[i].H, cases[i].V, 1, 0.1, 0.01, 0.5);
        char name[64];
        snprintf(name, sizeof name, "classify_seed_jax_%zu", i);
        entropix_quadrant a = entropix_classify(&seed, &m), b = entropix_classify(&jax, &m);
        CHECK(a == cases[i].s && b == cases[i].j, name, "H %g V %g: seed %s jax %s", cases[i].H, cases[i].V,
              entropix_quadrant_name(a), entropix_quadrant_name(b));
    }
}

static void test_quadrants_frog(void) {
    entropix_config c;
    verr err;
    entropix_profile("frog", &c, &err);
    token_metrics lelv = tm(0.005, 0.01, 11.0, 0.0005, 1e-6, 0.1), helv = tm(3, 0.01, 11.0, 0.0005, 1e-6, 0.1);
    token_metrics lehv = tm(1, 6, 11.0, 0.01, 1e-6, 0.3), hehv = tm(1, 6, 12.0, 0.01, 6e-6, 0.3);
    token_metrics near_lelv = tm(0.005, 0.01, 11.0, 0.0005, 3e-6, 0.1);  // agreement too high for LELV
    CHECK(entropix_classify(&c, &lelv) == Q_LELV, "classify_frog_lelv", "%d", entropix_classify(&c, &lelv));
    CHECK(entropix_classify(&c, &helv) == Q_HELV, "classify_frog_helv", "%d", entropix_classify(&c, &helv));
    CHECK(entropix_classify(&c, &lehv) == Q_LEHV, "classify_frog_lehv", "%d", entropix_classify(&c, &lehv));
    CHECK(entropix_classify(&c, &hehv) == Q_HEHV, "classify_frog_hehv", "%d", entropix_classify(&c, &hehv));
    CHECK(entropix_classify(&c, &near_lelv) == Q_ADAPTIVE, "classify_frog_attention_matters", "%d",
          entropix_classify(&c, &near_lelv));
}

static int params_eq(sampler_params p, double t, int k, double tp, double mp) {
    return fabs(p.temperature - t) < 1e-5 && p.top_k == k && fabs(p.top_p - tp) < 1e-6 && fabs(p.min_p - mp) < 1e-6;
}

static void test_decide(void) {
    entropix_config c;
    verr err;
    entropix_profile("seed", &c, &err);
    token_metrics m = tm(0.05, 0.05, 2, 0.3, 0.1, 0.7);
    entropix_step s = entropix_decide(&c, &m, 7, 99);
    CHECK(s.q == Q_LELV && s.greedy, "decide_lelv_greedy", "q %d", s.q);
    m = tm(4, 0.05, 2, 0.3, 0.1, 0.7);
    s = entropix_decide(&c, &m, 7, 99);
    CHECK(s.q == Q_HELV && s.clarify, "decide_helv_clarify", "q %d clarify %d", s.q, s.clarify);
    s = entropix_decide(&c, &m, 99, 99);  // previous token is the clarifier: sample instead
    CHECK(!s.clarify && params_eq(s.sp, fmin(1.5, 0.666 * (1.3 + 0.2 * 2)), 27, 0.9, 0.03), "decide_helv_no_repeat",
          "clarify %d T %g", s.clarify, s.sp.temperature);
    m = tm(1, 6, 2, 0.3, 0.1, 0.7);  // LEHV: T = min(1.5, .666*(1.2+.21)) = 0.93906, k = floor(27*1.45) = 39
    s = entropix_decide(&c, &m, 7, 99);
    CHECK(s.q == Q_LEHV && params_eq(s.sp, 0.666 * 1.41, 39, 0.9, 0.03), "decide_lehv_params", "T %g k %d",
          s.sp.temperature, s.sp.top_k);
    m = tm(1, 6, 2, 0.3, 0.1, 5.0);  // .666 (1.2 + 1.5) = 1.798, capped at 1.5
    s = entropix_decide(&c, &m, 7, 99);
    CHECK(params_eq(s.sp, 1.5, 39, 0.9, 0.03), "decide_lehv_cap", "T %g", s.sp.temperature);
    m = tm(6, 6, 2, 0.3, 0.1, 0.7);  // HEHV: T = max(2, .666*2.15) = 2, top_p = max(.5, .9-.4) = 0.5
    s = entropix_decide(&c, &m, 7, 99);
    CHECK(s.q == Q_HEHV && params_eq(s.sp, 2.0, 27, 0.5, 0.03), "decide_hehv_params", "T %g p %g", s.sp.temperature,
          s.sp.top_p);
    m = tm(6, 6, 1, 3.0, 0.1, 0.7);  // T = .666*(2+1.5) = 2.331; top_p = .9 - .2 = .7
    s = entropix_decide(&c, &m, 7, 99);
    CHECK(params_eq(s.sp, 2.331, 27, 0.7, 0.03), "decide_hehv_params2", "T %g p %g", s.sp.temperature, s.sp.top_p);
    // ADAPTIVE with H=1, V=1, ae=2, av=0.3, ag=0.1, is=0.7:
    // T = .666 (1 + .6 + .46 - .02) = 1.35864; top_p = .9*1.03 = .927
    // top_k = round(27 (1 + .21 - .02)) = round(32.13) = 32; min_p = clip(.03 * 0, .01, .5) = .01
    m = tm(1, 1, 2, 0.3, 0.1, 0.7);
    s = entropix_decide(&c, &m, 7, 99);
    CHECK(s.q == Q_ADAPTIVE && s.n_samples == 5 && params_eq(s.sp, 0.666 * 2.04, 32, 0.927, 0.01), "decide_adaptive_params",
          "T %g k %d p %g m %g", s.sp.temperature, s.sp.top_k, s.sp.top_p, s.sp.min_p);
    m = tm(0.2, 0.3, 0.5, 5.0, 0.0, 0.0);  // top_p clipped to 1, min_p = .03 * .75 = .0225
    s = entropix_decide(&c, &m, 7, 99);
    CHECK(params_eq(s.sp, 0.666 * (1 + 0.15 + 1.1), 27, 1.0, 0.0225), "decide_adaptive_clips", "T %g k %d p %g m %g",
          s.sp.temperature, s.sp.top_k, s.sp.top_p, s.sp.min_p);
    // score = log-softmax + .1(1-H) + .2(1-ae) + .3(1-V) + .4(1-av) + .5 ag + .6 is
    m = tm(1, 1, 2, 0.3, 0.1, 0.7), m.log_z = 2.0;
    double want = (1.5 - 2.0) + 0 - 0.2 + 0 + 0.4 * 0.7 + 0.05 + 0.42;
    CHECK(near(entropix_score(&c, &m, 1.5), want, 1e-12), "adaptive_score", "%g vs %g", entropix_score(&c, &m, 1.5), want);
}

static void test_overrides(void) {
    entropix_config c;
    verr err = { { 0 } };
    entropix_profile("seed", &c, &err);
    int ok = entropix_set(&c, "temperature", "0.5", &err) == 0 && entropix_set(&c, "LEHV.varentropy.min", "2", &err) == 0 &&
             entropix_set(&c, "order", "HEHV,LEHV", &err) == 0;
    token_metrics m = tm(1, 3, 2, 0.3, 0.1, 0.7);
    CHECK(ok && c.temp == 0.5 && entropix_classify(&c, &m) == Q_LEHV, "set_constants", "%s", err.msg);
    m = tm(0.01, 0.01, 2, 0.3, 0.1, 0.7);  // LELV is no longer checked
    CHECK(entropix_classify(&c, &m) == Q_ADAPTIVE, "set_order_drops_quadrants", "%d", entropix_classify(&c, &m));
    CHECK(entropix_set(&c, "LEHV.nope.min", "1", &err) == -1 && strstr(err.msg, "LEHV.nope.min"), "set_unknown_key", "%s",
          err.msg);
    CHECK(entropix_set(&c, "top_k", "abc", &err) == -1 && strstr(err.msg, "abc"), "set_bad_value", "%s", err.msg);
    CHECK(entropix_profile("nope", &c, &err) == -1 && strstr(err.msg, "nope"), "unknown_profile", "%s", err.msg);
}

// Truncated distribution computed here from scratch: softmax(x/T), min-p (relative to
// the max), top-k, then the smallest prefix reaching top-p, renormalised.
static int reference_dist(const float *x, int n, sampler_params p, double *q) {
    double mx = -INFINITY, z = 0;
    int order[64];
    for (int i = 0; i < n; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < n; i++) q[i] = exp((x[i] - mx) / p.temperature), order[i] = i;
    for (int i = 0; i < n; i++)  // insertion sort by probability, descending
        for (int j = i; j > 0 && q[order[j]] > q[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    int kept = 0;
    double mass = 0, total = 0;
    for (int r = 0; r < n; r++) {
        int i = order[r];
        int in = q[i] >= p.min_p && (p.top_k <= 0 || r < p.top_k);
        if (!in) q[i] = 0;
        total += q[i];
    }
    for (int r = 0; r < n; r++) {
        int i = order[r];
        if (q[i] == 0) continue;
        if (mass >= p.top_p * total) q[i] = 0;
        else mass += q[i], kept++;
    }
    for (int i = 0; i < n; i++) q[i] /= mass, z += q[i];
    return kept;
}

static void chi_square(const char *name, sampler_params p) {
    enum { N = 24, DRAWS = 200000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(2.0 * sin(i * 1.7) + 0.15 * i);
    double q[N];
    int kept = reference_dist(x, N, p, q);
    sampler s;
    sampler_init(&s, N);
    rng r = { 1234, 0 };
    long cnt[N] = { 0 };
    for (int d = 0; d < DRAWS; d++) cnt[sampler_sample(&s, x, p, &r)]++;
    double chi = 0;
    int outside = 0;
    for (int i = 0; i < N; i++) {
        if (q[i] == 0) outside += cnt[i] > 0;
        else chi += pow(cnt[i] - DRAWS * q[i], 2) / (DRAWS * q[i]);
    }
    // 99.9% quantile of chi-square with kept-1 degrees of freedom (Wilson-Hilferty)
    int df = kept - 1;
    double crit = df > 0 ? df * pow(1 - 2.0 / (9 * df) + 3.09 * sqrt(2.0 / (9 * df)), 3) : 1e-9;
    CHECK(!outside && chi <= crit && s.n_cand == kept, name, "chi2 %.2f crit %.2f kept %d/%d outside %d", chi, crit,
          s.n_cand, kept, outside);
    sampler_free(&s);
}

static void test_sampler_stats(void) {
    chi_square("chi2_temperature_only", (sampler_params){ 1.0f, 0, 1.0f, 0 });
    chi_square("chi2_top_k", (sampler_params){ 0.8f, 5, 1.0f, 0 });
    chi_square("chi2_top_p", (sampler_params){ 1.3f, 0, 0.7f, 0 });
    chi_square("chi2_min_p", (sampler_params){ 1.0f, 0, 1.0f, 0.1f });
    chi_square("chi2_all_three", (sampler_params){ 0.9f, 9, 0.8f, 0.05f });
}

static void test_distinct(void) {
    float x[6] = { 1, 2, 3, 0.5f, 2.5f, -1 };
    sampler s;
    sampler_init(&s, 6);
    sampler_distribution(&s, x, (sampler_params){ 1, 4, 1, 0 });
    rng r = { 7, 0 };
    int ok = 1, out[6];
    for (int t = 0; t < 200 && ok; t++) {
        int n = sampler_draw_distinct(&s, &r, 6, out);
        ok = n == 4;
        for (int i = 0; i < n && ok; i++) {
            ok = out[i] == 1 || out[i] == 2 || out[i] == 4 || out[i] == 0;  // the top 4 ids
            for (int j = 0; j < i; j++) ok = ok && out[i] != out[j];
        }
    }
    CHECK(ok, "draw_distinct", "drew a duplicate or a truncated id");
    sampler_free(&s);
}

static void test_penalties(void) {
    float x[6] = { 2, -2, 1, 4, 0.5f, 3 };
    int seen[6] = { 0 };
    int hist[5] = { 0, 1, 0, 3, 0 };
    sampler_penalties rep = { .repeat = 2.0f, .last_n = -1 };
    sampler_penalize(x, 6, hist, 5, &rep, seen);
    CHECK(x[0] == 1 && x[1] == -4 && x[3] == 2 && x[2] == 1 && x[5] == 3 && !seen[0] && !seen[3], "repeat_penalty_hf",
          "%g %g %g %g", x[0], x[1], x[3], x[5]);
    // history 0 1 0 3 0 1: with N=3 the prefix is (0, 1); (0, 1) was followed by 0 -> 0 banned
    float y[6] = { 1, 1, 1, 1, 1, 1 };
    int h2[6] = { 0, 1, 0, 3, 0, 1 };
    sampler_penalties ng3 = { .no_repeat_ngram = 3 }, ng2 = { .no_repeat_ngram = 2 };
    sampler_penalize(y, 6, h2, 6, &ng3, seen);
    CHECK(isinf(y[0]) && y[0] < 0 && y[1] == 1 && y[3] == 1, "no_repeat_ngram3", "%g %g %g", y[0], y[1], y[3]);
    float w[6] = { 1, 1, 1, 1, 1, 1 };  // N=2, prefix (1): 1 was followed by 0 -> ban 0
    sampler_penalize(w, 6, h2, 6, &ng2, seen);
    CHECK(isinf(w[0]) && w[2] == 1 && w[3] == 1, "no_repeat_ngram2", "%g %g", w[0], w[3]);
}

// Non-finite metrics (NaN logits upstream) and absurd constants: every float->int
// conversion is range-checked (the old code cast NaN to int, a UBSan report in
// make test-asan, and the metrics showed "top_k":-2147483648).
static void test_nonfinite_metrics(void) {
    entropix_config c;
    entropix_profile("seed", &c, NULL);
    token_metrics m = { 0 };
    m.entropy = m.varentropy = m.attn_entropy = m.attn_varentropy = m.agreement = m.interaction_strength = NAN;
    m.log_z = NAN;
    int bad = 0;
    for (int q = 0; q < Q_COUNT; q++) {  // NaN metrics are in no box: ADAPTIVE, whose top-k is cast
        entropix_step st = entropix_decide(&c, &m, 7, -1);
        bad += st.sp.top_k < 0 || st.sp.top_k > (1 << 30) || st.n_samples < 1 || st.n_samples > ENTROPIX_MAX_SAMPLES;
        m.entropy = q % 2 ? NAN : INFINITY, m.agreement = q % 2 ? -INFINITY : NAN;
    }
    CHECK(!bad, "entropix_nan_metrics_top_k_in_range", "%d steps out of range", bad);
    c.top_k = 1e300, c.n_samples = -1e300;
    sampler_params p = entropix_base_params(&c);
    CHECK(p.top_k == 1 << 30 && entropix_n_samples(&c) == 1, "entropix_huge_constants_clipped", "top_k %d n %d",
          p.top_k, entropix_n_samples(&c));
    c.top_k = NAN, c.n_samples = 1e12;
    p = entropix_base_params(&c);
    CHECK(p.top_k == 0 && entropix_n_samples(&c) == ENTROPIX_MAX_SAMPLES, "entropix_nan_constants_default",
          "top_k %d n %d", p.top_k, entropix_n_samples(&c));
    // LEHV with NaN agreement and a huge K0
    entropix_config l;
    entropix_profile("seed", &l, NULL);
    l.top_k = 1e30;
    for (int i = 0; i < M_COUNT; i++) l.box[Q_LEHV].lo[i] = -INFINITY, l.box[Q_LEHV].hi[i] = INFINITY;
    l.order[0] = Q_LEHV;
    token_metrics z = { 0 };
    entropix_step st = entropix_decide(&l, &z, 7, -1);
    CHECK(st.q == Q_LEHV && st.sp.top_k == 1 << 30, "entropix_lehv_huge_top_k_clipped", "q %d top_k %d", st.q,
          st.sp.top_k);
}

int main(void) {
    test_logit_metrics();
    test_quadrants_seed_jax();
    test_quadrants_frog();
    test_decide();
    test_overrides();
    test_sampler_stats();
    test_distinct();
    test_penalties();
    test_nonfinite_metrics();
    CHECK_DONE();
}
