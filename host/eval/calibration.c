// calibration.c: see calibration.h.
#include "host/eval/calibration.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode/generate.h"
#include "host/util/json_out.h"
#include "host/util/stats.h"

const double CALIB_QS[CALIB_N_Q] = { 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95 };
static const char *const METRIC[M_COUNT] = { "entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement",
                                             "interaction_strength" };
static const char *const STOCK[] = { "seed", "jax", "frog" };
#define N_STOCK 3

void calib_samples_free(calib_samples *c) {
    free(c->m);
    memset(c, 0, sizeof *c);
}

static int add(calib_samples *c, const token_metrics *m) {
    if (c->n == c->cap) {
        long cap = c->cap ? 2 * c->cap : 1024;
        token_metrics *p = realloc(c->m, sizeof *p * (size_t)cap);
        if (!p) return -1;
        c->m = p, c->cap = cap;
    }
    c->m[c->n++] = *m;
    return 0;
}

int calib_corpus(session *s, const int *ids, int n, long max, calib_samples *out, verr *err) {
    metrics_ws ws = { 0 };
    int rc = 0;
    s->fw.attn_layer = s->m.cfg.n_layers - 1;
    for (int b = 0; rc == 0 && b < n && (max <= 0 || out->n < max); b += s->ctx) {
        kv_cache_truncate(&s->kv, 0);
        int e = b + s->ctx < n ? b + s->ctx : n;
        for (int i = b; rc == 0 && i < e && (max <= 0 || out->n < max); i++) {
            kv_view kv = kv_view_of(&s->kv);
            token_metrics m;
            rc = session_forward(s, &kv, &ids[i], 1, err);
            if (rc == 0 && i > b && (session_metrics(s, &ws, &m) || add(out, &m))) rc = verr_set(err, "out of memory");
        }
    }
    metrics_ws_free(&ws);
    return rc;
}

static int on_record(void *ud, const gen_record *r) { return add(ud, &r->m) ? 1 : 0; }

int calib_generate(session *s, const int *prompt, int n_prompt, int max_new, uint64_t seed, calib_samples *out,
                   verr *err) {
    entropix_config seedp;
    entropix_profile("seed", &seedp, NULL);
    gen_opts g = { .max_new = max_new, .sp = { 1, 0, 1, 0 }, .seed = seed, .ex = &seedp, .want_metrics = 1,
                   .on_record = on_record, .record_ud = out };
    gen_stats st;
    long before = out->n;
    kv_cache_truncate(&s->kv, 0);
    if (generate(s, prompt, n_prompt, &g, &st, err)) return -1;
    if (out->n - before < st.n_gen) return verr_set(err, "out of memory collecting metrics");
    return 0;
}

static double metric(const token_metrics *m, int i) {
    const double v[M_COUNT] = { m->entropy, m->varentropy, m->attn_entropy, m->attn_varentropy, m->agreement,
                                m->interaction_strength };
    return v[i];
}

void calib_fit_free(calib_fit *f) {
    for (int i = 0; i < M_COUNT; i++) free(f->sorted[i]);
    memset(f, 0, sizeof *f);
}

static void set_box(entropix_config *c, int q, double h_lo, double h_hi, double v_lo, double v_hi) {
    for (int i = 0; i < M_COUNT; i++) c->box[q].lo[i] = -INFINITY, c->box[q].hi[i] = INFINITY;
    c->box[q].lo[M_ENT] = h_lo, c->box[q].hi[M_ENT] = h_hi;
    c->box[q].lo[M_VENT] = v_lo, c->box[q].hi[M_VENT] = v_hi;
}

