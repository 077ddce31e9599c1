// branch.h: entropix's LEHV branching. K distinct candidate tokens fork from the
// committed cache; each branch extends B tokens with the base sampler on its own small
// KV tail (kv_view: shared trunk + private tail, no cache copy); the branch with the
// lowest mean entropy over its B steps wins and its tail is committed to the trunk.
#ifndef VARENT_BRANCH_H
#define VARENT_BRANCH_H

#include "host/generate.h"

typedef struct {
    int k, b;           // capacity: K branches of B steps
    kv_cache *tails;    // [k], b + 1 positions each
    int *tok;           // [k, b + 1] each branch's tokens: the candidate, then B draws
    gen_record *rec;    // [k, b + 1] how each was drawn
    int *len;           // [k] tokens in each branch (shorter when it drew a stop id)
    double *mean_h;     // [k] mean entropy over its steps
} branch_set;

// The stock penalties inside branches: each branch step sees the committed history
// plus the branch's own tokens. hist has room for n_hist + b + 1 ids past which the
// branch tokens are written; work [vocab] and seen [vocab, zeroed] are scratch.
typedef struct {
    int *hist, n_hist;
    int no_repeat_ngram;
    float repeat_penalty;
    float *work;
    unsigned char *seen;
} branch_penalty;

int branch_init(branch_set *bs, const model_config *c, int k, int b, verr *err);
void branch_free(branch_set *bs);

// Forks from s->kv using the distribution last built in s->smp (the LEHV parameters),
// runs `steps` (<= b) base-sampler steps per branch and commits the winner's fed
// tokens to s->kv. root: the current step's record (metrics, LEHV parameters).
// Returns the winner's index; its tokens are tok + i*(b+1), len[i] of them, all but
// the last already in the cache. -1 with err on failure.
// pen: NULL or the penalties to apply.
int branch_run(branch_set *bs, session *s, const gen_record *root, sampler_params base, int steps, metrics_ws *ws,
               rng *r, const branch_penalty *pen, verr *err);

#endif
