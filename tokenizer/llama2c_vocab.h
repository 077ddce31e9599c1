// llama2c_vocab.h: converts a llama2.c tokenizer.bin into an HF-style Llama-2
// tokenizer.json + tokenizer_config.json, so one tokenizer path serves every model.
#ifndef VARENT_LLAMA2C_VOCAB_H
#define VARENT_LLAMA2C_VOCAB_H

#include "host/util/err.h"

// tok_bin_path: int32 max_token_length, then per token float score, int32 len,
// bytes. Writes out_dir/tokenizer.json and out_dir/tokenizer_config.json
// atomically (tmp + rename). Merges are derived so that rank-ordered BPE
// reproduces llama2.c's score-greedy merging. Returns 0, or -1 with err.
int llama2c_vocab_to_tokenizer_json(const char *tok_bin_path, int vocab_size, const char *out_dir, verr *err);
// The same tokenizer.json as text (malloc'd into *json), written nowhere.
int llama2c_vocab_build_json(const char *tok_bin_path, int vocab_size, char **json, verr *err);
// The tokenizer_config.json that goes with it (static text).
const char *llama2c_vocab_config_json(void);

#endif
