// convert_gguf.c: convert_gguf (host/formats/convert.h), behind `varent convert gguf`.
// Turns a llama.cpp GGUF (llama, qwen2, qwen3) into a Hugging Face style directory:
// model.safetensors, config.json, generation_config.json, tokenizer.json,
// tokenizer_config.json. Everything is built in memory first and written by
// model_dir_write, so a failure leaves OUT_DIR as it was.
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/formats/convert.h"
#include "host/formats/dequant.h"
#include "host/formats/gguf.h"
#include "host/formats/gguf_check.h"
#include "host/formats/model_dir.h"
#include "host/formats/st_write.h"
#include "host/util/parse.h"
#include "kernels/ops.h"
#include "tokenizer/tokenizer.h"

static const char *arch_class(const char *arch) {
    if (strcmp(arch, "llama") == 0) return "LlamaForCausalLM";
    if (strcmp(arch, "qwen2") == 0) return "Qwen2ForCausalLM";
    if (strcmp(arch, "qwen3") == 0) return "Qwen3ForCausalLM";
    return NULL;
}

// ---- hyperparameters --------------------------------------------------------------

static int get_req_int(const gguf_file *g, const char *arch, const char *name, int64_t *out, verr *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    int r = gguf_get_int(g, key, out, err);
    if (r < 0) return -1;
    if (r == 0) return verr_set(err, "%s: missing metadata key '%s'", g->path, key);
    if (*out <= 0 || *out > (1 << 30)) {
        return verr_set(err, "%s: metadata key '%s' has an invalid value %lld", g->path, key, (long long)*out);
    }
    return 0;
}

static int get_heads_kv(const gguf_file *g, const char *arch, int64_t n_head, int64_t *out, verr *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) { *out = n_head; return 0; }
    if (kv->type == GGUF_ARRAY && kv->arr_n > 0 && kv->arr_type != GGUF_STRING && kv->arr_type != GGUF_ARRAY &&
        kv->arr_type != GGUF_F32 && kv->arr_type != GGUF_F64) {
        *out = gguf_arr_int(kv, 0);
        for (uint64_t i = 1; i < kv->arr_n; i++) {
            if (gguf_arr_int(kv, i) != *out) return verr_set(err, "%s: '%s' differs between layers (not supported)", g->path, key);
        }
    } else if (gguf_get_int(g, key, out, err) < 0) {
        return -1;
    }
    if (*out <= 0 || n_head % *out) return verr_set(err, "%s: '%s' = %lld does not divide the head count %lld",
                                                   g->path, key, (long long)*out, (long long)n_head);
    return 0;
}

static int load_hparams(const gguf_file *g, gguf_hparams *hp, verr *err) {
    const char *a = hp->arch;
    if (get_req_int(g, a, "block_count", &hp->n_layer, err) || get_req_int(g, a, "embedding_length", &hp->n_embd, err) ||
        get_req_int(g, a, "feed_forward_length", &hp->n_ff, err) ||
        get_req_int(g, a, "attention.head_count", &hp->n_head, err) ||
        get_heads_kv(g, a, hp->n_head, &hp->n_head_kv, err)) return -1;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.key_length", a);
    hp->head_dim = hp->n_embd / hp->n_head;
    if (gguf_get_int(g, key, &hp->head_dim, err) < 0) return -1;
    snprintf(key, sizeof key, "%s.context_length", a);
    hp->n_ctx = 2048;
    if (gguf_get_int(g, key, &hp->n_ctx, err) < 0) return -1;
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    hp->rope_theta = 10000.0;
    if (gguf_get_float(g, key, &hp->rope_theta, err) < 0) return -1;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    int r = gguf_get_float(g, key, &hp->eps, err);
    if (r < 0) return -1;
    if (r == 0) return verr_set(err, "%s: missing metadata key '%s'", g->path, key);
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2) return verr_set(err, "%s: missing 2-D tensor 'token_embd.weight'", g->path);
    hp->n_vocab = (int64_t)emb->ne[1];
    hp->tied = gguf_find_tensor(g, "output.weight") == NULL;
    // Qwen2 always has q/k/v biases (model/config.c); Llama and Qwen3 may (attention_bias)
    hp->attn_bias = strcmp(a, "qwen2") == 0 || gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    snprintf(key, sizeof key, "%s.rope.dimension_count", a);
    hp->n_rot = hp->head_dim;
    return gguf_get_int(g, key, &hp->n_rot, err) < 0 ? -1 : 0;
}

// The shortest decimal that reads back as the same float32 (1e-05, not 9.99999974e-06):
// GGUF stores most hyperparameters as f32.
static double f32_clean(double v) {
    char buf[64];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        double r = strtod(buf, NULL);
        if ((float)r == (float)v) return r;
    }
    return v;
}

// ---- rope scaling -----------------------------------------------------------------

