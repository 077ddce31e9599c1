// json_out.c: see json_out.h.
#include "host/util/json_out.h"

#include <math.h>

void json_out_str(FILE *f, const char *s) {
    const unsigned char *t = (const unsigned char *)s;
    fputc('"', f);
    while (*t) {
        unsigned char ch = *t;
        int n = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0, ok = n > 0;
        for (int i = 1; ok && i < n; i++) ok = (t[i] & 0xc0) == 0x80;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch == '\n') fputs("\\n", f);
        else if (ch == '\t') fputs("\\t", f);
        else if (ch < 0x20 || !ok) fprintf(f, "\\u%04x", ch);
        else fwrite(t, 1, (size_t)n, f);
        t += ok ? n : 1;
    }
    fputc('"', f);
}

void json_out_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}
