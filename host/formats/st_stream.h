// st_stream.h: a safetensors file written while the data arrives, for captures whose
// length is unknown until the run ends (activations, attention rows). Rows go to an
// anonymous spool file as they come, so memory holds only their index; the finished
// file (header, then each tensor contiguous) is written at the end, to a stream the
// caller commits atomically (host/util/outfile.h). Tensors hold 4-byte elements.
#ifndef VARENT_ST_STREAM_H
#define VARENT_ST_STREAM_H

#include <stdio.h>

#include "host/util/err.h"

typedef struct st_stream st_stream;

st_stream *st_stream_new(verr *err);
void st_stream_free(st_stream *w);
// A tensor of rows of `groups` x width elements (dtype "F32" or "I32"): its id, or -1.
// The file's shape is [rows] (groups 0: rows of one element), [rows, width] (groups 1)
// or [rows, groups, width_max], rows narrower than the widest padded with zeros in
// every group.
int st_stream_tensor(st_stream *w, const char *name, const char *dtype, int groups, verr *err);
// Appends rows [rows, groups, width] of tensor id.
int st_stream_append(st_stream *w, int id, const void *data, int rows, int width, verr *err);
// The rows tensor id holds so far.
long st_stream_rows(const st_stream *w, int id);
// A __metadata__ string entry.
int st_stream_meta(st_stream *w, const char *key, const char *value, verr *err);
// Writes the whole file to f; what names it in errors.
int st_stream_write(st_stream *w, FILE *f, const char *what, verr *err);

#endif
