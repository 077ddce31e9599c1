// json_out.h: the small JSON writers the JSONL logs and reports share.
#ifndef VARENT_JSON_OUT_H
#define VARENT_JSON_OUT_H

#include <stdio.h>

// A JSON string of raw bytes (token text may hold partial UTF-8): valid UTF-8 is
// written as is, \n and \t as escapes, other control and invalid bytes as \u00XX.
void json_out_str(FILE *f, const char *s);
// A number with full precision, or null when it is not finite.
void json_out_num(FILE *f, double x);

#endif
