// config.c: config.json parsing. Every field is type-checked and errors name the
// file and the field, because a wrong config silently produces garbage logits.
#include "model/config.h"

#include "host/util/bounds.h"
#include "host/util/fileio.h"
#include "host/util/json_in.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static cJSON *load_json(const char *path, verr *err) {
    char *text = fileio_read_all(path, err);
    if (!text) return NULL;
    cJSON *j = json_in_parse(text, path, 1, err);
    free(text);
    return j;
}

// Integer field: required (def < 0 means required), 0..max (host/util/bounds.h) (positivity is checked by
// the caller where it matters).
static int get_int(cJSON *j, const char *path, const char *key, int def, int max, int *out, verr *err) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0) return verr_set(err, "%s: missing field '%s'", path, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0)
        return verr_set(err, "%s: field '%s' must be a non-negative integer", path, key);
    if (v->valuedouble > max)
        return verr_set(err, "%s: field '%s' is %.17g; it must be at most %d (no model has more)", path, key,
                        v->valuedouble, max);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_float(cJSON *j, const char *path, const char *key, double def, float *out, verr *err) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        *out = (float)def;
        return 0;
    }
    if (json_in_float(v, out) || !(*out > 0))
        return verr_set(err, "%s: field '%s' must be a positive number (within a float's range)", path, key);
    return 0;
}

static int get_bool(cJSON *j, const char *path, const char *key, int def, int *out, verr *err) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return *out = def, 0;
    if (!cJSON_IsBool(v)) return verr_set(err, "%s: field '%s' must be true or false", path, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int parse_arch(model_config *c, cJSON *j, const char *path, verr *err) {
    cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    cJSON *name = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
    if (!cJSON_IsString(name)) return verr_set(err, "%s: missing field 'architectures' (a list of class names)", path);
    snprintf(c->arch_name, sizeof c->arch_name, "%s", name->valuestring);
    if (strcmp(name->valuestring, "LlamaForCausalLM") == 0) c->arch = ARCH_LLAMA;
    else if (strcmp(name->valuestring, "Qwen2ForCausalLM") == 0) c->arch = ARCH_QWEN2;
    else if (strcmp(name->valuestring, "Qwen3ForCausalLM") == 0) c->arch = ARCH_QWEN3;
    else
        return verr_set(err, "%s: unsupported architecture '%s' (supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                             "Qwen3ForCausalLM)", path, name->valuestring);
    return 0;
}

static int parse_rope_scaling(model_config *c, cJSON *j, const char *path, verr *err) {
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return 0;
    if (!cJSON_IsObject(rs)) return verr_set(err, "%s: field 'rope_scaling' must be an object or null", path);
    cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(type)) return verr_set(err, "%s: rope_scaling has no 'rope_type'", path);
    if (strcmp(type->valuestring, "default") == 0) return 0;
    if (strcmp(type->valuestring, "llama3") != 0)
        return verr_set(err, "%s: unsupported rope_scaling type '%s' (supported: llama3, none)", path, type->valuestring);
    c->rope_llama3 = 1;
    if (get_float(rs, path, "factor", -1, &c->rope_factor, err) || get_float(rs, path, "low_freq_factor", -1, &c->rope_low_freq, err) ||
        get_float(rs, path, "high_freq_factor", -1, &c->rope_high_freq, err) ||
        get_int(rs, path, "original_max_position_embeddings", -1, BOUND_TOKENS, &c->rope_orig_max_pos, err))
        return -1;
    if (c->rope_factor <= 0 || c->rope_low_freq <= 0 || c->rope_high_freq <= c->rope_low_freq)
        return verr_set(err, "%s: rope_scaling needs factor, low_freq_factor < high_freq_factor", path);
    return 0;
}

// A token id field: an integer of the vocabulary.
static int token_id(const cJSON *v, const model_config *c, const char *path, const char *key, int *out, verr *err) {
    if (json_in_int32(v, 0, c->vocab_size - 1, out) == 0) return 0;
    return verr_set(err, "%s: '%s' must be a token id (an integer in 0..%d)", path, key, c->vocab_size - 1);
}

// bos_token_id; eos_token_id may be an int or a list of ints (null or absent: none).
static int parse_ids(model_config *c, cJSON *j, const char *path, verr *err) {
    cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "bos_token_id");
    if (b && !cJSON_IsNull(b) && token_id(b, c, path, "bos_token_id", &c->bos_id, err)) return -1;
    cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    if (!e || cJSON_IsNull(e)) return 0;
    if (!cJSON_IsArray(e)) return token_id(e, c, path, "eos_token_id", &c->eos_ids[0], err) ? -1 : (c->n_eos = 1, 0);
    c->n_eos = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, e) {
        if (token_id(it, c, path, "eos_token_id", &c->eos_ids[c->n_eos], err)) return -1;
        if (c->n_eos < CONFIG_MAX_EOS) c->n_eos++;
    }
    return 0;
}