// Llama 3 scaling as llama.cpp stores it: a rope_freqs tensor of per-frequency
// divisors (1 in the kept high band, `factor` in the slowed low band, a blend in
// between). Recover the HF parameters assuming the published low/high factors (1, 4):
// factor is the largest divisor, the original context follows from a blended entry,
// and the result must reproduce every entry.
static double llama3_divisor(double wavelen, double factor, double lo, double hi, double orig) {
    if (wavelen < orig / hi) return 1;
    if (wavelen > orig / lo) return factor;
    double s = (orig / wavelen - lo) / (hi - lo);
    return 1 / ((1 - s) / factor + s);
}

static cJSON *rope_llama3(const gguf_file *g, const gguf_hparams *hp, const gguf_tensor *t, verr *err) {
    size_t n = (size_t)t->ne[0];
    if (t->type != GGML_F32 || !t->data || t->n_dims != 1 || n * 2 != (size_t)hp->head_dim) {
        verr_set(err, "%s: tensor 'rope_freqs.weight' must be F32 with head_dim/2 = %lld entries", g->path,
                 (long long)hp->head_dim / 2);
        return NULL;
    }
    float *f = malloc(n * sizeof *f);
    if (!f) { verr_set(err, "out of memory"); return NULL; }
    memcpy(f, t->data, n * 4);
    double factor = 1, lo = 1, hi = 4, orig = 8192, bad = 0;
    for (size_t i = 0; i < n; i++) factor = fmax(factor, f[i]);
    for (size_t i = 0; i < n; i++) {
        double wavelen = 2 * M_PI * pow(hp->rope_theta, 2.0 * i / hp->head_dim);
        if (f[i] > 1 + 1e-4 && f[i] < factor - 1e-4) {  // blended: solve for the original context
            double s = (1 / f[i] - 1 / factor) / (1 - 1 / factor);
            orig = round(wavelen * (s * (hi - lo) + lo));
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        double wavelen = 2 * M_PI * pow(hp->rope_theta, 2.0 * i / hp->head_dim);
        double want = llama3_divisor(wavelen, factor, lo, hi, orig);
        bad = fmax(bad, fabs(want - f[i]) / want);
    }
    free(f);
    if (bad > 1e-3) {
        verr_set(err, "%s: rope_freqs.weight does not match Llama 3 rope scaling (low_freq_factor 1, high_freq_factor 4)",
                 g->path);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "rope_type", "llama3");
    cJSON_AddNumberToObject(o, "factor", f32_clean(factor));
    cJSON_AddNumberToObject(o, "low_freq_factor", lo);
    cJSON_AddNumberToObject(o, "high_freq_factor", hi);
    cJSON_AddNumberToObject(o, "original_max_position_embeddings", orig);
    return o;
}

// Returns cJSON null when there is no scaling, NULL (err set) on error.
static cJSON *rope_scaling(const gguf_file *g, const gguf_hparams *hp, verr *err) {
    const gguf_tensor *rf = gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) return rope_llama3(g, hp, rf, err);
    char key[128];
    const char *type = NULL;
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    if (gguf_get_str(g, key, &type, err) < 0) return NULL;
    if (!type || strcmp(type, "none") == 0) return cJSON_CreateNull();
    double factor = 1, orig = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", hp->arch);
    if (gguf_get_float(g, key, &factor, err) < 0) return NULL;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", hp->arch);
    if (gguf_get_float(g, key, &orig, err) < 0) return NULL;
    if (strcmp(type, "linear") != 0 && strcmp(type, "yarn") != 0) {
        verr_set(err, "%s: rope scaling type '%s' is not supported (linear, yarn)", g->path, type);
        return NULL;
    }
    if (!isfinite(factor) || factor <= 0 || !isfinite(orig) || orig < 0 || orig > (1 << 24)) {
        verr_set(err, "%s: '%s.rope.scaling.factor' (%g) must be positive and finite, and "
                 "'%s.rope.scaling.original_context_length' (%g) 0..16777216", g->path, hp->arch, factor, hp->arch, orig);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "rope_type", type);
    cJSON_AddNumberToObject(o, "factor", f32_clean(factor));
    if (orig > 0) cJSON_AddNumberToObject(o, "original_max_position_embeddings", orig);
    return o;
}

// ---- config.json / generation_config.json -----------------------------------------

static void add_id(cJSON *o, const char *name, int64_t id) {
    if (id >= 0) cJSON_AddNumberToObject(o, name, (double)id);
}

