// err.h: error reporting for library code. Library functions return 0 on success
// and -1 on failure, filling a verr with a message that names the file/field/offset.
// Only the CLI prints and exits.
#ifndef VARENT_ERR_H
#define VARENT_ERR_H

#include <stdarg.h>
#include <stdio.h>

typedef struct {
    char msg[1024];
} verr;

// Formats through a copy, so the message may quote the one it replaces
// (verr_set(err, "%s:%d: %s", path, line, err->msg) prefixes it once).
static inline int verr_set(verr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int verr_set(verr *e, const char *fmt, ...) {
    if (e) {
        char buf[sizeof e->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        snprintf(e->msg, sizeof e->msg, "%s", buf);
    }
    return -1;
}

#endif
