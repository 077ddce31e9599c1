// gguf_write.h: writes a GGUF v3 file (the format host/formats/gguf.h reads): scalar
// and string metadata, F32 tensors, default alignment 32. Used for control vectors
// (`varent cvector`); saved through host/util/outfile.h, so a failure leaves no file.
#ifndef VARENT_GGUF_WRITE_H
#define VARENT_GGUF_WRITE_H

#include <stdint.h>

#include "host/util/err.h"

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
// Metadata in the order added; a key given twice is an error.
int gguf_writer_str(gguf_writer *w, const char *key, const char *value, verr *err);
int gguf_writer_i32(gguf_writer *w, const char *key, int32_t value, verr *err);
int gguf_writer_u32(gguf_writer *w, const char *key, uint32_t value, verr *err);
int gguf_writer_f32(gguf_writer *w, const char *key, float value, verr *err);
// An F32 tensor; ne[0] is the fastest-varying dimension (GGUF order). The data is copied.
int gguf_writer_tensor_f32(gguf_writer *w, const char *name, const uint64_t *ne, int n_dims, const float *data,
                           verr *err);
// The whole file, atomically (written beside path, renamed into place).
int gguf_writer_save(gguf_writer *w, const char *path, verr *err);

#endif