static cJSON *build_config(const gguf_file *g, const gguf_hparams *hp, const tok_ids *ti, int f32, verr *err) {
    cJSON *rs = rope_scaling(g, hp, err);
    if (!rs) return NULL;
    cJSON *c = cJSON_CreateObject();
    cJSON *archs = cJSON_CreateArray();
    if (!c || !archs) { cJSON_Delete(c); cJSON_Delete(archs); cJSON_Delete(rs); verr_set(err, "out of memory"); return NULL; }
    cJSON_AddItemToArray(archs, cJSON_CreateString(arch_class(hp->arch)));
    cJSON_AddItemToObject(c, "architectures", archs);
    cJSON_AddStringToObject(c, "model_type", hp->arch);
    cJSON_AddNumberToObject(c, "hidden_size", (double)hp->n_embd);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)hp->n_ff);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)hp->n_layer);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)hp->n_head);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)hp->n_head_kv);
    cJSON_AddNumberToObject(c, "head_dim", (double)hp->head_dim);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "rope_theta", f32_clean(hp->rope_theta));
    cJSON_AddNumberToObject(c, "rms_norm_eps", f32_clean(hp->eps));
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)hp->n_ctx);
    cJSON_AddItemToObject(c, "rope_scaling", rs);
    cJSON_AddNumberToObject(c, "vocab_size", (double)hp->n_vocab);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", hp->tied);
    cJSON_AddBoolToObject(c, "attention_bias", hp->attn_bias);
    add_id(c, "bos_token_id", ti->bos);
    add_id(c, "eos_token_id", ti->eos);
    cJSON_AddStringToObject(c, "torch_dtype", f32 ? "float32" : "bfloat16");
    return c;
}

static cJSON *build_gen_config(const tok_ids *ti) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    add_id(c, "bos_token_id", ti->bos);
    add_id(c, "eos_token_id", ti->eos);
    add_id(c, "pad_token_id", ti->pad);
    return c;
}

static int load_tok_ids(const gguf_file *g, tok_ids *ti, verr *err) {
    ti->bos = ti->eos = ti->pad = ti->unk = -1;
    int64_t v = 0;
    if (gguf_get_int(g, "tokenizer.ggml.bos_token_id", &ti->bos, err) < 0 ||
        gguf_get_int(g, "tokenizer.ggml.eos_token_id", &ti->eos, err) < 0 ||
        gguf_get_int(g, "tokenizer.ggml.padding_token_id", &ti->pad, err) < 0 ||
        gguf_get_int(g, "tokenizer.ggml.unknown_token_id", &ti->unk, err) < 0) return -1;
    ti->add_bos = ti->add_eos = 0;
    int r = gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v, err);
    if (r < 0) return -1;
    ti->add_bos = r && v;
    v = 0;
    r = gguf_get_int(g, "tokenizer.ggml.add_eos_token", &v, err);
    if (r < 0) return -1;
    ti->add_eos = r && v;
    return 0;
}

// ---- tokenizer.json / tokenizer_config.json ---------------------------------------

enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

// Split patterns of the byte-level BPE families llama.cpp names in tokenizer.ggml.pre.
static const char *RE_LLAMA3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *RE_QWEN2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static cJSON *byte_level(int add_prefix_space, int trim_offsets, int use_regex) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

static cJSON *seq_pretok(cJSON *first, cJSON *second) {
    cJSON *o = cJSON_CreateObject(), *list = cJSON_CreateArray();
    if (!o || !list || !first || !second) {
        cJSON_Delete(o); cJSON_Delete(list); cJSON_Delete(first); cJSON_Delete(second);
        return NULL;
    }
    cJSON_AddStringToObject(o, "type", "Sequence");
    cJSON_AddItemToArray(list, first);
    cJSON_AddItemToArray(list, second);
    cJSON_AddItemToObject(o, "pretokenizers", list);
    return o;
}

static cJSON *split_regex(const char *re) {
    cJSON *o = cJSON_CreateObject(), *pat = cJSON_CreateObject();
    if (!o || !pat) { cJSON_Delete(o); cJSON_Delete(pat); return NULL; }
    cJSON_AddStringToObject(o, "type", "Split");
    cJSON_AddStringToObject(pat, "Regex", re);
    cJSON_AddItemToObject(o, "pattern", pat);
    cJSON_AddStringToObject(o, "behavior", "Isolated");
    cJSON_AddBoolToObject(o, "invert", 0);
    return o;
}

// The pre-tokenizer of the HF tokenizer that llama.cpp's `pre` name stands for.
// Sets *nfc for Qwen (NFC normaliser) and *ignore_merges for Llama 3.
static cJSON *pre_tokenizer(const char *pre, int *nfc, int *ignore_merges) {
    *nfc = *ignore_merges = 0;
    if (strcmp(pre, "smollm") == 0) {
        cJSON *digits = cJSON_CreateObject();
        if (digits) {
            cJSON_AddStringToObject(digits, "type", "Digits");
            cJSON_AddBoolToObject(digits, "individual_digits", 1);
        }
        return seq_pretok(digits, byte_level(0, 1, 1));
    }
    if (strcmp(pre, "llama-bpe") == 0 || strcmp(pre, "llama3") == 0) {
        *ignore_merges = 1;
        return seq_pretok(split_regex(RE_LLAMA3), byte_level(0, 1, 0));
    }
    if (strcmp(pre, "qwen2") == 0) {
        *nfc = 1;
        return seq_pretok(split_regex(RE_QWEN2), byte_level(0, 0, 0));
    }
    return byte_level(0, 1, 1);  // "gpt2"/"default": GPT-2's own regex inside ByteLevel
}

