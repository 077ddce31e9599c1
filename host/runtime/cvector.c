// cvector.c: see cvector.h. The samples are never stored: the mean needs their sum and
// the power iteration their second moment sum d d^T, accumulated per layer in double.
#include "host/runtime/cvector.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/formats/gguf_write.h"

#define PCA_ITERS 1000
#define PCA_TOL 1e-10

typedef struct {
    int n_layers, dim, T;
    float *acts;     // [n_layers, T, dim] block outputs of the current prompt
    float *pos_acts; // the positive prompt's copy
} cvec_capture;

static void on_act(void *ud, int layer, int point, const float *x, int T, int pos0) {
    cvec_capture *c = ud;
    (void)point;
    memcpy(c->acts + ((size_t)layer * c->T + pos0) * c->dim, x, sizeof(float) * (size_t)T * c->dim);
}

// One prompt through the model from an empty cache, its block outputs into cap->acts.
static int run_prompt(session *s, cvec_capture *cap, const int *ids, int n, verr *err) {
    kv_cache_truncate(&s->kv, 0);
    kv_view kv = kv_view_of(&s->kv);
    cap->T = n;
    return session_forward(s, &kv, ids, n, err);
}

// Adds one pair's nonzero difference rows into sum [L, dim] and, for pca, gram [L, dim, dim].
static void accumulate(const cvec_capture *c, double *sum, double *gram, long *count, double *row) {
    int L = c->n_layers - 1, D = c->dim;
    for (int l = 0; l < L; l++)
        for (int t = 0; t < c->T; t++) {
            const float *a = c->pos_acts + ((size_t)l * c->T + t) * D, *b = c->acts + ((size_t)l * c->T + t) * D;
            int nonzero = 0;
            for (int i = 0; i < D; i++) nonzero |= fabs(row[i] = (double)a[i] - b[i]) > 1e-6;
            if (!nonzero) continue;
            count[l]++;
            for (int i = 0; i < D; i++) sum[(size_t)l * D + i] += row[i];
            for (int i = 0; gram && i < D; i++)
                for (int j = 0; j < D; j++) gram[((size_t)l * D + i) * D + j] += row[i] * row[j];
        }
}

static double norm2(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i] * v[i];
    return sqrt(s);
}

// The leading eigenvector of the symmetric g [D, D], starting from v0 (unit), into v.
static void power_iteration(const double *g, int D, const double *v0, double *v, double *w) {
    memcpy(v, v0, sizeof(double) * (size_t)D);
    for (int it = 0; it < PCA_ITERS; it++) {
        for (int i = 0; i < D; i++) {
            double acc = 0;
            for (int j = 0; j < D; j++) acc += g[(size_t)i * D + j] * v[j];
            w[i] = acc;
        }
        double n = norm2(w, D), delta = 0;
        if (n == 0) return;
        for (int i = 0; i < D; i++) {
            double x = w[i] / n;
            delta += (x - v[i]) * (x - v[i]);
            v[i] = x;
        }
        if (delta < PCA_TOL) return;
    }
}

// Unit directions from the accumulated sums: the mean, or the pca eigenvector signed by it.
static void finish(const double *sum, const double *gram, const long *count, int L, int D, float *dirs, double *tmp) {
    for (int l = 0; l < L; l++) {
        const double *s = sum + (size_t)l * D;
        double n = norm2(s, D), *mean = tmp, *v = tmp + D, *w = tmp + 2 * D;
        memset(dirs + (size_t)l * D, 0, sizeof(float) * (size_t)D);
        if (count[l] == 0 || n == 0) continue;
        for (int i = 0; i < D; i++) mean[i] = s[i] / n;
        if (gram) {  // the mean is a good start and gives the sign
            power_iteration(gram + (size_t)l * D * D, D, mean, v, w);
            double dot = 0;
            for (int i = 0; i < D; i++) dot += v[i] * mean[i];
            for (int i = 0; i < D; i++) mean[i] = dot < 0 ? -v[i] : v[i];
        }
        for (int i = 0; i < D; i++) dirs[(size_t)l * D + i] = (float)mean[i];
    }
}

