// gguf.c: see gguf.h. Parsing goes through a bounds-checked cursor; every error names
// the file, the byte offset and the key or tensor being read.
#include "host/formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/formats/dequant.h"
#include "host/util/fileio.h"

#define GGUF_MAX_NEST 8  // nested arrays deeper than this are rejected

typedef struct {
    const uint8_t *base;
    size_t size, pos;
    const char *path;
    const char *what;  // the key or tensor being read, for messages
    verr *err;
} cursor;

static int need(cursor *c, uint64_t n, const char *field) {
    if (n > c->size - c->pos) {
        return verr_set(c->err, "%s: offset %zu: %s of %s needs %llu bytes, past the end of the file (size %zu)",
                        c->path, c->pos, field, c->what, (unsigned long long)n, c->size);
    }
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *field) {
    if (need(c, 4, field)) return -1;
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *field) {
    if (need(c, 8, field)) return -1;
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return 0;
}

static int rd_str(cursor *c, gguf_str *s, const char *field) {
    size_t at = c->pos;
    if (rd_u64(c, &s->len, field)) return -1;
    if (s->len > c->size - c->pos) {
        return verr_set(c->err, "%s: offset %zu: %s of %s has length %llu, past the end of the file (size %zu)",
                        c->path, at, field, c->what, (unsigned long long)s->len, c->size);
    }
    s->p = (const char *)c->base + c->pos;
    c->pos += s->len;
    return 0;
}

static char *dup_str(gguf_str s) {
    char *p = malloc(s.len + 1);
    if (p) {
        memcpy(p, s.p, s.len);
        p[s.len] = 0;
    }
    return p;
}

static const uint8_t scalar_size[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_type_name(uint32_t t) {
    static const char *names[GGUF_NTYPES] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                             "bool", "string", "array", "u64", "i64", "f64"};
    return t < GGUF_NTYPES ? names[t] : "unknown";
}

// Skip over (and validate) n values of type t, e.g. the elements of a nested array.
static int skip_values(cursor *c, uint32_t t, uint64_t n, int depth) {
    if (t >= GGUF_NTYPES) {
        return verr_set(c->err, "%s: offset %zu: unknown metadata value type %u in %s",
                        c->path, c->pos, t, c->what);
    }
    if (scalar_size[t]) {
        if (need(c, n * scalar_size[t], "array data")) return -1;
        c->pos += n * scalar_size[t];
        return 0;
    }
    if (depth > GGUF_MAX_NEST) {
        return verr_set(c->err, "%s: offset %zu: arrays nested deeper than %d in %s",
                        c->path, c->pos, GGUF_MAX_NEST, c->what);
    }
    for (uint64_t i = 0; i < n; i++) {
        if (t == GGUF_STRING) {
            gguf_str s;
            if (rd_str(c, &s, "string")) return -1;
        } else {
            uint32_t et;
            uint64_t en;
            if (rd_u32(c, &et, "array type") || rd_u64(c, &en, "array count")) return -1;
            if (en > c->size - c->pos) {
                return verr_set(c->err, "%s: offset %zu: array count %llu of %s is larger than the file",
                                c->path, c->pos - 8, (unsigned long long)en, c->what);
            }
            if (skip_values(c, et, en, depth + 1)) return -1;
        }
    }
    return 0;
}

static int read_array(cursor *c, gguf_kv *kv) {
    size_t at = c->pos;
    if (rd_u32(c, &kv->arr_type, "array type") || rd_u64(c, &kv->arr_n, "array count")) return -1;
    if (kv->arr_type >= GGUF_NTYPES) {
        return verr_set(c->err, "%s: offset %zu: unknown array element type %u for key '%s'",
                        c->path, at, kv->arr_type, kv->key);
    }
    // Every element takes at least one byte (8 for strings, 12 for arrays).
    uint64_t min = scalar_size[kv->arr_type] ? scalar_size[kv->arr_type] : kv->arr_type == GGUF_STRING ? 8 : 12;
    if (kv->arr_n > (c->size - c->pos) / min) {
        return verr_set(c->err, "%s: offset %zu: array count %llu for key '%s' is larger than the file (size %zu)",
                        c->path, at + 4, (unsigned long long)kv->arr_n, kv->key, c->size);
    }
    kv->arr_data = c->base + c->pos;
    if (kv->arr_type != GGUF_STRING) return skip_values(c, kv->arr_type, kv->arr_n, 1);
    kv->arr_strs = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof *kv->arr_strs);
    if (!kv->arr_strs) return verr_set(c->err, "%s: out of memory for key '%s'", c->path, kv->key);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        if (rd_str(c, &kv->arr_strs[i], "string element")) return -1;
    }
    return 0;
}

