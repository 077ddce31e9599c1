// args.c: see args.h. argv is split into options and positionals once, against the
// command's tables; the getters then only look values up.
#include "host/cli/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/help.h"

// Does name equal one of the '|'-separated names (len: name's length)?
static int has_name(const char *names, const char *name, size_t len) {
    for (const char *p = names; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0) return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

static const cli_opt *lookup(const cli_spec *spec, const char *name, size_t len) {
    for (const cli_opt *const *t = spec->tables; t && *t; t++)
        for (const cli_opt *o = *t; o->names; o++)
            if (has_name(o->names, name, len)) return o;
    return NULL;
}

static int is_help(const char *s) { return !strcmp(s, "-h") || !strcmp(s, "--help"); }

// An option of this command, typed alone or as NAME=VALUE: then the value's values.
static const cli_opt *as_option(const cli_spec *spec, const char *s, const char **eq_val) {
    *eq_val = NULL;
    if (s[0] != '-' || s[1] == 0) return NULL;
    const cli_opt *o = lookup(spec, s, strlen(s));
    const char *eq = strchr(s, '=');
    if (!o && eq && (o = lookup(spec, s, (size_t)(eq - s)))) *eq_val = eq + 1;
    return o;
}

// Edit distance, for "did you mean": small strings only.
static int distance(const char *x, size_t n, const char *y, size_t m) {
    if (n > 40 || m > 40) return 99;
    int d[41][41];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int c = d[i - 1][j - 1] + (x[i - 1] != y[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[n][m];
}

// " (did you mean --temp?)" for the closest long name, or a moved option's hint.
static void suggest(const cli_spec *spec, const char *s, char *out, size_t len) {
    out[0] = 0;
    for (const char *const *m = spec->moved; m && m[0]; m += 2)
        if (!strcmp(m[0], s)) {
            snprintf(out, len, " (%s)", m[1]);
            return;
        }
    const char *best = NULL;
    size_t best_n = 0;
    int best_d = strlen(s) > 4 ? 3 : 2;
    for (const cli_opt *const *t = spec->tables; t && *t; t++)
        for (const cli_opt *o = *t; o->names; o++)
            for (const char *p = o->names; p && *p;) {
                const char *bar = strchr(p, '|');
                size_t n = bar ? (size_t)(bar - p) : strlen(p);
                int d = distance(s, strlen(s), p, n);
                if (n > 2 && d < best_d) best = p, best_n = n, best_d = d;
                p = bar ? bar + 1 : NULL;
            }
    if (best) snprintf(out, len, " (did you mean %.*s?)", (int)best_n, best);
}

static void set_err(args *a, const char *fmt, const char *x, const char *y) {
    if (!a->err[0]) snprintf(a->err, sizeof a->err, fmt, x, y);
}

// Is v one of the words of an optional value's metavar "[a|b|c]"?
static int optval_word(const cli_opt *o, const char *v) {
    const char *m = o->metavar + (o->metavar[0] == '[');
    size_t len = strcspn(m, "]");
    for (const char *p = m; p < m + len;) {
        size_t n = strcspn(p, "|]");
        if (strlen(v) == n && !strncmp(p, v, n)) return 1;
        p += n + 1;
    }
    return 0;
}

// One argument at argv[*i] that starts with '-': an option occurrence, or an error.
static void parse_option(args *a, int argc, char **argv, int *i) {
    const char *s = argv[*i], *val = NULL;
    const cli_opt *o = as_option(a->spec, s, &val);
    if (!o) {
        char hint[256];
        suggest(a->spec, s, hint, sizeof hint);
        if (!a->err[0]) snprintf(a->err, sizeof a->err, "unknown option '%.200s'%s", s, hint);
        return;
    }
    char *name = a->occ[a->n].name;
    size_t n = val ? (size_t)(val - 1 - s) : strlen(s);
    snprintf(name, sizeof a->occ[a->n].name, "%.*s", (int)n, s);
    if (o->flags & ARG_OPTVAL) {
        if (val && !optval_word(o, val) && !a->err[0])
            snprintf(a->err, sizeof a->err, "option %s takes %s (got '%.200s')", name, o->metavar, val);
        if (val && !optval_word(o, val)) return;
        if (!val && *i + 1 < argc && optval_word(o, argv[*i + 1])) val = argv[++*i];
    } else if (val) {
        if (!o->metavar) return set_err(a, "option %s takes no value (got '%.200s')", name, val);
        if (strchr(o->metavar, ' ')) return set_err(a, "option %s takes two values (%s), not NAME=VALUE", name, o->metavar);
    } else if (o->metavar) {
        int two = strchr(o->metavar, ' ') != NULL;
        for (int k = 1; k <= 1 + two; k++) {
            const char *eq, *v = *i + k < argc ? argv[*i + k] : NULL;
            if (!v) return set_err(a, two ? "option %s needs two values (%s)" : "option %s needs a value (%s)", name, o->metavar);
            if (is_help(v) || as_option(a->spec, v, &eq)) {
                if (two) return set_err(a, "option %s needs two values, but '%.200s' is an option", name, v);
                if (!a->err[0])
                    snprintf(a->err, sizeof a->err, "option %s needs a value, but '%.200s' is an option (to pass it as "
                             "the value, write %s=%.200s)", name, v, name, v);
                return;
            }
        }
        val = argv[*i + 1];
        a->occ[a->n].val2 = two ? argv[*i + 2] : NULL;
        *i += 1 + two;
    }
    a->occ[a->n].opt = o, a->occ[a->n].val = val;
    a->n++;
}

int args_init(args *a, const cli_spec *spec, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->spec = spec;
    int help = 0, opts = 1;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (a->n >= ARGS_MAX || a->n_pos >= ARGS_MAX) {
            set_err(a, "too many arguments (at most %s)", "256", "");
            break;
        }
        if (opts && !strcmp(s, "--")) opts = 0;
        else if (opts && is_help(s)) help = 1;
        else if (opts && s[0] == '-' && s[1]) parse_option(a, argc, argv, &i);
        else a->pos[a->n_pos++] = s;
    }
    if (help) {
        cli_help_print(stdout, spec);
        return 0;
    }
    if (a->err[0]) return cli_usage_error(spec->name, "%s", a->err);
    return -1;
}

// The table entry of names (abort: a programming error), marked read.
static const cli_opt *opt_of(args *a, const char *names, int repeat_ok) {
    const char *bar = strchr(names, '|');
    const cli_opt *o = lookup(a->spec, names, bar ? (size_t)(bar - names) : strlen(names));
    if (!o) {
        fprintf(stderr, "varent %s: internal error: the command reads option %s, which its table lacks\n",
                a->spec->name, names);
        abort();
    }
    for (int i = 0; i < a->n_read; i++)
        if (a->read[i] == o) {
            if (repeat_ok) return o;
            fprintf(stderr, "varent %s: internal error: option %s is read twice\n", a->spec->name, names);
            abort();
        }
    if (a->n_read < ARGS_MAX) a->read[a->n_read++] = o;
    return o;
}

static int last_of(const args *a, const cli_opt *o) {
    for (int i = a->n - 1; i >= 0; i--)
        if (a->occ[i].opt == o) return i;
    return -1;
}

const char *args_str(args *a, const char *names, const char *def) {
    const cli_opt *o = opt_of(a, names, 0);
    if (o->flags & ARG_REPEAT) {
        fprintf(stderr, "varent %s: internal error: %s is repeatable: read it with args_each\n", a->spec->name, names);
        abort();
    }
    int i = last_of(a, o);
    return i < 0 ? def : a->occ[i].val;
}

const char *args_each(args *a, const char *names) {
    const cli_opt *o = opt_of(a, names, 1);
    if (o != a->each_opt) a->each_opt = o, a->each_at = 0;
    for (int i = a->each_at; i < a->n; i++)
        if (a->occ[i].opt == o) {
            a->each_at = i + 1;
            return a->occ[i].val;
        }
    a->each_at = 0;
    return NULL;
}

int args_pair(args *a, const char *names, const char **v1, const char **v2) {
    int i = last_of(a, opt_of(a, names, 0));
    if (i < 0) return 0;
    *v1 = a->occ[i].val, *v2 = a->occ[i].val2;
    return 1;
}

int args_each_pair(args *a, const char *names, const char **v1, const char **v2) {
    *v1 = args_each(a, names);
    if (!*v1) return 0;
    *v2 = a->occ[a->each_at - 1].val2;
    return 1;
}

int args_given(args *a, const char *names) {
    const char *bar = strchr(names, '|');
    const cli_opt *o = lookup(a->spec, names, bar ? (size_t)(bar - names) : strlen(names));
    return o && last_of(a, o) >= 0;
}

const char *args_peek(args *a, const char *names) {
    const char *bar = strchr(names, '|');
    const cli_opt *o = lookup(a->spec, names, bar ? (size_t)(bar - names) : strlen(names));
    int i = o ? last_of(a, o) : -1;
    return i >= 0 ? a->occ[i].val : NULL;
}

const char *args_typed(args *a, const char *names) {
    const char *bar = strchr(names, '|');
    const cli_opt *o = lookup(a->spec, names, bar ? (size_t)(bar - names) : strlen(names));
    int i = o ? last_of(a, o) : -1;
    if (i >= 0) return a->occ[i].name;
    snprintf(a->typed, sizeof a->typed, "%.*s", (int)(bar ? bar - names : (long)strlen(names)), names);
    return a->typed;
}

// A number outside lo..hi. An unbounded side (hi_inf: INT_MAX or LONG_MAX stand for
// "no limit") is left out of the message, unless the value is beyond it (above).
static void range_err(args *a, const char *name, const char *s, const char *lo, const char *hi, int lo_inf, int hi_inf,
                      int above) {
    if (a->err[0]) return;
    if (above && hi_inf) snprintf(a->err, sizeof a->err, "%s %.100s: too large (at most %s)", name, s, hi);
    else if (!above && lo_inf) snprintf(a->err, sizeof a->err, "%s %.100s: too small (at least %s)", name, s, lo);
    else if (hi_inf) snprintf(a->err, sizeof a->err, "%s %.100s: must be >= %s", name, s, lo);
    else if (lo_inf) snprintf(a->err, sizeof a->err, "%s %.100s: must be <= %s", name, s, hi);
    else snprintf(a->err, sizeof a->err, "%s %.100s: must be in %s..%s", name, s, lo, hi);
}

long args_int_range(args *a, const char *names, long def, long lo, long hi) {
    const cli_opt *o = opt_of(a, names, 0);
    int i = last_of(a, o);
    if (i < 0) return def;
    const char *s = a->occ[i].val, *name = a->occ[i].name;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end) {
        set_err(a, "%s '%.100s': not an integer", name, s);
        return def;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        char l[32], h[32];
        snprintf(l, sizeof l, "%ld", lo), snprintf(h, sizeof h, "%ld", hi);
        range_err(a, name, s, l, h, lo == LONG_MIN, hi == LONG_MAX || hi == INT_MAX, v > hi || (errno == ERANGE && v > 0));
        return def;
    }
    return v;
}

long args_int(args *a, const char *names, long def) { return args_int_range(a, names, def, LONG_MIN, LONG_MAX); }

double args_float_range(args *a, const char *names, double def, double lo, double hi) {
    const cli_opt *o = opt_of(a, names, 0);
    int i = last_of(a, o);
    if (i < 0) return def;
    const char *s = a->occ[i].val, *name = a->occ[i].name;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || isnan(v)) {
        set_err(a, "%s '%.100s': not a number", name, s);
        return def;
    }
    if (errno == ERANGE && fabs(v) > 1) {
        set_err(a, "%s %.100s: beyond the range of a double", name, s);
        return def;
    }
    if (!(v >= lo && v <= hi)) {
        char l[32], h[32];
        snprintf(l, sizeof l, "%g", lo), snprintf(h, sizeof h, "%g", hi);
        range_err(a, name, s, l, h, lo == -HUGE_VAL, hi == HUGE_VAL, v > hi);
        return def;
    }
    return v;
}

