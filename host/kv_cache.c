// kv_cache.c: see kv_cache.h.
#include "host/kv_cache.h"

#include <stdlib.h>
#include <string.h>

int kv_cache_init(kv_cache *c, int n_layers, int ctx, int kv_dim, verr *err) {
    memset(c, 0, sizeof *c);
    size_t n = (size_t)n_layers * ctx * kv_dim;
    c->k = malloc(n * sizeof(float));
    c->v = malloc(n * sizeof(float));
    if (!c->k || !c->v) {
        kv_cache_free(c);
        return verr_set(err, "out of memory allocating a %d-token KV cache (%.1f MiB)", ctx,
                        2.0 * n * sizeof(float) / (1 << 20));
    }
    c->n_layers = n_layers, c->ctx = ctx, c->kv_dim = kv_dim;
    return 0;
}

void kv_cache_free(kv_cache *c) {
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

void kv_cache_truncate(kv_cache *c, int len) {
    if (len >= 0 && len < c->len) c->len = len;
}

int kv_cache_commit(kv_cache *trunk, const kv_cache *tail, int n, verr *err) {
    if (n > tail->len || trunk->len + n > trunk->ctx)
        return verr_set(err, "cannot commit %d branch tokens: the context is full (%d of %d)", n, trunk->len, trunk->ctx);
    size_t row = (size_t)trunk->kv_dim * sizeof(float);
    for (int l = 0; l < trunk->n_layers; l++) {
        memcpy(kv_cache_k(trunk, l) + (size_t)trunk->len * trunk->kv_dim, kv_cache_k(tail, l), n * row);
        memcpy(kv_cache_v(trunk, l) + (size_t)trunk->len * trunk->kv_dim, kv_cache_v(tail, l), n * row);
    }
    trunk->len += n;
    return 0;
}
