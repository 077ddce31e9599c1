// kv_pool.c: see kv_pool.h.
#include "model/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "host/util/hugemem.h"
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

size_t kv_pool_block_bytes(int n_layers, int kv_dim, int bf16, int block) {
    return 2 * (size_t)n_layers * block * kv_dim * (bf16 ? 2 : 4);
}

// ---- the idle list ---------------------------------------------------------------

static void idle_unlink(kv_pool *p, int b) {
    if (p->prev[b] >= 0) p->next[p->prev[b]] = p->next[b];
    else p->head = p->next[b];
    if (p->next[b] >= 0) p->prev[p->next[b]] = p->prev[b];
    else p->tail = p->prev[b];
    p->prev[b] = p->next[b] = -1;
    p->n_idle--;
}

// A block nobody maps any more: a registered one becomes the most recently used, a
// plain one goes to the front, to be handed out before any prefix is evicted.
static void idle_push(kv_pool *p, int b) {
    if (p->key[b]) {
        p->prev[b] = p->tail, p->next[b] = -1;
        if (p->tail >= 0) p->next[p->tail] = b;
        else p->head = b;
        p->tail = b;
    } else {
        p->prev[b] = -1, p->next[b] = p->head;
        if (p->head >= 0) p->prev[p->head] = b;
        else p->tail = b;
        p->head = b;
    }
    p->n_idle++;
}

// ---- the registry ----------------------------------------------------------------

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The key of a block holding ids[block] after the block keyed parent (never 0).
static uint64_t block_key(uint64_t parent, const int *ids, int block) {
    uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < block; i++) h = mix(h ^ ((uint64_t)(uint32_t)ids[i] + 0x632be59bd9b4e019ull * (uint64_t)(i + 1)));
    return h ? h : 1;
}

static int *bucket_of(kv_pool *p, uint64_t key) { return &p->bucket[key & (uint64_t)(p->n_buckets - 1)]; }

static void unregister(kv_pool *p, int b) {
    if (!p->key[b]) return;
    for (int *at = bucket_of(p, p->key[b]); *at >= 0; at = &p->chain[*at])
        if (*at == b) {
            *at = p->chain[b];
            break;
        }
    p->key[b] = 0, p->chain[b] = -1;
}

// The registered block with this key, parent and ids, or -1 (the ids are compared too,
// so a hash collision can never map the wrong positions).
static int find(kv_pool *p, uint64_t key, uint64_t parent, const int *ids) {
    for (int b = *bucket_of(p, key); b >= 0; b = p->chain[b])
        if (p->key[b] == key && p->parent[b] == parent &&
            !memcmp(p->ids + (size_t)b * p->block, ids, sizeof(int) * (size_t)p->block))
            return b;
    return -1;
}

// ---- the pool --------------------------------------------------------------------

// The block tables, idle list and registry of a pool whose geometry is set.
static int init_books(kv_pool *p, verr *err) {
    int n_blocks = p->n_blocks, block = p->block;
    p->n_buckets = 1;
    while (p->n_buckets < n_blocks) p->n_buckets *= 2;
    p->refs = calloc((size_t)n_blocks, sizeof(int));
    p->prev = malloc(sizeof(int) * (size_t)n_blocks), p->next = malloc(sizeof(int) * (size_t)n_blocks);
    p->key = calloc((size_t)n_blocks, sizeof(uint64_t)), p->parent = calloc((size_t)n_blocks, sizeof(uint64_t));
    p->ids = malloc(sizeof(int) * (size_t)n_blocks * block);
    p->chain = malloc(sizeof(int) * (size_t)n_blocks), p->bucket = malloc(sizeof(int) * (size_t)p->n_buckets);
    if (!p->refs || !p->prev || !p->next || !p->key || !p->parent || !p->ids || !p->chain || !p->bucket) {
        kv_pool_free(p);
        return verr_set(err, "out of memory for the books of a KV pool of %d blocks", n_blocks);
    }
    p->head = p->tail = -1;
    for (int b = 0; b < p->n_buckets; b++) p->bucket[b] = -1;
    for (int b = n_blocks - 1; b >= 0; b--) p->chain[b] = -1, idle_push(p, b);  // block 0 first
    return 0;
}