double args_float(args *a, const char *names, double def) { return args_float_range(a, names, def, -HUGE_VAL, HUGE_VAL); }

int args_flag(args *a, const char *names) { return last_of(a, opt_of(a, names, 0)) >= 0; }

int args_bool(args *a, const char *on, const char *off, int def) {
    int i = last_of(a, opt_of(a, on, 0)), j = last_of(a, opt_of(a, off, 0));
    return i < 0 && j < 0 ? def : i > j;
}

const char *args_pos(args *a, int k) { return k >= 0 && k < a->n_pos ? a->pos[k] : NULL; }

int args_finish(args *a, int n_positional_allowed) {
    // (after a bad value a command may stop reading: only a clean parse must read all)
    for (int i = 0; i < a->n && !a->err[0]; i++) {
        int read = 0;
        for (int k = 0; k < a->n_read && !read; k++) read = a->read[k] == a->occ[i].opt;
        if (!read) {
            fprintf(stderr, "varent %s: internal error: option %s is in the table but the command ignores it\n",
                    a->spec->name, a->occ[i].name);
            abort();
        }
    }
    if (a->err[0]) return -1;
    if (a->n_pos > n_positional_allowed) {
        snprintf(a->err, sizeof a->err, "unexpected argument '%.200s'", a->pos[n_positional_allowed]);
        return -1;
    }
    return 0;
}

void args_bad(args *a, const char *fmt, ...) {
    if (a->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->err, sizeof a->err, fmt, ap);
    va_end(ap);
}

static void vmsg(const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "varent %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vmsg(cmd, fmt, ap);
    va_end(ap);
    fprintf(stderr, "(varent %s --help lists the options)\n", cmd);
    return CLI_EXIT_USAGE;
}

int cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vmsg(cmd, fmt, ap);
    va_end(ap);
    return CLI_EXIT_RUNTIME;
}
