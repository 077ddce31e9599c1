// fileio.c: see fileio.h.
#include "host/util/fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *fileio_read_all(const char *path, verr *err) {
    FILE *fp = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!fp) {
        verr_set(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
    }
    const char *bad = !buf ? "out of memory" : ferror(fp) ? "read error" : NULL;
    if (fp != stdin) fclose(fp);
    if (bad) {
        free(buf);
        verr_set(err, "%s: %s", path, bad);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}
