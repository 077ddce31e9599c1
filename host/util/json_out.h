// json_out.h: the JSON writers the JSONL logs, reports and the server share. Every
// string written into JSON goes through json_escape (names given on the command line,
// task and profile names, token text), so no string can break a file or add a key.
#ifndef VARENT_JSON_OUT_H
#define VARENT_JSON_OUT_H

#include <stddef.h>
#include <stdio.h>

// Where json_escape hands its output, in runs of n bytes.
typedef void (*json_sink)(void *ud, const char *s, size_t n);

// The body of a JSON string (no quotes) of n raw bytes (token text may hold partial
// UTF-8): valid UTF-8 as is, " and \ escaped, \n \r \t as escapes, other control bytes
// and bytes of invalid UTF-8 (overlong forms, surrogates) as \u00XX.
void json_escape(const char *s, size_t n, json_sink put, void *ud);
// A quoted JSON string of s.
void json_out_str(FILE *f, const char *s);
// A number with full precision, or null when it is not finite.
void json_out_num(FILE *f, double x);

#endif
