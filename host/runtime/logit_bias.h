// logit_bias.h: additive per-token biases (OpenAI's logit_bias, llama.cpp's
// -l/--logit-bias ID(+|-)BIAS). They are added to a copy of the raw logits that the
// draw sees, before the penalties, temperature and truncation; the entropix metrics
// and the reported logprobs keep reading the raw logits.
#ifndef VARENT_LOGIT_BIAS_H
#define VARENT_LOGIT_BIAS_H

#include "host/util/err.h"

#define LOGIT_BIAS_MAX 100.0  // |bias| <= 100 (OpenAI's range); the CLI also takes -inf (a ban)

typedef struct {
    int id;
    float bias;
} logit_bias;

// "ID+BIAS", "ID-BIAS" or "ID-inf" (llama.cpp's syntax): 0, or -1 with err naming the text.
int logit_bias_parse(const char *s, logit_bias *out, verr *err);
// Every id must be in 0..vocab-1: 0, or -1 with err naming the first that is not.
int logit_bias_check(const logit_bias *b, int n, int vocab, verr *err);
// logits[id] += bias for every entry (an id given twice gets both); ids outside 0..n-1
// are skipped (logit_bias_check reports them first).
void logit_bias_apply(float *logits, int n, const logit_bias *b, int n_bias);

#endif
