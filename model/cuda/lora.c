// lora.c: LoRA adapters on the device (model/lora.h), applied unmerged as
// on the CPU: y += scale * scaling * B (A x) after the projection's product, for each
// adapter in use. Each adapter's pairs are uploaded once per device, in their stored
// type (they are r * (n_in + n_out) values a projection, under 1% of its weight at the
// usual ranks, so fp32 adapters stay fp32 and the device computes with the same values
// as the CPU), into one registry the weights' owner holds and every forward sharing
// those weights reads. Under tensor parallelism each device uploads its own share, cut
// from the uncut pairs as model_shard cuts W, so the row-split projections' deltas join
// the partial sums before the all-reduce.
#include "model/forward_cuda.h"

#ifdef VARENT_CUDA

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/lora.h"

// One adapter on this device: its pairs as device wrefs (a.data NULL: not adapted).
struct dev_adapter {
    long id;                   // lora_adapter.id it was uploaded from
    int r;
    void *arena;
    lora_pair *w;              // [n_layers * LORA_N_PROJ], device pointers
    struct dev_adapter *next;
};

struct dev_lora_reg {
    pthread_mutex_t mu;        // forwards sharing the weights may run on several threads
    struct dev_adapter *head;
};

// Projection p's widths on this forward's share (the whole model without TP).
static void local_dims(const model *m, lora_proj p, int *n_in, int *n_out) {
    const tp_shard *s = &m->tp;
    int q = s->n_heads * m->cfg.head_dim, kv = s->n_kv_heads * m->cfg.head_dim, d = m->cfg.dim;
    static const int in_of[LORA_N_PROJ] = { 0, 0, 0, 1, 0, 0, 2 }, out_of[LORA_N_PROJ] = { 1, 3, 3, 0, 2, 2, 0 };
    int w[4] = { d, q, s->n_ffn, kv };
    *n_in = w[in_of[p]], *n_out = w[out_of[p]];
}

int cuda_lora_reg_new(struct dev_lora_reg **out, verr *err) {
    struct dev_lora_reg *g = calloc(1, sizeof *g);
    if (!g || pthread_mutex_init(&g->mu, NULL)) return free(g), verr_set(err, "out of memory");
    *out = g;
    return 0;
}

void cuda_lora_reg_free(struct dev_lora_reg *g) {
    if (!g) return;
    for (struct dev_adapter *d = g->head, *n; d; d = n) {
        n = d->next;
        cuda_free(d->arena);
        free(d->w);
        free(d);
    }
    pthread_mutex_destroy(&g->mu);
    free(g);
}

#define ALIGN(n) (((n) + 255) & ~(size_t)255)

// Pair p of layer l cut to this forward's share, from the uncut pair wh (any TP rank's
// adapter: the device cuts its own share, so one process's ranks share one load). A of
// o/down: the share's columns, gathered into cols [r, count]; B of the others: its rows.
static void cut_pair(const cuda_core *f, const lora_adapter *a, lora_proj p, const lora_pair *wh, void *cols,
                     wref *A, wref *B) {
    const model_config *c = &f->m->cfg;
    int n_in, n_out;
    lora_proj_dims(c, p, &n_in, &n_out);
    size_t first, count, ea = wtype_size(wh->a.type);
    lora_shard_range(c, &f->m->tp, p, &first, &count);
    *A = wh->a, *B = wh->b;
    if (p == LORA_O || p == LORA_DOWN) {
        for (int r = 0; cols && r < a->r; r++)
            memcpy((char *)cols + (size_t)r * count * ea, (const char *)wh->a.data + ((size_t)r * n_in + first) * ea,
                   count * ea);
        A->data = cols;
    } else {
        B->data = (const char *)wh->b.data + first * (size_t)a->r * wtype_size(wh->b.type);
    }
}

// Copies a's pairs, cut to this forward's share, to the device: one arena, each tensor
// 256-byte aligned (the matvec's 16-byte loads need it).
static struct dev_adapter *upload(cuda_core *f, const lora_adapter *a, verr *err) {
    struct dev_adapter *d = calloc(1, sizeof *d);
    void *cols = NULL;
    if (!d || !(d->w = calloc((size_t)a->n_layers * LORA_N_PROJ, sizeof *d->w)) ||
        !(cols = malloc(sizeof(float) * (size_t)a->r * (f->m->cfg.hidden_dim + f->m->cfg.n_heads * f->m->cfg.head_dim)))) {
        if (d) free(d->w);
        free(d);
        verr_set(err, "out of memory");
        return NULL;
    }
    d->id = a->id, d->r = a->r;
    size_t bytes = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int l = 0; l < a->n_layers; l++)
            for (int p = 0; p < LORA_N_PROJ; p++) {
                const lora_pair *wh = &a->whole[(size_t)l * LORA_N_PROJ + p];
                if (!wh->a.data) continue;
                int n_in, n_out;
                local_dims(f->m, (lora_proj)p, &n_in, &n_out);
                size_t ab = (size_t)a->r * n_in * wtype_size(wh->a.type), bb = (size_t)n_out * a->r * wtype_size(wh->b.type);
                if (pass == 1) {
                    char *base = d->arena;
                    wref A, B;
                    cut_pair(f, a, (lora_proj)p, wh, cols, &A, &B);
                    lora_pair *dp = &d->w[(size_t)l * LORA_N_PROJ + p];
                    dp->a = (wref){ base + off, A.type }, dp->b = (wref){ base + off + ALIGN(ab), B.type };
                    if (cuda_upload(&f->ctx, base + off, A.data, ab) ||
                        cuda_upload(&f->ctx, base + off + ALIGN(ab), B.data, bb)) {
                        verr_set(err, "%s: uploading the LoRA adapter: %s", a->dir, f->ctx.err.msg);
                        goto fail;
                    }
                }
                off += ALIGN(ab) + ALIGN(bb);
            }
        bytes = off;
        if (pass == 0 && cuda_malloc(&d->arena, bytes ? bytes : 256, "LoRA adapter", err)) goto fail;
    }
    free(cols);
    return d;
