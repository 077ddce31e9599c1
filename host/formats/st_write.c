// st_write.c: see st_write.h. The header is JSON built with cJSON, padded with
// spaces to a multiple of 8 so tensor data stays aligned when mmapped.
#include "host/formats/st_write.h"

#include "host/util/outfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;
    char dtype[8];
    int64_t shape[8];
    int ndim;
    void *data;
    size_t nbytes;
} st_entry;

struct st_writer {
    st_entry *items;
    int n, cap;
    cJSON *meta;
};

st_writer *st_writer_new(void) {
    st_writer *w = calloc(1, sizeof *w);
    if (w) w->meta = cJSON_CreateObject();
    return w;
}

int st_writer_add(st_writer *w, const char *name, const char *dtype, const int64_t *shape,
                  int ndim, const void *data, size_t nbytes, verr *err) {
    if (ndim < 0 || ndim > 8) return verr_set(err, "tensor %s: %d dimensions (max 8)", name, ndim);
    if (strlen(dtype) >= 8) return verr_set(err, "tensor %s: bad dtype '%s'", name, dtype);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->items[i].name, name) == 0) return verr_set(err, "tensor %s added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 64;
        st_entry *p = realloc(w->items, (size_t)cap * sizeof *p);
        if (!p) return verr_set(err, "out of memory adding tensor %s", name);
        w->items = p, w->cap = cap;
    }
    st_entry *e = &w->items[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->data = malloc(nbytes ? nbytes : 1);
    if (!e->name || !e->data) {
        free(e->name), free(e->data);
        return verr_set(err, "out of memory adding tensor %s (%zu bytes)", name, nbytes);
    }
    memcpy(e->data, data, nbytes);
    strcpy(e->dtype, dtype);
    memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->ndim = ndim, e->nbytes = nbytes;
    w->n++;
    return 0;
}

int st_writer_meta(st_writer *w, const char *key, const char *value, verr *err) {
    if (!cJSON_AddStringToObject(w->meta, key, value)) return verr_set(err, "out of memory");
    return 0;
}

static char *build_header(st_writer *w) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddItemToObject(root, "__metadata__", cJSON_Duplicate(w->meta, 1));
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        st_entry *e = &w->items[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON_AddStringToObject(t, "dtype", e->dtype);
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + e->nbytes)));
        off += e->nbytes;
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

int st_writer_write(st_writer *w, FILE *f, const char *what, verr *err) {
    char *hdr = build_header(w);
    if (!hdr) return verr_set(err, "%s: out of memory building header", what);
    size_t len = strlen(hdr), padded = (len + 7) / 8 * 8;
    uint64_t n = padded;
    int ok = fwrite(&n, 8, 1, f) == 1 && fwrite(hdr, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < w->n; i++)
        ok = fwrite(w->items[i].data, 1, w->items[i].nbytes, f) == w->items[i].nbytes;
    free(hdr);
    return ok ? 0 : verr_set(err, "%s: write failed: %s", what, strerror(errno));
}

int st_writer_save(st_writer *w, const char *path, verr *err) {
    outfile o;
    if (outfile_open(&o, path, NULL, err)) return -1;
    if (st_writer_write(w, o.f, path, err)) {
        outfile_abort(&o);
        return -1;
    }
    return outfile_commit(&o, err);
}

void st_writer_free(st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->items[i].name), free(w->items[i].data);
    free(w->items);
    cJSON_Delete(w->meta);
    free(w);
}