int calib_fit_run(const calib_samples *c, double lo_q, double hi_q, const char *name, calib_fit *f, verr *err) {
    memset(f, 0, sizeof *f);
    if (c->n < 2) return verr_set(err, "only %ld token%s measured; calibration needs at least 2", c->n, c->n == 1 ? "" : "s");
    if (!(lo_q > 0 && lo_q < hi_q && hi_q < 1)) return verr_set(err, "need 0 < low (%g) < high (%g) < 1", lo_q, hi_q);
    f->n = c->n, f->lo_q = lo_q, f->hi_q = hi_q;
    for (int i = 0; i < M_COUNT; i++) {
        if (!(f->sorted[i] = malloc(sizeof(double) * (size_t)c->n))) return calib_fit_free(f), verr_set(err, "out of memory");
        double sum = 0;
        for (long k = 0; k < c->n; k++) sum += f->sorted[i][k] = metric(&c->m[k], i);
        stats_sort(f->sorted[i], c->n);
        f->mean[i] = sum / c->n;
        for (int j = 0; j < CALIB_N_Q; j++) f->q[i][j] = stats_quantile(f->sorted[i], c->n, CALIB_QS[j]);
    }
    f->h_lo = stats_quantile(f->sorted[M_ENT], c->n, lo_q), f->h_hi = stats_quantile(f->sorted[M_ENT], c->n, hi_q);
    f->v_lo = stats_quantile(f->sorted[M_VENT], c->n, lo_q), f->v_hi = stats_quantile(f->sorted[M_VENT], c->n, hi_q);
    entropix_config *p = &f->profile;
    entropix_profile("seed", p, NULL);
    snprintf(p->name, sizeof p->name, "%s", name);
    set_box(p, Q_LELV, -INFINITY, f->h_lo, -INFINITY, f->v_lo);
    set_box(p, Q_HELV, f->h_hi, INFINITY, -INFINITY, f->v_lo);
    set_box(p, Q_LEHV, -INFINITY, f->h_lo, f->v_hi, INFINITY);
    set_box(p, Q_HEHV, f->h_hi, INFINITY, f->v_hi, INFINITY);
    const int order[ENTROPIX_N_BOXES] = { Q_LELV, Q_LEHV, Q_HELV, Q_HEHV };
    memcpy(p->order, order, sizeof order);
    return 0;
}

// The share of samples in each quadrant (LELV..ADAPTIVE) under profile p.
static void shares(const calib_samples *c, const entropix_config *p, double out[Q_ADAPTIVE + 1]) {
    long count[Q_COUNT] = { 0 };
    for (long k = 0; k < c->n; k++) count[entropix_classify(p, &c->m[k])]++;
    for (int q = 0; q <= Q_ADAPTIVE; q++) out[q] = c->n ? (double)count[q] / c->n : 0;
}

static void json_bound(FILE *f, double v) {
    if (isinf(v)) fprintf(f, "\"%sinf\"", v < 0 ? "-" : "");
    else fprintf(f, "%.9g", v);
}

// A stock profile's finite bounds: calls fn for each (quadrant, metric, is-lower, value).
typedef void (*bound_fn)(void *ud, const char *profile, int q, int metric, int lower, double v);
static void stock_bounds(bound_fn fn, void *ud) {
    for (int p = 0; p < N_STOCK; p++) {
        entropix_config c;
        entropix_profile(STOCK[p], &c, NULL);
        for (int q = 0; q < ENTROPIX_N_BOXES; q++)
            for (int i = 0; i < M_COUNT; i++) {
                if (isfinite(c.box[q].lo[i])) fn(ud, STOCK[p], q, i, 1, c.box[q].lo[i]);
                if (isfinite(c.box[q].hi[i])) fn(ud, STOCK[p], q, i, 0, c.box[q].hi[i]);
            }
    }
}

typedef struct {
    FILE *f;
    const calib_fit *fit;
    int k, md;
} bound_out;

static void put_bound(void *ud, const char *profile, int q, int i, int lower, double v) {
    bound_out *b = ud;
    double pct = stats_rank(b->fit->sorted[i], b->fit->n, v);
    const char *qn = entropix_quadrant_name((entropix_quadrant)q);
    if (b->md) {
        fprintf(b->f, "| %s | %s.%s.%s | %g | %.1f%% |\n", profile, qn, METRIC[i], lower ? "min" : "max", v, 100 * pct);
        return;
    }
    fputs(b->k++ ? ",\n      {\"profile\":" : "\n      {\"profile\":", b->f), json_out_str(b->f, profile);
    fprintf(b->f, ",\"key\":\"%s.%s.%s\",\"value\":%.9g,\"below\":%.6f}", qn, METRIC[i], lower ? "min" : "max", v, pct);
}

