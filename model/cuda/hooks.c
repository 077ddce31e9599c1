// hooks.c: the forward hooks (model/hooks.h) on the CUDA device, the twin
// of what model/forward.c does on the CPU (docs/cuda.md "Forward hooks"):
//   interventions change the launches: a skipped layer launches nothing (its control
//     vector aside), an ablated head is a 2D memset of its columns of the attention
//     output before o_proj, and a control vector rides on the residual add (the down
//     matvec's bias in decode, one bias add before the fused norm in prefill);
//   captures are device-to-device copies of the chosen rows into one arena per step,
//     then one copy back per kind (activations, attention scores) and one wait, after
//     which the callbacks run on the host exactly as the CPU forward calls them.
// A decode graph is captured with the hooks' launches in it: hk.gen changes whenever
// they would change, and the decode graph is captured again (forward.c). Without hooks nothing here runs but
// the branch in cuda_hooks_sync, so the plain step keeps its launches and waits.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_hooks_unused;  // nothing to build without CUDA
#else

#include <stdlib.h>
#include <string.h>

#include "model/cuda/hooks.h"

// The flag arrays, one block (skip, cvec_on, ablate, act_on, attn_on) and its scratch twin.
static int alloc_flags(cuda_core *f, dev_hooks *k, verr *err) {
    const model_config *c = &f->m->cfg;
    size_t L = (size_t)c->n_layers;
    k->flags_bytes = L + L + L * c->n_heads + L * HOOK_NPOINTS + L;
    unsigned char *p = calloc(2, k->flags_bytes);
    k->act_slot = malloc(sizeof(int) * L * HOOK_NPOINTS);
    k->attn_slot = malloc(sizeof(int) * L);
    if (!p || !k->act_slot || !k->attn_slot) {
        free(p);
        return verr_set(err, "out of memory");
    }
    k->skip = p, k->cvec_on = p + L, k->ablate = k->cvec_on + L, k->act_on = k->ablate + L * c->n_heads;
    k->attn_on = k->act_on + L * HOOK_NPOINTS, k->next = p + k->flags_bytes;
    return 0;
}

// What h asks of the launches, into k->next (same layout as skip..attn_on).
static void resolve(const cuda_core *f, const dev_hooks *k, const forward_hooks *h, unsigned char *nx) {
    const model_config *c = &f->m->cfg;
    int L = c->n_layers, H = c->n_heads;
    unsigned char *skip = nx, *on = nx + L, *abl = on + L, *act = abl + (size_t)L * H, *attn = act + L * HOOK_NPOINTS;
    memset(nx, 0, k->flags_bytes);
    if (!h) return;
    for (int l = 0; l < L; l++) {
        skip[l] = h->skip && h->skip[l];
        on[l] = h->cvec && h->cvec_on && h->cvec_on[l];
        for (int p = 0; p < HOOK_NPOINTS; p++)
            act[l * HOOK_NPOINTS + p] = h->on_act && h->act_layers && h->act_layers[l] && (h->points >> p & 1u);
        attn[l] = h->on_attn && h->attn_layers && h->attn_layers[l] && !skip[l];  // a skipped layer attends to nothing
    }
    if (h->ablate) memcpy(abl, h->ablate, (size_t)L * H);
}

// Host and device room for n slots of rows (acts: max_T x dim each; attn: n_heads x max_ctx).
static int grow_arena(float **d, float **hst, int *have, int n, size_t per_slot, const char *what,
                      verr *err) {
    if (n <= *have) return 0;
    cuda_free(*d);
    if (*hst) cudaFreeHost(*hst);
    *d = NULL, *hst = NULL, *have = 0;
    size_t bytes = sizeof(float) * per_slot * (size_t)n;
    if (cuda_malloc((void **)d, bytes, what, err)) return -1;
    CK(cudaHostAlloc((void **)hst, bytes, cudaHostAllocDefault));
    *have = n;
    return 0;
}

