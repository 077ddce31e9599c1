// kv_cache.c: see kv_cache.h.
#include "model/kv_cache.h"

#include "host/util/hugemem.h"
#include "model/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

int kv_cache_init_typed(kv_cache *c, int n_layers, int ctx, int kv_dim, int bf16, verr *err) {
    memset(c, 0, sizeof *c);
    size_t n = (size_t)n_layers * ctx * kv_dim, es = bf16 ? 2 : 4;
    c->n_layers = n_layers, c->ctx = ctx, c->kv_dim = kv_dim, c->bf16 = bf16 != 0;
    // Huge pages: attention at depth streams the whole cache every step (host/util/hugemem.h).
    c->k = huge_alloc(n * es);
    c->v = huge_alloc(n * es);
    if (!c->k || !c->v) {
        kv_cache_free(c);
        return verr_set(err, "out of memory allocating a %d-token KV cache (%.1f MiB)", ctx, 2.0 * n * es / (1 << 20));
    }
    return 0;
}

static size_t host_bytes(const kv_cache *c) {
    return (size_t)c->n_layers * c->ctx * c->kv_dim * (c->bf16 ? 2 : 4);
}

int kv_cache_init(kv_cache *c, int n_layers, int ctx, int kv_dim, verr *err) {
    return kv_cache_init_typed(c, n_layers, ctx, kv_dim, 0, err);
}

int kv_cache_init_cuda(kv_cache *c, struct cuda_ctx *cu, int n_layers, int ctx, int kv_dim, verr *err) {
    memset(c, 0, sizeof *c);
#ifdef VARENT_CUDA
    size_t bytes = (size_t)n_layers * ctx * kv_dim * sizeof(uint16_t);
    if (cuda_activate(cu)) return verr_set(err, "%s", cu->err.msg);
    if (cuda_malloc(&c->dk, bytes, "KV cache keys", err) || cuda_malloc(&c->dv, bytes, "KV cache values", err)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        kv_cache_free(c);
        return verr_set(err, "%s; the %d-token KV cache needs %.1f MiB on the GPU: lower --ctx", msg, ctx,
                        2.0 * bytes / (1 << 20));
    }
    c->cu = cu;
    // Zeroed so a kernel reading past len sees finite values, never stale NaN bits.
    if (cuda_memset(cu, c->dk, 0, bytes) || cuda_memset(cu, c->dv, 0, bytes)) {
        kv_cache_free(c);
        return verr_set(err, "%s", cu->err.msg);
    }
    c->n_layers = n_layers, c->ctx = ctx, c->kv_dim = kv_dim;
    return 0;
#else
    (void)cu, (void)n_layers, (void)ctx, (void)kv_dim;
    return verr_set(err, "this varent was built without CUDA: no device KV cache");
#endif
}

int kv_cache_init_like(kv_cache *c, const kv_cache *like, int ctx, verr *err) {
    int rc = like->dk ? kv_cache_init_cuda(c, like->cu, like->n_layers, ctx, like->kv_dim, err)
                      : kv_cache_init_typed(c, like->n_layers, ctx, like->kv_dim, like->bf16, err);
    if (rc || !like->peer) return rc;
    if (!(c->peer = calloc(1, sizeof *c->peer))) {
        kv_cache_free(c);
        return verr_set(err, "out of memory");
    }
    if (kv_cache_init_like(c->peer, like->peer, ctx, err)) {
        kv_cache_free(c);
        return -1;
    }
    return 0;
}

void kv_cache_free(kv_cache *c) {
    if (c->table) {  // paged: the rows are the pool's
        kv_pool_release(c->pool, c);
        return;
    }
    if (c->peer) {
        kv_cache_free(c->peer);
        free(c->peer);
    }
    huge_free(c->k, host_bytes(c));
    huge_free(c->v, host_bytes(c));
    kv_cache_free_device(c->cu, c->dk, c->dv);
    memset(c, 0, sizeof *c);
}

void kv_cache_free_device(struct cuda_ctx *cu, void *dk, void *dv) {
#ifdef VARENT_CUDA
    if (cu) {  // cudaFree acts on the current device; a copy may be in flight
        cuda_activate(cu);
        cuda_sync(cu);
    }
    cuda_free(dk);
    cuda_free(dv);
#else
    (void)cu, (void)dk, (void)dv;
#endif
}

// Device caches: one pitched copy per K and V, a row per layer, on the trunk's stream.
static int commit_device(kv_cache *trunk, const kv_cache *tail, int n, verr *err) {
#ifdef VARENT_CUDA
    if (!trunk->dk || !tail->dk || trunk->cu != tail->cu)
        return verr_set(err, "cannot commit branch tokens between KV caches on different devices");
    size_t row = (size_t)trunk->kv_dim * sizeof(uint16_t);
    size_t dpitch = (size_t)trunk->ctx * row, spitch = (size_t)tail->ctx * row;
    char *dk = (char *)trunk->dk + (size_t)trunk->len * row, *dv = (char *)trunk->dv + (size_t)trunk->len * row;
    if (cuda_activate(trunk->cu) ||
        cuda_copy_2d(trunk->cu, dk, dpitch, tail->dk, spitch, (size_t)n * row, (size_t)trunk->n_layers) ||
        cuda_copy_2d(trunk->cu, dv, dpitch, tail->dv, spitch, (size_t)n * row, (size_t)trunk->n_layers))
        return verr_set(err, "%s", trunk->cu->err.msg);
    trunk->len += n;
    return 0;
#else
    (void)trunk, (void)tail, (void)n;
    return verr_set(err, "this varent was built without CUDA: no device KV cache");
#endif
}

void kv_cache_truncate(kv_cache *c, int len) {
    for (; c; c = c->peer)
        if (len >= 0 && len < c->len) c->len = len;
}

int kv_cache_commit(kv_cache *trunk, const kv_cache *tail, int n, verr *err) {
    if (n > tail->len || trunk->len + n > trunk->ctx)
        return verr_set(err, "cannot commit %d branch tokens: the context is full (%d of %d)", n, trunk->len, trunk->ctx);
    if (trunk->peer) {  // the other ranks' shares of the same rows first
        if (!tail->peer) return verr_set(err, "cannot commit a branch tail without the other ranks' shares");
        trunk->peer->len = trunk->len, tail->peer->len = tail->len;
        if (kv_cache_commit(trunk->peer, tail->peer, n, err)) return -1;
    }
    if (trunk->dk || tail->dk) return commit_device(trunk, tail, n, err);
    if (trunk->bf16 != tail->bf16) return verr_set(err, "cannot commit branch tokens between fp32 and bf16 KV caches");
    size_t row = (size_t)trunk->kv_dim * kv_cache_esize(trunk), at = (size_t)trunk->len * row;
    for (int l = 0; l < trunk->n_layers; l++) {
        char *tk = kv_cache_k(trunk, l), *tv = kv_cache_v(trunk, l);
        const char *sk = kv_cache_k(tail, l), *sv = kv_cache_v(tail, l);
        if (!trunk->table && !tail->table) {
            memcpy(tk + at, sk, n * row);
            memcpy(tv + at, sv, n * row);
            continue;
        }
        for (int i = 0; i < n; i++) {  // a paged cache's rows are placed one by one
            size_t d = kv_cache_phys(trunk, trunk->len + i) * row, f = kv_cache_phys(tail, i) * row;
            memcpy(tk + d, sk + f, row);
            memcpy(tv + d, sv + f, row);
        }
    }
    trunk->len += n;
    return 0;
}
