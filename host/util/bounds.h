// bounds.h: the largest sizes varent accepts from a model file (docs/robustness.md,
// "Bounds"): beyond any published model, and small enough that every size derived
// from them fits. config.json (model/config.c) and the converters
// (host/formats/gguf_check.c) check the same numbers.
#ifndef VARENT_BOUNDS_H
#define VARENT_BOUNDS_H

#define BOUND_DIM (1 << 16)      // hidden_size / embedding_length
#define BOUND_FFN (1 << 20)      // intermediate_size / feed_forward_length
#define BOUND_LAYERS 1024        // num_hidden_layers / block_count
#define BOUND_HEADS 1024         // attention heads, key-value heads, head_dim
#define BOUND_TOKENS (1 << 24)   // vocab_size, context length (2^24: the tokenizer's id limit)

#endif
