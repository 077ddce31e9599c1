// sample.c: the CPU twin of the device sampler (kernels/cuda/sample.cu). Same arithmetic
// (kernels/sample_core.h), a different route to it: this one sorts the candidates and
// walks them in order, the device narrows them by radix digits. Equal results check the
// device's search; host/runtime/sampler.c (floating point, no fixed-point masses) checks both.
#include <stdlib.h>

#include "kernels/ops.h"
#include "kernels/sample_core.h"

typedef struct {
    uint64_t key, q, e;  // sort key, 2^44-scaled mass and -p ln p
} sample_cand;

static int cand_cmp(const void *a, const void *b) {
    uint64_t x = ((const sample_cand *)a)->key, y = ((const sample_cand *)b)->key;
    return x < y ? -1 : x > y;
}

// First index of the largest logit; NaN never wins; 0 when every logit is NaN.
static int row_argmax(const float *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

static void set_argmax(sample_out *o, const float *x, int n) {
    o->token = row_argmax(x, n);
    o->n_kept = 1;
    o->logit = x[o->token];
    o->entropy = 0;
}

// Candidates (q > 0, passing min-p; the top token always passes) into c, sorted.
static int gather(sample_cand *c, const float *x, int n, float mx, const sample_cfg *cfg) {
    double inv_t = 1.0 / (double)cfg->temperature;
    int m = 0;
    for (int i = 0; i < n; i++) {
        double d = sample_logp(x[i], mx, inv_t), p = exp(d);
        uint64_t q = sample_q(p);
        if (q == 0 || (cfg->min_p > 0 && !(p >= (double)cfg->min_p) && d != 0)) continue;
        c[m++] = (sample_cand){ sample_key(x[i], i), q, sample_e(p, d) };
    }
    qsort(c, (size_t)m, sizeof *c, cand_cmp);
    return m;
}

static void sample_one(sample_out *o, const float *x, int n, const sample_cfg *cfg, sample_cand *c) {
    float mx = x[row_argmax(x, n)];
    if (!(cfg->temperature > 0) || !(mx == mx) || mx == -INFINITY || mx == INFINITY) {
        set_argmax(o, x, n);
        return;
    }
    int m = gather(c, x, n, mx, cfg);
    if (m == 0) {
        set_argmax(o, x, n);
        return;
    }
    if (cfg->top_k > 0 && cfg->top_k < m) m = cfg->top_k;
    if (cfg->top_p < 1) {
        uint64_t Q = 0, cum = 0;
        for (int i = 0; i < m; i++) Q += c[i].q;
        uint64_t t = sample_top_p_target(cfg->top_p, Q);
        int j = 0;
        while (cum < t) cum += c[j++].q;
        m = j;
    }
    uint64_t Q = 0, E = 0, cum = 0;
    for (int i = 0; i < m; i++) Q += c[i].q, E += c[i].e;
    uint64_t t = sample_draw_target(cfg->u, Q);
    int j = 0;
    while (cum + c[j].q < t) cum += c[j++].q;
    o->token = sample_key_id(c[j].key);
    o->n_kept = m;
    o->logit = x[o->token];
    o->entropy = sample_entropy_bits(Q, E);
}

int cpu_sample(sample_out *out, const float *logits, int n, const sample_cfg *cfg, int n_cfg) {
    if (n <= 0 || n > SAMPLE_MAX_VOCAB || n_cfg < 0) return -1;
    sample_cand *c = malloc((size_t)n * sizeof *c);
    if (!c) return -1;
    for (int k = 0; k < n_cfg; k++) sample_one(&out[k], logits, n, &cfg[k], c);
    free(c);
    return 0;
}
