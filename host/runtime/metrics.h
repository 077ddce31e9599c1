// metrics.h: entropix's uncertainty metrics of one decode step, all logs base 2.
// From the logits: entropy H and varentropy V of softmax(logits). From the last
// query's scaled attention scores at one layer ([n_heads, n_keys], filled keys only):
// the mean and population variance over heads of each head's attention entropy, the
// agreement (mean |a_h(j) - mean_h a_h(j)|) and the interaction strength (mean |s|).
// Everything is accumulated in double; docs/entropix.md has the formulas.
#ifndef VARENT_METRICS_H
#define VARENT_METRICS_H

typedef struct {
    double entropy, varentropy;
    double attn_entropy, attn_varentropy, agreement, interaction_strength;
    double log_z;  // natural-log partition function of the raw logits (log-softmax = x - log_z)
} token_metrics;

// Scratch sized for the largest vocab and key count seen; grows on demand.
typedef struct {
    double *buf;
    long cap;
} metrics_ws;

void metrics_ws_free(metrics_ws *w);
// Natural-log probability of id under softmax(logits[n]): logit - logsumexp, in double.
double metrics_log_prob(const float *logits, int n, int id);
// H, V and log_z from logits[n]. Returns -1 only when out of memory.
int metrics_logits(metrics_ws *w, const float *logits, int n, token_metrics *m);
// The four attention metrics from scores[n_heads, n_keys] (cpu_attn_stats, the CPU twin
// of the CUDA forward's cuda_attn_stats). n_keys == 0 gives zeros.
int metrics_attention(metrics_ws *w, const float *scores, int n_heads, int n_keys, token_metrics *m);
// The metrics from statistics a CUDA forward computed on the device:
// logit[4] = {max, lse, entropy, varentropy}, attn[4] = {attn_entropy, attn_varentropy,
// agreement, interaction_strength} (log_z = lse).
void metrics_from_stats(token_metrics *m, const float logit[4], const float attn[4]);

#endif
