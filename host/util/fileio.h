// fileio.h: whole-file reads shared by the loaders and commands.
#ifndef VARENT_FILEIO_H
#define VARENT_FILEIO_H

#include "host/util/err.h"

// The whole file (stdin for "-") as a malloc'd NUL-terminated string, or NULL with
// err naming the path. Reads until EOF, so pipes work too.
char *fileio_read_all(const char *path, verr *err);

#endif
