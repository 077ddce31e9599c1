// kv_pool.h: a paged KV cache, on the host or on a GPU. One pool of fixed-size blocks of positions
// serves every sequence; a sequence is a kv_cache whose block table maps its positions
// to blocks (kv_cache.h, "Paged"), so the forward and the attention kernel read it
// through the table, and memory goes to the positions sequences actually hold.
//
// Blocks are reference-counted: sequences that share a prefix map the same blocks. A
// block nobody maps is idle, in a least-recently-used list. A block registered as a
// prefix (kv_pool_register: keyed by the hash chain of its token ids) stays findable by
// kv_pool_lookup while idle, until the pool hands it out again: idle blocks that hold
// no prefix go first, then the least recently used prefixes (evicted).
#ifndef VARENT_KV_POOL_H
#define VARENT_KV_POOL_H

#include <stdint.h>

#include "model/kv_cache.h"

typedef struct kv_pool {
    int n_layers, kv_dim, bf16;
    int block, block_shift;   // positions per block (a power of two)
    int n_blocks;
    void *k, *v;              // [n_layers, n_blocks * block, kv_dim], fp32 or bf16 (NULL on a device pool)
    size_t bytes;             // of k, and of v (or dk, dv)
    void *dk, *dv;            // a device pool (kv_pool_init_cuda): bf16 [n_layers, n_blocks * block, kv_dim]
    struct cuda_ctx *cu;      // its context (stream); NULL on the host
    int *refs;                // [n_blocks] caches mapping each block
    int *prev, *next;         // [n_blocks] the idle list, least recently used first (-1 ends)
    int head, tail, n_idle;
    // The prefix registry: a chained hash table of block keys.
    uint64_t *key;            // [n_blocks] 0: not registered
    uint64_t *parent;         // [n_blocks] the key of the block before it (the salt for block 0)
    int *ids;                 // [n_blocks, block] the token ids a registered block holds
    int *chain;               // [n_blocks] next block in its bucket (-1 ends)
    int *bucket;              // [n_buckets] first block (-1: none)
    int n_buckets;            // a power of two
    // Statistics (tokens): asked for by lookups, found; registered blocks handed out again.
    long lookup_tokens, hit_tokens, evictions;
} kv_pool;

// Bytes of one block (keys and values, every layer).
size_t kv_pool_block_bytes(int n_layers, int kv_dim, int bf16, int block);
// A pool of n_blocks blocks of `block` positions (a power of two, 1..1024). -1 with err
// when the arguments are bad or memory is short (naming the size).
int kv_pool_init(kv_pool *p, int n_layers, int kv_dim, int bf16, int block, int n_blocks, verr *err);
// The same pool in bf16 on cu's GPU (CUDA builds; an error otherwise): the block tables
// stay on the host, the forward uploads them (model/cuda/core.c), and its caches are
// device caches that the CUDA forward reads through their tables. Block copies run on
// cu's stream.
int kv_pool_init_cuda(kv_pool *p, struct cuda_ctx *cu, int n_layers, int kv_dim, int block, int n_blocks, verr *err);
void kv_pool_free(kv_pool *p);
// Blocks nobody maps (free, or holding an idle prefix).
static inline int kv_pool_idle(const kv_pool *p) { return p->n_idle; }
// Blocks that positions [0, n) need.
static inline int kv_pool_blocks_for(const kv_pool *p, int n) { return (n + p->block - 1) >> p->block_shift; }

// c becomes an empty paged cache of this pool, able to map max_pos positions at most.
int kv_pool_open(kv_pool *p, kv_cache *c, int max_pos, verr *err);
// Maps idle blocks to c until it holds positions [0, n) (c->ctx >= n). -1 with err when
// the pool has too few idle blocks (c keeps what it had) or n is past its max_pos.
int kv_pool_grow(kv_pool *p, kv_cache *c, int n, verr *err);
// Gives back every block c maps (the last ones first, so a prefix's first blocks stay
// longest) and frees its table; kv_cache_free calls it for a paged cache.
void kv_pool_release(kv_pool *p, kv_cache *c);
// Maps src's blocks [0, n) to dst, which maps none yet (both of this pool): they share
// those positions. dst->len becomes n blocks' positions (capped at src->len).
int kv_pool_share(kv_pool *p, kv_cache *dst, const kv_cache *src, int n, verr *err);
// dst's next block: an idle block holding a copy of src's block i (a partly filled last
// block that dst goes on writing after). -1 with err when no block is idle.
int kv_pool_copy_block(kv_pool *p, kv_cache *dst, const kv_cache *src, int i, verr *err);

// Registers c's blocks [0, n) as the prefix ids[0, n * block): block i under the hash
// of salt, ids[0, (i + 1) * block). A block whose key is already registered (the same
// prefix computed by another sequence) is left unregistered.
void kv_pool_register(kv_pool *p, const kv_cache *c, const int *ids, int n, uint64_t salt);
// Maps to c, which maps nothing yet, the longest run of registered blocks holding
// ids[0, ...), at most max_blocks and rounded down to a multiple of `multiple` blocks;
// returns the blocks mapped (c->len is set to their positions). Counts max_blocks'
// positions as looked up and the mapped ones as hits.
int kv_pool_lookup(kv_pool *p, kv_cache *c, const int *ids, int max_blocks, int multiple, uint64_t salt);

#endif
