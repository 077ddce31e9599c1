// safetensors.h: a header-only safetensors reader (define SAFETENSORS_IMPLEMENTATION
// in exactly one .c file). The file is mmapped and the JSON header parsed with cJSON;
// every entry is validated before any tensor is handed out: header length within the
// file, known dtype, shape x element size == byte length, offsets inside the data
// region, in order and non-overlapping, names unique. Tensors stay in their stored
// dtype and are not copied, except a tensor whose data is not aligned for its dtype (a
// header length that is not a multiple of 4 shifts every offset): it is copied once, at
// open, into an aligned buffer the file owns, so no kernel ever does a misaligned load.
//
// Sharded checkpoints (model.safetensors.index.json) are opened with st_set_open.
#ifndef VARENT_SAFETENSORS_H
#define VARENT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "host/util/err.h"
#include "host/util/fileio.h"

typedef enum { ST_F32, ST_F16, ST_BF16, ST_I8, ST_U8, ST_I32, ST_NDTYPES } st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;  // points into the mapping (or f->aligned, see above)
    size_t nbytes;
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
    st_tensor *tensors;  // sorted by name
    int n;
    void *meta;  // cJSON object of __metadata__, or NULL
    void *aligned;      // the copies of misaligned tensors (64-byte aligned), or NULL
    size_t aligned_bytes;
} st_file;

// A checkpoint of one or more files.
typedef struct {
    st_file *files;
    int n;
} st_set;

const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);

int st_open(st_file *f, const char *path, verr *err);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
// __metadata__ string value, or NULL.
const char *st_meta(const st_file *f, const char *key);

// dir holds model.safetensors or model.safetensors.index.json (+ its shards).
int st_set_open(st_set *s, const char *dir, verr *err);
void st_set_close(st_set *s);
// Returns the tensor and (optionally) the file it lives in.
const st_tensor *st_set_find(const st_set *s, const char *name, const st_file **file);
// Typed get: the tensor must exist with one of the allowed dtypes (bitmask of
// 1 << st_dtype) and exactly this shape. Errors name the tensor and the file.
const st_tensor *st_set_get(const st_set *s, const char *name, unsigned dtype_mask, int ndim,
                            const int64_t *shape, verr *err);

#ifdef SAFETENSORS_IMPLEMENTATION

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/util/json_in.h"

static const char *st_names_[ST_NDTYPES] = { "F32", "F16", "BF16", "I8", "U8", "I32" };
static const size_t st_sizes_[ST_NDTYPES] = { 4, 2, 2, 1, 1, 4 };

const char *st_dtype_name(st_dtype t) { return t < ST_NDTYPES ? st_names_[t] : "?"; }
size_t st_dtype_size(st_dtype t) { return t < ST_NDTYPES ? st_sizes_[t] : 0; }

static int st_cmp_name_(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int st_cmp_offset_(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data;
}

// Parses one header entry into t. data_base/data_size describe the data region.
static int st_parse_entry_(st_file *f, cJSON *item, st_tensor *t, const uint8_t *data_base,
                           size_t data_size, verr *err) {
    const char *name = item->string;
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsObject(item) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return verr_set(err, "%s: tensor '%s': header entry needs dtype, shape and data_offsets", f->path, name);
    int d;
    for (d = 0; d < ST_NDTYPES && strcmp(dt->valuestring, st_names_[d]) != 0; d++) {}
    if (d == ST_NDTYPES)
        return verr_set(err, "%s: tensor '%s': unknown dtype '%s' (supported: F32 F16 BF16 I8 U8 I32)",
                        f->path, name, dt->valuestring);
    t->dtype = (st_dtype)d;
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > 8) return verr_set(err, "%s: tensor '%s': %d dimensions (max 8)", f->path, name, t->ndim);
    uint64_t count = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (json_in_int(cJSON_GetArrayItem(shape, i), 0, 9000000000000000LL, &t->shape[i]))
            return verr_set(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", f->path, name, i);
        if (t->shape[i] && count > UINT64_MAX / (uint64_t)t->shape[i])
            return verr_set(err, "%s: tensor '%s': shape overflows", f->path, name);
        count *= (uint64_t)t->shape[i];
    }
    int64_t b, e;  // integers (0.5 is not an offset) below 9e15, beyond any file
    if (cJSON_GetArraySize(offs) != 2 || json_in_int(cJSON_GetArrayItem(offs, 0), 0, 9000000000000000LL, &b) ||
        json_in_int(cJSON_GetArrayItem(offs, 1), b, 9000000000000000LL, &e))
        return verr_set(err, "%s: tensor '%s': data_offsets must be integers [begin, end] with 0 <= begin <= end <= the "
                        "data size", f->path, name);
    uint64_t begin = (uint64_t)b, end = (uint64_t)e;
    if (end > data_size)
        return verr_set(err, "%s: tensor '%s': data_offsets [%llu, %llu] lie outside the data region (%zu bytes)",
                        f->path, name, (unsigned long long)begin, (unsigned long long)end, data_size);
    if (count > UINT64_MAX / st_sizes_[d] || count * st_sizes_[d] != end - begin)
        return verr_set(err, "%s: tensor '%s': shape needs %llu bytes of %s but data_offsets span %llu", f->path, name,
                        (unsigned long long)(count * st_sizes_[d]), st_names_[d], (unsigned long long)(end - begin));
    t->data = data_base + begin;
    t->nbytes = end - begin;
    t->name = strdup(name);
    return t->name ? 0 : verr_set(err, "%s: out of memory", f->path);
}

