// model.c: maps HF tensor names to the layer structs, checking every shape against
// config.json so a mismatched checkpoint fails at load time, naming the tensor.
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FLOAT_TYPES ((1u << ST_F32) | (1u << ST_F16) | (1u << ST_BF16))

static wtype to_wtype(st_dtype d) { return d == ST_F32 ? WT_F32 : d == ST_F16 ? WT_F16 : WT_BF16; }

// Fetch a float tensor of the given shape (rows = 0 means 1-D [cols]).
static int get(model *m, wref *out, const char *name, int64_t rows, int64_t cols, verr *err) {
    int64_t shape[2] = { rows, cols };
    const st_tensor *t = rows ? st_set_get(&m->files, name, FLOAT_TYPES, 2, shape, err)
                              : st_set_get(&m->files, name, FLOAT_TYPES, 1, shape + 1, err);
    if (!t) return -1;
    out->data = t->data;
    out->type = to_wtype(t->dtype);
    m->n_params += (size_t)(rows ? rows : 1) * (size_t)cols;
    m->weight_bytes += t->nbytes;
    return 0;
}

static int load_layer(model *m, int l, verr *err) {
    const model_config *c = &m->cfg;
    layer_weights *w = &m->layers[l];
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    char n[256];
#define GET(field, rows, cols, fmt)                             \
    snprintf(n, sizeof n, "model.layers.%d." fmt, l);           \
    if (get(m, &w->field, n, rows, cols, err)) return -1;
    GET(attn_norm, 0, c->dim, "input_layernorm.weight");
    GET(wq, q_dim, c->dim, "self_attn.q_proj.weight");
    GET(wk, kv_dim, c->dim, "self_attn.k_proj.weight");
    GET(wv, kv_dim, c->dim, "self_attn.v_proj.weight");
    GET(wo, c->dim, q_dim, "self_attn.o_proj.weight");
    if (c->attn_bias) {
        GET(bq, 0, q_dim, "self_attn.q_proj.bias");
        GET(bk, 0, kv_dim, "self_attn.k_proj.bias");
        GET(bv, 0, kv_dim, "self_attn.v_proj.bias");
    }
    if (c->qk_norm) {
        GET(q_norm, 0, c->head_dim, "self_attn.q_norm.weight");
        GET(k_norm, 0, c->head_dim, "self_attn.k_norm.weight");
    }
    GET(ffn_norm, 0, c->dim, "post_attention_layernorm.weight");
    GET(w_gate, c->hidden_dim, c->dim, "mlp.gate_proj.weight");
    GET(w_up, c->hidden_dim, c->dim, "mlp.up_proj.weight");
    GET(w_down, c->dim, c->hidden_dim, "mlp.down_proj.weight");
#undef GET
    return 0;
}

static int load_weights(model *m, verr *err) {
    const model_config *c = &m->cfg;
    if (get(m, &m->embed, "model.embed_tokens.weight", c->vocab_size, c->dim, err) ||
        get(m, &m->final_norm, "model.norm.weight", 0, c->dim, err))
        return -1;
    // Decode reads one embedding row per token, not the table.
    m->weight_bytes -= (size_t)c->vocab_size * c->dim * wtype_size(m->embed.type);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers)
        return verr_set(err, "%s/config.json: out of memory allocating %zu bytes for num_hidden_layers = %d", m->dir,
                        (size_t)c->n_layers * sizeof *m->layers, c->n_layers);
    for (int l = 0; l < c->n_layers; l++)
        if (load_layer(m, l, err)) return -1;
    if (c->tie_embeddings || !st_set_find(&m->files, "lm_head.weight", NULL)) {
        if (!c->tie_embeddings)
            return verr_set(err, "%s: tensor 'lm_head.weight' is missing and tie_word_embeddings is false", m->dir);
        m->lm_head = m->embed;
        m->weight_bytes += (size_t)c->vocab_size * c->dim * wtype_size(m->embed.type);
    } else if (get(m, &m->lm_head, "lm_head.weight", c->vocab_size, c->dim, err)) {
        return -1;
    }
    return 0;
}

int model_load(model *m, const char *dir, verr *err) {
    memset(m, 0, sizeof *m);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return verr_set(err, "%s: model directory does not exist", dir);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    if (config_load(&m->cfg, dir, err) || st_set_open(&m->files, dir, err)) {
        model_free(m);
        return -1;
    }
    m->inv_freq = malloc(sizeof(float) * (size_t)(m->cfg.head_dim / 2));
    if (!m->inv_freq) {
        verr_set(err, "%s/config.json: out of memory allocating the RoPE table for head_dim = %d", dir, m->cfg.head_dim);
        model_free(m);
        return -1;
    }
    config_rope_inv_freq(&m->cfg, m->inv_freq);
    tp_shard_whole(&m->cfg, &m->tp);
    if (load_weights(m, err)) {
        model_free(m);
        return -1;
    }
    return 0;
}

void model_free(model *m) {
    model_unplace(m);
    st_set_close(&m->files);
    free(m->layers);
    free(m->inv_freq);
    free(m->tp_owned);
    memset(m, 0, sizeof *m);
}
