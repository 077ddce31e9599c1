// parse.c: see parse.h.
#include "host/util/parse.h"

#include <stddef.h>

const char *parse_index(const char *s, long max, long *out) {
    long v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        int d = *p - '0';
        // beyond max, without overflowing (a digit above max on its own: C's division
        // truncates (max - d) / 10 to 0 when max - d is -1..-9, which let "5" past max 4)
        if (d > max || v > (max - d) / 10) return NULL;
        v = v * 10 + d;
    }
    if (p == s) return NULL;
    *out = v;
    return p;
}
