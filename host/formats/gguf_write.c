// gguf_write.c: see gguf_write.h. Metadata is serialised as it is added; tensors keep
// their data until the save, which lays them out 32-byte aligned after the infos.
#include "host/formats/gguf_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/formats/dequant.h"
#include "host/formats/gguf.h"
#include "host/util/outfile.h"

#define GGUF_WRITE_ALIGN 32

typedef struct {
    char *name;
    uint64_t ne[GGUF_MAX_DIMS];
    int n_dims;
    float *data;
    uint64_t n;
} wtensor;

struct gguf_writer {
    unsigned char *kv;  // serialised key/values
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;
    wtensor *t;
    int n_t, cap_t;
};

gguf_writer *gguf_writer_new(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name), free(w->t[i].data);
    free(w->keys), free(w->t), free(w->kv), free(w);
}

static int put(gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap * 2 : 1024;
        while (cap < w->kv_len + n) cap *= 2;
        unsigned char *b = realloc(w->kv, cap);
        if (!b) return -1;
        w->kv = b, w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_str(gguf_writer *w, const char *s) {
    uint64_t n = strlen(s);
    return put(w, &n, 8) || put(w, s, n);
}

// The key and the value's type; the caller appends the value.
static int begin_kv(gguf_writer *w, const char *key, uint32_t type, verr *err) {
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return verr_set(err, "gguf writer: key %s added twice", key);
    char **k = realloc(w->keys, sizeof *k * (size_t)(w->n_kv + 1));
    if (!k) return verr_set(err, "out of memory");
    w->keys = k;
    if (!(k[w->n_kv] = strdup(key)) || put_str(w, key) || put(w, &type, 4)) return verr_set(err, "out of memory");
    w->n_kv++;
    return 0;
}

int gguf_writer_str(gguf_writer *w, const char *key, const char *value, verr *err) {
    if (begin_kv(w, key, GGUF_STRING, err)) return -1;
    return put_str(w, value) ? verr_set(err, "out of memory") : 0;
}

int gguf_writer_i32(gguf_writer *w, const char *key, int32_t value, verr *err) {
    if (begin_kv(w, key, GGUF_I32, err)) return -1;
    return put(w, &value, 4) ? verr_set(err, "out of memory") : 0;
}

int gguf_writer_u32(gguf_writer *w, const char *key, uint32_t value, verr *err) {
    if (begin_kv(w, key, GGUF_U32, err)) return -1;
    return put(w, &value, 4) ? verr_set(err, "out of memory") : 0;
}

int gguf_writer_f32(gguf_writer *w, const char *key, float value, verr *err) {
    if (begin_kv(w, key, GGUF_F32, err)) return -1;
    return put(w, &value, 4) ? verr_set(err, "out of memory") : 0;
}

int gguf_writer_tensor_f32(gguf_writer *w, const char *name, const uint64_t *ne, int n_dims, const float *data,
                           verr *err) {
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) return verr_set(err, "tensor %s: %d dimensions (1..4)", name, n_dims);
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return verr_set(err, "gguf writer: tensor %s added twice", name);
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? 2 * w->cap_t : 16;
        wtensor *t = realloc(w->t, sizeof *t * (size_t)cap);
        if (!t) return verr_set(err, "out of memory");
        w->t = t, w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->n = 1;
    for (int i = 0; i < n_dims; i++) t->ne[i] = ne[i], t->n *= ne[i];
    t->n_dims = n_dims;
    t->name = strdup(name);
    t->data = malloc(sizeof(float) * (size_t)(t->n ? t->n : 1));
    if (!t->name || !t->data) {
        free(t->name), free(t->data);
        return verr_set(err, "out of memory adding tensor %s", name);
    }
    memcpy(t->data, data, sizeof(float) * (size_t)t->n);
    w->n_t++;
    return 0;
}

static uint64_t align_up(uint64_t x) { return (x + GGUF_WRITE_ALIGN - 1) / GGUF_WRITE_ALIGN * GGUF_WRITE_ALIGN; }

static void write_u64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }
static void write_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }

static void write_pad(FILE *f, uint64_t at) {
    static const char zeros[GGUF_WRITE_ALIGN];
    fwrite(zeros, 1, (size_t)(align_up(at) - at), f);
}

// Header, metadata, tensor infos, then the data; pos counts bytes for the padding.
static void write_file(const gguf_writer *w, FILE *f) {
    fwrite("GGUF", 1, 4, f);
    write_u32(f, 3);
    write_u64(f, (uint64_t)w->n_t);
    write_u64(f, w->n_kv);
    fwrite(w->kv, 1, w->kv_len, f);
    uint64_t pos = 24 + w->kv_len, off = 0;
    for (int i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t len = strlen(t->name);
        write_u64(f, len);
        fwrite(t->name, 1, len, f);
        write_u32(f, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) write_u64(f, t->ne[d]);
        write_u32(f, GGML_F32);
        write_u64(f, off);
        pos += 8 + len + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
        off = align_up(off + 4 * t->n);
    }
    write_pad(f, pos);
    for (int i = 0; i < w->n_t; i++) {
        fwrite(w->t[i].data, 4, (size_t)w->t[i].n, f);
        if (i + 1 < w->n_t) write_pad(f, 4 * w->t[i].n);
    }
}

int gguf_writer_save(gguf_writer *w, const char *path, verr *err) {
    outfile o;
    outfile_opts oo = { 0 };
    if (outfile_open(&o, path, &oo, err)) return -1;
    write_file(w, o.f);
    return outfile_commit(&o, err);
}
