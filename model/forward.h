// forward.h: the transformer forward pass on the CPU backend. One call processes T
// new tokens (a prefill batch, or T=1 for decode) and leaves the logits of the last.
#ifndef VARENT_FORWARD_H
#define VARENT_FORWARD_H

#include "model/hooks.h"
#include "model/kv_cache.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/tp.h"

typedef struct {
    const model *m;
    int max_T;              // tokens per internal chunk
    int ctx;                // longest sequence the scratch supports
    // scratch activations, [max_T, ...]
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    int *pos;               // [max_T]
    float *logits;          // [vocab] logits of the last token
    // Attention capture for the uncertainty metrics: the last query's scaled
    // pre-softmax scores at layer attn_layer, [n_heads, attn_keys] (on CUDA only with
    // copy_scores; attn_keys is always set).
    int attn_layer;         // -1: no capture
    float *attn_scores;     // [n_heads, ctx]
    int attn_keys;          // keys in the last capture (filled positions)
    // Entropix statistics computed on the device (CUDA forward, steps with a capture
    // layer; the CPU forward leaves dev_stats 0 and session_metrics computes them on
    // the host from logits and attn_scores):
    int dev_stats;          // 1: the two arrays below belong to the last step
    float logit_stats[4];   // {max, lse (nats), entropy (bits), varentropy (bits^2)} of logits
    float attn_stats[4];    // {attn_entropy, attn_varentropy, agreement, interaction_strength}
    int lazy_logits;        // CUDA: leave this step's logits on the device until
                            // session_logits() asks (the caller draws with session_sample
                            // and reads metrics from the device statistics)
    int copy_scores;        // CUDA: also copy the capture into attn_scores (off by default,
                            // so only the logits and these 8 floats cross per step)
    const forward_hooks *hooks;  // interventions and captures (model/hooks.h); NULL: none
    const lora_use *lora;   // LoRA adapters applied to the projections ([n_lora]; forward_set_lora)
    int n_lora;
    float *lora_tmp, *lora_dy;  // their scratch: [max_T, rank], [max_T, widest projection]
    int lora_rank;          // the rank lora_tmp has room for
    // Tensor parallelism (model/tp.h; forward_set_comm): the model is a shard (m->tp) and
    // every pass makes the same collectives on every rank. NULL: one process, whole model.
    tp_comm *comm;
    float *tp_logits;       // [TP_ROWS, max_vocab] this rank's vocabulary slice
    float *tp_scores;       // [max_heads, ctx] this rank's heads' attention capture
    float *tp_gather;       // [size, max(TP_ROWS * max_vocab, max_heads * ctx)] gathered slices
    int tp_failed;          // a collective failed in this pass: tp_err says why
    verr tp_err;
    int rows_exact;         // forward_batch's pass: every product sums each row as a row
                            // alone (cpu_matmul_rows), whatever the batch's size
} forward_state;

// Logit rows gathered per collective (scoring passes gather in slices of this many).
#define TP_ROWS 16

int forward_init(forward_state *s, const model *m, int max_T, int ctx, verr *err);
void forward_free(forward_state *s);
// Runs the passes as rank c->rank of c's group on a model sharded to match (model_shard
// with the same rank and size); every rank must make the same forward calls. -1 with err
// on a mismatch or when out of memory.
int forward_set_comm(forward_state *s, tp_comm *c, verr *err);
// The adapters the next passes apply (n 0: none); u must outlive their use. Grows the
// scratch; -1 with err when out of memory (nothing changed then).
int forward_set_lora(forward_state *s, const lora_use *u, int n, verr *err);
// Appends T tokens to the sequence in kv and computes s->logits for the last one.
// Fails (without touching kv) on ids outside the vocab or when the context is full.
// Fails after the pass (kv holds the new positions) when the logits hold a NaN or inf,
// naming the position and the first layer whose output went non-finite.
int forward(forward_state *s, kv_view *kv, const int *ids, int T, verr *err);
// forward() that also writes every new position's logits to out [T, vocab] (scoring).
int forward_all(forward_state *s, kv_view *kv, const int *ids, int T, float *out, verr *err);
// B sequences decode one token each in one pass, so every weight is read once per step
// (branches, lookahead agents): row b appends ids[b] to views[b] at its own position
// kv_view_len(&views[b]) (rows may share a trunk; each writes its own tail or cache).
// logits [B, vocab] receives every row's (s->logits the last row's). With a capture
// layer and scores != NULL, row b's capture goes to scores + b * n_heads * s->ctx
// ([n_heads, keys[b]], as s->attn_scores); s->attn_scores is left alone. Rows use the
// row-exact matmul (cpu_matmul_rows), which sums each row exactly as forward() T=1 does,
// bit for bit, every weight type and any B. A trunk may be paged (model/kv_pool.h); tails
// are contiguous. Fails, touching nothing,
// on B outside 1..max_T, an id outside the vocab, a full view, or two rows writing to
// the same cache. Non-finite logits in a row fail as in forward(), naming the row.
// out[T, vocab] = lm_head(x) for rows x[T, dim] already through the final norm (the logit
// lens). A tensor-parallel rank computes its vocabulary rows and gathers the rest: every
// rank calls it together. -1 with err when a collective failed.
int forward_lm_head(forward_state *s, float *out, const float *x, int T, verr *err);
int forward_batch(forward_state *s, kv_view *views, const int *ids, int B, float *logits, float *scores, int *keys,
                  verr *err);

#endif
