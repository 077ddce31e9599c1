// attention.c: causal grouped-query attention over a kv_span (trunk + tail).
// Each (token, head) pair is independent, so they are spread across threads; each
// thread keeps its own score buffer sized to the number of keys. cpu_attn_stats: the
// entropix statistics of the last query's scores (the twin of cuda_attn_stats).
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "kernels/ops.h"

static inline const float *kv_row(const void *trunk, const void *tail, int n_trunk, int j, int kv_dim) {
    return j < n_trunk ? (const float *)trunk + (size_t)j * kv_dim
                       : (const float *)tail + (size_t)(j - n_trunk) * kv_dim;
}

// One query against keys 0..n_keys-1: writes softmax(q.k * scale) @ v to out and,
// if raw is non-NULL, the scaled scores before softmax.
static void attend_one(float *out, const float *q, kv_span kv, int n_keys, int kv_off, int kv_dim,
                       int hd, float scale, float *scores, float *raw) {
    float mx = -INFINITY;
    for (int j = 0; j < n_keys; j++) {
        const float *k = kv_row(kv.k_trunk, kv.k_tail, kv.n_trunk, j, kv_dim) + kv_off;
        float s = 0;
        for (int i = 0; i < hd; i++) s += q[i] * k[i];
        s *= scale;
        scores[j] = s;
        if (raw) raw[j] = s;
        if (s > mx) mx = s;
    }
    float sum = 0;
    for (int j = 0; j < n_keys; j++) sum += scores[j] = expf(scores[j] - mx);
    float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int j = 0; j < n_keys; j++) {
        const float *v = kv_row(kv.v_trunk, kv.v_tail, kv.n_trunk, j, kv_dim) + kv_off;
        float a = scores[j] * inv;
        for (int i = 0; i < hd; i++) out[i] += a * v[i];
    }
}

void cpu_attention(float *out, const float *q, kv_span kv, int T, attn_shape s, float *last_scores) {
    int total = kv.n_trunk + kv.n_tail, kv_dim = s.n_kv_heads * s.head_dim;
    int group = s.n_heads / s.n_kv_heads;
    int jobs = T * s.n_heads;
#pragma omp parallel if (jobs > 1 && (long)jobs * total * s.head_dim > 16384)
    {
        float *scores = malloc(sizeof(float) * (size_t)(total ? total : 1));
#pragma omp for schedule(dynamic, 4)
        for (int job = 0; job < jobs; job++) {
            int t = job / s.n_heads, h = job % s.n_heads;
            int n_keys = total - T + t + 1;  // causal: keys up to this query's position
            size_t off = ((size_t)t * s.n_heads + h) * s.head_dim;
            float *raw = (last_scores && t == T - 1) ? last_scores + (size_t)h * total : NULL;
            if (scores)
                attend_one(out + off, q + off, kv, n_keys, (h / group) * s.head_dim, kv_dim, s.head_dim,
                           s.scale, scores, raw);
        }
        free(scores);
    }
}

// ---- entropix attention statistics -------------------------------------------------------
// Natural-log partition function of x[n] (max-shifted), in double.
static double log_sum_exp(const float *x, int n) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

// ws: mean probability per key [n_keys], then per-head lse and entropy [n_heads] each.
void cpu_attn_stats(double out4[4], const float *scores, int n_heads, int n_keys, double *ws) {
    out4[0] = out4[1] = out4[2] = out4[3] = 0;
    if (n_keys <= 0 || n_heads <= 0) return;
    double *mean = ws, *lse = mean + n_keys, *ent = lse + n_heads, inter = 0;
    for (int j = 0; j < n_keys; j++) mean[j] = 0;
    for (int h = 0; h < n_heads; h++) {
        const float *s = scores + (size_t)h * n_keys;
        lse[h] = log_sum_exp(s, n_keys);
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
    out4[0] = em, out4[1] = ev, out4[2] = agree / cells, out4[3] = inter / cells;
}
