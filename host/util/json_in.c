// json_in.c: see json_in.h.
#include "host/util/json_in.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

int json_in_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    // the range first: floor(inf) == inf, and NaN fails every comparison
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) return -1;
    *out = (int64_t)d;
    return 0;
}

int json_in_int32(const cJSON *v, int lo, int hi, int *out) {
    int64_t x;
    if (json_in_int(v, lo, hi, &x)) return -1;
    *out = (int)x;
    return 0;
}

int json_in_float(const cJSON *v, float *out) {
    if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= FLT_MAX)) return -1;
    *out = (float)v->valuedouble;
    return 0;
}

// Where the scan is: an object (its current key) or an array (its index).
typedef struct {
    int array, index;
    char key[48];
} json_level;

static void json_path(const json_level *st, int depth, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < depth && n < cap; i++)
        n += st[i].array ? (size_t)snprintf(out + n, cap - n, "[%d]", st[i].index)
                         : (size_t)snprintf(out + n, cap - n, i ? ".%s" : "%s", st[i].key);
}

int json_in_find_nul(const char *s, char *path, size_t cap) {
    json_level st[16];
    int depth = 0, expect_key = 0;
    for (const char *p = s; *p; p++) {
        json_level *top = depth > 0 && depth <= 16 ? &st[depth - 1] : NULL;
        if (*p == '{' || *p == '[') {
            if (depth < 16) st[depth] = (json_level){ *p == '[', 0, "" };
            depth++, expect_key = *p == '{';
        } else if (*p == '}' || *p == ']') {
            depth--;
        } else if (*p == ',') {
            if (top && top->array) top->index++;
            expect_key = top && !top->array;
        } else if (*p == '"') {
            const char *start = ++p;
            for (; *p && *p != '"'; p++) {
                if (*p != '\\') continue;
                if (!strncmp(p + 1, "u0000", 5)) {  // in a key: the object that holds it
                    json_path(st, (depth < 16 ? depth : 16) - (expect_key && top), path, cap);
                    if (!path[0]) snprintf(path, cap, "(a key)");
                    return 1;
                }
                if (!*++p) return 0;  // the escaped character (a text cut after the backslash)
            }
            if (!*p) return 0;
            if (expect_key && top) snprintf(top->key, sizeof top->key, "%.*s", (int)(p - start), start);
            expect_key = 0;
        }
    }
    return 0;
}

cJSON *json_in_parse(const char *text, const char *what, int object, verr *err) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (!j) {
        const char *at = end ? end : text;
        int line = 1, col = 1;
        for (const char *p = text; p < at; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        if (!*at) return verr_set(err, "%s: invalid JSON: the text ends at line %d, column %d before the value is "
                                  "complete", what, line, col), NULL;
        return verr_set(err, "%s: invalid JSON at line %d, column %d", what, line, col), NULL;
    }
    if (object && !cJSON_IsObject(j)) {
        const char *kind = cJSON_IsArray(j) ? "an array" : cJSON_IsString(j) ? "a string" : cJSON_IsNumber(j) ? "a number"
                           : cJSON_IsNull(j) ? "null" : "a boolean";
        cJSON_Delete(j);
        return verr_set(err, "%s: the top level is %s, not a JSON object", what, kind), NULL;
    }
    return j;
}