// A string set for de-duplicating vocab entries (a JSON object must not repeat keys).
typedef struct {
    const gguf_str **slot;
    size_t cap;
} str_set;

static uint64_t str_hash(const gguf_str *s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (uint64_t i = 0; i < s->len; i++) h = (h ^ (uint8_t)s->p[i]) * 1099511628211ull;
    return h;
}

// 1 if inserted, 0 if already present, -1 out of memory.
static int str_set_add(str_set *set, const gguf_str *s) {
    for (size_t i = str_hash(s) & (set->cap - 1);; i = (i + 1) & (set->cap - 1)) {
        const gguf_str *o = set->slot[i];
        if (!o) { set->slot[i] = s; return 1; }
        if (o->len == s->len && memcmp(o->p, s->p, s->len) == 0) return 0;
    }
}

static cJSON *make_str(const gguf_str *s) {
    char *tmp = malloc(s->len + 1);
    if (!tmp) return NULL;
    memcpy(tmp, s->p, s->len);
    tmp[s->len] = 0;
    cJSON *j = cJSON_CreateString(tmp);
    free(tmp);
    return j;
}

static cJSON *added_token(int64_t id, const gguf_str *s, int special) {
    cJSON *o = cJSON_CreateObject(), *content = make_str(s);
    if (!o || !content) { cJSON_Delete(o); cJSON_Delete(content); return NULL; }
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddItemToObject(o, "content", content);
    cJSON_AddBoolToObject(o, "single_word", 0);
    cJSON_AddBoolToObject(o, "lstrip", 0);
    cJSON_AddBoolToObject(o, "rstrip", 0);
    cJSON_AddBoolToObject(o, "normalized", 0);
    cJSON_AddBoolToObject(o, "special", special);
    return o;
}

// vocab {token: id} (first occurrence wins) and added_tokens (control + user-defined).
static int build_vocab(const gguf_file *g, const gguf_kv *toks, const gguf_kv *types, cJSON *vocab,
                       cJSON *added, verr *err) {
    str_set set = {NULL, 1};
    while (set.cap < toks->arr_n * 2 + 2) set.cap <<= 1;
    if (!(set.slot = calloc(set.cap, sizeof *set.slot))) return verr_set(err, "out of memory");
    int rc = 0;
    for (uint64_t i = 0; i < toks->arr_n && rc == 0; i++) {
        const gguf_str *s = &toks->arr_strs[i];
        int64_t type = types ? gguf_arr_int(types, i) : TOK_NORMAL;
        if (type == TOK_CONTROL || type == TOK_USER) {
            cJSON *a = added_token((int64_t)i, s, type == TOK_CONTROL);
            if (!a) rc = verr_set(err, "out of memory");
            else cJSON_AddItemToArray(added, a);
        }
        int fresh = str_set_add(&set, s);
        if (fresh == 1) {
            char *key = malloc(s->len + 1);
            cJSON *num = cJSON_CreateNumber((double)i);
            if (!key || !num) { free(key); cJSON_Delete(num); rc = verr_set(err, "out of memory"); break; }
            memcpy(key, s->p, s->len);
            key[s->len] = 0;
            cJSON_AddItemToObject(vocab, key, num);
            free(key);
        }
    }
    free(set.slot);
    (void)g;
    return rc;
}

static cJSON *build_model(const gguf_file *g, const gguf_kv *toks, const gguf_kv *types, const gguf_kv *merges,
                          int ignore_merges, cJSON *added, verr *err) {
    cJSON *m = cJSON_CreateObject(), *vocab = cJSON_CreateObject(), *ml = cJSON_CreateArray();
    if (!m || !vocab || !ml) goto oom;
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", 0);
    cJSON_AddBoolToObject(m, "byte_fallback", 0);
    cJSON_AddBoolToObject(m, "ignore_merges", ignore_merges);
    cJSON_AddItemToObject(m, "vocab", vocab);
    cJSON_AddItemToObject(m, "merges", ml);
    if (build_vocab(g, toks, types, vocab, added, err)) { cJSON_Delete(m); return NULL; }
    for (uint64_t i = 0; merges && i < merges->arr_n; i++) {
        cJSON *s = make_str(&merges->arr_strs[i]);
        if (!s) { cJSON_Delete(m); verr_set(err, "out of memory"); return NULL; }
        cJSON_AddItemToArray(ml, s);
    }
    return m;
oom:
    cJSON_Delete(m); cJSON_Delete(vocab); cJSON_Delete(ml);
    verr_set(err, "out of memory");
    return NULL;
}

