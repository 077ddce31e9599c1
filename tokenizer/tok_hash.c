// tok_hash.c: the open-addressing hash maps behind vocab and merge lookups.
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

uint64_t tok_hash_bytes(const char *s, size_t len) {
    // FNV-1a over 8-byte words then a final mix: fast on short keys.
    uint64_t h = 0xcbf29ce484222325ull ^ len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static uint32_t pow2_at_least(uint32_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int strmap_init(strmap *m, uint32_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2);
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

void strmap_free(strmap *m) {
    free(m->slots);
    free(m->ent);
    free(m->arena.p);
    memset(m, 0, sizeof *m);
}

// Slots hold (hash high bits << 32 | entry + 1) so probes rarely touch the keys.
static uint32_t strmap_slot(const strmap *m, const char *k, size_t len, uint64_t h) {
    uint32_t i = (uint32_t)h & (m->cap - 1), tag = (uint32_t)(h >> 32);
    for (;;) {
        uint64_t sl = m->slots[i];
        if (!sl) return i;
        uint32_t e = (uint32_t)sl - 1;
        if ((uint32_t)(sl >> 32) == tag && m->ent[e].len == len && memcmp(m->arena.p + m->ent[e].off, k, len) == 0) return i;
        i = (i + 1) & (m->cap - 1);
    }
}

static int strmap_grow(strmap *m) {
    uint32_t cap = m->cap * 2;
    uint64_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    for (uint32_t e = 0; e < m->n; e++) {
        const char *k = m->arena.p + m->ent[e].off;
        uint64_t h = tok_hash_bytes(k, m->ent[e].len);
        m->slots[strmap_slot(m, k, m->ent[e].len, h)] = (h >> 32 << 32) | (e + 1);
    }
    return 0;
}

int strmap_get(const strmap *m, const char *k, size_t len) {
    if (!m->cap) return -1;
    uint64_t sl = m->slots[strmap_slot(m, k, len, tok_hash_bytes(k, len))];
    return sl ? m->ent[(uint32_t)sl - 1].val : -1;
}

int strmap_put(strmap *m, const char *k, size_t len, int val) {
    uint64_t h = tok_hash_bytes(k, len);
    uint32_t i = strmap_slot(m, k, len, h);
    if (m->slots[i]) {
        m->ent[(uint32_t)m->slots[i] - 1].val = val;
        return 0;
    }
    if (m->n == m->ncap) {
        uint32_t nc = m->ncap ? m->ncap * 2 : 64;
        struct strmap_ent *e = realloc(m->ent, nc * sizeof *e);
        if (!e) return -1;
        m->ent = e;
        m->ncap = nc;
    }
    uint32_t off = (uint32_t)m->arena.n;
    if (tbuf_put(&m->arena, k, len) < 0 || tbuf_put(&m->arena, "", 1) < 0) return -1;  // key + NUL
    m->ent[m->n] = (struct strmap_ent){off, (uint32_t)len, val};
    m->slots[i] = (h >> 32 << 32) | ++m->n;
    if (m->n * 2 > m->cap) return strmap_grow(m);
    return 0;
}

int pairmap_init(pairmap *m, uint32_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2);
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->rank = malloc(m->cap * sizeof *m->rank);
    m->out = malloc(m->cap * sizeof *m->out);
    if (!m->keys || !m->rank || !m->out) {
        pairmap_free(m);
        return -1;
    }
    return 0;
}

void pairmap_free(pairmap *m) {
    free(m->keys);
    free(m->rank);
    free(m->out);
    memset(m, 0, sizeof *m);
}

int pairmap_put(pairmap *m, int a, int b, int rank, int out) {
    if ((m->n + 1) * 2 > m->cap) {
        pairmap bigger;
        if (pairmap_init(&bigger, m->cap) < 0) return -1;
        for (uint32_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            uint64_t k = m->keys[i] - 1;
            pairmap_put(&bigger, (int)(k >> 32), (int)(uint32_t)k, m->rank[i], m->out[i]);
        }
        pairmap_free(m);
        *m = bigger;
    }
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t i = (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & (m->cap - 1);
    while (m->keys[i]) {
        if (m->keys[i] == k) return 0;  // first rank wins
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = k;
    m->rank[i] = rank;
    m->out[i] = out;
    m->n++;
    return 0;
}