// Slots of the captured points and layers, and arenas that hold them.
static int layout(cuda_core *f, dev_hooks *k, verr *err) {
    const model_config *c = &f->m->cfg;
    k->n_act = 0, k->n_attn = 0;
    for (int i = 0; i < c->n_layers * HOOK_NPOINTS; i++) k->act_slot[i] = k->act_on[i] ? k->n_act++ : -1;
    for (int l = 0; l < c->n_layers; l++) k->attn_slot[l] = k->attn_on[l] ? k->n_attn++ : -1;
    return grow_arena(&k->d_acts, &k->h_acts, &k->acts_cap, k->n_act, (size_t)f->max_T * c->dim,
                      "activation captures", err) ||
                   grow_arena(&k->d_attn, &k->h_attn, &k->attn_cap, k->n_attn, (size_t)c->n_heads * f->max_ctx,
                              "attention captures", err)
               ? -1
               : 0;
}

// The control vectors' values on the device (uploaded when they changed).
static int sync_cvec(cuda_core *f, dev_hooks *k, const forward_hooks *h, verr *err) {
    const model_config *c = &f->m->cfg;
    size_t n = (size_t)c->n_layers * c->dim;
    if (!h || !h->cvec) return 0;
    if (!k->d_cvec) {
        if (!(k->h_cvec = malloc(sizeof(float) * n))) return verr_set(err, "out of memory");
        if (cuda_malloc((void **)&k->d_cvec, sizeof(float) * n, "control vectors", err)) return -1;
    } else if (!memcmp(k->h_cvec, h->cvec, sizeof(float) * n)) {
        return 0;
    }
    memcpy(k->h_cvec, h->cvec, sizeof(float) * n);
    if (cuda_upload(&f->ctx, k->d_cvec, k->h_cvec, sizeof(float) * n))
        return verr_set(err, "uploading control vectors: %s", f->ctx.err.msg);
    return 0;
}

int cuda_hooks_sync(cuda_core *f, dev_hooks *k, const forward_hooks *h, verr *err) {
    if (!h && !k->active) return 0;
    if (!k->next && alloc_flags(f, k, err)) return -1;
    k->h = h;
    resolve(f, k, h, k->next);
    if (memcmp(k->next, k->skip, k->flags_bytes) != 0 || k->active != (h != NULL)) {
        memcpy(k->skip, k->next, k->flags_bytes);
        k->active = h != NULL;
        k->gen++;  // the decode graphs re-capture
        if (layout(f, k, err)) {
            k->active = 0;
            return -1;
        }
    }
    return sync_cvec(f, k, h, err);
}

int cuda_hooks_captures(const dev_hooks *k) {
    return !k->active ? 0 : (k->n_act ? HK_ACTS : 0) | (k->n_attn ? HK_ATTN : 0);
}

int cuda_hooks_point(cuda_core *f, const dev_hooks *k, int cap, int l, int p, const float *x, int T, verr *err) {
    if (!cuda_hooks_wants(k, cap, l, p)) return 0;
    size_t n = (size_t)T * f->m->cfg.dim;
    float *dst = k->d_acts + (size_t)k->act_slot[l * HOOK_NPOINTS + p] * n;  // packed [n_act, T, dim]
    CK(cudaMemcpyAsync(dst, x, sizeof(float) * n, cudaMemcpyDeviceToDevice, f->ctx.stream));
    return 0;
}

int cuda_hooks_skipped(cuda_core *f, const dev_hooks *k, int cap, int l, const float *x, int T, verr *err) {
    size_t n = (size_t)T * f->m->cfg.dim;
    for (int p = HOOK_RESID_MID; p < HOOK_NPOINTS; p++) {
        if (p == HOOK_RESID_POST || !cuda_hooks_wants(k, cap, l, p)) continue;  // resid_post: after the vector
        if (p == HOOK_RESID_MID) {
            if (cuda_hooks_point(f, k, cap, l, p, x, T, err)) return -1;
            continue;
        }
        float *dst = k->d_acts + (size_t)k->act_slot[l * HOOK_NPOINTS + p] * n;
        CK(cudaMemsetAsync(dst, 0, sizeof(float) * n, f->ctx.stream));
    }
    return 0;
}

float *cuda_hooks_scores(const cuda_core *f, const dev_hooks *k, int cap, int l) {
    if (!(cap & HK_ATTN) || !k->attn_on[l]) return NULL;
    return k->d_attn + (size_t)k->attn_slot[l] * f->m->cfg.n_heads * f->max_ctx;
}

