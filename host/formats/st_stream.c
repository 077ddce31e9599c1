// st_stream.c: see st_stream.h. Each append is one record (tensor, rows, width, spool
// offset); the final write walks a tensor's records in order and copies its rows.
#include "host/formats/st_stream.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    char dtype[4];
    int groups;
    long rows;
    int width;  // the widest row so far
    int vector; // shape [rows] (rows of one element)
} stream_tensor;

typedef struct {
    int id, rows, width;
    long off;  // in the spool
} stream_rec;

struct st_stream {
    FILE *spool;
    long spool_len;
    stream_tensor *t;
    int n_t, cap_t;
    stream_rec *rec;
    long n_rec, cap_rec;
    cJSON *meta;
    float *buf;  // one row while copying
    size_t buf_cap;
};

st_stream *st_stream_new(verr *err) {
    st_stream *w = calloc(1, sizeof *w);
    if (!w || !(w->meta = cJSON_CreateObject())) {
        free(w);
        verr_set(err, "out of memory");
        return NULL;
    }
    if (!(w->spool = tmpfile())) {
        verr_set(err, "cannot create a spool file for the capture: %s (TMPDIR full or not writable?)", strerror(errno));
        st_stream_free(w);
        return NULL;
    }
    return w;
}

void st_stream_free(st_stream *w) {
    if (!w) return;
    if (w->spool) fclose(w->spool);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t), free(w->rec), free(w->buf);
    cJSON_Delete(w->meta);
    free(w);
}

int st_stream_tensor(st_stream *w, const char *name, const char *dtype, int groups, verr *err) {
    if (strcmp(dtype, "F32") && strcmp(dtype, "I32")) return verr_set(err, "tensor %s: dtype %s (F32 or I32)", name, dtype);
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? 2 * w->cap_t : 64;
        stream_tensor *t = realloc(w->t, sizeof *t * (size_t)cap);
        if (!t) return verr_set(err, "out of memory");
        w->t = t, w->cap_t = cap;
    }
    stream_tensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return verr_set(err, "out of memory");
    strcpy(t->dtype, dtype);
    t->groups = groups > 0 ? groups : 1;
    t->vector = groups == 0;
    return w->n_t++;
}

int st_stream_append(st_stream *w, int id, const void *data, int rows, int width, verr *err) {
    stream_tensor *t = &w->t[id];
    size_t n = (size_t)rows * t->groups * width;
    if (w->n_rec == w->cap_rec) {
        long cap = w->cap_rec ? 2 * w->cap_rec : 1024;
        stream_rec *r = realloc(w->rec, sizeof *r * (size_t)cap);
        if (!r) return verr_set(err, "out of memory");
        w->rec = r, w->cap_rec = cap;
    }
    if (fwrite(data, 4, n, w->spool) != n)
        return verr_set(err, "writing the capture spool failed: %s (TMPDIR full?)", strerror(errno));
    w->rec[w->n_rec++] = (stream_rec){ id, rows, width, w->spool_len };
    w->spool_len += (long)(4 * n);
    t->rows += rows;
    if (width > t->width) t->width = width;
    return 0;
}

long st_stream_rows(const st_stream *w, int id) { return w->t[id].rows; }

int st_stream_meta(st_stream *w, const char *key, const char *value, verr *err) {
    return cJSON_AddStringToObject(w->meta, key, value) ? 0 : verr_set(err, "out of memory");
}

static size_t tensor_bytes(const stream_tensor *t) { return 4 * (size_t)t->rows * t->groups * t->width; }

static char *header(const st_stream *w) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddItemToObject(root, "__metadata__", cJSON_Duplicate(w->meta, 1));
    size_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        const stream_tensor *t = &w->t[i];
        cJSON *o = cJSON_AddObjectToObject(root, t->name), *shape = cJSON_AddArrayToObject(o, "shape");
        cJSON_AddStringToObject(o, "dtype", t->dtype);
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->rows));
        if (t->groups > 1) cJSON_AddItemToArray(shape, cJSON_CreateNumber(t->groups));
        if (!t->vector) cJSON_AddItemToArray(shape, cJSON_CreateNumber(t->width));
        cJSON *offs = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + tensor_bytes(t))));
        off += tensor_bytes(t);
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

// Copies one record's rows from the spool to f, each group padded to the tensor's width.
static int copy_rec(st_stream *w, const stream_rec *r, FILE *f) {
    const stream_tensor *t = &w->t[r->id];
    if ((size_t)t->width > w->buf_cap) {
        float *b = realloc(w->buf, 4 * (size_t)t->width);
        if (!b) return -1;
        w->buf = b, w->buf_cap = (size_t)t->width;
    }
    if (fseek(w->spool, r->off, SEEK_SET) != 0) return -1;
    for (long g = 0; g < (long)r->rows * t->groups; g++) {
        memset(w->buf, 0, 4 * (size_t)t->width);
        if (fread(w->buf, 4, (size_t)r->width, w->spool) != (size_t)r->width) return -1;
        if (fwrite(w->buf, 4, (size_t)t->width, f) != (size_t)t->width) return -1;
    }
    return 0;
}

int st_stream_write(st_stream *w, FILE *f, const char *what, verr *err) {
    if (fflush(w->spool) != 0) return verr_set(err, "writing the capture spool failed: %s", strerror(errno));
    char *hdr = header(w);
    if (!hdr) return verr_set(err, "%s: out of memory building the header", what);
    size_t len = strlen(hdr), padded = (len + 7) / 8 * 8;
    uint64_t n = padded;
    int ok = fwrite(&n, 8, 1, f) == 1 && fwrite(hdr, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    for (int id = 0; ok && id < w->n_t; id++)
        for (long i = 0; ok && i < w->n_rec; i++)
            if (w->rec[i].id == id) ok = copy_rec(w, &w->rec[i], f) == 0;
    return ok ? 0 : verr_set(err, "%s: write failed: %s (disk full?)", what, errno ? strerror(errno) : "short write");
}
