// gguf_check.c: gguf_check_model, gguf_check_tok_ids (host/formats/gguf_check.h).
#include "host/formats/gguf_check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host/util/bounds.h"

// The GGUF key "ARCH.name" of a hyperparameter, for messages.
static const char *key(const gguf_hparams *hp, const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", hp->arch, name);
    return buf;
}

static int check_range(const gguf_file *g, const gguf_hparams *hp, const char *name, int64_t v, int64_t lo,
                       int64_t hi, verr *err) {
    char k[128];
    if (v >= lo && v <= hi) return 0;
    return verr_set(err, "%s: metadata key '%s' is %lld; it must be %lld..%lld", g->path, key(hp, name, k, sizeof k),
                    (long long)v, (long long)lo, (long long)hi);
}

static int check_positive(const gguf_file *g, const gguf_hparams *hp, const char *name, double v, verr *err) {
    char k[128];
    if (isfinite(v) && v > 0) return 0;
    return verr_set(err, "%s: metadata key '%s' is %g; it must be a positive finite number", g->path,
                    key(hp, name, k, sizeof k), v);
}

static int check_bounds(const gguf_file *g, const gguf_hparams *hp, verr *err) {
    char k[128];
    if (check_range(g, hp, "block_count", hp->n_layer, 1, BOUND_LAYERS, err) ||
        check_range(g, hp, "embedding_length", hp->n_embd, 1, BOUND_DIM, err) ||
        check_range(g, hp, "feed_forward_length", hp->n_ff, 1, BOUND_FFN, err) ||
        check_range(g, hp, "attention.head_count", hp->n_head, 1, BOUND_HEADS, err) ||
        check_range(g, hp, "attention.head_count_kv", hp->n_head_kv, 1, hp->n_head, err) ||
        check_range(g, hp, "attention.key_length", hp->head_dim, 2, BOUND_HEADS, err) ||
        check_range(g, hp, "context_length", hp->n_ctx, 1, BOUND_TOKENS, err) ||
        check_positive(g, hp, "rope.freq_base", hp->rope_theta, err) ||
        check_positive(g, hp, "attention.layer_norm_rms_epsilon", hp->eps, err))
        return -1;
    if (hp->head_dim % 2)
        return verr_set(err, "%s: the head size %lld ('%s', or embedding_length / head_count) must be even for RoPE",
                        g->path, (long long)hp->head_dim, key(hp, "attention.key_length", k, sizeof k));
    if (hp->n_rot != hp->head_dim)  // varent turns every dimension: a partial rotary model would run, wrongly
        return verr_set(err, "%s: metadata key '%s' is %lld but the head size is %lld: partial rotary embeddings "
                        "(RoPE on part of each head) are not supported", g->path,
                        key(hp, "rope.dimension_count", k, sizeof k), (long long)hp->n_rot, (long long)hp->head_dim);
    if (hp->n_vocab < 1 || hp->n_vocab > BOUND_TOKENS)
        return verr_set(err, "%s: tensor 'token_embd.weight' has %lld rows (the vocabulary); at most %d", g->path,
                        (long long)hp->n_vocab, BOUND_TOKENS);
    return 0;
}

// One expected tensor: its GGUF dims (ne[0] first) and, for each, what implies it.
typedef struct {
    const char *name;  // "blk.%d.attn_q.weight" or a plain name
    int n_dims;
    int64_t ne[2];
    const char *why[2];
} want;

// need: why the tensor must be there, for the message when it is missing (NULL: the
// layer count).
static int check_tensor(const gguf_file *g, const gguf_hparams *hp, const want *w, int layer, const char *need,
                        verr *err) {
    char name[128], count[160];
    snprintf(name, sizeof name, w->name, layer);
    snprintf(count, sizeof count, "%s.block_count is %lld", hp->arch, (long long)hp->n_layer);
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) return verr_set(err, "%s: tensor '%s' is missing (%s)", g->path, name, need ? need : count);
    if ((int)t->n_dims != w->n_dims)
        return verr_set(err, "%s: tensor '%s' has %u dimensions, expected %d", g->path, name, t->n_dims, w->n_dims);
    for (int d = 0; d < w->n_dims; d++) {
        if ((int64_t)t->ne[d] != w->ne[d])
            return verr_set(err, "%s: tensor '%s' has ne[%d] = %llu but %s = %lld", g->path, name, d,
                            (unsigned long long)t->ne[d], w->why[d], (long long)w->ne[d]);
    }
    return 0;
}