// Offsets must be in order and must not overlap; names must be unique.
static int st_check_layout_(st_file *f, verr *err) {
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, st_cmp_offset_);
    for (int i = 1; i < f->n; i++) {
        const st_tensor *p = &f->tensors[i - 1], *t = &f->tensors[i];
        if ((const uint8_t *)p->data + p->nbytes > (const uint8_t *)t->data)
            return verr_set(err, "%s: tensors '%s' and '%s' overlap in the data region", f->path, p->name, t->name);
    }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, st_cmp_name_);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
            return verr_set(err, "%s: tensor name '%s' appears twice", f->path, f->tensors[i].name);
    return 0;
}

static int st_parse_header_(st_file *f, verr *err) {
    if (f->size < 8) return verr_set(err, "%s: file is %zu bytes, too short for a safetensors header", f->path, f->size);
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > f->size - 8)
        return verr_set(err, "%s: header length %llu is larger than the file (%zu bytes): truncated or not safetensors",
                        f->path, (unsigned long long)hlen, f->size);
    const char *js = (const char *)f->map + 8;
    cJSON *root = cJSON_ParseWithLength(js, hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return verr_set(err, "%s: header is not a valid JSON object", f->path);
    }
    const uint8_t *data = (const uint8_t *)f->map + 8 + hlen;
    size_t data_size = f->size - 8 - hlen;
    f->tensors = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *f->tensors);
    int rc = f->tensors ? 0 : verr_set(err, "%s: out of memory", f->path);
    f->meta = cJSON_DetachItemFromObjectCaseSensitive(root, "__metadata__");
    for (cJSON *it = root->child; it && rc == 0; it = it->next) {
        rc = st_parse_entry_(f, it, &f->tensors[f->n], data, data_size, err);
        if (rc == 0) f->n++;
    }
    cJSON_Delete(root);
    return rc ? rc : st_check_layout_(f, err);
}

static int st_misaligned_(const st_tensor *t) { return t->nbytes && (uintptr_t)t->data % st_sizes_[t->dtype]; }

// Copies every tensor whose data is not aligned for its dtype (4 bytes for F32 and I32,
// 2 for F16/BF16) into one aligned buffer, once; aligned files copy nothing.
static int st_align_(st_file *f, verr *err) {
    size_t total = 0;
    for (int i = 0; i < f->n; i++)
        if (st_misaligned_(&f->tensors[i])) total += (f->tensors[i].nbytes + 63) & ~(size_t)63;
    if (!total) return 0;
    f->aligned = aligned_alloc(64, total);
    if (!f->aligned)
        return verr_set(err, "%s: out of memory copying %zu bytes of tensors whose data is not aligned for their "
                        "dtype (header length not a multiple of 4)", f->path, total);
    f->aligned_bytes = total;
    uint8_t *p = f->aligned;
    for (int i = 0; i < f->n; i++) {
        st_tensor *t = &f->tensors[i];
        if (!st_misaligned_(t)) continue;
        memcpy(p, t->data, t->nbytes);
        t->data = p;
        p += (t->nbytes + 63) & ~(size_t)63;
    }
    return 0;
}

