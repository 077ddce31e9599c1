// st_write.h: writes a safetensors file (used by the converters and tests).
// Tensors are laid out in the order added, 8-byte aligned header; st_writer_save
// writes through host/util/outfile.h, so a failure never leaves a partial file.
#ifndef VARENT_ST_WRITE_H
#define VARENT_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "host/util/err.h"

typedef struct st_writer st_writer;

st_writer *st_writer_new(void);
// dtype: "F32", "F16", "BF16", "I32", ... The data is copied.
int st_writer_add(st_writer *w, const char *name, const char *dtype, const int64_t *shape,
                  int ndim, const void *data, size_t nbytes, verr *err);
// Optional __metadata__ string entries.
int st_writer_meta(st_writer *w, const char *key, const char *value, verr *err);
int st_writer_save(st_writer *w, const char *path, verr *err);
// The whole file to an open stream (what st_writer_save writes); what names it in errors.
int st_writer_write(st_writer *w, FILE *f, const char *what, verr *err);
void st_writer_free(st_writer *w);

#endif
