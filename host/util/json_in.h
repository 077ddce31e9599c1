// json_in.h: checked reads of JSON that cJSON parsed. cJSON hands out numbers as
// doubles and strings as C strings: an integer field needs an exact, in-range value
// before any cast (a float-to-int cast of 1e300 is undefined), and an escaped NUL
// ("\u0000") would silently cut a string short. Every reader of user JSON goes
// through these (docs/robustness.md).
#ifndef VARENT_JSON_IN_H
#define VARENT_JSON_IN_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "host/util/err.h"

// A JSON number that is an integer in lo..hi (both within +-2^53, where doubles are
// exact): 0 with *out, or -1 (not a number, a fraction, NaN, or out of range).
int json_in_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out);
// The same into an int (lo and hi within the int range).
int json_in_int32(const cJSON *v, int lo, int hi, int *out);
// A JSON number that is finite and fits a float (|v| <= FLT_MAX): 0 with *out, or -1.
int json_in_float(const cJSON *v, float *out);

// The first escaped NUL ("\u0000") in the strings of a JSON text: 1 with the field that
// holds it in path ("messages[1].content", "(a key)"), or 0 when there is none.
// Levels deeper than 16 are not named.
int json_in_find_nul(const char *text, char *path, size_t cap);

// Parses a whole JSON text (nothing but whitespace after the value). On a syntax error:
// NULL with err "WHAT: invalid JSON at line L, column C". object: the value must be an
// object ("WHAT: the top level is an array, not a JSON object"). The caller frees the
// tree with cJSON_Delete.
cJSON *json_in_parse(const char *text, const char *what, int object, verr *err);

#endif
