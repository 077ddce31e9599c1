// gguf.h: a GGUF v2/v3 reader over an mmap'd file. gguf_open validates the whole
// header up front (every count, length and offset against the file size), so
// accessors never read out of bounds. Layout: magic "GGUF", u32 version, u64 tensor
// count, u64 metadata count, metadata key/values, tensor infos, padding to
// general.alignment (default 32), then tensor data.
#ifndef VARENT_GGUF_H
#define VARENT_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "host/util/err.h"

// Metadata value types.
enum {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12, GGUF_NTYPES
};

#define GGUF_MAX_DIMS 4

typedef struct {
    const char *p;  // points into the mapping, not NUL-terminated
    uint64_t len;
} gguf_str;

typedef struct {
    char *key;          // NUL-terminated copy
    uint32_t type;      // GGUF_*
    uint64_t offset;    // file offset of the value, for messages
    union { uint64_t u; int64_t i; double f; } num;  // integer, bool and float scalars
    char *str;          // GGUF_STRING: NUL-terminated copy
    uint32_t arr_type;  // GGUF_ARRAY: element type
    uint64_t arr_n;     // GGUF_ARRAY: element count
    const uint8_t *arr_data;  // GGUF_ARRAY of scalars: little-endian elements
    gguf_str *arr_strs;       // GGUF_ARRAY of strings: [arr_n]
} gguf_kv;

typedef struct {
    char *name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];  // ne[0] is the fastest-varying dim (columns); unused = 1
    uint32_t type;               // ggml type id (see host/formats/dequant.h)
    uint64_t offset;             // relative to the data section
    const uint8_t *data;         // NULL when the type's block size is unknown
    uint64_t nbytes;             // 0 when the type's block size is unknown
} gguf_tensor;

typedef struct {
    char *path;
    uint8_t *map;
    size_t size;
    uint32_t version;
    uint64_t alignment, data_offset;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;          // [n_kv]
    gguf_tensor *tensors; // [n_tensors]
} gguf_file;

gguf_file *gguf_open(const char *path, verr *err);
void gguf_close(gguf_file *g);

const gguf_kv *gguf_find(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);
const char *gguf_type_name(uint32_t vtype);

// Typed lookups: 1 and *out set when the key exists with a compatible type, 0 when
// absent, -1 (err filled) when present with the wrong type.
int gguf_get_int(const gguf_file *g, const char *key, int64_t *out, verr *err);
int gguf_get_float(const gguf_file *g, const char *key, double *out, verr *err);
int gguf_get_str(const gguf_file *g, const char *key, const char **out, verr *err);
// Element i of an integer array (any integer element type).
int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i);

#endif