static int read_kv(cursor *c, gguf_kv *kv) {
    gguf_str key;
    c->what = "metadata key";
    if (rd_str(c, &key, "key")) return -1;
    if (!(kv->key = dup_str(key))) return verr_set(c->err, "%s: out of memory", c->path);
    c->what = kv->key;
    size_t at = c->pos;
    if (rd_u32(c, &kv->type, "value type")) return -1;
    kv->offset = c->pos;
    if (kv->type >= GGUF_NTYPES) {
        return verr_set(c->err, "%s: offset %zu: unknown metadata value type %u for key '%s'",
                        c->path, at, kv->type, kv->key);
    }
    if (kv->type == GGUF_ARRAY) return read_array(c, kv);
    if (kv->type == GGUF_STRING) {
        gguf_str s;
        if (rd_str(c, &s, "string value")) return -1;
        if (!(kv->str = dup_str(s))) return verr_set(c->err, "%s: out of memory", c->path);
        return 0;
    }
    uint8_t n = scalar_size[kv->type], raw[8] = {0};
    if (need(c, n, "value")) return -1;
    memcpy(raw, c->base + c->pos, n);
    c->pos += n;
    switch (kv->type) {
    case GGUF_I8: kv->num.i = (int8_t)raw[0]; break;
    case GGUF_I16: { int16_t v; memcpy(&v, raw, 2); kv->num.i = v; break; }
    case GGUF_I32: { int32_t v; memcpy(&v, raw, 4); kv->num.i = v; break; }
    case GGUF_I64: memcpy(&kv->num.i, raw, 8); break;
    case GGUF_F32: { float v; memcpy(&v, raw, 4); kv->num.f = v; break; }
    case GGUF_F64: memcpy(&kv->num.f, raw, 8); break;
    default: memcpy(&kv->num.u, raw, 8); break;  // unsigned and bool, zero-extended
    }
    return 0;
}

static int read_tensor_info(cursor *c, gguf_tensor *t, uint64_t idx) {
    gguf_str name;
    c->what = "tensor name";
    if (rd_str(c, &name, "name")) return -1;
    if (!(t->name = dup_str(name))) return verr_set(c->err, "%s: out of memory", c->path);
    c->what = t->name;
    size_t at = c->pos;
    if (rd_u32(c, &t->n_dims, "n_dims")) return -1;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
        return verr_set(c->err, "%s: offset %zu: tensor '%s' has %u dims (1..%d allowed)",
                        c->path, at, t->name, t->n_dims, GGUF_MAX_DIMS);
    }
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (rd_u64(c, &t->ne[d], "dim")) return -1;
    }
    if (rd_u32(c, &t->type, "type") || rd_u64(c, &t->offset, "data offset")) return -1;
    (void)idx;
    return 0;
}

// Locate a tensor's bytes in the data section and check they fit in the file.
static int place_tensor(gguf_file *g, gguf_tensor *t, verr *err) {
    uint64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)1 << 40 || n > ((uint64_t)1 << 50) / t->ne[d]) {
            return verr_set(err, "%s: tensor '%s' has an invalid shape (dim %d = %llu)", g->path,
                            t->name, d, (unsigned long long)t->ne[d]);
        }
        n *= t->ne[d];
    }
    if (t->offset % g->alignment) {
        return verr_set(err, "%s: tensor '%s' data offset %llu is not a multiple of the alignment %llu",
                        g->path, t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
    }
    uint32_t be, bb;
    if (!dq_block(t->type, &be, &bb)) return 0;  // unknown type: reported when converting
    if (t->ne[0] % be) {
        return verr_set(err, "%s: tensor '%s' row length %llu is not a multiple of the %s block size %u",
                        g->path, t->name, (unsigned long long)t->ne[0], dq_type_name(t->type), be);
    }
    t->nbytes = n / be * bb;
    uint64_t avail = g->size - g->data_offset;
    if (t->offset > avail || t->nbytes > avail - t->offset) {
        return verr_set(err, "%s: tensor '%s' data (offset %llu, %llu bytes) runs past the end of the file (size %zu): truncated?",
                        g->path, t->name, (unsigned long long)(g->data_offset + t->offset),
                        (unsigned long long)t->nbytes, g->size);
    }
    t->data = g->map + g->data_offset + t->offset;
    return 0;
}

static int map_file(gguf_file *g, const char *path, verr *err) {
    int fd = fileio_open_input(path, err);  // regular files only: a FIFO never blocks
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return verr_set(err, "%s: cannot stat: %s", path, strerror(errno));
    }
    g->size = (size_t)st.st_size;
    if (g->size < 24) {
        close(fd);
        return verr_set(err, "%s: file is %zu bytes, too small for a GGUF header (24 bytes)", path, g->size);
    }
    g->map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (g->map == MAP_FAILED) {
        g->map = NULL;
        return verr_set(err, "%s: mmap failed: %s", path, strerror(errno));
    }
    return 0;
}

