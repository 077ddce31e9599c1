// kv_cache.h: preallocated keys and values for every layer: fp32 on the CPU by default,
// bf16 there with --kv-type bf16 (half the bytes read per step at depth), bf16 on the GPU
// for the CUDA backend.
// A sequence reads a trunk (shared, e.g. the prompt) and optionally writes into a
// small private tail; branches fork by getting their own tail, not a cache copy.
#ifndef VARENT_KV_CACHE_H
#define VARENT_KV_CACHE_H

#include <stddef.h>
#include "host/util/err.h"

struct cuda_ctx;

typedef struct kv_cache kv_cache;
struct kv_cache {
    int n_layers, ctx, kv_dim;
    void *k, *v;   // [n_layers, ctx, kv_dim] fp32, or bf16 with bf16 set; NULL on a device cache
    int bf16;      // host cache of bf16 elements (kv_cache_init_typed)
    int len;       // filled positions
    void *dk, *dv;        // device cache (kv_cache_init_cuda): bf16 [n_layers, ctx, kv_dim]
    struct cuda_ctx *cu;  // the CUDA context (stream) that owns dk/dv; NULL on the host
    // Tensor parallelism in one process (host/runtime/session_tpl.c): the next rank's
    // share of the same positions, on its GPU (a chain: rank 1, 2, ...). Its len follows
    // this cache's at every forward call, commit and truncation. NULL: none.
    kv_cache *peer;
    // Paged (model/kv_pool.h, host caches only): k and v are the pool's
    // [n_layers, layer_rows, kv_dim] and position p lives in row
    // (table[p >> block_shift] << block_shift) + (p & mask); ctx is the positions mapped
    // so far (whole blocks), which the pool grows. NULL table: contiguous rows.
    int *table;          // [table_cap] physical block of each logical block
    int table_cap;       // blocks the sequence may map at most
    int block_shift;
    size_t layer_rows;   // rows per layer in k and v (the pool's)
    struct kv_pool *pool;
};

// What one forward call sees: trunk positions 0..n_trunk-1 and, when tail is set,
// tail positions after them. New tokens go to the tail if there is one.
typedef struct {
    kv_cache *trunk;
    int n_trunk;     // trunk positions visible to this sequence (<= trunk->len)
    kv_cache *tail;  // NULL: append to the trunk
} kv_view;

int kv_cache_init(kv_cache *c, int n_layers, int ctx, int kv_dim, verr *err);
// The same on the host with bf16 elements when bf16 is set (each K and V row rounded to
// nearest even as the forward stores it).
int kv_cache_init_typed(kv_cache *c, int n_layers, int ctx, int kv_dim, int bf16, verr *err);
// The same cache in bf16 on cu's GPU (CUDA builds; an error otherwise). Commits copy on
// cu's stream, so use it with the session that owns cu.
int kv_cache_init_cuda(kv_cache *c, struct cuda_ctx *cu, int n_layers, int ctx, int kv_dim, verr *err);
// A cache of ctx positions on the same backend (host or device) and geometry as `like`,
// with a peer chain like like's.
int kv_cache_init_like(kv_cache *c, const kv_cache *like, int ctx, verr *err);
void kv_cache_free(kv_cache *c);
// Frees device rows dk and dv of cu's GPU once its stream is idle (NULL: nothing).
void kv_cache_free_device(struct cuda_ctx *cu, void *dk, void *dv);
// Bytes per element of a host cache.
static inline size_t kv_cache_esize(const kv_cache *c) { return c->bf16 ? 2 : 4; }
// Rows per layer of a host cache's k and v: ctx, or the pool's when paged.
static inline size_t kv_cache_layer_rows(const kv_cache *c) { return c->table ? c->layer_rows : (size_t)c->ctx; }
// Layer l's rows of a host cache, [kv_cache_layer_rows, kv_dim] of kv_cache_esize bytes
// each (a paged cache's positions are placed by kv_cache_phys).
static inline void *kv_cache_k(const kv_cache *c, int layer) {
    return (char *)c->k + (size_t)layer * kv_cache_layer_rows(c) * c->kv_dim * kv_cache_esize(c);
}
static inline void *kv_cache_v(const kv_cache *c, int layer) {
    return (char *)c->v + (size_t)layer * kv_cache_layer_rows(c) * c->kv_dim * kv_cache_esize(c);
}
// The row of position pos within a layer's rows.
static inline size_t kv_cache_phys(const kv_cache *c, int pos) {
    if (!c->table) return (size_t)pos;
    int sh = c->block_shift;
    return ((size_t)c->table[pos >> sh] << sh) | (size_t)(pos & ((1 << sh) - 1));
}
// A view of the whole trunk that appends to it.
static inline kv_view kv_view_of(kv_cache *c) { return (kv_view){ c, c->len, NULL }; }
// Positions the view holds, and how many more it can take.
static inline int kv_view_len(const kv_view *v) { return v->n_trunk + (v->tail ? v->tail->len : 0); }
static inline int kv_view_room(const kv_view *v) {
    return v->tail ? v->tail->ctx - v->tail->len : v->trunk->ctx - v->trunk->len;
}
// Drop positions >= len (rollback). The cache is truncated, never recomputed.
void kv_cache_truncate(kv_cache *c, int len);
// Append the first n tail positions to the trunk (commit a branch).
int kv_cache_commit(kv_cache *trunk, const kv_cache *tail, int n, verr *err);

#endif