// TemplateProcessing that prepends BOS (how HF Llama tokenizers add it).
static cJSON *bos_template(int64_t bos, const char *bos_str) {
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"%s\",\"type_id\":0}},"
             "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[{\"SpecialToken\":{\"id\":\"%s\",\"type_id\":0}},"
             "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"%s\",\"type_id\":1}},"
             "{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],\"special_tokens\":{}}", "BOS", "BOS", "BOS");
    cJSON *o = cJSON_Parse(buf), *st = cJSON_CreateObject(), *ids = cJSON_CreateArray(), *toks = cJSON_CreateArray();
    if (!o || !st || !ids || !toks) { cJSON_Delete(o); cJSON_Delete(st); cJSON_Delete(ids); cJSON_Delete(toks); return NULL; }
    // Replace the placeholder id "BOS" with the token string.
    cJSON *lists[2] = {cJSON_GetObjectItem(o, "single"), cJSON_GetObjectItem(o, "pair")}, *it;
    for (int k = 0; k < 2; k++) {
        cJSON_ArrayForEach(it, lists[k]) {
            cJSON *sp = cJSON_GetObjectItem(it, "SpecialToken");
            if (sp) cJSON_ReplaceItemInObject(sp, "id", cJSON_CreateString(bos_str));
        }
    }
    cJSON_AddStringToObject(st, "id", bos_str);
    cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)bos));
    cJSON_AddItemToArray(toks, cJSON_CreateString(bos_str));
    cJSON_AddItemToObject(st, "ids", ids);
    cJSON_AddItemToObject(st, "tokens", toks);
    cJSON_AddItemToObject(cJSON_GetObjectItem(o, "special_tokens"), bos_str, st);
    return o;
}

static char *token_str(const gguf_kv *toks, int64_t id) {
    if (id < 0 || (uint64_t)id >= toks->arr_n) return NULL;
    const gguf_str *s = &toks->arr_strs[id];
    char *p = malloc(s->len + 1);
    if (p) { memcpy(p, s->p, s->len); p[s->len] = 0; }
    return p;
}

static int check_tok_kv(const gguf_file *g, const gguf_kv *kv, const char *key, uint32_t elem, uint64_t n, verr *err) {
    if (!kv) return 0;
    int ok = kv->type == GGUF_ARRAY && (elem == GGUF_STRING ? kv->arr_type == GGUF_STRING
                                        : kv->arr_type != GGUF_STRING && kv->arr_type != GGUF_ARRAY &&
                                          kv->arr_type != GGUF_F32 && kv->arr_type != GGUF_F64);
    if (!ok) return verr_set(err, "%s: offset %llu: key '%s' must be an array of %s", g->path,
                             (unsigned long long)kv->offset, key, elem == GGUF_STRING ? "strings" : "integers");
    if (n && kv->arr_n != n) return verr_set(err, "%s: key '%s' has %llu entries, expected %llu (one per token)",
                                             g->path, key, (unsigned long long)kv->arr_n, (unsigned long long)n);
    return 0;
}