static int parse_header(gguf_file *g, cursor *c, verr *err) {
    if (memcmp(g->map, "GGUF", 4) != 0) {
        return verr_set(err, "%s: offset 0: bad magic %02x %02x %02x %02x (expected \"GGUF\")", g->path,
                        g->map[0], g->map[1], g->map[2], g->map[3]);
    }
    c->pos = 4;
    c->what = "header";
    if (rd_u32(c, &g->version, "version")) return -1;
    if (g->version != 2 && g->version != 3) {
        return verr_set(err, "%s: offset 4: GGUF version %u is not supported (2 or 3)", g->path, g->version);
    }
    if (rd_u64(c, &g->n_tensors, "tensor count") || rd_u64(c, &g->n_kv, "metadata count")) return -1;
    // A key/value takes at least 13 bytes, a tensor info at least 32.
    if (g->n_kv > (g->size - c->pos) / 13) {
        return verr_set(err, "%s: offset 16: metadata count %llu is larger than the file (size %zu) can hold",
                        g->path, (unsigned long long)g->n_kv, g->size);
    }
    if (g->n_tensors > (g->size - c->pos) / 32) {
        return verr_set(err, "%s: offset 8: tensor count %llu is larger than the file (size %zu) can hold",
                        g->path, (unsigned long long)g->n_tensors, g->size);
    }
    return 0;
}

static int parse(gguf_file *g, verr *err) {
    cursor c = {g->map, g->size, 0, g->path, "header", err};
    if (parse_header(g, &c, err)) return -1;
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return verr_set(err, "%s: out of memory", g->path);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (read_kv(&c, &g->kv[i])) return -1;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (read_tensor_info(&c, &g->tensors[i], i)) return -1;
    }
    g->alignment = 32;
    const gguf_kv *a = gguf_find(g, "general.alignment");
    if (a) {
        if (a->type != GGUF_U32 || a->num.u == 0 || (a->num.u & (a->num.u - 1))) {
            return verr_set(err, "%s: offset %llu: general.alignment must be a u32 power of two",
                            g->path, (unsigned long long)a->offset);
        }
        g->alignment = a->num.u;
    }
    g->data_offset = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_offset > g->size) {
        if (g->n_tensors == 0) g->data_offset = g->size;
        else return verr_set(err, "%s: data section (offset %llu) starts past the end of the file (size %zu)",
                             g->path, (unsigned long long)g->data_offset, g->size);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (place_tensor(g, &g->tensors[i], err)) return -1;
    }
    return 0;
}

gguf_file *gguf_open(const char *path, verr *err) {
    gguf_file *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        verr_set(err, "%s: out of memory", path);
        return NULL;
    }
    if (map_file(g, path, err) || parse(g, err)) {
        gguf_close(g);
        return NULL;
    }
    return g;
}

void gguf_close(gguf_file *g) {
    if (!g) return;
    if (g->kv) {
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str);
            free(g->kv[i].arr_strs);
        }
    }
    if (g->tensors) {
        for (uint64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    }
    free(g->kv);
    free(g->tensors);
    if (g->map) munmap(g->map, g->size);
    free(g->path);
    free(g);
}

const gguf_kv *gguf_find(const gguf_file *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (g->kv[i].key && strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    }
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    }
    return NULL;
}

static int is_int_type(uint32_t t) {
    return t <= GGUF_I32 || t == GGUF_BOOL || t == GGUF_U64 || t == GGUF_I64;
}
static int is_signed(uint32_t t) {
    return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64;
}

int gguf_get_int(const gguf_file *g, const char *key, int64_t *out, verr *err) {
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (!is_int_type(kv->type)) {
        return verr_set(err, "%s: key '%s' is a %s, expected an integer", g->path, key, gguf_type_name(kv->type));
    }
    *out = is_signed(kv->type) ? kv->num.i : (int64_t)kv->num.u;
    return 1;
}

int gguf_get_float(const gguf_file *g, const char *key, double *out, verr *err) {
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type == GGUF_F32 || kv->type == GGUF_F64) *out = kv->num.f;
    else if (is_int_type(kv->type)) *out = is_signed(kv->type) ? (double)kv->num.i : (double)kv->num.u;
    else return verr_set(err, "%s: key '%s' is a %s, expected a number", g->path, key, gguf_type_name(kv->type));
    return 1;
}

int gguf_get_str(const gguf_file *g, const char *key, const char **out, verr *err) {
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_STRING) {
        return verr_set(err, "%s: key '%s' is a %s, expected a string", g->path, key, gguf_type_name(kv->type));
    }
    *out = kv->str;
    return 1;
}

int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i) {
    uint32_t t = kv->arr_type;
    const uint8_t *p = kv->arr_data + i * scalar_size[t];
    switch (t) {
    case GGUF_U8: case GGUF_BOOL: return p[0];
    case GGUF_I8: return (int8_t)p[0];
    case GGUF_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_U64: case GGUF_I64: { int64_t v; memcpy(&v, p, 8); return v; }
    default: return 0;
    }
}
