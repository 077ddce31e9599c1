// metrics.c: see metrics.h. Log-probabilities are stored once so that the varentropy
// is the centred second moment sum p (log2 p + H)^2, not E[x^2] - H^2 (which cancels
// when the distribution is nearly uniform). The attention metrics are cpu_attn_stats
// (kernels/cpu/attention.c), the twin of the CUDA forward's cuda_attn_stats.
#include "host/runtime/metrics.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/ops.h"

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
    double out[4] = { 0, 0, 0, 0 };
    if (n_keys > 0 && n_heads > 0) {
        double *ws = ws_get(w, (long)n_keys + 2L * n_heads);
        if (!ws) return -1;
        cpu_attn_stats(out, scores, n_heads, n_keys, ws);
    }
    m->attn_entropy = out[0], m->attn_varentropy = out[1], m->agreement = out[2], m->interaction_strength = out[3];
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

void metrics_from_stats(token_metrics *m, const float logit[4], const float attn[4]) {
    m->entropy = logit[2], m->varentropy = logit[3], m->log_z = logit[1];
    m->attn_entropy = attn[0], m->attn_varentropy = attn[1];
    m->agreement = attn[2], m->interaction_strength = attn[3];
}
