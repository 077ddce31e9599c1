// fileio.h: whole-file reads shared by the loaders and commands.
#ifndef VARENT_FILEIO_H
#define VARENT_FILEIO_H

#include "host/util/err.h"

#include <stdio.h>

// Opens an input for reading, never blocking: the path is stat'ed first and must be a
// regular file (a FIFO, device, socket or directory is an error naming the path and
// what it is, so a FIFO in place of config.json never blocks open()); it is opened with
// O_NONBLOCK (in case it was swapped for a FIFO after the stat), checked again with
// fstat, and O_NONBLOCK is cleared. Returns the fd, or -1 with err ("PATH: cannot open:
// REASON" or "PATH: is a FIFO, not a regular file").
int fileio_open_input(const char *path, verr *err);
// fileio_open_input as a stdio stream ("rb"); NULL with err.
FILE *fileio_fopen_input(const char *path, verr *err);
// The whole file as a malloc'd NUL-terminated string, or NULL with err naming the path.
// "-" is stdin, read until EOF (pipes work there); any other path goes through
// fileio_open_input, so it must be a regular file. A NUL byte in it is an error naming
// its line (every caller reads text, which would end there).
char *fileio_read_all(const char *path, verr *err);
// The rest of an open stream as a malloc'd NUL-terminated buffer (*len: its bytes, which
// may include NULs; len may be NULL), or NULL with err naming what ("stdin", a path).
char *fileio_read_stream(FILE *fp, const char *what, size_t *len, verr *err);

#endif