fail:
    free(cols);
    cuda_free(d->arena);
    free(d->w);
    free(d);
    return NULL;
}

// a's copy on this device: the registry's, or uploaded now.
static const struct dev_adapter *find(cuda_core *f, struct dev_lora_reg *g, const lora_adapter *a, verr *err) {
    pthread_mutex_lock(&g->mu);
    struct dev_adapter *d = g->head;
    while (d && d->id != a->id) d = d->next;
    if (!d && (d = upload(f, a, err))) d->next = g->head, g->head = d;
    pthread_mutex_unlock(&g->mu);
    return d;
}

// Scratch for `rank` on every row of a chunk: tmp [max_T, rank], dy [max_T, widest].
static int fit_scratch(cuda_core *f, dev_lora *L, int rank, verr *err) {
    if (rank <= L->rank) return 0;
    int widest = 0;
    for (int p = 0; p < LORA_N_PROJ; p++) {
        int n_in, n_out;
        local_dims(f->m, (lora_proj)p, &n_in, &n_out);
        if (n_out > widest) widest = n_out;
    }
    if (cudaStreamSynchronize(f->ctx.stream) != cudaSuccess)  // a queued step may still read the old ones
        return verr_set(err, "LoRA scratch: the stream failed: %s", cudaGetErrorString(cudaGetLastError()));
    cuda_free(L->tmp), cuda_free(L->dy);
    L->tmp = L->dy = NULL, L->rank = 0;
    if (cuda_malloc((void **)&L->tmp, sizeof(float) * (size_t)f->max_T * rank, "LoRA scratch", err) ||
        (cuda_malloc((void **)&L->dy, sizeof(float) * (size_t)f->max_T * widest, "LoRA scratch", err)))
        return -1;
    L->rank = rank, L->gen++;  // graphs captured with the old buffers are stale
    return 0;
}

int cuda_lora_set(cuda_core *f, dev_lora *L, const lora_use *u, int n, verr *err) {
    const model_config *c = &f->m->cfg;
    if (cuda_activate(&f->ctx)) return verr_set(err, "%s", f->ctx.err.msg);
    if (!L->on && !(L->on = calloc((size_t)c->n_layers * LORA_N_PROJ, 1))) return verr_set(err, "out of memory");
    dev_lora_use *use = calloc((size_t)(n > 0 ? n : 1), sizeof *use);
    if (!use) return verr_set(err, "out of memory");
    int k = 0, rank = 0;
    for (int i = 0; i < n; i++) {
        if (u[i].scale == 0) continue;  // as lora_apply: the base model's launches, bit for bit
        const struct dev_adapter *d = find(f, L->reg, u[i].a, err);
        if (!d) return free(use), -1;
        use[k++] = (dev_lora_use){ d, (float)(u[i].scale * u[i].a->scaling) };
        if (d->r > rank) rank = d->r;
    }
    if (fit_scratch(f, L, rank, err)) return free(use), -1;
    int same = k == L->n && (k == 0 || !memcmp(use, L->use, sizeof *use * (size_t)k));
    free(L->use);
    L->use = use, L->n = k;
    memset(L->on, 0, (size_t)c->n_layers * LORA_N_PROJ);
    for (int i = 0; i < k; i++)
        for (size_t j = 0; j < (size_t)c->n_layers * LORA_N_PROJ; j++) L->on[j] |= use[i].d->w[j].a.data != NULL;
    if (!same) L->gen++;  // a captured decode step bakes the pairs and coefficients in
    return 0;
}

int cuda_lora_apply(cuda_core *f, const dev_lora *L, int l, lora_proj p, float *y, const float *x, int T, int decode,
                    verr *err) {
    cuda_ctx *ctx = &f->ctx;
    int n_in, n_out;
    local_dims(f->m, p, &n_in, &n_out);
    for (int i = 0; i < L->n; i++) {
        const struct dev_adapter *d = L->use[i].d;
        const lora_pair *pr = &d->w[(size_t)l * LORA_N_PROJ + p];
        if (!pr->a.data) continue;
        if (decode) {  // the rows kernels: each row sums as it would alone (batch rows stay bit-identical)
            OP(cuda_matvec_rows(ctx, L->tmp, x, pr->a, n_in, d->r, T, d->r, d->r));
            OP(cuda_matvec_rows(ctx, L->dy, L->tmp, pr->b, d->r, n_out, T, n_out, n_out));
        } else {
            OP(cuda_matmul(ctx, L->tmp, x, pr->a, T, n_in, d->r));
            OP(cuda_matmul(ctx, L->dy, L->tmp, pr->b, T, d->r, n_out));
        }
        OP(cuda_add_scaled(ctx, y, L->dy, L->use[i].coef, (size_t)T * n_out));
    }
    return 0;
}

void cuda_lora_free(dev_lora *L) {
    cuda_free(L->tmp), cuda_free(L->dy);
    free(L->use), free(L->on);
    memset(L, 0, sizeof *L);
}

#else
typedef int cuda_lora_unused;  // nothing to build without CUDA
#endif
