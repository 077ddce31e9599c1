// place.c: the CPU forward's weights copied out of the file mapping into one anonymous
// region backed by transparent huge pages (model_place). Decode streams every weight
// once per token: from the page cache's 4 KiB pages each page of weights costs a TLB
// miss and a page walk; SmolLM2-135M decoded about 1.2x faster from 2 MiB pages on the
// development machine (docs/benchmarks.md). 2 MiB pages leave one walk per 2 MiB. The mapping stays open
// for everything else (headers, the untied embedding table, of which decode reads one
// row); `--mmap` keeps the old behaviour.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "host/util/hugemem.h"
#include "model/model.h"

#define PLACE_ALIGN 64  // every tensor starts on a cache line

typedef struct {
    wref *w;
    size_t n;  // elements
} place_item;

// The tensors a forward reads, with this rank's element counts (model_shard_bytes's
// shapes). items: room for 14 per layer plus 2.
static int place_list(model *m, place_item *items) {
    const model_config *c = &m->cfg;
    const tp_shard *s = &m->tp;
    size_t D = (size_t)c->dim, hd = (size_t)c->head_dim, q = (size_t)s->n_heads * hd, kv = (size_t)s->n_kv_heads * hd;
    size_t ffn = (size_t)s->n_ffn;
    int k = 0;
    for (int l = 0; l < c->n_layers; l++) {
        layer_weights *w = &m->layers[l];
        place_item li[] = {
            { &w->attn_norm, D }, { &w->wq, q * D }, { &w->wk, kv * D }, { &w->wv, kv * D }, { &w->wo, D * q },
            { &w->bq, q },        { &w->bk, kv },    { &w->bv, kv },     { &w->q_norm, hd }, { &w->k_norm, hd },
            { &w->ffn_norm, D },  { &w->w_gate, ffn * D }, { &w->w_up, ffn * D }, { &w->w_down, D * ffn },
        };
        for (size_t i = 0; i < sizeof li / sizeof li[0]; i++)
            if (li[i].w->data) items[k++] = li[i];
    }
    items[k++] = (place_item){ &m->final_norm, D };
    items[k++] = (place_item){ &m->lm_head, (size_t)s->n_vocab * D };
    return k;
}

static size_t place_round(size_t n, size_t a) { return (n + a - 1) / a * a; }

int model_place(model *m, verr *err) {
    if (m->placed) return 0;
    int cap = 14 * m->cfg.n_layers + 2;
    place_item *items = malloc(sizeof *items * (size_t)cap);
    if (!items) return verr_set(err, "%s: out of memory listing the weights", m->dir);
    int n = place_list(m, items);
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += place_round(items[i].n * wtype_size(items[i].w->type), PLACE_ALIGN);
    char *base = huge_alloc(bytes);
    if (!base) {
        free(items);
        return verr_set(err, "%s: out of memory copying %zu bytes of weights into huge pages (--mmap reads them from "
                        "the file instead)", m->dir, bytes);
    }
    const void *embed = m->embed.data, *lm_head_src = m->lm_head.data;
    char *dst = base;
    for (int i = 0; i < n; i++) {
        size_t b = items[i].n * wtype_size(items[i].w->type);
        memcpy(dst, items[i].w->data, b);
        items[i].w->data = dst;
        dst += place_round(b, PLACE_ALIGN);
    }
    if (embed == lm_head_src && m->tp.n_vocab == m->cfg.vocab_size) m->embed = m->lm_head;  // tied: one copy
    free(items);
    if (bytes >= ((size_t)2 << 20)) mprotect(base, bytes, PROT_READ);  // read-only, as in the mapping
    m->placed = base;
    m->placed_bytes = bytes;
    return 0;
}

void model_unplace(model *m) {
    huge_free(m->placed, m->placed_bytes);
    m->placed = NULL;
    m->placed_bytes = 0;
}
