// interp_opts.c: see interp_opts.h.
#include "host/cli/interp_opts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void bad(args *a, const char *fmt, const char *flag, const char *v) {
    if (!a->err[0]) snprintf(a->err, sizeof a->err, fmt, flag, v);
}

// An option with two values ("--flag A B"), the next occurrence not yet read: 1 and the
// values, 0 when absent (args.h reads one value per option).
static int take2(args *a, const char *flag, const char **v1, const char **v2) {
    for (int i = 0; i < a->argc; i++) {
        if (a->used[i] || strcmp(a->argv[i], flag)) continue;
        a->used[i] = 1;
        if (i + 2 >= a->argc) {
            bad(a, "option %s needs two values%s", flag, "");
            return 0;
        }
        a->used[i + 1] = a->used[i + 2] = 1;
        *v1 = a->argv[i + 1], *v2 = a->argv[i + 2];
        return 1;
    }
    return 0;
}

static int to_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > 1 << 20) return -1;
    *out = (int)v;
    return 0;
}

static void read_cvecs(args *a, steer_spec *sp) {
    for (const char *f; (f = args_str(a, "--control-vector", NULL));) {
        if (sp->n_cvec == STEER_MAX) {
            bad(a, "%s: more than 64 files%s", "--control-vector", "");
            return;
        }
        sp->cvec_path[sp->n_cvec] = f, sp->cvec_scale[sp->n_cvec++] = 1.0f;
    }
    const char *f, *s;
    while (take2(a, "--control-vector-scaled", &f, &s)) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || *end || !(v > -1e6 && v < 1e6))
            {
            bad(a, "option %s: scale '%s' is not a number (FILE SCALE)", "--control-vector-scaled", s);
            return;
        }
        if (sp->n_cvec == STEER_MAX) {
            bad(a, "%s: more than 64 files%s", "--control-vector-scaled", "");
            return;
        }
        sp->cvec_path[sp->n_cvec] = f, sp->cvec_scale[sp->n_cvec++] = (float)v;
    }
    if (take2(a, "--control-vector-layer-range", &f, &s)) {
        if (to_int(f, &sp->range_start) || to_int(s, &sp->range_end))
            {
            bad(a, "option %s: want two block indices A B, got '%s ...'", "--control-vector-layer-range", f);
            return;
        }
        sp->range_given = 1;
    }
}

void cli_steer_opts(args *a, steer_spec *sp) {
    memset(sp, 0, sizeof *sp);
    read_cvecs(a, sp);
    for (const char *v; (v = args_str(a, "--ablate-head", NULL));) {
        char l[32];
        const char *colon = strchr(v, ':');
        size_t n = colon ? (size_t)(colon - v) : 0;
        if (!colon || n == 0 || n >= sizeof l) {
            bad(a, "option %s: '%s' is not LAYER:HEAD", "--ablate-head", v);
            return;
        }
        memcpy(l, v, n), l[n] = 0;
        if (sp->n_ablate == STEER_MAX) {
            bad(a, "%s: more than 64 heads%s", "--ablate-head", "");
            return;
        }
        if (to_int(l, &sp->ablate[sp->n_ablate][0]) || to_int(colon + 1, &sp->ablate[sp->n_ablate][1]))
            {
            bad(a, "option %s: '%s' is not LAYER:HEAD", "--ablate-head", v);
            return;
        }
        sp->n_ablate++;
    }
    for (const char *v; (v = args_str(a, "--skip-layer", NULL));) {
        if (sp->n_skip == STEER_MAX) {
            bad(a, "%s: more than 64 layers%s", "--skip-layer", "");
            return;
        }
        if (to_int(v, &sp->skip[sp->n_skip])) {
            bad(a, "option %s: '%s' is not a layer index", "--skip-layer", v);
            return;
        }
        sp->n_skip++;
    }
}

void cli_probe_opts(args *a, probe_spec *p) {
    memset(p, 0, sizeof *p);
    p->acts_path = args_str(a, "--dump-acts", NULL);
    p->dump_layers = args_str(a, "--dump-layers", NULL);
    p->dump_points = args_str(a, "--dump-points", NULL);
    p->attn_layers = args_str(a, "--attn-layers", NULL);
    p->attn_path = args_str(a, "--dump-attn", NULL);
    p->logit_lens = args_flag(a, "--logit-lens");
    if (!p->acts_path && (p->dump_layers || p->dump_points))
        bad(a, "%s and --dump-points choose what --dump-acts FILE writes: give --dump-acts%s", "--dump-layers", "");
}
