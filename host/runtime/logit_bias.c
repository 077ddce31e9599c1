// logit_bias.c: see logit_bias.h.
#include "host/runtime/logit_bias.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int logit_bias_parse(const char *s, logit_bias *out, verr *err) {
    char *end;
    errno = 0;
    long id = strtol(s, &end, 10);
    if (end == s || *s == '-' || *s == '+' || errno || id > 0x7fffffff || (*end != '+' && *end != '-'))
        return verr_set(err, "--logit-bias '%s': expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf)", s);
    int neg = *end == '-';
    const char *num = end + 1;
    double v;
    if (neg && !strcmp(num, "inf")) {
        v = -INFINITY;
    } else {
        errno = 0;
        v = strtod(num, &end);
        // the sign is the separator: a second one ("5+-1"), hex, inf or nan are not numbers here
        if (end == num || *end || errno || !isfinite(v) || *num == '+' || *num == '-' || strpbrk(num, "xXnN"))
            return verr_set(err, "--logit-bias '%s': '%s' is not a number (a bias is a decimal, or -inf to ban)", s,
                            num);
        if (v > LOGIT_BIAS_MAX)
            return verr_set(err, "--logit-bias '%s': the bias must be in -100..100 (or -inf)", s);
        if (neg) v = -v;
    }
    out->id = (int)id, out->bias = (float)v;
    return 0;
}

int logit_bias_check(const logit_bias *b, int n, int vocab, verr *err) {
    for (int i = 0; i < n; i++)
        if (b[i].id < 0 || b[i].id >= vocab)
            return verr_set(err, "logit bias: token id %d is outside the vocabulary (0..%d)", b[i].id, vocab - 1);
    return 0;
}

void logit_bias_apply(float *logits, int n, const logit_bias *b, int n_bias) {
    for (int i = 0; i < n_bias; i++)
        if (b[i].id >= 0 && b[i].id < n) logits[b[i].id] += b[i].bias;
}