// A partial_rotary_factor below 1 turns only part of each head; varent turns all of it,
// so such a model would run with wrong logits.
static int check_rotary(cJSON *j, const char *path, verr *err) {
    cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "partial_rotary_factor");
    if (!f || cJSON_IsNull(f) || (cJSON_IsNumber(f) && f->valuedouble == 1.0)) return 0;
    return verr_set(err, "%s: partial_rotary_factor is %s: partial rotary embeddings (RoPE on part of each head) "
                    "are not supported", path, cJSON_IsNumber(f) ? "not 1" : "not a number");
}

static int parse_config(model_config *c, cJSON *j, const char *path, verr *err) {
    if (parse_arch(c, j, path, err) || get_int(j, path, "hidden_size", -1, BOUND_DIM, &c->dim, err) ||
        get_int(j, path, "intermediate_size", -1, BOUND_FFN, &c->hidden_dim, err) ||
        get_int(j, path, "num_hidden_layers", -1, BOUND_LAYERS, &c->n_layers, err) ||
        get_int(j, path, "num_attention_heads", -1, BOUND_HEADS, &c->n_heads, err) ||
        get_int(j, path, "vocab_size", -1, BOUND_TOKENS, &c->vocab_size, err) ||
        get_int(j, path, "max_position_embeddings", 4096, BOUND_TOKENS, &c->max_pos, err) ||
        get_float(j, path, "rms_norm_eps", 1e-6, &c->norm_eps, err) ||
        get_float(j, path, "rope_theta", 10000.0, &c->rope_theta, err) || parse_rope_scaling(c, j, path, err))
        return -1;
    if (c->dim == 0 || c->n_heads == 0 || c->n_layers == 0 || c->vocab_size == 0 || c->hidden_dim == 0)
        return verr_set(err, "%s: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and "
                             "vocab_size must be positive", path);
    if (get_int(j, path, "num_key_value_heads", c->n_heads, BOUND_HEADS, &c->n_kv_heads, err) ||
        get_int(j, path, "head_dim", c->dim / c->n_heads, BOUND_HEADS, &c->head_dim, err))
        return -1;
    if (c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads)
        return verr_set(err, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", path,
                        c->n_heads, c->n_kv_heads);
    if (c->head_dim == 0 || c->head_dim % 2)
        return verr_set(err, "%s: head_dim (%d) must be positive and even", path, c->head_dim);
    int bias_default = c->arch == ARCH_QWEN2;
    if (get_bool(j, path, "tie_word_embeddings", 0, &c->tie_embeddings, err) ||
        get_bool(j, path, "attention_bias", bias_default, &c->attn_bias, err))
        return -1;
    if (c->arch == ARCH_QWEN2) c->attn_bias = 1;  // Qwen2 always has q/k/v biases
    c->qk_norm = c->arch == ARCH_QWEN3;
    return check_rotary(j, path, err) || parse_ids(c, j, path, err) ? -1 : 0;
}

int config_load(model_config *c, const char *dir, verr *err) {
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *j = load_json(path, err);
    if (!j) return -1;
    int rc = parse_config(c, j, path, err);
    cJSON_Delete(j);
    if (rc) return rc;
    // generation_config.json overrides the stop tokens when present; one that is there
    // but cannot be read (a FIFO, a directory, invalid JSON) is an error, not ignored.
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT) return 0;
    cJSON *g = load_json(path, err);
    rc = g ? parse_ids(c, g, path, err) : -1;
    cJSON_Delete(g);
    return rc;
}

void config_rope_inv_freq(const model_config *c, float *inv_freq) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        // HF computes the base frequencies in fp32; so do we, then scale in double.
        float f32 = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        double f = f32;
        if (c->rope_llama3) {
            double wavelen = 2 * M_PI / f;
            double low_wavelen = c->rope_orig_max_pos / c->rope_low_freq;
            double high_wavelen = c->rope_orig_max_pos / c->rope_high_freq;
            if (wavelen > low_wavelen) {
                f = f / c->rope_factor;
            } else if (wavelen >= high_wavelen) {  // smooth band between the two
                double smooth = (c->rope_orig_max_pos / wavelen - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                f = (1 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

const char *config_arch_label(model_arch a) {
    return a == ARCH_QWEN3 ? "qwen3" : a == ARCH_QWEN2 ? "qwen2" : "llama";
}
