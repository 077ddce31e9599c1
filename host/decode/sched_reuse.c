// sched_reuse.c: the scheduler's two reuses (sched.h): whole prompts prefilled before,
// kept as entries with their last logits, and the blocks of whole prefill chunks,
// registered in the pool under their token ids. Both are exact: a reused position holds
// what the sequence's own prefill would have computed, because it was computed by the
// same chunk of the same tokens.
#include <stdlib.h>
#include <string.h>

#include "host/decode/sched_internal.h"

static uint64_t hash_ids(const int *ids, int n, uint64_t salt) {
    uint64_t h = salt ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)ids[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h ^ (uint64_t)n;
}

void sched_update_reserve(sched *q, seq *x) {
    int mapped = x->open ? x->kv.ctx >> q->pool.block_shift : 0, r = x->worst - mapped;
    if (r < 0) r = 0;
    q->reserved += r - x->reserve;
    x->reserve = r;
}

static void entry_drop(sched_entry *e) {
    if (!e->used) return;
    kv_cache_free(&e->kv);
    free(e->ids), free(e->logits);
    memset(e, 0, sizeof *e);
}

int sched_reuse_evict(sched *q) {
    sched_entry *old = NULL;
    for (int i = 0; i < SCHED_ENTRIES; i++)
        if (q->entries[i].used && (!old || q->entries[i].stamp < old->stamp)) old = &q->entries[i];
    if (!old) return 0;
    entry_drop(old);
    return 1;
}

void sched_reuse_free(sched *q) {
    for (int i = 0; i < SCHED_ENTRIES; i++) entry_drop(&q->entries[i]);
}

// The entry holding exactly this prompt, computed with this salt and, when the sequence
// needs metrics, with its capture layer.
static sched_entry *entry_find(sched *q, const seq *x) {
    uint64_t h = hash_ids(x->prompt, x->r.n_prompt, x->salt);
    for (int i = 0; i < SCHED_ENTRIES; i++) {
        sched_entry *e = &q->entries[i];
        if (!e->used || e->hash != h || e->n != x->r.n_prompt || e->salt != x->salt) continue;
        if (x->c.metrics && e->layer != q->layer) continue;
        if (!memcmp(e->ids, x->prompt, sizeof(int) * (size_t)e->n)) return e;
    }
    return NULL;
}

// x maps e's positions: the whole blocks shared, the partial last one copied (x writes
// after it). Its reserve covers the copy.
static int entry_map(sched *q, seq *x, const sched_entry *e) {
    verr err;
    int full = e->n >> q->pool.block_shift;
    if (kv_pool_share(&q->pool, &x->kv, &e->kv, full, &err)) return -1;
    if (e->n > full << q->pool.block_shift && kv_pool_copy_block(&q->pool, &x->kv, &e->kv, full, &err)) {
        kv_pool_release(&q->pool, &x->kv);  // back to empty (the table is reopened below)
        verr e2;
        kv_pool_open(&q->pool, &x->kv, q->s->ctx, &e2);
        return -1;
    }
    x->kv.len = e->n;
    return 0;
}

int sched_reuse_find(sched *q, seq *x, const float **row, token_metrics *m) {
    if (!q->pooled || q->o.no_reuse) return 0;
    int n = x->r.n_prompt, shift = q->pool.block_shift;
    sched_entry *e = entry_find(q, x);
    if (e && entry_map(q, x, e) == 0) {
        e->stamp = ++q->clock;
        *row = e->logits, *m = e->m;
        q->pool.lookup_tokens += n, q->pool.hit_tokens += n;
        sched_update_reserve(q, x);
        return 2;
    }
    if (q->chunk % q->pool.block) return 0;  // chunks do not end on block boundaries
    // whole chunks before the last position's (which must be computed for its logits)
    int chunks = (n - 1) / q->chunk, per = q->chunk >> shift;
    int got = kv_pool_lookup(&q->pool, &x->kv, x->prompt, chunks * per, per, x->salt);
    sched_update_reserve(q, x);
    return got > 0;
}

// A copy of x's prompt and last logits as an entry (the least recently used one goes
// when all are taken). Needs one idle block beyond the reserves for a partial last block.
static void entry_keep(sched *q, seq *x, const token_metrics *m) {
    int n = x->r.n_prompt, full = n >> q->pool.block_shift, partial = n > full << q->pool.block_shift;
    if (entry_find(q, x)) return;
    sched_entry *slot = NULL;
    for (int i = 0; i < SCHED_ENTRIES && !slot; i++)
        if (!q->entries[i].used) slot = &q->entries[i];
    if (!slot) {
        sched_reuse_evict(q);
        for (int i = 0; i < SCHED_ENTRIES && !slot; i++)
            if (!q->entries[i].used) slot = &q->entries[i];
    }
    if (!slot || kv_pool_idle(&q->pool) - q->reserved < partial) return;
    int vocab = q->s->m.cfg.vocab_size;
    sched_entry e = { .used = 1, .salt = x->salt, .n = n, .layer = m ? q->layer : -1 };
    e.hash = hash_ids(x->prompt, n, x->salt);
    e.ids = malloc(sizeof(int) * (size_t)n);
    e.logits = malloc(sizeof(float) * (size_t)vocab);
    verr err;
    if (!e.ids || !e.logits || kv_pool_open(&q->pool, &e.kv, n, &err)) {
        free(e.ids), free(e.logits);
        return;
    }
    memcpy(e.ids, x->prompt, sizeof(int) * (size_t)n);
    memcpy(e.logits, q->s->fw.logits, sizeof(float) * (size_t)vocab);
    if (m) e.m = *m;
    if (kv_pool_share(&q->pool, &e.kv, &x->kv, full, &err) ||
        (partial && kv_pool_copy_block(&q->pool, &e.kv, &x->kv, full, &err))) {
        kv_cache_free(&e.kv);
        free(e.ids), free(e.logits);
        return;
    }
    e.kv.len = n;
    e.stamp = ++q->clock;
    *slot = e;
}

void sched_reuse_keep(sched *q, seq *x, const token_metrics *m) {
    if (!q->pooled || q->o.no_reuse) return;
    if (q->chunk % q->pool.block == 0) {  // the blocks of its whole chunks
        int whole = x->r.n_prompt / q->chunk * q->chunk;
        kv_pool_register(&q->pool, &x->kv, x->prompt, whole >> q->pool.block_shift, x->salt);
    }
    entry_keep(q, x, m);
}