static cJSON *build_tok_config(const gguf_file *g, const gguf_kv *toks, const tok_ids *ti, int64_t n_ctx, cJSON *added) {
    cJSON *c = cJSON_CreateObject(), *dec = cJSON_CreateObject(), *it;
    if (!c || !dec) { cJSON_Delete(c); cJSON_Delete(dec); return NULL; }
    cJSON_AddBoolToObject(c, "add_bos_token", ti->add_bos);
    cJSON_AddBoolToObject(c, "add_eos_token", ti->add_eos);
    const char *names[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    int64_t ids[4] = {ti->bos, ti->eos, ti->pad, ti->unk};
    for (int k = 0; k < 4; k++) {
        char *s = token_str(toks, ids[k]);
        if (s) cJSON_AddStringToObject(c, names[k], s);
        else cJSON_AddNullToObject(c, names[k]);
        free(s);
    }
    const char *tmpl = NULL;
    verr e;
    if (gguf_get_str(g, "tokenizer.chat_template", &tmpl, &e) == 1) cJSON_AddStringToObject(c, "chat_template", tmpl);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", 0);
    cJSON_AddNumberToObject(c, "model_max_length", (double)n_ctx);
    cJSON_AddStringToObject(c, "tokenizer_class", "PreTrainedTokenizerFast");
    cJSON_ArrayForEach(it, added) {
        char id[32];
        snprintf(id, sizeof id, "%d", cJSON_GetObjectItem(it, "id")->valueint);
        cJSON *d = cJSON_Duplicate(it, 1);
        if (d) { cJSON_DeleteItemFromObject(d, "id"); cJSON_AddItemToObject(dec, id, d); }
    }
    cJSON_AddItemToObject(c, "added_tokens_decoder", dec);
    return c;
}

// 0 with *tok = NULL when the GGUF has no byte-level BPE vocabulary (warned by caller).
static int build_tokenizer(const gguf_file *g, const tok_ids *ti, int64_t n_ctx, cJSON **tok, cJSON **cfg, verr *err) {
    *tok = *cfg = NULL;
    const char *model = NULL, *pre = "default";
    if (gguf_get_str(g, "tokenizer.ggml.model", &model, err) < 0 || gguf_get_str(g, "tokenizer.ggml.pre", &pre, err) < 0)
        return -1;
    if (!model || strcmp(model, "gpt2") != 0) return 0;
    const gguf_kv *toks = gguf_find(g, "tokenizer.ggml.tokens"), *types = gguf_find(g, "tokenizer.ggml.token_type");
    const gguf_kv *merges = gguf_find(g, "tokenizer.ggml.merges");
    if (!toks) return verr_set(err, "%s: tokenizer.ggml.model is gpt2 but 'tokenizer.ggml.tokens' is missing", g->path);
    if (check_tok_kv(g, toks, "tokenizer.ggml.tokens", GGUF_STRING, 0, err) ||
        check_tok_kv(g, types, "tokenizer.ggml.token_type", GGUF_I32, toks->arr_n, err) ||
        check_tok_kv(g, merges, "tokenizer.ggml.merges", GGUF_STRING, 0, err)) return -1;
    int nfc, ignore_merges;
    cJSON *t = cJSON_CreateObject(), *added = cJSON_CreateArray(), *pt = pre_tokenizer(pre, &nfc, &ignore_merges);
    if (!t || !added || !pt) { cJSON_Delete(t); cJSON_Delete(added); cJSON_Delete(pt); return verr_set(err, "out of memory"); }
    cJSON *m = build_model(g, toks, types, merges, ignore_merges, added, err);
    if (!m) { cJSON_Delete(t); cJSON_Delete(added); cJSON_Delete(pt); return -1; }
    cJSON_AddStringToObject(t, "version", "1.0");
    cJSON_AddNullToObject(t, "truncation");
    cJSON_AddNullToObject(t, "padding");
    cJSON_AddItemToObject(t, "added_tokens", added);
    if (nfc) {
        cJSON *n = cJSON_CreateObject();
        if (n) cJSON_AddStringToObject(n, "type", "NFC");
        cJSON_AddItemToObject(t, "normalizer", n ? n : cJSON_CreateNull());
    } else {
        cJSON_AddNullToObject(t, "normalizer");
    }
    cJSON_AddItemToObject(t, "pre_tokenizer", pt);
    char *bos_str = ti->add_bos ? token_str(toks, ti->bos) : NULL;
    cJSON *post = bos_str ? bos_template(ti->bos, bos_str) : byte_level(1, 0, 1);
    free(bos_str);
    cJSON_AddItemToObject(t, "post_processor", post ? post : cJSON_CreateNull());
    cJSON_AddItemToObject(t, "decoder", byte_level(1, 1, 1));
    cJSON_AddItemToObject(t, "model", m);
    *cfg = build_tok_config(g, toks, ti, n_ctx, added);
    if (!*cfg) { cJSON_Delete(t); return verr_set(err, "out of memory"); }
    *tok = t;
    return 0;
}

// ---- tensors ----------------------------------------------------------------------

static const struct { const char *gguf, *hf; } layer_names[] = {
    {"attn_q", "self_attn.q_proj"},         {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},         {"attn_output", "self_attn.o_proj"},
    {"attn_norm", "input_layernorm"},       {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},          {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},          {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},
};

// HF name of a GGUF tensor: 1 mapped, 0 skipped (no HF tensor), -1 unknown.
static int map_name(const char *name, int64_t n_layer, char *out, size_t cap) {
    const char *top[][2] = {{"token_embd.weight", "model.embed_tokens.weight"},
                            {"output_norm.weight", "model.norm.weight"},
                            {"output.weight", "lm_head.weight"}};
    for (size_t i = 0; i < 3; i++) {
        if (strcmp(name, top[i][0]) == 0) return snprintf(out, cap, "%s", top[i][1]), 1;
    }
    if (strcmp(name, "rope_freqs.weight") == 0) return 0;  // becomes config rope_scaling
    if (strncmp(name, "blk.", 4) != 0) return -1;
    long layer;
    const char *end = parse_index(name + 4, 1 << 30, &layer);
    if (!end || *end != '.' || layer >= n_layer) return -1;
    const char *mid = end + 1, *dot = strrchr(mid, '.');
    if (!dot || (strcmp(dot, ".weight") != 0 && strcmp(dot, ".bias") != 0)) return -1;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        size_t n = strlen(layer_names[i].gguf);
        if ((size_t)(dot - mid) == n && strncmp(mid, layer_names[i].gguf, n) == 0) {
            snprintf(out, cap, "model.layers.%ld.%s%s", layer, layer_names[i].hf, dot);
            return 1;
        }
    }
    return -1;
}

// llama.cpp reorders each head's q/k rows from rotate-half [x0..x(d/2-1), y0..] to
// interleaved pairs [x0, y0, x1, y1, ...]; put them back. w is [rows, cols].
static int unpermute_rows(float *w, int64_t rows, int64_t cols, int64_t n_head, const char *name,
                          const char *path, verr *err) {
    if (n_head <= 0 || rows % n_head || (rows / n_head) % 2) {
        return verr_set(err, "%s: tensor '%s': %lld rows do not split into %lld heads of even size", path, name,
                        (long long)rows, (long long)n_head);
    }
    int64_t d = rows / n_head, half = d / 2;
    size_t head_bytes = (size_t)(d * cols) * sizeof(float);
    float *tmp = malloc(head_bytes);
    if (!tmp) return verr_set(err, "out of memory");
    for (int64_t h = 0; h < n_head; h++) {
        float *head = w + h * d * cols;
        for (int64_t i = 0; i < half; i++) {
            memcpy(tmp + i * cols, head + 2 * i * cols, (size_t)cols * sizeof(float));
            memcpy(tmp + (i + half) * cols, head + (2 * i + 1) * cols, (size_t)cols * sizeof(float));
        }
        memcpy(head, tmp, head_bytes);
    }
    free(tmp);
    return 0;
}