// The geometry (checked), before any storage.
static int init_geometry(kv_pool *p, int n_layers, int kv_dim, int bf16, int block, int n_blocks, verr *err) {
    memset(p, 0, sizeof *p);
    int shift = 0;
    while ((1 << shift) < block && shift < 10) shift++;
    if (block < 1 || (1 << shift) != block) return verr_set(err, "KV pool: block size %d is not a power of two in 1..1024", block);
    if (n_blocks < 1) return verr_set(err, "KV pool: %d blocks, want at least 1", n_blocks);
    p->n_layers = n_layers, p->kv_dim = kv_dim, p->bf16 = bf16 != 0, p->block = block, p->block_shift = shift;
    p->n_blocks = n_blocks;
    p->bytes = (size_t)n_layers * n_blocks * block * kv_dim * (bf16 ? 2 : 4);
    return 0;
}

int kv_pool_init(kv_pool *p, int n_layers, int kv_dim, int bf16, int block, int n_blocks, verr *err) {
    if (init_geometry(p, n_layers, kv_dim, bf16, block, n_blocks, err)) return -1;
    p->k = huge_alloc(p->bytes), p->v = huge_alloc(p->bytes);
    if (!p->k || !p->v) {
        size_t mib = 2 * p->bytes >> 20;
        kv_pool_free(p);
        return verr_set(err, "out of memory allocating a KV pool of %d blocks of %d positions (%zu MiB): lower "
                        "--kv-pool-mb", n_blocks, block, mib);
    }
    return init_books(p, err);
}

int kv_pool_init_cuda(kv_pool *p, struct cuda_ctx *cu, int n_layers, int kv_dim, int block, int n_blocks, verr *err) {
#ifdef VARENT_CUDA
    if (init_geometry(p, n_layers, kv_dim, 1, block, n_blocks, err)) return -1;
    p->bf16 = 0;  // the caches' bf16 flag names host rows; device rows are always bf16
    p->cu = cu;
    char what[160];
    snprintf(what, sizeof what, "a device KV pool of %d blocks of %d positions (lower --kv-pool-mb)", n_blocks, block);
    if (cuda_activate(cu)) return verr_set(err, "%s", cu->err.msg);
    if (cuda_malloc(&p->dk, p->bytes, what, err) || cuda_malloc(&p->dv, p->bytes, what, err)) {
        kv_pool_free(p);
        return -1;
    }
    return init_books(p, err);
#else
    (void)p, (void)cu, (void)n_layers, (void)kv_dim, (void)block, (void)n_blocks;
    return verr_set(err, "this varent was built without CUDA: no device KV pool");
#endif
}

void kv_pool_free(kv_pool *p) {
    huge_free(p->k, p->bytes), huge_free(p->v, p->bytes);
    kv_cache_free_device(p->cu, p->dk, p->dv);
    free(p->refs), free(p->prev), free(p->next), free(p->key), free(p->parent), free(p->ids), free(p->chain);
    free(p->bucket);
    memset(p, 0, sizeof *p);
}

int kv_pool_open(kv_pool *p, kv_cache *c, int max_pos, verr *err) {
    memset(c, 0, sizeof *c);
    int cap = kv_pool_blocks_for(p, max_pos > 0 ? max_pos : 1);
    if (!(c->table = malloc(sizeof(int) * (size_t)cap))) return verr_set(err, "out of memory");
    c->n_layers = p->n_layers, c->kv_dim = p->kv_dim, c->bf16 = p->bf16;
    c->k = p->k, c->v = p->v, c->layer_rows = (size_t)p->n_blocks * p->block;
    c->dk = p->dk, c->dv = p->dv, c->cu = p->cu;
    c->table_cap = cap, c->block_shift = p->block_shift, c->pool = p;
    return 0;
}

// The idle list's first block, now mapped once (a registered one is evicted).
static int take(kv_pool *p) {
    int b = p->head;
    idle_unlink(p, b);
    if (p->key[b]) p->evictions++;
    unregister(p, b);
    p->refs[b] = 1;
    return b;
}

int kv_pool_grow(kv_pool *p, kv_cache *c, int n, verr *err) {
    int have = c->ctx >> p->block_shift, want = kv_pool_blocks_for(p, n);
    if (want > c->table_cap)
        return verr_set(err, "KV pool: %d positions asked for, the sequence may hold %d", n, c->table_cap << p->block_shift);
    if (want - have > p->n_idle)
        return verr_set(err, "KV pool full: %d more blocks of %d positions needed, %d of %d idle", want - have, p->block,
                        p->n_idle, p->n_blocks);
    for (int i = have; i < want; i++) c->table[i] = take(p);
    c->ctx = want << p->block_shift;
    return 0;
}

