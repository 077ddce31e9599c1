// json_out.c: see json_out.h.
#include "host/util/json_out.h"

#include <math.h>
#include <string.h>

// Bytes of the valid UTF-8 sequence at s (at most n), or 0 when it is not one.
static int utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int k = c < 0x80 ? 1 : c >= 0xc2 && c < 0xe0 ? 2 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xf0 && c < 0xf5 ? 4 : 0;
    if (k == 0 || (size_t)k > n) return 0;
    for (int i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (k == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;  // overlong, surrogate
    if (k == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;  // overlong, > U+10FFFF
    return k;
}

void json_escape(const char *s, size_t n, json_sink put, void *ud) {
    const unsigned char *t = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t run = i;  // plain ASCII goes out in one piece
        while (run < n && t[run] >= 0x20 && t[run] < 0x80 && t[run] != '"' && t[run] != '\\') run++;
        if (run > i) put(ud, s + i, run - i), i = run;
        if (i >= n) break;
        unsigned c = t[i];
        int k = c >= 0x80 ? utf8_len(t + i, n - i) : 1;
        char esc[8];
        if (c == '"' || c == '\\') esc[0] = '\\', esc[1] = (char)c, put(ud, esc, 2);
        else if (c == '\n') put(ud, "\\n", 2);
        else if (c == '\t') put(ud, "\\t", 2);
        else if (c == '\r') put(ud, "\\r", 2);
        else if (c < 0x20 || k == 0) snprintf(esc, sizeof esc, "\\u%04x", c), put(ud, esc, 6);
        else put(ud, s + i, (size_t)k);
        i += k ? (size_t)k : 1;
    }
}

static void to_file(void *ud, const char *s, size_t n) { fwrite(s, 1, n, ud); }

void json_out_str(FILE *f, const char *s) {
    fputc('"', f);
    json_escape(s, strlen(s), to_file, f);
    fputc('"', f);
}

void json_out_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}
