// forward.h: the transformer forward pass on the CPU backend. One call processes T
// new tokens (a prefill batch, or T=1 for decode) and leaves the logits of the last.
#ifndef VARENT_FORWARD_H
#define VARENT_FORWARD_H

#include "host/kv_cache.h"
#include "model/model.h"

typedef struct {
    const model *m;
    int max_T;              // tokens per internal chunk
    int ctx;                // longest sequence the scratch supports
    // scratch activations, [max_T, ...]
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    int *pos;               // [max_T]
    float *logits;          // [vocab] logits of the last token
    // Attention capture for the uncertainty metrics: the last query's scaled
    // pre-softmax scores at layer attn_layer, [n_heads, attn_keys].
    int attn_layer;         // -1: no capture
    float *attn_scores;     // [n_heads, ctx]
    int attn_keys;          // keys in the last capture (filled positions)
} forward_state;

int forward_init(forward_state *s, const model *m, int max_T, int ctx, verr *err);
void forward_free(forward_state *s);
// Appends T tokens to the sequence in kv and computes s->logits for the last one.
// Fails (without touching kv) on ids outside the vocab or when the context is full.
int forward(forward_state *s, kv_view *kv, const int *ids, int T, verr *err);
// forward() that also writes every new position's logits to out [T, vocab] (scoring).
int forward_all(forward_state *s, kv_view *kv, const int *ids, int T, float *out, verr *err);

#endif