static int convert_tensor(const gguf_file *g, const gguf_hparams *hp, const gguf_tensor *t, const char *hf,
                          int f32, st_writer *w, verr *err) {
    if (!dq_supported(t->type) || !t->data) {
        return verr_set(err, "%s: tensor '%s' has unsupported type %s (%u); supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 "
                        "Q5_0 Q5_1 Q6_K", g->path, t->name, dq_type_name(t->type), t->type);
    }
    int64_t shape[GGUF_MAX_DIMS], n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        shape[d] = (int64_t)t->ne[t->n_dims - 1 - d];  // GGUF lists dims fastest-first
        n *= shape[d];
    }
    float *buf = malloc((size_t)n * sizeof(float));
    if (!buf) return verr_set(err, "%s: out of memory for tensor '%s' (%lld elements)", g->path, t->name, (long long)n);
    int rc = dq_to_f32(t->type, t->data, buf, (size_t)n, err);
    if (rc) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        verr_set(err, "%s: tensor '%s': %s", g->path, t->name, why);
    }
    int is_q = strstr(t->name, ".attn_q.") != NULL, is_k = strstr(t->name, ".attn_k.") != NULL;
    if (!rc && strcmp(hp->arch, "llama") == 0 && (is_q || is_k)) {
        int64_t cols = t->n_dims == 2 ? (int64_t)t->ne[0] : 1, rows = n / cols;
        rc = unpermute_rows(buf, rows, cols, is_q ? hp->n_head : hp->n_head_kv, t->name, g->path, err);
    }
    if (!rc && f32) {
        rc = st_writer_add(w, hf, "F32", shape, (int)t->n_dims, buf, (size_t)n * 4, err);
    } else if (!rc) {
        uint16_t *h = malloc((size_t)n * 2);
        if (!h) rc = verr_set(err, "%s: out of memory for tensor '%s'", g->path, t->name);
        for (int64_t i = 0; h && i < n; i++) h[i] = f32_to_bf16(buf[i]);
        if (h) rc = st_writer_add(w, hf, "BF16", shape, (int)t->n_dims, h, (size_t)n * 2, err);
        free(h);
    }
    free(buf);
    return rc;
}

static void report(const convert_progress *prog, long done, long total) {
    if (prog && prog->fn) prog->fn(prog->ud, done, total);
}

static int convert_tensors(const gguf_file *g, const gguf_hparams *hp, int f32, st_writer *w, int *count,
                           const convert_progress *prog, verr *err) {
    char hf[256];
    *count = 0;
    long total = (long)g->n_tensors + 1;  // + the write
    report(prog, 0, total);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        int r = map_name(t->name, hp->n_layer, hf, sizeof hf);
        if (r < 0) return verr_set(err, "%s: tensor '%s' has no Hugging Face equivalent (unknown name)", g->path, t->name);
        if (r == 0) continue;
        if (convert_tensor(g, hp, t, hf, f32, w, err)) return -1;
        ++*count;
        report(prog, (long)i + 1, total);
    }
    return 0;
}

// ---- output -----------------------------------------------------------------------

enum { OUT_CONFIG, OUT_GEN, OUT_TOK, OUT_TOKCFG, OUT_N };
static const char *out_names[OUT_N] = {"config.json", "generation_config.json", "tokenizer.json",
                                       "tokenizer_config.json"};

// The JSON files as text (pretty, tokenizer.json compact), each with a final newline.
static int render_outputs(cJSON *const json[OUT_N], char *text[OUT_N], verr *err) {
    for (int i = 0; i < OUT_N; i++) {
        if (!json[i]) continue;
        char *s = i == OUT_TOK ? cJSON_PrintUnformatted(json[i]) : cJSON_Print(json[i]);
        size_t n = s ? strlen(s) : 0;
        text[i] = s ? malloc(n + 2) : NULL;
        if (text[i]) memcpy(text[i], s, n), memcpy(text[i] + n, "\n", 2);
        cJSON_free(s);
        if (!text[i]) return verr_set(err, "out of memory printing %s", out_names[i]);
    }
    return 0;
}

// The tokenizer.json about to be written loads as `run` will load it: merges name
// tokens of the vocabulary, ids in range (issue 22, row 17).
static int check_tokenizer(const gguf_file *g, const char *text, verr *err) {
    if (!text) return 0;
    tokenizer *t = tokenizer_load_text(text, strlen(text), "tokenizer.json", err);
    if (t) return tokenizer_free(t), 0;
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return verr_set(err, "%s: tokenizer.ggml.tokens and tokenizer.ggml.merges make an invalid tokenizer: %s", g->path,
                    why);
}

