// args.c: see args.h. Options are consumed when a command asks for them, so
// positional arguments must be read after every option has been queried.
#include "host/cli/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void args_init(args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->argc = argc > 255 ? 255 : argc;
    a->argv = argv;
}

// Does argv[i] equal one of the '|'-separated names?
static int name_matches(const char *names, const char *arg) {
    size_t n = strlen(arg);
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, arg, n) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

static int find(args *a, const char *names) {
    for (int i = 0; i < a->argc; i++) {
        if (!a->used[i] && a->argv[i][0] == '-' && name_matches(names, a->argv[i])) return i;
    }
    return -1;
}

const char *args_str(args *a, const char *names, const char *def) {
    int i = find(a, names);
    if (i < 0) return def;
    a->used[i] = 1;
    if (i + 1 >= a->argc) {
        if (!a->err[0]) snprintf(a->err, sizeof a->err, "option %s needs a value", a->argv[i]);
        return def;
    }
    a->used[i + 1] = 1;
    return a->argv[i + 1];
}

// Parses s (not NULL) as an integer in lo..hi; on an error records it and returns def.
static long parse_int(args *a, const char *names, const char *s, long def, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno == ERANGE || (!errno && end != s && !*end && (v < lo || v > hi))) {
        if (!a->err[0]) snprintf(a->err, sizeof a->err, "option %s: %s is outside %ld..%ld", names, s, lo, hi);
        return def;
    }
    if (errno || end == s || *end) {
        if (!a->err[0]) snprintf(a->err, sizeof a->err, "option %s: '%s' is not an integer", names, s);
        return def;
    }
    return v;
}

static double parse_float(args *a, const char *names, const char *s, double def, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || (errno && errno != ERANGE)) {
        if (!a->err[0]) snprintf(a->err, sizeof a->err, "option %s: '%s' is not a number", names, s);
        return def;
    }
    if (errno == ERANGE || !(v >= lo && v <= hi)) {  // NaN too
        if (!a->err[0] && errno == ERANGE)
            snprintf(a->err, sizeof a->err, "option %s: %s is beyond a double's range", names, s);
        else if (!a->err[0])
            snprintf(a->err, sizeof a->err, "option %s: %s is outside %g..%g", names, s, lo, hi);
        return def;
    }
    return v;
}

long args_int(args *a, const char *names, long def) { return args_int_range(a, names, def, LONG_MIN, LONG_MAX); }

long args_int_range(args *a, const char *names, long def, long lo, long hi) {
    const char *s = args_str(a, names, NULL);
    return s ? parse_int(a, names, s, def, lo, hi) : def;
}

double args_float(args *a, const char *names, double def) { return args_float_range(a, names, def, -HUGE_VAL, HUGE_VAL); }

double args_float_range(args *a, const char *names, double def, double lo, double hi) {
    const char *s = args_str(a, names, NULL);
    return s ? parse_float(a, names, s, def, lo, hi) : def;
}

const char *args_str2(args *a, const char *names, const char **second) {
    int i = find(a, names);
    *second = NULL;
    if (i < 0) return NULL;
    a->used[i] = 1;
    if (i + 2 >= a->argc) {
        if (!a->err[0]) snprintf(a->err, sizeof a->err, "option %s needs two values", a->argv[i]);
        return NULL;
    }
    a->used[i + 1] = a->used[i + 2] = 1;
    *second = a->argv[i + 2];
    return a->argv[i + 1];
}

int args_flag(args *a, const char *names) {
    int i = find(a, names);
    if (i < 0) return 0;
    a->used[i] = 1;
    return 1;
}

static int is_positional(args *a, int i) {
    const char *s = a->argv[i];
    return !a->used[i] && (s[0] != '-' || s[1] == '\0');
}

const char *args_pos(args *a, int k) {
    for (int i = 0; i < a->argc; i++) {
        if (is_positional(a, i) && k-- == 0) return a->argv[i];
    }
    return NULL;
}

int args_finish(args *a, int n_positional_allowed) {
    if (a->err[0]) return -1;
    int npos = 0;
    for (int i = 0; i < a->argc; i++) {
        if (a->used[i]) continue;
        if (!is_positional(a, i)) {
            snprintf(a->err, sizeof a->err, "unknown option '%s'", a->argv[i]);
            return -1;
        }
        if (++npos > n_positional_allowed) {
            snprintf(a->err, sizeof a->err, "unexpected argument '%s'", a->argv[i]);
            return -1;
        }
    }
    return 0;
}
