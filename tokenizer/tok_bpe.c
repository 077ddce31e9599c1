// tok_bpe.c: the BPE model on one pre-tokenized piece. Merges run on a linked list
// of symbols with a binary heap of candidate pairs ordered by (rank, position), so a
// long piece costs O(n log n). A per-call cache remembers pieces already encoded.
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct bpe_cache {
    strmap map;   // piece -> offset into ids
    id_list ids;  // [count, id...] records
};

enum { CACHE_MAX_PIECE = 256, CACHE_MAX_ENTRIES = 1 << 20 };

bpe_cache *bpe_cache_new(void) {
    bpe_cache *c = calloc(1, sizeof *c);
    if (c && strmap_init(&c->map, 4096) < 0) {
        free(c);
        return NULL;
    }
    return c;
}

void bpe_cache_free(bpe_cache *c) {
    if (!c) return;
    strmap_free(&c->map);
    free(c->ids.p);
    free(c);
}

static void cache_put(bpe_cache *c, const char *s, size_t n, const int *ids, int cnt) {
    if (!c || n > CACHE_MAX_PIECE) return;
    if (c->map.n >= CACHE_MAX_ENTRIES) {  // bound memory on huge inputs
        strmap_free(&c->map);
        c->ids.n = 0;
        if (strmap_init(&c->map, 4096) < 0) return;
    }
    int at = c->ids.n;
    if (id_list_push(&c->ids, cnt) < 0) return;
    for (int i = 0; i < cnt; i++)
        if (id_list_push(&c->ids, ids[i]) < 0) {
            c->ids.n = at;
            return;
        }
    if (strmap_put(&c->map, s, n, at) < 0) c->ids.n = at;
}

typedef struct {
    int rank, pos, a, b;
} cand;

typedef struct {
    cand *h;
    int n, cap;
} heap;

static int cand_less(const cand *x, const cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static int heap_push(heap *h, cand c) {
    if (h->n == h->cap) {
        int nc = h->cap ? h->cap * 2 : 64;
        cand *p = realloc(h->h, (size_t)nc * sizeof *p);
        if (!p) return -1;
        h->h = p;
        h->cap = nc;
    }
    int i = h->n++;
    while (i > 0 && cand_less(&c, &h->h[(i - 1) / 2])) {
        h->h[i] = h->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->h[i] = c;
    return 0;
}

static cand heap_pop(heap *h) {
    cand top = h->h[0], last = h->h[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, m = i;
        const cand *best = &last;
        if (l < h->n && cand_less(&h->h[l], best)) m = l, best = &h->h[l];
        if (l + 1 < h->n && cand_less(&h->h[l + 1], best)) m = l + 1;
        if (m == i) break;
        h->h[i] = h->h[m];
        i = m;
    }
    if (h->n) h->h[i] = last;
    return top;
}

typedef struct {
    int *id, *prev, *next;  // [n] symbol id and list links (-1 = none)
    int n;
} symbols;

static int try_pair(const struct tokenizer *t, const symbols *sy, heap *h, int left) {
    if (left < 0 || sy->next[left] < 0) return 0;
    int a = sy->id[left], b = sy->id[sy->next[left]];
    int slot = pairmap_find(&t->merges, a, b);
    if (slot < 0) return 0;
    return heap_push(h, (cand){t->merges.rank[slot], left, a, b});
}

static int merge_all(const struct tokenizer *t, symbols *sy) {
    heap h = {0};
    for (int i = 0; i + 1 < sy->n; i++)
        if (try_pair(t, sy, &h, i) < 0) goto oom;
    while (h.n) {
        cand c = heap_pop(&h);
        int l = c.pos, r = sy->next[l];
        if (sy->id[l] != c.a || r < 0 || sy->id[r] != c.b) continue;  // stale
        sy->id[l] = t->merges.out[pairmap_find(&t->merges, c.a, c.b)];
        sy->next[l] = sy->next[r];
        if (sy->next[r] >= 0) sy->prev[sy->next[r]] = l;
        sy->id[r] = -1;
        if (try_pair(t, sy, &h, sy->prev[l]) < 0 || try_pair(t, sy, &h, l) < 0) goto oom;
    }
    free(h.h);
    return 0;
oom:
    free(h.h);
    return -1;
}

// Initial symbols: bytes for byte-level models, else characters with byte fallback.
static int init_symbols(const struct tokenizer *t, const char *s, size_t n, id_list *ids) {
    size_t i = 0;
    int last_unk = 0;
    while (i < n) {
        if (t->byte_level) {
            int id = t->byte_ids[(unsigned char)s[i++]];
            if (id_list_push(ids, id >= 0 ? id : t->unk_id) < 0) return -1;
            continue;
        }
        uint32_t cp;
        int cl = tok_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (cl == 0) cl = 1;  // an invalid byte stands alone
        int id = strmap_get(&t->vocab, s + i, (size_t)cl);
        if (id >= 0) {
            if (id_list_push(ids, id) < 0) return -1;
            last_unk = 0;
        } else if (t->byte_fallback) {
            for (int k = 0; k < cl; k++)
                if (id_list_push(ids, t->byte_ids[(unsigned char)s[i + k]]) < 0) return -1;
            last_unk = 0;
        } else if (!(t->fuse_unk && last_unk)) {
            if (id_list_push(ids, t->unk_id) < 0) return -1;
            last_unk = 1;
        }
        i += (size_t)cl;
    }
    return 0;
}

int tok_bpe_piece(const struct tokenizer *t, const char *s, size_t n, bpe_cache *c, id_list *out,
                  verr *err) {
    if (!n) return 0;
    if (c && n <= CACHE_MAX_PIECE) {
        int at = strmap_get(&c->map, s, n);
        if (at >= 0) {
            for (int i = 0; i < c->ids.p[at]; i++)
                if (id_list_push(out, c->ids.p[at + 1 + i]) < 0) goto oom;
            return 0;
        }
    }
    if (t->ignore_merges) {
        int id = strmap_get(&t->vocab, s, n);
        if (id >= 0) return id_list_push(out, id) < 0 ? verr_set(err, "tokenizer: out of memory") : 0;
    }
    id_list init = {0};
    symbols sy = {0};
    if (init_symbols(t, s, n, &init) < 0) goto oom_free;
    for (int i = 0; i < init.n; i++)
        if (init.p[i] < 0) {
            free(init.p);
            return verr_set(err, "tokenizer: byte 0x%02x at offset %d of a piece has no token and the "
                            "model has no unk_token", (unsigned char)s[i], i);
        }
    sy.n = init.n;
    sy.id = init.p;
    sy.prev = malloc((size_t)sy.n * sizeof(int));
    sy.next = malloc((size_t)sy.n * sizeof(int));
    if (!sy.prev || !sy.next) goto oom_free;
    for (int i = 0; i < sy.n; i++) sy.prev[i] = i - 1, sy.next[i] = i + 1 < sy.n ? i + 1 : -1;
    if (merge_all(t, &sy) < 0) goto oom_free;
    int start = out->n;
    for (int i = 0; i >= 0 && sy.n; i = sy.next[i])
        if (id_list_push(out, sy.id[i]) < 0) goto oom_free;
    cache_put(c, s, n, out->p + start, out->n - start);
    free(sy.id), free(sy.prev), free(sy.next);
    return 0;
oom_free:
    free(init.p), free(sy.prev), free(sy.next);
oom:
    return verr_set(err, "tokenizer: out of memory in BPE");
}