// Everything through model_dir_write: nothing is written unless all is ready.
static int write_outputs(const char *dir, char *const text[OUT_N], st_writer *w, verr *err) {
    model_dir_file files[OUT_N];
    for (int i = 0; i < OUT_N; i++) files[i] = (model_dir_file){ out_names[i], text[i] };
    return model_dir_write(dir, files, OUT_N, w, err);
}

static uint64_t n_tokens(const gguf_file *g) {
    const gguf_kv *kv = gguf_find(g, "tokenizer.ggml.tokens");
    return kv && kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING ? kv->arr_n : 0;
}

// general.architecture into hp->arch: 0, or -1 with err.
static int read_arch(const gguf_file *g, gguf_hparams *hp, verr *err) {
    int r = gguf_get_str(g, "general.architecture", &hp->arch, err);
    if (r == 0) verr_set(err, "%s: missing metadata key 'general.architecture'", g->path);
    return r > 0 ? 0 : -1;
}

int convert_gguf(const char *in, const char *out, int f32, const convert_progress *prog, convert_summary *sum,
                 verr *err) {
    gguf_file *g = gguf_open(in, err);
    if (!g) return -1;
    gguf_hparams hp = {0};
    tok_ids ti;
    cJSON *json[OUT_N] = {0};
    char *text[OUT_N] = {0};
    st_writer *w = NULL;
    int rc = -1, n_tensors = 0;
    if (read_arch(g, &hp, err)) goto done;
    if (!arch_class(hp.arch)) {
        verr_set(err, "%s: architecture '%s' is not supported (llama, qwen2, qwen3)", g->path, hp.arch);
        goto done;
    }
    if (load_hparams(g, &hp, err) || gguf_check_model(g, &hp, err) || load_tok_ids(g, &ti, err) ||
        gguf_check_tok_ids(g, &hp, &ti, n_tokens(g), err)) goto done;
    if (!(json[OUT_CONFIG] = build_config(g, &hp, &ti, f32, err))) goto done;
    if (!(json[OUT_GEN] = build_gen_config(&ti))) { verr_set(err, "out of memory"); goto done; }
    if (build_tokenizer(g, &ti, hp.n_ctx, &json[OUT_TOK], &json[OUT_TOKCFG], err)) goto done;
    if (render_outputs(json, text, err) || check_tokenizer(g, text[OUT_TOK], err)) goto done;
    if (!(w = st_writer_new())) { verr_set(err, "out of memory"); goto done; }
    if (convert_tensors(g, &hp, f32, w, &n_tensors, prog, err)) goto done;
    if (write_outputs(out, text, w, err)) goto done;
    report(prog, (long)g->n_tensors + 1, (long)g->n_tensors + 1);
    sum->n_tensors = n_tensors;
    sum->n_layers = (long long)hp.n_layer;
    sum->arch_class = arch_class(hp.arch);
    sum->has_tokenizer = json[OUT_TOK] != NULL;
    rc = 0;
done:
    for (int i = 0; i < OUT_N; i++) cJSON_Delete(json[i]), free(text[i]);
    st_writer_free(w);
    gguf_close(g);
    return rc;
}

// The tokenizer files' texts (text[OUT_TOK], text[OUT_TOKCFG]) from the metadata: 1, 0
// when the GGUF has no byte-level BPE vocabulary, -1 with err.
static int tokenizer_texts(const gguf_file *g, char *text[OUT_N], verr *err) {
    gguf_hparams hp = {0};
    tok_ids ti;
    cJSON *json[OUT_N] = {0};
    int rc = read_arch(g, &hp, err) || load_hparams(g, &hp, err) || load_tok_ids(g, &ti, err) ||
             build_tokenizer(g, &ti, hp.n_ctx, &json[OUT_TOK], &json[OUT_TOKCFG], err) ? -1 : 0;
    if (rc == 0 && json[OUT_TOK]) rc = render_outputs(json, text, err) || check_tokenizer(g, text[OUT_TOK], err) ? -1 : 1;
    for (int i = 0; i < OUT_N; i++) cJSON_Delete(json[i]);
    return rc;
}

// The tokenizer alone: what convert_gguf writes of it, from the metadata (no tensor is read).
int convert_gguf_tokenizer(const char *in, const char *out, verr *err) {
    gguf_file *g = gguf_open(in, err);
    if (!g) return -1;
    char *text[OUT_N] = {0};
    int rc = tokenizer_texts(g, text, err);
    if (rc == 1) {
        model_dir_file files[2] = { { out_names[OUT_TOK], text[OUT_TOK] }, { out_names[OUT_TOKCFG], text[OUT_TOKCFG] } };
        rc = model_dir_write(out, files, 2, NULL, err) ? -1 : 1;
    }
    for (int i = 0; i < OUT_N; i++) free(text[i]);
    gguf_close(g);
    return rc;
}
