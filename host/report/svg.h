// svg.h: a small SVG writer into a growable in-memory buffer (written out whole by
// the caller, so a failed plot leaves no partial file), plus "nice" axis ticks.
#ifndef VARENT_SVG_H
#define VARENT_SVG_H

#include <stddef.h>

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;  // an allocation failed: the document is incomplete
} svg;

// Starts a document of w x h pixels with a white background.
void svg_begin(svg *s, int w, int h);
void svg_end(svg *s);
void svg_free(svg *s);
// Appends formatted markup as is (the caller writes well-formed tags).
void svg_printf(svg *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Appends text escaped for XML character data and attribute values: & < > " ' are
// entities, control characters and invalid UTF-8 bytes become U+FFFD.
void svg_escape(svg *s, const char *text);
// <text x y attrs>escaped(formatted)</text>.
void svg_text(svg *s, double x, double y, const char *attrs, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

// Up to about max_n round tick values (1, 2 or 5 x 10^k apart) within [lo, hi]. Returns
// the count (at most 32) written to out.
int svg_ticks(double lo, double hi, int max_n, double *out);

#endif
