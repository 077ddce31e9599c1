// steer.c: see steer.h.
#include "host/runtime/steer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "host/formats/dequant.h"
#include "host/formats/gguf.h"
#include "host/util/parse.h"

int steer_spec_active(const steer_spec *sp) { return sp && (sp->n_cvec || sp->n_ablate || sp->n_skip); }

// "direction.<il>" with il decimal digits and nothing else: il, or -1.
static long direction_layer(const char *name) {
    long il;
    const char *end = strncmp(name, "direction.", 10) ? NULL : parse_index(name + 10, 1L << 30, &il);
    return end && !*end ? il : -1;
}

// The keys every control vector file has (llama.cpp's cvector-generator and repeng write both).
static int check_keys(const gguf_file *g, const char *path, int64_t *layer_count, verr *err) {
    const char *arch = NULL;
    int rc = gguf_get_str(g, "general.architecture", &arch, err);
    if (rc < 0) return verr_set(err, "%s: %.900s", path, err->msg);
    if (rc == 0) return verr_set(err, "%s: missing key general.architecture (a control vector file has \"controlvector\")", path);
    if (strcmp(arch, "controlvector") != 0)
        return verr_set(err, "%s: general.architecture is \"%s\", not \"controlvector\": not a control vector file", path, arch);
    rc = gguf_get_int(g, "controlvector.layer_count", layer_count, err);
    if (rc < 0) return verr_set(err, "%s: %.900s", path, err->msg);
    if (rc == 0) return verr_set(err, "%s: missing key controlvector.layer_count", path);
    if (*layer_count != (int64_t)g->n_tensors)
        return verr_set(err, "%s: controlvector.layer_count is %lld but the file has %llu direction tensors", path,
                        (long long)*layer_count, (unsigned long long)g->n_tensors);
    return 0;
}

static int check_tensor(const gguf_tensor *t, const char *path, const model_config *c, verr *err) {
    long il = direction_layer(t->name);
    if (il < 0) return verr_set(err, "%s: tensor %s is not direction.<layer>", path, t->name);
    if (il == 0)
        return verr_set(err, "%s: tensor %s: layer 0 is never steered (llama.cpp's direction.il is added to the "
                        "output of block il >= 1)", path, t->name);
    if (il >= c->n_layers)
        return verr_set(err, "%s: tensor %s: the model has blocks 0..%d (a vector for a deeper model?)", path, t->name,
                        c->n_layers - 1);
    if (t->type != GGML_F32) return verr_set(err, "%s: tensor %s is %s, want F32", path, t->name, dq_type_name(t->type));
    if (t->n_dims != 1 || t->ne[0] != (uint64_t)c->dim)
        return verr_set(err, "%s: tensor %s has %llu values in %u dimensions but the model's hidden_size is %d (a vector "
                        "for another model?)", path, t->name, (unsigned long long)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]),
                        t->n_dims, c->dim);
    if (!t->data) return verr_set(err, "%s: tensor %s has no data", path, t->name);
    return 0;
}

int steer_load_cvec(const char *path, const model_config *c, float scale, float *sum, unsigned char *on, verr *err) {
    gguf_file *g = gguf_open(path, err);
    if (!g) return -1;
    int64_t layer_count;
    int rc = check_keys(g, path, &layer_count, err);
    for (uint64_t i = 0; rc == 0 && i < g->n_tensors; i++) rc = check_tensor(&g->tensors[i], path, c, err);
    for (uint64_t i = 0; rc == 0 && sum && i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        long il = direction_layer(t->name);
        float *dst = sum + (size_t)il * c->dim;
        for (int j = 0; j < c->dim; j++) {
            float v;
            memcpy(&v, t->data + 4 * (size_t)j, 4);  // the mapping may not be 4-aligned for floats
            dst[j] += scale * v;
        }
        if (on) on[il] = 1;
    }
    gguf_close(g);
    return rc;
}

static int open_cvecs(steer *st, const steer_spec *sp, const model_config *c, verr *err) {
    st->cvec = calloc((size_t)c->n_layers * c->dim, sizeof(float));
    st->cvec_on = calloc((size_t)c->n_layers, 1);
    if (!st->cvec || !st->cvec_on) return verr_set(err, "out of memory");
    for (int i = 0; i < sp->n_cvec; i++)
        if (steer_load_cvec(sp->cvec_path[i], c, sp->cvec_scale[i], st->cvec, st->cvec_on, err)) return -1;
    if (sp->range_given) {
        if (sp->range_start < 0 || sp->range_end < sp->range_start || sp->range_end >= c->n_layers)
            return verr_set(err, "--control-vector-layer-range %d %d: want 0 <= A <= B <= %d (the model's last block)",
                            sp->range_start, sp->range_end, c->n_layers - 1);
        for (int l = 0; l < c->n_layers; l++)
            if (l < sp->range_start || l > sp->range_end) st->cvec_on[l] = 0;
    }
    st->hooks.cvec = st->cvec, st->hooks.cvec_on = st->cvec_on;
    return 0;
}

static int open_lists(steer *st, const steer_spec *sp, const model_config *c, verr *err) {
    if (sp->n_ablate) {
        if (!(st->ablate = calloc((size_t)c->n_layers * c->n_heads, 1))) return verr_set(err, "out of memory");
        for (int i = 0; i < sp->n_ablate; i++) {
            int l = sp->ablate[i][0], h = sp->ablate[i][1];
            if (l < 0 || l >= c->n_layers || h < 0 || h >= c->n_heads)
                return verr_set(err, "--ablate-head %d:%d: the model has layers 0..%d and heads 0..%d", l, h,
                                c->n_layers - 1, c->n_heads - 1);
            st->ablate[(size_t)l * c->n_heads + h] = 1;
        }
        st->hooks.ablate = st->ablate;
    }
    if (sp->n_skip) {
        if (!(st->skip = calloc((size_t)c->n_layers, 1))) return verr_set(err, "out of memory");
        for (int i = 0; i < sp->n_skip; i++) {
            if (sp->skip[i] < 0 || sp->skip[i] >= c->n_layers)
                return verr_set(err, "--skip-layer %d: the model has layers 0..%d", sp->skip[i], c->n_layers - 1);
            st->skip[sp->skip[i]] = 1;
        }
        st->hooks.skip = st->skip;
    }
    return 0;
}

int steer_open(steer *st, const steer_spec *sp, const model *m, verr *err) {
    memset(st, 0, sizeof *st);
    const model_config *c = &m->cfg;
    if ((sp->n_cvec && open_cvecs(st, sp, c, err)) || open_lists(st, sp, c, err)) {
        steer_free(st);
        return -1;
    }
    if (!sp->n_cvec && sp->range_given) {
        steer_free(st);
        return verr_set(err, "--control-vector-layer-range needs --control-vector or --control-vector-scaled");
    }
    return 0;
}

void steer_free(steer *st) {
    free(st->cvec), free(st->cvec_on), free(st->ablate), free(st->skip);
    memset(st, 0, sizeof *st);
}