// att holds this rank's heads (all of them without tensor parallelism): local head h is
// the model's head head0 + h.
int cuda_hooks_ablate(cuda_core *f, const dev_hooks *k, int l, float *att, int T, verr *err) {
    if (!k->active) return 0;
    const model_config *c = &f->m->cfg;
    const tp_shard *t = &f->m->tp;
    const unsigned char *a = k->ablate + (size_t)l * c->n_heads + t->head0;
    size_t hd = (size_t)c->head_dim, pitch = sizeof(float) * t->n_heads * hd;
    for (int h = 0; h < t->n_heads; h++)
        if (a[h]) CK(cudaMemset2DAsync(att + h * hd, pitch, 0, sizeof(float) * hd, (size_t)T, f->ctx.stream));
    return 0;
}

// The callbacks once the rows are on the host: per layer, the points in the CPU
// forward's order, then the layer's attention scores.
static void callbacks(const cuda_core *f, const dev_hooks *k, int cap, int T, int pos0, int keys) {
    const forward_hooks *h = k->h;
    const model_config *c = &f->m->cfg;
    static const int order[HOOK_NPOINTS] = { HOOK_RESID_PRE, HOOK_ATTN_OUT, HOOK_RESID_MID, HOOK_MLP_OUT,
                                             HOOK_RESID_POST };
    size_t n = (size_t)T * c->dim;
    for (int l = 0; l < c->n_layers; l++) {
        for (int i = 0; (cap & HK_ACTS) && i < HOOK_NPOINTS; i++) {
            int s = k->act_slot[l * HOOK_NPOINTS + order[i]];
            if (s >= 0) h->on_act(h->ud, l, order[i], k->h_acts + (size_t)s * n, T, pos0);
        }
        if ((cap & HK_ATTN) && k->attn_slot[l] >= 0)
            h->on_attn(h->ud, l, k->h_attn + (size_t)k->attn_slot[l] * c->n_heads * keys, keys);
    }
}

int cuda_hooks_deliver(cuda_core *f, dev_hooks *k, dev_tp *t, int cap, int T, int pos0, int keys, verr *err) {
    if (!cap) return 0;
    const model_config *c = &f->m->cfg;
    cudaStream_t st = f->ctx.stream;
    for (int l = 0; (cap & HK_ATTN) && t->comm && l < c->n_layers; l++)  // every rank's heads, in place
        if (k->attn_slot[l] >= 0 &&
            cuda_tp_gather_heads(f, t, k->d_attn + (size_t)k->attn_slot[l] * c->n_heads * f->max_ctx, keys, err))
            return -1;
    if (cap & HK_ACTS)
        CK(cudaMemcpyAsync(k->h_acts, k->d_acts, sizeof(float) * k->n_act * T * c->dim, cudaMemcpyDeviceToHost, st));
    if (cap & HK_ATTN) {  // row s of slot l: [n_heads, keys] packed, from [n_heads, max_ctx] slots
        size_t row = sizeof(float) * c->n_heads * keys;
        CK(cudaMemcpy2DAsync(k->h_attn, row, k->d_attn, sizeof(float) * c->n_heads * f->max_ctx, row,
                             (size_t)k->n_attn, cudaMemcpyDeviceToHost, st));
    }
    f->ctx.n_syncs++;
    if (t->comm) {
        if (cuda_tp_wait(f, t, err)) return -1;
    } else {
        cudaError_t e = cudaStreamSynchronize(st);
        if (e != cudaSuccess)
            return verr_set(err, "CUDA forward pass failed: %s (%s:%d)", cudaGetErrorString(e), __FILE__, __LINE__);
    }
    f->par_pending = 0;
    callbacks(f, k, cap, T, pos0, keys);
    return 0;
}

void cuda_hooks_free(dev_hooks *k) {
    free(k->skip), free(k->act_slot), free(k->attn_slot), free(k->h_cvec);
    cuda_free(k->d_cvec), cuda_free(k->d_acts), cuda_free(k->d_attn);
    if (k->h_acts) cudaFreeHost(k->h_acts);
    if (k->h_attn) cudaFreeHost(k->h_attn);
    memset(k, 0, sizeof *k);
}

#endif
