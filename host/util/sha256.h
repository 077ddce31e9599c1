// sha256.h: SHA-256 (FIPS 180-4), for content-addressed caches (a GGUF's converted
// directory is keyed by the hash of its bytes).
#ifndef VARENT_SHA256_H
#define VARENT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "host/util/err.h"

typedef struct {
    uint32_t h[8];
    uint64_t len;      // bytes hashed so far
    uint8_t buf[64];   // a partial block
    size_t n;          // bytes in buf
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t n);
// The digest as 64 lowercase hex digits and a NUL.
void sha256_hex(sha256_ctx *c, char out[65]);
// The hash of a whole file, read in chunks; on_chunk (may be NULL) is told the bytes
// read so far after each chunk. -1 with err naming the file when it cannot be read.
int sha256_file(const char *path, char out[65], void (*on_chunk)(void *ud, long long done), void *ud, verr *err);

#endif