void kv_pool_release(kv_pool *p, kv_cache *c) {
    for (int i = (c->ctx >> p->block_shift) - 1; i >= 0; i--) {
        int b = c->table[i];
        if (--p->refs[b] == 0) idle_push(p, b);
    }
    free(c->table);
    memset(c, 0, sizeof *c);
}

// Maps block b (already counted) as c's next block.
static void map_next(kv_pool *p, kv_cache *c, int b) {
    c->table[c->ctx >> p->block_shift] = b;
    c->ctx += p->block;
}

// One more cache maps block b.
static void ref(kv_pool *p, int b) {
    if (p->refs[b]++ == 0) idle_unlink(p, b);
}

int kv_pool_share(kv_pool *p, kv_cache *dst, const kv_cache *src, int n, verr *err) {
    if (dst->ctx || n > (src->ctx >> p->block_shift) || n > dst->table_cap)
        return verr_set(err, "KV pool: cannot share %d blocks (the source maps %d, the sequence %d)", n,
                        src->ctx >> p->block_shift, dst->ctx >> p->block_shift);
    for (int i = 0; i < n; i++) {
        ref(p, src->table[i]);
        map_next(p, dst, src->table[i]);
    }
    int len = n << p->block_shift;
    dst->len = len < src->len ? len : src->len;
    return 0;
}

int kv_pool_copy_block(kv_pool *p, kv_cache *dst, const kv_cache *src, int i, verr *err) {
    if ((dst->ctx >> p->block_shift) >= dst->table_cap) return verr_set(err, "KV pool: the sequence's table is full");
    if (p->n_idle < 1) return verr_set(err, "KV pool full: no idle block to copy a prompt's last block into");
    int b = take(p), from = src->table[i];
    size_t rows = (size_t)p->block * p->kv_dim * (p->dk || p->bf16 ? 2 : 4), layer = (size_t)p->n_blocks * rows;
#ifdef VARENT_CUDA
    if (p->dk) {  // one pitched copy per K and V: a block's rows in every layer
        if (cuda_activate(p->cu) ||
            cuda_copy_2d(p->cu, (char *)p->dk + b * rows, layer, (char *)p->dk + from * rows, layer, rows,
                         (size_t)p->n_layers) ||
            cuda_copy_2d(p->cu, (char *)p->dv + b * rows, layer, (char *)p->dv + from * rows, layer, rows,
                         (size_t)p->n_layers)) {
            if (--p->refs[b] == 0) idle_push(p, b);
            return verr_set(err, "%s", p->cu->err.msg);
        }
        map_next(p, dst, b);
        return 0;
    }
#endif
    for (int l = 0; l < p->n_layers; l++) {
        memcpy((char *)p->k + l * layer + b * rows, (char *)p->k + l * layer + from * rows, rows);
        memcpy((char *)p->v + l * layer + b * rows, (char *)p->v + l * layer + from * rows, rows);
    }
    map_next(p, dst, b);
    return 0;
}

void kv_pool_register(kv_pool *p, const kv_cache *c, const int *ids, int n, uint64_t salt) {
    uint64_t parent = salt;
    for (int i = 0; i < n && i < (c->ctx >> p->block_shift); i++) {
        const int *bid = ids + (size_t)i * p->block;
        uint64_t key = block_key(parent, bid, p->block);
        int b = c->table[i];
        if (!p->key[b] && find(p, key, parent, bid) < 0) {
            p->key[b] = key, p->parent[b] = parent;
            memcpy(p->ids + (size_t)b * p->block, bid, sizeof(int) * (size_t)p->block);
            int *at = bucket_of(p, key);
            p->chain[b] = *at, *at = b;
        }
        parent = key;
    }
}

int kv_pool_lookup(kv_pool *p, kv_cache *c, const int *ids, int max_blocks, int multiple, uint64_t salt) {
    if (max_blocks > c->table_cap) max_blocks = c->table_cap;
    if (c->ctx || max_blocks <= 0) return 0;
    p->lookup_tokens += (long)max_blocks << p->block_shift;
    int found[max_blocks > 0 ? max_blocks : 1], n = 0;
    uint64_t parent = salt;
    for (; n < max_blocks; n++) {
        const int *bid = ids + (size_t)n * p->block;
        uint64_t key = block_key(parent, bid, p->block);
        if ((found[n] = find(p, key, parent, bid)) < 0) break;
        parent = key;
    }
    if (multiple > 1) n -= n % multiple;
    for (int i = 0; i < n; i++) {
        ref(p, found[i]);
        map_next(p, c, found[i]);
    }
    c->len = n << p->block_shift;
    p->hit_tokens += (long)c->len;
    return n;
}
