// model.h: a loaded model: config, weights (views into the mmapped safetensors, in
// their stored dtype) and the RoPE table.
#ifndef VARENT_MODEL_H
#define VARENT_MODEL_H

#include "host/formats/safetensors.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/tp.h"

typedef struct {
    wref attn_norm;          // [dim]
    wref wq, wk, wv, wo;     // [n_heads*hd, dim], [n_kv*hd, dim] x2, [dim, n_heads*hd]
    wref bq, bk, bv;         // [n_heads*hd], [n_kv*hd] x2 (Qwen2 / attention_bias)
    wref q_norm, k_norm;     // [hd] (Qwen3)
    wref ffn_norm;           // [dim]
    wref w_gate, w_up;       // [hidden_dim, dim]
    wref w_down;             // [dim, hidden_dim]
} layer_weights;

typedef struct {
    model_config cfg;
    char dir[4096];
    st_set files;
    wref embed;              // [vocab, dim]
    wref final_norm;         // [dim]
    wref lm_head;            // [vocab, dim] (the embedding when tied)
    layer_weights *layers;   // [n_layers]
    float *inv_freq;         // [head_dim/2]
    size_t n_params;
    size_t weight_bytes;     // bytes read per token (all weights, lm_head once; a rank's share when sharded)
    tp_shard tp;             // the share of the weights this process holds (size 1: all of them)
    void *tp_owned;          // the copied o_proj/down_proj columns of a shard (model_shard)
    void *placed;            // the forward's weights in huge pages (model_place), or NULL
    size_t placed_bytes;
} model;

// Floats per position in this process's KV cache (its share of the KV heads).
static inline int model_kv_dim(const model *m) { return m->tp.n_kv_heads * m->cfg.head_dim; }

int model_load(model *m, const char *dir, verr *err);
void model_free(model *m);
// Keep only rank s->rank's share of the weights (model/tp.h; size 1: no change). The
// config stays the whole model's; m->tp says what this rank holds.
int model_shard(model *m, const tp_shard *s, verr *err);
// The forward's weights (this rank's share) copied from the file mapping into one
// region of 2 MiB transparent huge pages, and the wrefs pointed at the copies: decode
// then takes a TLB miss per 2 MiB instead of per 4 KiB (model/place.c). Call after
// model_shard; a LoRA or steering set later is unaffected. model_free releases it.
int model_place(model *m, verr *err);
void model_unplace(model *m);
// The weight bytes a decode step reads on rank s->rank of an unsharded model m, as
// weight_bytes counts them for the whole (the embedding's one row aside).
size_t model_shard_bytes(const model *m, const tp_shard *s);
// SHA-256 of config.json's content and every safetensors header (names, dtypes, shapes,
// offsets), as 64 hex digits: ranks that must hold one checkpoint compare these.
int model_digest(const model *m, char out[65], verr *err);

#endif
