// branch.h: entropix's LEHV branching. K distinct candidate tokens fork from the
// committed cache; each branch extends B tokens with the base sampler on its own small
// KV tail (kv_view: shared trunk + private tail, no cache copy); the branch with the
// lowest mean entropy over its B steps wins and its tail is committed to the trunk.
// The K branches decode as one batch: step j of every live branch is one
// session_forward_batch, so the weights are read once per step, not once per branch.
#ifndef VARENT_BRANCH_H
#define VARENT_BRANCH_H

#include "host/decode/generate.h"

typedef struct {
    int k, b;           // capacity: K branches of B steps
    kv_cache *tails;    // [k], b + 1 positions each
    int *tok;           // [k, b + 1] each branch's tokens: the candidate, then B draws
    gen_record *rec;    // [k, b + 1] how each was drawn
    int *len;           // [k] tokens in each branch (shorter when it drew a stop id)
    double *mean_h;     // [k] mean entropy over its steps
    // one step's batch: the live branches' rows
    int *row;           // [k] branch of each row
    kv_view *views;     // [k]
    int *ids;           // [k] the token each row feeds
    float *logits;      // [k, vocab]
    token_metrics *m;   // [k]
    unsigned char *live;// [k] 0 once a branch drew a stop id
    batch_ws bw;
    long fed;           // forward rows run so far (the cost of branching)
} branch_set;

// The stock penalties (and logit biases) inside branches: each branch step sees the committed history
// plus the branch's own tokens. hist has room for n_hist + b + 1 ids past which the
// branch tokens are written; work [vocab] and count are scratch.
typedef struct {
    int *hist, n_hist;
    const sampler_penalties *pen;  // NULL: none
    float *work;
    int *count;  // [vocab] zeroed scratch of sampler_penalize
    const logit_bias *bias;  // [n_bias] (generate.h); last, so older initialisers mean "none"
    int n_bias;
} branch_penalty;

int branch_init(branch_set *bs, const model *m, int k, int b, verr *err);
void branch_free(branch_set *bs);

// Forks from s->kv using the distribution last built in s->smp (the LEHV parameters),
// runs `steps` (<= b) base-sampler steps per branch and commits the winner's fed
// tokens to s->kv. Draw order (one rng r): the K candidates, then step-major: step 1 of
// branches 0..K-1, step 2 of the branches still live, ... (a fixed seed gives fixed
// output; the order differs from the one-branch-after-another order before batching). root: the current step's record (metrics, LEHV parameters).
// Returns the winner's index; its tokens are tok + i*(b+1), len[i] of them, all but
// the last already in the cache. -1 with err on failure.
// pen: NULL or the penalties to apply.
int branch_run(branch_set *bs, session *s, const gen_record *root, sampler_params base, int steps, metrics_ws *ws,
               rng *r, const branch_penalty *pen, verr *err);

#endif
