// lora_merge.c: `varent lora merge`: a base model directory with adapters folded into
// its weights, W' = W + sum of s * c * B A, written as a new HF directory (one
// model.safetensors, the base's config and tokenizer files) through model_dir_write,
// so nothing is written unless all of it is ready.
#include "model/lora_merge.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/formats/model_dir.h"
#include "host/util/fileio.h"
#include "host/util/parse.h"

// The base files copied unchanged (those present).
static const char *const copied[] = { "config.json", "generation_config.json", "tokenizer.json",
                                      "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                                      "chat_template.json" };
#define N_COPIED ((int)(sizeof copied / sizeof *copied))

// Which projection of which layer a base tensor name is ("model.layers.L.self_attn.q_proj.weight"); -1: none.
static int proj_of_name(const char *name, int *layer) {
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof pre - 1)) return -1;
    long l;
    const char *end = parse_index(name + sizeof pre - 1, 1 << 20, &l);
    if (!end || *end != '.') return -1;
    for (int p = 0; p < LORA_N_PROJ; p++) {
        char want[96];
        snprintf(want, sizeof want, ".%s.%s.weight", p <= LORA_O ? "self_attn" : "mlp", lora_proj_name((lora_proj)p));
        if (!strcmp(end, want)) return *layer = (int)l, p;
    }
    return -1;
}

static float elem(wref w, size_t i) {
    if (w.type == WT_F32) return ((const float *)w.data)[i];
    uint16_t h = ((const uint16_t *)w.data)[i];
    return w.type == WT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// x rounded to the stored dtype at out[at]; 0 when it does not fit the dtype (an
// infinity or NaN, or beyond its largest finite value).
static int store(void *out, wtype type, size_t at, double x) {
    if (!(fabs(x) <= FLT_MAX)) return 0;  // the float casts below need it
    if (type == WT_F32) return ((float *)out)[at] = (float)x, 1;
    uint16_t h = type == WT_BF16 ? f32_to_bf16((float)x) : f32_to_f16((float)x);
    ((uint16_t *)out)[at] = h;
    return isfinite(type == WT_BF16 ? bf16_to_f32(h) : f16_to_f32(h));
}

// W + sum_u coef_u * B_u A_u in double, rounded once to the stored dtype of t. NULL
// with err naming t when out of memory or when a merged weight does not fit the dtype.
static void *merged(const st_tensor *t, const lora_use *u, int n, int l, lora_proj p, int n_in, int n_out, verr *err) {
    wref w = { t->data, t->dtype == ST_F32 ? WT_F32 : t->dtype == ST_F16 ? WT_F16 : WT_BF16 };
    double *acc = malloc(sizeof(double) * (size_t)n_in);
    void *out = malloc(t->nbytes);
    if (!acc || !out) return free(acc), free(out), verr_set(err, "out of memory merging '%s'", t->name), NULL;
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++) acc[i] = elem(w, (size_t)o * n_in + i);
        for (int k = 0; k < n; k++) {
            const lora_pair *pr = lora_get(u[k].a, l, p);
            if (!pr->a.data || u[k].scale == 0) continue;
            double coef = u[k].scale * u[k].a->scaling;
            int r = u[k].a->r;
            for (int j = 0; j < r; j++) {
                double bj = coef * elem(pr->b, (size_t)o * r + j);
                for (int i = 0; i < n_in; i++) acc[i] += bj * elem(pr->a, (size_t)j * n_in + i);
            }
        }
        for (int i = 0; i < n_in; i++)
            if (!store(out, w.type, (size_t)o * n_in + i, acc[i])) {
                verr_set(err, "merging into '%s' gives %g at [%d, %d], which %s cannot hold: the adapter's values or "
                         "scaling overflow", t->name, acc[i], o, i, st_dtype_name(t->dtype));
                free(acc), free(out);
                return NULL;
            }
    }
    free(acc);
    return out;
}

static int add_tensor(st_writer *w, const model *m, const st_tensor *t, const lora_use *u, int n, verr *err) {
    int l, p = proj_of_name(t->name, &l);
    void *data = NULL;
    if (p >= 0 && l < m->cfg.n_layers) {
        int n_in, n_out;
        lora_proj_dims(&m->cfg, (lora_proj)p, &n_in, &n_out);
        data = merged(t, u, n, l, (lora_proj)p, n_in, n_out, err);
        if (!data) return -1;
    }
    int rc = st_writer_add(w, t->name, st_dtype_name(t->dtype), t->shape, t->ndim, data ? data : t->data, t->nbytes,
                           err);
    free(data);
    return rc;
}

int lora_merge(const char *base_dir, const lora_spec *spec, int n_spec, const char *out_dir, verr *err) {
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", out_dir);
    if (access(idx, F_OK) == 0)
        return verr_set(err, "%s holds a sharded checkpoint (model.safetensors.index.json): give a new directory",
                        out_dir);
    model m;
    if (model_load(&m, base_dir, err)) return -1;
    lora_adapter *ad = calloc((size_t)n_spec, sizeof *ad);
    lora_use *u = calloc((size_t)n_spec, sizeof *u);
    st_writer *w = st_writer_new();
    char *text[N_COPIED] = { 0 };
    int rc = !ad || !u || !w ? verr_set(err, "out of memory") : 0, loaded = 0;
    for (; rc == 0 && loaded < n_spec; loaded++) {
        rc = lora_load(&ad[loaded], &m, spec[loaded].dir, err);
        u[loaded] = (lora_use){ &ad[loaded], spec[loaded].scale };
        if (rc) break;  // a failed load frees its adapter; a loaded one counts in loaded
        rc = lora_check_scale(&ad[loaded], spec[loaded].scale, err);
    }
    for (int f = 0; rc == 0 && f < m.files.n; f++)
        for (int i = 0; rc == 0 && i < m.files.files[f].n; i++)
            rc = add_tensor(w, &m, &m.files.files[f].tensors[i], u, n_spec, err);
    model_dir_file files[N_COPIED];
    for (int i = 0; rc == 0 && i < N_COPIED; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", base_dir, copied[i]);
        if (access(path, F_OK) == 0 && !(text[i] = fileio_read_all(path, err))) rc = -1;
        files[i] = (model_dir_file){ copied[i], text[i] };
    }
    if (rc == 0) rc = st_writer_meta(w, "format", "pt", err);
    if (rc == 0) rc = model_dir_write(out_dir, files, N_COPIED, w, err);
    for (int i = 0; i < N_COPIED; i++) free(text[i]);
    for (int i = 0; i < loaded && ad; i++) lora_free(&ad[i]);
    free(ad), free(u);
    if (w) st_writer_free(w);
    model_free(&m);
    return rc;
}
