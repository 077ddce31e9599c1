// tp.c: the tensor-parallel plan (which heads, intermediate columns and vocabulary rows
// each rank holds).
#include "model/tp.h"

#include <stdio.h>
#include <string.h>

void tp_shard_whole(const model_config *c, tp_shard *s) {
    *s = (tp_shard){
        .rank = 0, .size = 1,
        .head0 = 0, .n_heads = c->n_heads, .kv_head0 = 0, .n_kv_heads = c->n_kv_heads,
        .ffn0 = 0, .n_ffn = c->hidden_dim, .vocab0 = 0, .n_vocab = c->vocab_size,
        .max_heads = c->n_heads, .max_vocab = c->vocab_size,
    };
}

// [r * total / n, (r + 1) * total / n): sizes differ by at most one.
static void split(int total, int r, int n, int *first, int *count) {
    *first = (int)((long)r * total / n);
    *count = (int)((long)(r + 1) * total / n) - *first;
}

// The heads of rank r, or -1 when n does not fit the head layout.
static int heads_of(const model_config *c, int r, int n, tp_shard *s) {
    int group = c->n_heads / c->n_kv_heads;
    if (n <= c->n_kv_heads) {  // whole KV groups per rank
        split(c->n_kv_heads, r, n, &s->kv_head0, &s->n_kv_heads);
        s->head0 = s->kv_head0 * group, s->n_heads = s->n_kv_heads * group;
        return 0;
    }
    int rep = n / c->n_kv_heads;  // ranks sharing one KV head
    if (n % c->n_kv_heads || group % rep) return -1;
    s->kv_head0 = r / rep, s->n_kv_heads = 1;
    s->n_heads = group / rep;
    s->head0 = s->kv_head0 * group + (r % rep) * s->n_heads;
    return 0;
}

// The degrees that work for this head layout, for the refusal message.
static void valid_degrees(const model_config *c, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    tp_shard s;
    for (int n = 1; n <= c->n_heads && used + 8 < len; n++) {
        if (heads_of(c, 0, n, &s)) continue;
        used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? ", " : "", n);
    }
}

int tp_shard_plan(const model_config *c, int rank, int n, tp_shard *s, verr *err) {
    memset(s, 0, sizeof *s);
    if (n < 1 || rank < 0 || rank >= n) return verr_set(err, "tensor parallelism: rank %d of %d is not a rank", rank, n);
    if (n == 1) {
        tp_shard_whole(c, s);
        return 0;
    }
    if (heads_of(c, 0, n, s)) {
        char ok[128];
        valid_degrees(c, ok, sizeof ok);
        return verr_set(err, "--tp %d: the model's %d query heads and %d KV heads cannot be split over %d ranks (a "
                        "degree up to the KV heads takes whole KV groups; above it, it must be a multiple of the KV "
                        "heads that divides the query heads). Degrees that work: %s", n, c->n_heads, c->n_kv_heads,
                        n, ok);
    }
    if (c->hidden_dim < n || c->vocab_size < n)
        return verr_set(err, "--tp %d: intermediate_size %d and vocab_size %d must each be at least the degree", n,
                        c->hidden_dim, c->vocab_size);
    s->rank = rank, s->size = n;
    for (int r = 0; r < n; r++) {  // every rank's share, for the gather padding
        tp_shard o = { 0 };
        heads_of(c, r, n, &o);
        split(c->vocab_size, r, n, &o.vocab0, &o.n_vocab);
        if (o.n_heads > s->max_heads) s->max_heads = o.n_heads;
        if (o.n_vocab > s->max_vocab) s->max_vocab = o.n_vocab;
    }
    heads_of(c, rank, n, s);
    split(c->hidden_dim, rank, n, &s->ffn0, &s->n_ffn);
    split(c->vocab_size, rank, n, &s->vocab0, &s->n_vocab);
    return 0;
}