int st_open(st_file *f, const char *path, verr *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    int fd = fileio_open_input(path, err);  // regular files only: a FIFO never blocks
    if (fd < 0) {
        st_close(f);
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        verr_set(err, "%s: not a regular file", path);
        st_close(f);
        return -1;
    }
    f->size = (size_t)sb.st_size;
    f->map = f->size ? mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        verr_set(err, "%s: mmap failed: %s", path, strerror(errno));
        st_close(f);
        return -1;
    }
    if (st_parse_header_(f, err) != 0 || st_align_(f, err) != 0) {
        st_close(f);
        return -1;
    }
    return 0;
}

void st_close(st_file *f) {
    if (f->map) munmap(f->map, f->size);
    free(f->aligned);
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    cJSON_Delete((cJSON *)f->meta);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    st_tensor key = { .name = (char *)name };
    return f->n ? bsearch(&key, f->tensors, (size_t)f->n, sizeof key, st_cmp_name_) : NULL;
}

const char *st_meta(const st_file *f, const char *key) {
    cJSON *v = f->meta ? cJSON_GetObjectItemCaseSensitive((cJSON *)f->meta, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static char *st_read_text_(const char *path, verr *err) {
    FILE *fp = fileio_fopen_input(path, err);
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        fclose(fp);
        return verr_set(err, "%s: read failed", path), NULL;
    }
    buf[n] = 0;
    fclose(fp);
    return buf;
}

static int st_add_file_(st_set *s, const char *path, verr *err) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->files[i].path, path) == 0) return 0;
    st_file *p = realloc(s->files, (size_t)(s->n + 1) * sizeof *p);
    if (!p) return verr_set(err, "out of memory");
    s->files = p;
    if (st_open(&s->files[s->n], path, err) != 0) return -1;
    s->n++;
    return 0;
}

// Opens every shard named in the index's weight_map.
static int st_open_index_(st_set *s, const char *dir, const char *index_path, verr *err) {
    char *text = st_read_text_(index_path, err);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = cJSON_IsObject(map) ? 0 : verr_set(err, "%s: missing or invalid 'weight_map'", index_path);
    for (cJSON *it = map ? map->child : NULL; it && rc == 0; it = it->next) {
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/')) {
            rc = verr_set(err, "%s: weight_map['%s'] is not a file name in the model dir", index_path, it->string);
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, it->valuestring);
        rc = st_add_file_(s, path, err);
    }
    cJSON_Delete(root);
    if (rc == 0 && s->n == 0) rc = verr_set(err, "%s: weight_map names no files", index_path);
    return rc;
}

int st_set_open(st_set *s, const char *dir, verr *err) {
    memset(s, 0, sizeof *s);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc;
    if (access(path, F_OK) == 0) {
        rc = st_add_file_(s, path, err);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        rc = access(path, F_OK) == 0 ? st_open_index_(s, dir, path, err)
                                     : verr_set(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    if (rc != 0) st_set_close(s);
    return rc;
}

void st_set_close(st_set *s) {
    for (int i = 0; i < s->n; i++) st_close(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_set_find(const st_set *s, const char *name, const st_file **file) {
    for (int i = 0; i < s->n; i++) {
        const st_tensor *t = st_find(&s->files[i], name);
        if (t) {
            if (file) *file = &s->files[i];
            return t;
        }
    }
    return NULL;
}

const st_tensor *st_set_get(const st_set *s, const char *name, unsigned dtype_mask, int ndim,
                            const int64_t *shape, verr *err) {
    const st_file *f = NULL;
    const st_tensor *t = st_set_find(s, name, &f);
    if (!t) return verr_set(err, "%s: tensor '%s' is missing from the checkpoint", s->n ? s->files[0].path : "?", name), NULL;
    if (!(dtype_mask & (1u << t->dtype)))
        return verr_set(err, "%s: tensor '%s' has dtype %s, which is not supported here", f->path, name,
                        st_dtype_name(t->dtype)), NULL;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char want[128] = "", got[128] = "";
        for (int i = 0; i < ndim; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
        for (int i = 0; i < t->ndim; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        return verr_set(err, "%s: tensor '%s' has shape [%s] but config.json implies [%s]", f->path, name, got, want), NULL;
    }
    return t;
}

#endif  // SAFETENSORS_IMPLEMENTATION
#endif  // VARENT_SAFETENSORS_H
