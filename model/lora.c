// lora.c: see lora.h.
#include "model/lora.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/util/fileio.h"
#include "host/util/json_in.h"
#include "host/util/parse.h"
#include "model/lora_targets.h"

static const char *const proj_names[LORA_N_PROJ] = { "q_proj", "k_proj", "v_proj", "o_proj",
                                                     "gate_proj", "up_proj", "down_proj" };

const char *lora_proj_name(lora_proj p) { return proj_names[p]; }

void lora_proj_dims(const model_config *c, lora_proj p, int *n_in, int *n_out) {
    int q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    static const int in_is[LORA_N_PROJ] = { 0, 0, 0, 1, 0, 0, 2 };  // 0 dim, 1 q_dim, 2 hidden
    int ins[3] = { c->dim, q_dim, c->hidden_dim };
    int outs[LORA_N_PROJ] = { q_dim, kv_dim, kv_dim, c->dim, c->hidden_dim, c->hidden_dim, c->dim };
    *n_in = ins[in_is[p]], *n_out = outs[p];
}

int lora_max_rank(const lora_use *u, int n) {
    int r = 0;
    for (int i = 0; i < n; i++)
        if (u[i].a->r > r) r = u[i].a->r;
    return r;
}

// ---- adapter_config.json ------------------------------------------------------------

// A refused or malformed key: "DIR/adapter_config.json: 'KEY' WHY".
static int cfg_err(const char *path, const char *key, const char *why, verr *err) {
    return verr_set(err, "%s: '%s' %s", path, key, why);
}

static int is_empty(const cJSON *v) {
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child) ||
           (cJSON_IsString(v) && !v->valuestring[0]);
}

