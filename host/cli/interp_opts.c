// interp_opts.c: see interp_opts.h.
#include "host/cli/interp_opts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void bad(args *a, const char *fmt, const char *flag, const char *v) {
    if (!a->err[0]) snprintf(a->err, sizeof a->err, fmt, flag, v);
}

static int to_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > 1 << 20) return -1;
    *out = (int)v;
    return 0;
}

const cli_opt cli_opts_steer[] = {
    { "--control-vector", "FILE", "interventions", NULL, "add a control vector (llama.cpp GGUF) to the residual stream",
      ARG_REPEAT },
    { "--control-vector-scaled", "FILE SCALE", "interventions", NULL, "the same, times SCALE (vectors sum)", ARG_REPEAT },
    { "--control-vector-layer-range", "A B", "interventions", "every layer", "apply control vectors to blocks A..B only", 0 },
    { "--ablate-head", "L:H", "interventions", NULL, "zero head H of layer L's attention output", ARG_REPEAT },
    { "--skip-layer", "L", "interventions", NULL, "skip block L (the residual passes through)", ARG_REPEAT },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

const cli_opt cli_opts_probe[] = {
    { "--dump-acts", "FILE", "captures", NULL, "activations of every position fed to a safetensors file", 0 },
    { "--dump-layers", "LIST", "captures", "all", "layers --dump-acts writes (e.g. 0,5,11 or all)", 0 },
    { "--dump-points", "P,P,...", "captures", "resid_post", "where in each block --dump-acts reads (docs/research.md)", 0 },
    { "--attn-layers", "LIST", "captures", NULL, "per-layer, per-head attention statistics in each token's metrics record",
      0 },
    { "--dump-attn", "FILE", "captures", NULL, "attention weights to a safetensors file", 0 },
    { "--logit-lens", NULL, "captures", NULL,
      "each layer's top tokens through the final norm and lm_head, in each token's metrics record", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

static void read_cvecs(args *a, steer_spec *sp) {
    for (const char *f; (f = args_each(a, "--control-vector"));) {
        if (sp->n_cvec == STEER_MAX) {
            bad(a, "%s: more than 64 files%s", "--control-vector", "");
            return;
        }
        sp->cvec_path[sp->n_cvec] = f, sp->cvec_scale[sp->n_cvec++] = 1.0f;
    }
    const char *f, *s;
    while (args_each_pair(a, "--control-vector-scaled", &f, &s)) {
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
    if (args_pair(a, "--control-vector-layer-range", &f, &s)) {
        if (to_int(f, &sp->range_start) || to_int(s, &sp->range_end))
            {
            bad(a, "option %s: want two block indices A B, got '%s ...'", "--control-vector-layer-range", f);
            return;
        }
        sp->range_given = 1;
        if (sp->n_cvec == 0)
            bad(a, "option %s: no control vector to apply it to (--control-vector FILE, --control-vector-scaled FILE "
                   "SCALE)%s", "--control-vector-layer-range", "");
    }
}

void cli_steer_opts(args *a, steer_spec *sp) {
    memset(sp, 0, sizeof *sp);
    read_cvecs(a, sp);
    for (const char *v; (v = args_each(a, "--ablate-head"));) {
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
    for (const char *v; (v = args_each(a, "--skip-layer"));) {
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

int cli_probe_check(const probe_spec *p, const char *log_flag, int has_log, int branch, char *msg, size_t n) {
    if (!probe_spec_active(p)) return 0;
    if ((p->attn_layers || p->logit_lens) && !has_log) {
        if (!log_flag)
            return snprintf(msg, n, "--attn-layers and --logit-lens write into a per-token log, which this command "
                            "does not have"), -1;
        return snprintf(msg, n, "--attn-layers and --logit-lens write into the per-token log: give %s FILE.jsonl",
                        log_flag), -1;
    }
    if (branch)
        return snprintf(msg, n, "--branch decodes candidates outside the captured sequence: drop it with --dump-acts, "
                        "--attn-layers, --dump-attn or --logit-lens"), -1;
    return 0;
}

void cli_probe_name(const char *name, char *out, size_t n) {
    size_t k = 0;
    for (; name[k] && k + 1 < n; k++) {
        char ch = name[k];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
        out[k] = ok ? ch : '_';
    }
    out[k] = 0;
}

int cli_probe_path(const char *path, const char *tag, char *out, size_t n, verr *err) {
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    size_t stem = dot && dot > (slash ? slash : path) && dot[1] ? (size_t)(dot - path) : strlen(path);
    int k = snprintf(out, n, "%.*s.%s%s", (int)stem, path, tag, path + stem);
    return k < 0 || (size_t)k >= n ? verr_set(err, "%s: path too long", path) : 0;
}