int cvec_train(session *s, int **pos, int **neg, const int *n, int n_pairs, cvec_method method, float *dirs,
               verr *err) {
    const model_config *c = &s->m.cfg;
    int L = c->n_layers - 1, D = c->dim, max_n = 0;
    if (L < 1) return verr_set(err, "the model has one layer: llama.cpp's format steers blocks 1.. only");
    for (int i = 0; i < n_pairs; i++) max_n = n[i] > max_n ? n[i] : max_n;
    cvec_capture cap = { c->n_layers, D, 0, malloc(sizeof(float) * (size_t)c->n_layers * max_n * D),
                         malloc(sizeof(float) * (size_t)c->n_layers * max_n * D) };
    double *sum = calloc((size_t)L * D, sizeof(double)), *tmp = malloc(sizeof(double) * 4 * (size_t)D);
    double *gram = method == CVEC_PCA ? calloc((size_t)L * D * D, sizeof(double)) : NULL;
    long *count = calloc((size_t)L, sizeof(long));
    unsigned char *all = malloc((size_t)c->n_layers);
    int rc = !cap.acts || !cap.pos_acts || !sum || !tmp || !count || !all || (method == CVEC_PCA && !gram)
                 ? verr_set(err, "out of memory (the pca method holds hidden_size^2 doubles per layer)")
                 : 0;
    const forward_hooks *prev = s->fw.hooks;
    forward_hooks h = prev ? *prev : (forward_hooks){ 0 };  // keep the session's interventions
    if (rc == 0) {
        memset(all, 1, (size_t)c->n_layers);
        h.act_layers = all, h.points = 1u << HOOK_RESID_POST, h.on_act = on_act, h.ud = &cap;
        h.attn_layers = NULL, h.on_attn = NULL;
        s->fw.hooks = &h;
    }
    for (int i = 0; rc == 0 && i < n_pairs; i++) {
        if (run_prompt(s, &cap, pos[i], n[i], err)) {
            rc = verr_set(err, "pair %d, positive: %.900s", i + 1, err->msg);
            break;
        }
        float *t = cap.acts;
        cap.acts = cap.pos_acts, cap.pos_acts = t;  // keep the positive's, capture the negative
        if (run_prompt(s, &cap, neg[i], n[i], err)) rc = verr_set(err, "pair %d, negative: %.900s", i + 1, err->msg);
        else accumulate(&cap, sum, gram, count, tmp);
    }
    if (rc == 0) finish(sum, gram, count, L, D, dirs, tmp);
    s->fw.hooks = prev;
    kv_cache_truncate(&s->kv, 0);
    free(cap.acts), free(cap.pos_acts), free(sum), free(tmp), free(gram), free(count), free(all);
    return rc;
}

int cvec_save(const char *path, const model_config *c, const char *model_hint, const float *dirs, verr *err) {
    gguf_writer *w = gguf_writer_new();
    if (!w) return verr_set(err, "out of memory");
    int rc = gguf_writer_str(w, "general.architecture", "controlvector", err) ||
             gguf_writer_str(w, "controlvector.model_hint", model_hint, err) ||
             gguf_writer_i32(w, "controlvector.layer_count", c->n_layers - 1, err);
    char name[32];
    uint64_t ne = (uint64_t)c->dim;
    for (int l = 0; rc == 0 && l < c->n_layers - 1; l++) {
        snprintf(name, sizeof name, "direction.%d", l + 1);
        rc = gguf_writer_tensor_f32(w, name, &ne, 1, dirs + (size_t)l * c->dim, err);
    }
    if (rc == 0) rc = gguf_writer_save(w, path, err);
    gguf_writer_free(w);
    return rc ? -1 : 0;
}
