// svg.c: see svg.h.
#include "host/report/svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(svg *s, size_t more) {
    if (s->oom) return -1;
    if (s->len + more + 1 <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 1 << 16;
    while (cap < s->len + more + 1) cap *= 2;
    char *b = realloc(s->buf, cap);
    if (!b) return s->oom = 1, -1;
    s->buf = b, s->cap = cap;
    return 0;
}

static void put(svg *s, const char *t, size_t n) {
    if (reserve(s, n)) return;
    memcpy(s->buf + s->len, t, n);
    s->len += n;
    s->buf[s->len] = 0;
}

static void vprint(svg *s, const char *fmt, va_list ap) {
    va_list cp;
    va_copy(cp, ap);
    int n = vsnprintf(NULL, 0, fmt, cp);
    va_end(cp);
    if (n < 0 || reserve(s, (size_t)n)) return;
    vsnprintf(s->buf + s->len, (size_t)n + 1, fmt, ap);
    s->len += (size_t)n;
}

void svg_printf(svg *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint(s, fmt, ap);
    va_end(ap);
}

void svg_begin(svg *s, int w, int h) {
    memset(s, 0, sizeof *s);
    svg_printf(s,
               "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
               w, h, w, h);
}

void svg_end(svg *s) { svg_printf(s, "</svg>\n"); }

void svg_free(svg *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

void svg_escape(svg *s, const char *text) {
    static const char repl[] = "\xef\xbf\xbd";  // U+FFFD
    for (const unsigned char *t = (const unsigned char *)text; *t;) {
        unsigned char ch = *t;
        int n = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0, ok = n > 0;
        for (int i = 1; ok && i < n; i++) ok = (t[i] & 0xc0) == 0x80;
        const char *ent = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&quot;"
                        : ch == '\'' ? "&apos;" : NULL;
        if (ent) put(s, ent, strlen(ent));
        else if (!ok || (ch < 0x20 && ch != '\n' && ch != '\t')) put(s, repl, 3);
        else put(s, (const char *)t, (size_t)n);
        t += ok ? n : 1;
    }
}

void svg_text(svg *s, double x, double y, const char *attrs, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    svg_printf(s, "<text x=\"%.1f\" y=\"%.1f\"%s%s>", x, y, attrs && *attrs ? " " : "", attrs ? attrs : "");
    svg_escape(s, buf);
    svg_printf(s, "</text>\n");
}

int svg_ticks(double lo, double hi, int max_n, double *out) {
    if (!(hi > lo) || max_n < 1) {
        out[0] = lo;
        return 1;
    }
    double raw = (hi - lo) / max_n, mag = pow(10, floor(log10(raw))), step = 10 * mag;
    if (raw <= mag) step = mag;
    else if (raw <= 2 * mag) step = 2 * mag;
    else if (raw <= 5 * mag) step = 5 * mag;
    int n = 0;
    for (double v = ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9 && n < 32; v += step)
        out[n++] = fabs(v) < step * 1e-9 ? 0 : v;
    return n;
}
