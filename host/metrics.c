// metrics.c: see metrics.h. Log-probabilities are stored once so that the varentropy
// is the centred second moment sum p (log2 p + H)^2, not E[x^2] - H^2 (which cancels
// when the distribution is nearly uniform).
#include "host/metrics.h"

#include <math.h>
#include <stdlib.h>

static double *ws_get(metrics_ws *w, long n) {
    if (n > w->cap) {
        double *b = realloc(w->buf, (size_t)n * sizeof *b);
        if (!b) return NULL;
        w->buf = b, w->cap = n;
    }
    return w->buf;
}

void metrics_ws_free(metrics_ws *w) {
    free(w->buf);
    w->buf = NULL, w->cap = 0;
}

// Natural-log partition function of x[n] (max-shifted).
static double log_sum_exp(const float *x, int n, double *mx_out) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    *mx_out = mx;
    return mx + log(s);
}

// Entropy and varentropy (bits) of softmax(x); ws is scratch [2n]: one exp per logit.
static void entropy_pair(const float *x, int n, double *ws, double *h_out, double *v_out, double *lz_out) {
    double *p = ws, *lp = ws + n, mx = x[0], z = 0, h = 0, v = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) z += p[i] = exp((double)x[i] - mx);
    double lz = log(z);
    for (int i = 0; i < n; i++) {
        p[i] /= z;
        lp[i] = ((double)x[i] - mx - lz) * (1 / M_LN2);
        h -= p[i] * lp[i];
    }
    for (int i = 0; i < n; i++) {
        double d = lp[i] + h;
        v += p[i] * d * d;
    }
    *h_out = h, *v_out = v, *lz_out = mx + lz;
}

int metrics_logits(metrics_ws *w, const float *logits, int n, token_metrics *m) {
    double *buf = ws_get(w, 2L * n);
    if (!buf) return -1;
    entropy_pair(logits, n, buf, &m->entropy, &m->varentropy, &m->log_z);
    return 0;
}

int metrics_attention(metrics_ws *w, const float *scores, int n_heads, int n_keys, token_metrics *m) {
    m->attn_entropy = m->attn_varentropy = m->agreement = m->interaction_strength = 0;
    if (n_keys <= 0 || n_heads <= 0) return 0;
    // scratch: mean probability per key [n_keys], then per-head lse and entropy
    double *mean = ws_get(w, (long)n_keys + 2L * n_heads);
    if (!mean) return -1;
    double *lse = mean + n_keys, *ent = lse + n_heads, inter = 0;
    for (int j = 0; j < n_keys; j++) mean[j] = 0;
    for (int h = 0; h < n_heads; h++) {
        const float *s = scores + (size_t)h * n_keys;
        double mx;
        lse[h] = log_sum_exp(s, n_keys, &mx);
        double e = 0;
        for (int j = 0; j < n_keys; j++) {
            double a = exp((double)s[j] - lse[h]);
            double ac = a < 1e-10 ? 1e-10 : a > 1 ? 1 : a;  // entropix's clip inside the log
            e -= a * log2(ac);
            mean[j] += a / n_heads;
            inter += fabs((double)s[j]);
        }
        ent[h] = e;
    }
    double em = 0, ev = 0, agree = 0;
    for (int h = 0; h < n_heads; h++) em += ent[h] / n_heads;
    for (int h = 0; h < n_heads; h++) ev += (ent[h] - em) * (ent[h] - em) / n_heads;
    for (int h = 0; h < n_heads; h++) {
        const float *s = scores + (size_t)h * n_keys;
        for (int j = 0; j < n_keys; j++) agree += fabs(exp((double)s[j] - lse[h]) - mean[j]);
    }
    double cells = (double)n_heads * n_keys;
    m->attn_entropy = em, m->attn_varentropy = ev;
    m->agreement = agree / cells, m->interaction_strength = inter / cells;
    return 0;
}

double metrics_log_prob(const float *logits, int n, int id) {
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    return (double)logits[id] - mx - log(z);
}
