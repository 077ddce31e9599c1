// gguf_check.h: checks a GGUF's hyperparameters against their bounds and against its
// tensors before `convert gguf` writes anything (issue 22, row 17), as the loader
// (model/model.c) checks a model directory. Every error names the GGUF key or tensor.
#ifndef VARENT_GGUF_CHECK_H
#define VARENT_GGUF_CHECK_H

#include <stdint.h>

#include "host/formats/gguf.h"
#include "host/util/err.h"

typedef struct {
    const char *arch;      // "llama", "qwen2", "qwen3"
    int64_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_ctx, n_vocab;
    int64_t n_rot;         // rope.dimension_count: the dims of each head RoPE turns (head_dim: all)
    double rope_theta, eps;
    int tied, attn_bias;
} gguf_hparams;

// Token ids from tokenizer.ggml.*; -1 when absent.
typedef struct {
    int64_t bos, eos, pad, unk;
    int add_bos, add_eos;
} tok_ids;

// Every size within host/util/bounds.h, rope.freq_base and the RMS epsilon positive
// and finite, RoPE over whole heads (partial rotary is not supported), every tensor
// the architecture needs (qwen2: q/k/v biases; qwen3: q/k norms) present with the
// shape the hyperparameters imply, and none it would ignore. 0, or -1 with err naming
// the key or the tensor.
int gguf_check_model(const gguf_file *g, const gguf_hparams *hp, verr *err);
// The token ids (bos, eos, padding, unknown) name tokens of the vocabulary, and the
// vocabulary fits token_embd.weight. n_tokens: tokenizer.ggml.tokens' length (0: none).
int gguf_check_tok_ids(const gguf_file *g, const gguf_hparams *hp, const tok_ids *ti, uint64_t n_tokens, verr *err);

#endif
