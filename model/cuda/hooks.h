// hooks.h: the forward hooks (model/hooks.h) as the device runs them: host copies of
// what decides the launches, the control vectors on the device, and the capture arenas.
// All zero / NULL until a forward first sees hooks.
#ifndef VARENT_CUDA_HOOKS_H
#define VARENT_CUDA_HOOKS_H

#include "model/cuda/core.h"
#include "model/cuda/tp.h"
#include "model/hooks.h"

typedef struct {
    long gen;                  // bumped whenever what decides the launches changes
    int active;                // the last sync saw hooks (0: the plain pass)
    const forward_hooks *h;    // the hooks of the current forward call (their callbacks)
    unsigned char *skip;       // [n_layers]
    unsigned char *cvec_on;    // [n_layers]
    unsigned char *ablate;     // [n_layers * n_heads]
    unsigned char *act_on;     // [n_layers * HOOK_NPOINTS]: the point is captured
    unsigned char *attn_on;    // [n_layers]: the last query's scores are captured
    unsigned char *next;       // [the five above]: the sync's scratch
    size_t flags_bytes;        // of each of skip..attn_on together, and of next
    float *h_cvec;             // [n_layers, dim]: the values now on the device
    float *d_cvec;             // device [n_layers, dim]
    int *act_slot, n_act;      // [n_layers * HOOK_NPOINTS]: slot in the arenas (-1: none)
    int *attn_slot, n_attn;    // [n_layers]
    float *d_acts, *h_acts;    // [n_act, T, dim] of a chunk of T rows: device, pinned host
    float *d_attn, *h_attn;    // [n_attn, n_heads, max_ctx]: device, pinned ([n_attn, n_heads, keys])
    int acts_cap, attn_cap;    // slots the arenas hold
} dev_hooks;

// What a step captures for the hooks (bits): activations, last-query attention scores.
#define HK_ACTS 1
#define HK_ATTN 2

// Resolves h (fw->hooks, NULL: none) into k before a forward call: bumps k->gen when
// the launches must change, uploads changed control vectors, sizes the capture arenas.
// With no hooks before or now, one branch.
int cuda_hooks_sync(cuda_core *f, dev_hooks *k, const forward_hooks *h, verr *err);
// The HK_* captures a single-sequence call makes (batches: none).
int cuda_hooks_captures(const dev_hooks *k);
static inline int cuda_hooks_skip(const dev_hooks *k, int l) { return k->active && k->skip[l]; }
// Layer l's control vector on the device, or NULL.
static inline const float *cuda_hooks_cvec(const cuda_core *f, const dev_hooks *k, int l) {
    return k->active && k->cvec_on[l] ? k->d_cvec + (size_t)l * f->m->cfg.dim : NULL;
}
// 1 when a step with captures `cap` copies point p of layer l.
static inline int cuda_hooks_wants(const dev_hooks *k, int cap, int l, int p) {
    return (cap & HK_ACTS) && k->act_on[l * HOOK_NPOINTS + p];
}
// Queues the copy of rows x [T, dim] of layer l's point p into the arena (when wanted).
int cuda_hooks_point(cuda_core *f, const dev_hooks *k, int cap, int l, int p, const float *x, int T, verr *err);
// A skipped layer's points before its control vector: x for the residual ones, zeros
// for the block outputs.
int cuda_hooks_skipped(cuda_core *f, const dev_hooks *k, int cap, int l, const float *x, int T, verr *err);
// Where layer l's last-query scores go for the hooks, or NULL.
float *cuda_hooks_scores(const cuda_core *f, const dev_hooks *k, int cap, int l);
// Queues zeroing the ablated heads' columns of att [T, n_heads * head_dim] at layer l.
int cuda_hooks_ablate(cuda_core *f, const dev_hooks *k, int l, float *att, int T, verr *err);
// After a chunk of T rows at positions pos0.. (keys: the last query's key count): one
// copy back per capture kind, a wait, then the callbacks in the CPU forward's order.
// Under tensor parallelism (t->comm) every rank's heads are gathered first.
int cuda_hooks_deliver(cuda_core *f, dev_hooks *k, dev_tp *t, int cap, int T, int pos0, int keys, verr *err);
void cuda_hooks_free(dev_hooks *k);

#endif