static void json_meta(FILE *f, const calib_fit *fit, const calib_samples *c, const char *model_dir, const char *source) {
    fputs("  \"calibration\": {\n    \"model\": ", f), json_out_str(f, model_dir);
    fputs(",\n    \"source\": ", f), json_out_str(f, source);
    fprintf(f, ",\n    \"tokens\": %ld,\n    \"low\": %g,\n    \"high\": %g,\n    \"quantiles\": {", fit->n, fit->lo_q,
            fit->hi_q);
    for (int i = 0; i < M_COUNT; i++) {
        fprintf(f, "%s\n      \"%s\": {\"mean\": %.9g", i ? "," : "", METRIC[i], fit->mean[i]);
        for (int j = 0; j < CALIB_N_Q; j++) fprintf(f, ", \"p%02.0f\": %.9g", CALIB_QS[j] * 100, fit->q[i][j]);
        fputc('}', f);
    }
    fputs("\n    },\n    \"stock_thresholds\": [", f);
    bound_out b = { f, fit, 0, 0 };
    stock_bounds(put_bound, &b);
    fputs("\n    ],\n    \"quadrant_share\": {", f);
    for (int p = 0; p <= N_STOCK; p++) {
        entropix_config sc;
        if (p < N_STOCK) entropix_profile(STOCK[p], &sc, NULL);
        double s[Q_ADAPTIVE + 1];
        shares(c, p < N_STOCK ? &sc : &fit->profile, s);
        fputs(p ? ",\n      " : "\n      ", f), json_out_str(f, p < N_STOCK ? STOCK[p] : fit->profile.name);
        fputs(": {", f);
        for (int q = 0; q <= Q_ADAPTIVE; q++)
            fprintf(f, "%s\"%s\": %.6f", q ? ", " : "", entropix_quadrant_name((entropix_quadrant)q), s[q]);
        fputc('}', f);
    }
    fputs("\n    }\n  }\n", f);
}

void calib_write_profile(FILE *f, const calib_fit *fit, const calib_samples *c, const char *model_dir, const char *source) {
    const entropix_config *p = &fit->profile;
    fputs("{\n  \"name\": ", f), json_out_str(f, p->name);
    fputs(",\n  \"profile\": \"seed\",\n  \"order\": \"LELV,LEHV,HELV,HEHV\"", f);
    for (int q = 0; q < ENTROPIX_N_BOXES; q++)
        for (int i = M_ENT; i <= M_VENT; i++) {
            const char *qn = entropix_quadrant_name((entropix_quadrant)q);
            fprintf(f, ",\n  \"%s.%s.min\": ", qn, METRIC[i]), json_bound(f, p->box[q].lo[i]);
            fprintf(f, ",\n  \"%s.%s.max\": ", qn, METRIC[i]), json_bound(f, p->box[q].hi[i]);
        }
    fputs(",\n", f);
    json_meta(f, fit, c, model_dir, source);
    fputs("}\n", f);
}

void calib_report_md(FILE *f, const calib_fit *fit, const calib_samples *c, const char *model_dir, const char *source) {
    fprintf(f, "## varent calibrate: %s\n\n%ld tokens from %s; cut points at the %g and %g quantiles: "
               "H %.4g / %.4g bits, V %.4g / %.4g bits^2.\n\n| metric | mean |",
            model_dir, fit->n, source, fit->lo_q, fit->hi_q, fit->h_lo, fit->h_hi, fit->v_lo, fit->v_hi);
    for (int j = 0; j < CALIB_N_Q; j++) fprintf(f, " p%02.0f |", CALIB_QS[j] * 100);
    fputs("\n|---|--:|", f);
    for (int j = 0; j < CALIB_N_Q; j++) fputs("--:|", f);
    for (int i = 0; i < M_COUNT; i++) {
        fprintf(f, "\n| %s | %.4g |", METRIC[i], fit->mean[i]);
        for (int j = 0; j < CALIB_N_Q; j++) fprintf(f, " %.4g |", fit->q[i][j]);
    }
    fputs("\n\nWhere the stock profiles' thresholds fall on this model (share of tokens below):\n\n"
          "| profile | bound | value | below |\n|---|---|--:|--:|\n", f);
    bound_out b = { f, fit, 0, 1 };
    stock_bounds(put_bound, &b);
    fputs("\nShare of tokens per quadrant:\n\n| profile | LELV | HELV | LEHV | HEHV | ADAPTIVE |\n|---|--:|--:|--:|--:|--:|\n", f);
    for (int p = 0; p <= N_STOCK; p++) {
        entropix_config sc;
        if (p < N_STOCK) entropix_profile(STOCK[p], &sc, NULL);
        double s[Q_ADAPTIVE + 1];
        shares(c, p < N_STOCK ? &sc : &fit->profile, s);
        fprintf(f, "| %s |", p < N_STOCK ? STOCK[p] : fit->profile.name);
        for (int q = 0; q <= Q_ADAPTIVE; q++) fprintf(f, " %.1f%% |", 100 * s[q]);
        fputc('\n', f);
    }
}