// The keys that would change the math beyond W x + c B A x are refused by name.
static int check_refused(const cJSON *j, const char *path, verr *err) {
    static const struct {
        const char *key, *why;
    } refused[] = {
        { "use_dora", "is set: DoRA adapters are not supported (only plain LoRA)" },
        { "modules_to_save", "is set: adapters that replace whole modules are not supported" },
        { "rank_pattern", "is set: per-module ranks are not supported" },
        { "alpha_pattern", "is set: per-module alphas are not supported" },
        { "fan_in_fan_out", "is true: only Linear layers (not GPT-2 Conv1D) are supported" },
        // PEFT variants whose adapters are not W x + c B A x on every token:
        { "alora_invocation_tokens", "is set: activated LoRA (aLoRA) adapts only the tokens from its invocation "
                                     "sequence on; not supported" },
        { "layer_replication", "is set: adapters that replicate layers are not supported" },
        { "lora_bias", "is true: a bias on lora_B is not supported" },
        { "trainable_token_indices", "is set: trainable token embeddings are not supported" },
        { "target_parameters", "is set: adapters of raw parameters (MoE experts) are not supported" },
        { "use_bdlora", "is set: block-diagonal LoRA (BD-LoRA) is not supported" },
        { "use_qalora", "is true: QALoRA (pooled inputs) is not supported" },
        { "arrow_config", "is set: Arrow routing between adapters is not supported" },
        { "kasa_config", "is set: KaSA (which truncates the base weights) is not supported" },
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (!is_empty(cJSON_GetObjectItemCaseSensitive(j, refused[i].key)))
            return cfg_err(path, refused[i].key, refused[i].why, err);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (b && !cJSON_IsNull(b) && !(cJSON_IsString(b) && !strcmp(b->valuestring, "none")))
        return cfg_err(path, "bias", "is not \"none\": trained biases are not supported", err);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    if (t && !(cJSON_IsString(t) && !strcmp(t->valuestring, "LORA")))
        return cfg_err(path, "peft_type", "is not \"LORA\"", err);
    return 0;
}

// The parsed config into a and *targets (which borrows from *doc, freed by the caller).
static int read_config(lora_adapter *a, const char *dir, cJSON **doc, lora_targets *targets, verr *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = fileio_read_all(path, err);
    if (!text) return -1;
    cJSON *j = *doc = json_in_parse(text, path, 1, err);
    free(text);
    if (!j) return -1;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r"), *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "use_rslora");
    if (json_in_int32(r, 1, 65536, &a->r)) return cfg_err(path, "r", "must be an integer rank in 1..65536", err);
    if (!cJSON_IsNumber(al) || !isfinite(al->valuedouble)) return cfg_err(path, "lora_alpha", "must be a number", err);
    if (rs && !cJSON_IsBool(rs) && !cJSON_IsNull(rs)) return cfg_err(path, "use_rslora", "must be a boolean", err);
    a->alpha = al->valuedouble, a->rslora = cJSON_IsTrue(rs);
    a->scaling = a->alpha / (a->rslora ? sqrt((double)a->r) : (double)a->r);
    if (!(fabs(a->scaling) <= FLT_MAX)) {  // the forwards take it as a float
        char why[200];
        snprintf(why, sizeof why, "is %g: its scaling (lora_alpha / %s) of %g is beyond a float's range", a->alpha,
                 a->rslora ? "sqrt(r)" : "r", a->scaling);
        return cfg_err(path, "lora_alpha", why, err);
    }
    if (check_refused(j, path, err)) return -1;
    return lora_targets_read(targets, j, path, err);
}

int lora_check_scale(const lora_adapter *a, double scale, verr *err) {
    if (isfinite(scale) && fabs(scale * a->scaling) <= FLT_MAX) return 0;
    return verr_set(err, "%s: the scale %g times the adapter's scaling %g (lora_alpha %g) is beyond a float's range",
                    a->dir, scale, a->scaling, a->alpha);
}

// ---- adapter_model.safetensors ------------------------------------------------------

// "base_model.model.model.layers.L.(self_attn|mlp).PROJ.lora_(A|B)[.default].weight":
// 0 with *layer, *proj, *is_b; -1 when the name is not of that form.
static int parse_name(const char *name, int *layer, int *proj, int *is_b) {
    static const char pre[] = "base_model.model.model.layers.";
    if (strncmp(name, pre, sizeof pre - 1)) return -1;
    long l;
    const char *p = parse_index(name + sizeof pre - 1, 1 << 20, &l);
    if (!p || *p != '.') return -1;
    p++;
    const char *grp = !strncmp(p, "self_attn.", 10) ? "self_attn." : !strncmp(p, "mlp.", 4) ? "mlp." : NULL;
    if (!grp) return -1;
    p += strlen(grp);
    for (int k = 0; k < LORA_N_PROJ; k++) {
        size_t n = strlen(proj_names[k]);
        if (strncmp(p, proj_names[k], n) || p[n] != '.') continue;
        if ((k <= LORA_O) != (grp[0] == 's')) return -1;  // q/k/v/o under self_attn, the rest under mlp
        const char *s = p + n + 1;
        if (strcmp(s, "lora_A.weight") && strcmp(s, "lora_B.weight") && strcmp(s, "lora_A.default.weight") &&
            strcmp(s, "lora_B.default.weight"))
            return -1;
        *layer = (int)l, *proj = k, *is_b = s[5] == 'B';
        return 0;
    }
    return -1;
}

static int tensor_err(const lora_adapter *a, const st_tensor *t, const char *why, verr *err) {
    return verr_set(err, "%s: tensor '%s' %s", a->file.path, t->name, why);
}

// Files hold keys nobody reads when a projection is refused by name.
static int refused_tensor(const lora_adapter *a, const st_tensor *t, verr *err) {
    if (strstr(t->name, "lora_magnitude_vector"))
        return tensor_err(a, t, "is a DoRA magnitude: DoRA adapters are not supported", err);
    if (strstr(t->name, "embed_tokens") || strstr(t->name, "lm_head") || strstr(t->name, "lora_embedding"))
        return tensor_err(a, t, "adapts the embedding or lm_head: only q/k/v/o/gate/up/down projections can be "
                          "adapted", err);
    if (strstr(t->name, "modules_to_save")) return tensor_err(a, t, "is a saved module: not supported", err);
    return 0;
}

// The first NaN or infinity of t's n values: its index, or -1.
static long first_nonfinite(const st_tensor *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v;
        if (t->dtype == ST_F32) memcpy(&v, (const char *)t->data + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            v = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        if (!isfinite(v)) return (long)i;
    }
    return -1;
}

static int add_tensor(lora_adapter *a, const model_config *c, const st_tensor *t, const lora_targets *targets,
                      verr *err) {
    int l, p, is_b;
    if (refused_tensor(a, t, err)) return -1;
    if (parse_name(t->name, &l, &p, &is_b))
        return tensor_err(a, t, "is not a LoRA weight of a q/k/v/o/gate/up/down projection (expected "
                          "base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight and the like)", err);
    if (l >= c->n_layers) {
        char why[128];
        snprintf(why, sizeof why, "is for layer %d, but the model has %d layers", l, c->n_layers);
        return tensor_err(a, t, why, err);
    }
    char module[96], why[256];
    snprintf(module, sizeof module, "model.layers.%d.%s.%s", l, p <= LORA_O ? "self_attn" : "mlp", proj_names[p]);
    const char *no;
    if (!lora_targets_match(targets, module, &no)) {  // PEFT would not have given this module an adapter
        snprintf(why, sizeof why, "adapts %s, but %s", module, no);
        return tensor_err(a, t, why, err);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return tensor_err(a, t, "is not F32, F16 or BF16", err);
    int n_in, n_out;
    lora_proj_dims(c, (lora_proj)p, &n_in, &n_out);
    int64_t want0 = is_b ? n_out : a->r, want1 = is_b ? a->r : n_in;
    if (t->ndim != 2 || t->shape[0] != want0 || t->shape[1] != want1) {
        char got[96] = "";
        for (int i = 0, k = 0; i < t->ndim && k < 80; i++)
            k += snprintf(got + k, sizeof got - (size_t)k, i ? ", %lld" : "%lld", (long long)t->shape[i]);
        snprintf(why, sizeof why, "has shape [%s], expected [%lld, %lld] (r = %d, %s: %d -> %d)", got,
                 (long long)want0, (long long)want1, a->r, proj_names[p], n_in, n_out);
        return tensor_err(a, t, why, err);
    }
    long bad = first_nonfinite(t, (size_t)(want0 * want1));
    if (bad >= 0) {
        snprintf(why, sizeof why, "holds a non-finite value (NaN or infinity) at [%ld, %ld]", bad / (long)want1,
                 bad % (long)want1);
        return tensor_err(a, t, why, err);
    }
    lora_pair *pr = &a->w[(size_t)l * LORA_N_PROJ + p];
    wref *dst = is_b ? &pr->b : &pr->a;
    if (dst->data) return tensor_err(a, t, "appears twice (with and without .default)", err);
    dst->data = t->data;
    dst->type = t->dtype == ST_F32 ? WT_F32 : t->dtype == ST_F16 ? WT_F16 : WT_BF16;
    return 0;
}

// Every adapted projection has both halves.
static int check_pairs(lora_adapter *a, verr *err) {
    for (int l = 0; l < a->n_layers; l++)
        for (int p = 0; p < LORA_N_PROJ; p++) {
            const lora_pair *pr = lora_get(a, l, (lora_proj)p);
            if (!pr->a.data != !pr->b.data)
                return verr_set(err, "%s: tensor 'base_model.model.model.layers.%d.%s.%s.lora_%c.weight' is missing "
                                "(its lora_%c is there)", a->file.path, l, p <= LORA_O ? "self_attn" : "mlp",
                                proj_names[p], pr->a.data ? 'B' : 'A', pr->a.data ? 'A' : 'B');
            a->n_pairs += pr->a.data != NULL;
        }
    if (a->n_pairs == 0) return verr_set(err, "%s: holds no LoRA weights", a->file.path);
    return 0;
}

// adapter_model.safetensors, every tensor checked against m and the targets.
static int load_tensors(lora_adapter *a, const model *m, const char *dir, const lora_targets *targets, verr *err) {
    char path[4200], bin[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    snprintf(bin, sizeof bin, "%s/adapter_model.bin", dir);
    if (access(path, F_OK) != 0 && access(bin, F_OK) == 0)
        return verr_set(err, "%s: only adapter_model.safetensors is read (a pickled .bin is not); save the adapter "
                        "with safe_serialization=True", bin);
    if (st_open(&a->file, path, err)) {
        lora_free(a);
        return -1;
    }
    a->n_layers = m->cfg.n_layers;
    a->w = calloc((size_t)a->n_layers * LORA_N_PROJ, sizeof *a->w);
    if (!a->w) return lora_free(a), verr_set(err, "out of memory");
    for (int i = 0; i < a->file.n; i++)
        if (add_tensor(a, &m->cfg, &a->file.tensors[i], targets, err)) return lora_free(a), -1;
    if (check_pairs(a, err)) return lora_free(a), -1;
    return 0;
}

int lora_load(lora_adapter *a, const model *m, const char *dir, verr *err) {
    memset(a, 0, sizeof *a);
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    cJSON *doc = NULL;
    lora_targets targets;
    memset(&targets, 0, sizeof targets);
    int rc = read_config(a, dir, &doc, &targets, err);
    if (rc == 0) rc = load_tensors(a, m, dir, &targets, err);
    lora_targets_free(&targets);
    cJSON_Delete(doc);
    if (rc) return -1;
    a->whole = a->w;
    if (m->tp.size > 1 && lora_shard(a, &m->cfg, &m->tp, err)) return lora_free(a), -1;
    static _Atomic long next_id;
    a->id = ++next_id;
    return 0;
}

void lora_free(lora_adapter *a) {
    st_close(&a->file);
    if (a->whole != a->w) free(a->whole);
    free(a->w);
    free(a->tp_owned);
    memset(a, 0, sizeof *a);
}

// ---- tensor parallelism -----------------------------------------------------------

// The rank's first input or output and their count for projection p (the rows of W it holds).
void lora_shard_range(const model_config *c, const tp_shard *s, lora_proj p, size_t *first, size_t *count) {
    size_t hd = (size_t)c->head_dim;
    if (p == LORA_Q || p == LORA_O) *first = (size_t)s->head0 * hd, *count = (size_t)s->n_heads * hd;
    else if (p == LORA_K || p == LORA_V) *first = (size_t)s->kv_head0 * hd, *count = (size_t)s->n_kv_heads * hd;
    else *first = (size_t)s->ffn0, *count = (size_t)s->n_ffn;
}

int lora_shard(lora_adapter *a, const model_config *c, const tp_shard *s, verr *err) {
    if (s->size <= 1) return 0;
    if (a->tp_owned) return verr_set(err, "%s: the adapter is already sharded", a->dir);
    size_t bytes = 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int p = LORA_O; p <= LORA_DOWN; p += LORA_DOWN - LORA_O) {
            const lora_pair *pr = lora_get(a, l, (lora_proj)p);
            size_t first, count;
            lora_shard_range(c, s, (lora_proj)p, &first, &count);
            if (pr->a.data) bytes += (size_t)a->r * count * wtype_size(pr->a.type);
        }
    size_t n_pairs = (size_t)a->n_layers * LORA_N_PROJ;
    char *dst = a->tp_owned = malloc(bytes ? bytes : 1);
    a->whole = malloc(sizeof *a->whole * n_pairs);
    if (!dst || !a->whole) {
        free(a->whole);
        a->whole = a->w;  // lora_free frees tp_owned
        return verr_set(err, "%s: out of memory copying the rank's %zu bytes of lora_A columns", a->dir, bytes);
    }
    memcpy(a->whole, a->w, sizeof *a->whole * n_pairs);
    for (int l = 0; l < a->n_layers; l++)
        for (int p = 0; p < LORA_N_PROJ; p++) {
            lora_pair *pr = &a->w[(size_t)l * LORA_N_PROJ + p];
            if (!pr->a.data) continue;
            int n_in, n_out;
            lora_proj_dims(c, (lora_proj)p, &n_in, &n_out);
            size_t first, count;
            lora_shard_range(c, s, (lora_proj)p, &first, &count);
            if (p != LORA_O && p != LORA_DOWN) {  // B [n_out, r]: the rank's output rows, a view
                pr->b.data = (const char *)pr->b.data + first * (size_t)a->r * wtype_size(pr->b.type);
                continue;
            }
            size_t es = wtype_size(pr->a.type);  // A [r, n_in]: the rank's input columns, copied
            for (int r = 0; r < a->r; r++)
                memcpy(dst + (size_t)r * count * es, (const char *)pr->a.data + ((size_t)r * n_in + first) * es,
                       count * es);
            pr->a.data = dst;
            dst += (size_t)a->r * count * es;
        }
    return 0;
}

// ---- the CPU forward's part --------------------------------------------------------

void lora_apply(const lora_use *u, int n, int l, lora_proj p, float *y, const float *x, int T, int n_in, int n_out,
                float *tmp, float *dy, int rows) {
    void (*mul)(float *, const float *, wref, int, int, int) = rows ? cpu_matmul_rows : cpu_matmul;
    for (int i = 0; i < n; i++) {
        const lora_pair *pr = lora_get(u[i].a, l, p);
        if (!pr->a.data || u[i].scale == 0) continue;
        float coef = (float)(u[i].scale * u[i].a->scaling);
        int r = u[i].a->r;
        mul(tmp, x, pr->a, T, n_in, r);     // [T, r] = x A^T
        mul(dy, tmp, pr->b, T, r, n_out);   // [T, n_out] = tmp B^T
        cpu_add_scaled(y, dy, coef, (size_t)T * n_out);
    }
}
