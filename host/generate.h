// generate.h: the decode loop: prefill the prompt as one batch, then sample and
// feed back one token at a time until EOS, max_new tokens or a full context.
#ifndef VARENT_GENERATE_H
#define VARENT_GENERATE_H

#include "host/session.h"

typedef struct {
    int max_new;
    sampler_params sp;
    uint64_t seed;
    int (*on_token)(void *ud, int id);  // called per generated token; non-zero stops
    void *ud;
} gen_opts;

typedef struct {
    int n_prompt, n_gen;
    double prefill_s, decode_s;
    int hit_eos, hit_ctx;
} gen_stats;

int generate(session *s, const int *prompt, int n_prompt, const gen_opts *o, gen_stats *st, verr *err);
double gen_now(void);

#endif
