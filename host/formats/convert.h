// convert.h: converters from other checkpoint formats to a Hugging Face model directory
// (config.json, generation_config.json, model.safetensors, tokenizer files). Library
// code: no argument parsing and no messages; `varent convert` (host/cli/convert.c)
// parses the command line and reports.
#ifndef VARENT_CONVERT_H
#define VARENT_CONVERT_H

#include "host/util/err.h"

typedef struct {
    int n_tensors;
    long long n_layers;
    const char *arch_class;  // "LlamaForCausalLM", ... (static)
    int has_tokenizer;       // 0: the GGUF has no byte-level BPE vocabulary; no tokenizer files written
} convert_summary;

// Progress of a long conversion: fn(ud, done, total) after each tensor, the last step
// being the write of the directory. fn draws; the converter prints nothing itself.
typedef struct {
    void (*fn)(void *ud, long done, long total);
    void *ud;
} convert_progress;

// A llama.cpp GGUF (llama, qwen2, qwen3) to out_dir, weights as f32 or bf16. prog may
// be NULL.
int convert_gguf(const char *gguf_path, const char *out_dir, int f32, const convert_progress *prog,
                 convert_summary *sum, verr *err);
// The tokenizer.json and tokenizer_config.json that convert_gguf writes, alone, into
// out_dir (created; its other files are left alone), from the GGUF's metadata: 1, 0
// when the GGUF has no byte-level BPE vocabulary, -1 with err.
int convert_gguf_tokenizer(const char *gguf_path, const char *out_dir, verr *err);
// A llama2.c legacy (v0) checkpoint and its tokenizer.bin to out_dir, as f32 or bf16.
// prog may be NULL.
int convert_llama2c(const char *ckpt, const char *tok, const char *out_dir, int bf16, const convert_progress *prog,
                    verr *err);

#endif
