// parse.c: see parse.h.
#include "host/util/parse.h"

#include <stddef.h>

const char *parse_index(const char *s, long max, long *out) {
    long v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (max - (*p - '0')) / 10) return NULL;  // beyond max, without overflowing
        v = v * 10 + (*p - '0');
    }
    if (p == s) return NULL;
    *out = v;
    return p;
}