static int check_layer(const gguf_file *g, const gguf_hparams *hp, int l, verr *err) {
    char kd[96], kf[96], kq[200], kkv[200];
    int64_t D = hp->n_embd, F = hp->n_ff, Q = hp->n_head * hp->head_dim, KV = hp->n_head_kv * hp->head_dim;
    snprintf(kd, sizeof kd, "%s.embedding_length", hp->arch);
    snprintf(kf, sizeof kf, "%s.feed_forward_length", hp->arch);
    snprintf(kq, sizeof kq, "%s.attention.head_count x key_length (%lld x %lld)", hp->arch, (long long)hp->n_head,
             (long long)hp->head_dim);
    snprintf(kkv, sizeof kkv, "%s.attention.head_count_kv x key_length (%lld x %lld)", hp->arch,
             (long long)hp->n_head_kv, (long long)hp->head_dim);
    const want ws[] = {
        {"blk.%d.attn_norm.weight", 1, {D, 0}, {kd, NULL}},   {"blk.%d.attn_q.weight", 2, {D, Q}, {kd, kq}},
        {"blk.%d.attn_k.weight", 2, {D, KV}, {kd, kkv}},      {"blk.%d.attn_v.weight", 2, {D, KV}, {kd, kkv}},
        {"blk.%d.attn_output.weight", 2, {Q, D}, {kq, kd}},   {"blk.%d.ffn_norm.weight", 1, {D, 0}, {kd, NULL}},
        {"blk.%d.ffn_gate.weight", 2, {D, F}, {kd, kf}},      {"blk.%d.ffn_up.weight", 2, {D, F}, {kd, kf}},
        {"blk.%d.ffn_down.weight", 2, {F, D}, {kf, kd}},
    };
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (check_tensor(g, hp, &ws[i], l, NULL, err)) return -1;
    const want bias[] = {
        {"blk.%d.attn_q.bias", 1, {Q, 0}, {kq, NULL}}, {"blk.%d.attn_k.bias", 1, {KV, 0}, {kkv, NULL}},
        {"blk.%d.attn_v.bias", 1, {KV, 0}, {kkv, NULL}},
    };
    const char *why_bias = strcmp(hp->arch, "qwen2") == 0 ? "a qwen2 model has q/k/v biases in every layer"
                                                          : "blk.0.attn_q.bias is there: every layer has q/k/v biases";
    for (size_t i = 0; hp->attn_bias && i < sizeof bias / sizeof bias[0]; i++)
        if (check_tensor(g, hp, &bias[i], l, why_bias, err)) return -1;
    const want qk[] = {
        {"blk.%d.attn_q_norm.weight", 1, {hp->head_dim, 0}, {"the head size", NULL}},
        {"blk.%d.attn_k_norm.weight", 1, {hp->head_dim, 0}, {"the head size", NULL}},
    };
    for (size_t i = 0; strcmp(hp->arch, "qwen3") == 0 && i < 2; i++)
        if (check_tensor(g, hp, &qk[i], l, "a qwen3 model has q/k norms in every layer", err)) return -1;
    return 0;
}

// A layer tensor the architecture has no use for would be dropped silently by the
// loader (a bias after blk.0 had none, q/k norms outside qwen3): the model would run
// without it, wrongly.
static int check_unused(const gguf_file *g, const gguf_hparams *hp, verr *err) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *name = g->tensors[i].name, *dot = strncmp(name, "blk.", 4) ? NULL : strchr(name + 4, '.');
        if (!dot) continue;
        int bias = !strcmp(dot, ".attn_q.bias") || !strcmp(dot, ".attn_k.bias") || !strcmp(dot, ".attn_v.bias");
        int norm = !strcmp(dot, ".attn_q_norm.weight") || !strcmp(dot, ".attn_k_norm.weight");
        if (bias && !hp->attn_bias)
            return verr_set(err, "%s: tensor '%s' is a bias, but blk.0.attn_q.bias is missing: a %s model has q/k/v "
                            "biases in every layer or in none", g->path, name, hp->arch);
        if (norm && strcmp(hp->arch, "qwen3") != 0)
            return verr_set(err, "%s: tensor '%s' is a q/k norm, which a %s model does not have (qwen3 does)", g->path,
                            name, hp->arch);
    }
    return 0;
}

int gguf_check_model(const gguf_file *g, const gguf_hparams *hp, verr *err) {
    if (check_bounds(g, hp, err)) return -1;
    char kd[96];
    snprintf(kd, sizeof kd, "%s.embedding_length", hp->arch);
    const want top[] = {
        {"token_embd.weight", 2, {hp->n_embd, hp->n_vocab}, {kd, "the vocabulary size"}},
        {"output_norm.weight", 1, {hp->n_embd, 0}, {kd, NULL}},
        {"output.weight", 2, {hp->n_embd, hp->n_vocab}, {kd, "token_embd.weight's rows"}},
    };
    for (int i = 0; i < (hp->tied ? 2 : 3); i++)
        if (check_tensor(g, hp, &top[i], 0, NULL, err)) return -1;
    for (int l = 0; l < hp->n_layer; l++)
        if (check_layer(g, hp, l, err)) return -1;
    return check_unused(g, hp, err);
}

int gguf_check_tok_ids(const gguf_file *g, const gguf_hparams *hp, const tok_ids *ti, uint64_t n_tokens, verr *err) {
    if (n_tokens > (uint64_t)hp->n_vocab)
        return verr_set(err, "%s: tokenizer.ggml.tokens has %llu entries but token_embd.weight only %lld rows",
                        g->path, (unsigned long long)n_tokens, (long long)hp->n_vocab);
    const char *names[4] = {"bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id"};
    int64_t ids[4] = {ti->bos, ti->eos, ti->pad, ti->unk};
    int64_t n = n_tokens ? (int64_t)n_tokens : hp->n_vocab;
    for (int k = 0; k < 4; k++) {
        if (ids[k] != -1 && (ids[k] < 0 || ids[k] >= n))
            return verr_set(err, "%s: metadata key 'tokenizer.ggml.%s' is %lld, not a token id (0..%lld)", g->path,
                            names[k], (long long)ids[k], (long long)n - 1);
    }
    return 0;
}
