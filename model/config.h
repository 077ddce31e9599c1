// config.h: the model hyper-parameters read from a HF config.json (and
// generation_config.json when present).
#ifndef VARENT_CONFIG_H
#define VARENT_CONFIG_H

#include "host/util/err.h"

typedef enum { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3 } model_arch;

#define CONFIG_MAX_EOS 8

typedef struct {
    model_arch arch;
    char arch_name[64];  // e.g. "LlamaForCausalLM"
    int dim;             // hidden_size
    int hidden_dim;      // intermediate_size
    int n_layers, n_heads, n_kv_heads, head_dim;
    int vocab_size;
    int max_pos;         // max_position_embeddings
    float norm_eps;      // rms_norm_eps
    float rope_theta;
    int rope_llama3;     // rope_scaling type llama3
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_max_pos;
    int tie_embeddings;
    int attn_bias;       // q/k/v biases (Qwen2, or attention_bias)
    int qk_norm;         // per-head RMSNorm on q and k (Qwen3)
    int bos_id;          // -1 if none
    int eos_ids[CONFIG_MAX_EOS];
    int n_eos;
} model_config;

// dir: the model directory holding config.json.
int config_load(model_config *c, const char *dir, verr *err);
// inv_freq[head_dim/2] for RoPE, including llama3 frequency scaling.
void config_rope_inv_freq(const model_config *c, float *inv_freq);
const char *config_arch_label(model_arch a);

#endif
