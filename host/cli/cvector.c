// cvector.c: `varent cvector -m DIR --positive P.txt --negative N.txt [--method mean|pca]
// -o FILE.gguf`: a control vector from contrasting prompts, in llama.cpp's format
// (host/runtime/cvector.h has the method). Line i of the two files is one pair; each
// pair is padded to one length with the tokenizer's " " token, as llama.cpp does.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/cli/interp_opts.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/cli/prompts.h"
#include "host/runtime/cvector.h"

static int fail(const char *msg) { return cli_error("cvector", "%s", msg); }

static const cli_opt cvector_opts[] = {
    { "--positive", "FILE", "prompt", NULL, "prompts of the direction, one per line (required)", 0 },
    { "--negative", "FILE", "prompt", NULL, "their contrasts, line i paired with line i (required)", 0 },
    { "--method", "NAME", "output", "mean", "mean (of the differences) or pca (their first component)", 0 },
    { "-o|--out", "FILE", "output", NULL, "the control vector, llama.cpp GGUF (required)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const cvector_tables[] = { cli_opts_session, cli_opts_llama, cli_opts_kv, cli_opts_tp, cvector_opts, cli_opts_chat, cli_opts_steer, NULL };
const cli_spec cli_cvector_spec = {
    "cvector", "-m DIR --positive P.txt --negative N.txt [--method mean|pca] -o FILE.gguf [options]",
    "A control vector (llama.cpp's GGUF format) from contrasting prompts.",
    "Line i of the two files is one pair; each pair is padded to one length with the tokenizer's \" \" token, as\n"
    "llama.cpp does. Docs: docs/research.md.",
    cvector_tables, NULL, NULL,
};

typedef struct {
    session_opts so;
    const char *pos_path, *neg_path, *out, *method;
    prompt_style style;
} cvector_args;

// -1 to go on, else the exit status (after --help or a usage error).
static int read_args(int argc, char **argv, cvector_args *c) {
    args a;
    int rc = args_init(&a, &cli_cvector_spec, argc, argv);
    if (rc >= 0) return rc;
    memset(c, 0, sizeof *c);
    cli_session_opts(&a, &c->so);
    c->pos_path = args_str(&a, "--positive", NULL), c->neg_path = args_str(&a, "--negative", NULL);
    c->out = args_str(&a, "-o", NULL), c->method = args_str(&a, "--method", "mean");
    prompt_style_read(&a, &c->style);
    if (args_finish(&a, 0)) return cli_usage_error("cvector", "%s", a.err);
    if (!c->so.model_dir || !c->pos_path || !c->neg_path || !c->out)
        return cli_usage_error("cvector", "need -m DIR, --positive FILE, --negative FILE and -o FILE.gguf");
    if (strcmp(c->method, "mean") && strcmp(c->method, "pca"))
        return cli_usage_error("cvector", "--method: '%s' is not mean or pca", c->method);
    return -1;
}

// Both prompts of pair i as ids, padded to one length with pad.
static int encode_pair(session *s, const prompt_style *ps, const char *p, const char *q, int pad, int **a, int **b,
                       int *n, verr *err) {
    int na = prompt_encode(s, ps, p, a, err), nb = na < 0 ? -1 : prompt_encode(s, ps, q, b, err);
    if (nb < 0) return -1;
    int len = na > nb ? na : nb;
    if (len > s->ctx) return verr_set(err, "the pair is %d tokens, more than the %d-token context (raise --ctx)", len, s->ctx);
    int *ra = realloc(*a, sizeof(int) * (size_t)len), *rb = realloc(*b, sizeof(int) * (size_t)len);
    if (ra) *a = ra;
    if (rb) *b = rb;
    if (!ra || !rb) return verr_set(err, "out of memory");
    for (int i = na; i < len; i++) ra[i] = pad;
    for (int i = nb; i < len; i++) rb[i] = pad;
    *n = len;
    return 0;
}

static int pad_id(const session *s) {
    int *ids = NULL;
    verr e;
    int n = s->tok ? tokenizer_encode(s->tok, " ", 1, 0, &ids, &e) : 0, id = n > 0 ? ids[n - 1] : -1;
    free(ids);
    return id;
}

static int train(session *s, const cvector_args *c, const prompt_list *pl, const prompt_list *nl, verr *err) {
    int k = pl->n, **pos = calloc((size_t)k, sizeof *pos), **neg = calloc((size_t)k, sizeof *neg);
    int *n = calloc((size_t)k, sizeof *n), pad = pad_id(s), rc = 0;
    float *dirs = malloc(sizeof(float) * (size_t)(s->m.cfg.n_layers - 1 > 0 ? s->m.cfg.n_layers - 1 : 1) * s->m.cfg.dim);
    if (!pos || !neg || !n || !dirs) rc = verr_set(err, "out of memory");
    else if (pad < 0) rc = verr_set(err, "%s has no tokenizer to pad the prompts with", s->m.dir);
    for (int i = 0; rc == 0 && i < k; i++)
        if (encode_pair(s, &c->style, pl->text[i], nl->text[i], pad, &pos[i], &neg[i], &n[i], err))
            rc = verr_set(err, "%s:%d / %s:%d: %.900s", c->pos_path, pl->line[i], c->neg_path, nl->line[i], err->msg);
    if (rc == 0) rc = cvec_train(s, pos, neg, n, k, strcmp(c->method, "pca") ? CVEC_MEAN : CVEC_PCA, dirs, err);
    if (rc == 0) rc = cvec_save(c->out, &s->m.cfg, config_arch_label(s->m.cfg.arch), dirs, err);
    for (int i = 0; i < k; i++) free(pos ? pos[i] : NULL), free(neg ? neg[i] : NULL);
    free(pos), free(neg), free(n), free(dirs);
    return rc;
}

int cmd_cvector(int argc, char **argv) {
    cvector_args c;
    char msg[512];
    int rc0 = read_args(argc, argv, &c);
    if (rc0 >= 0) return rc0;
    verr err = { { 0 } };
    prompt_list pl = { 0 }, nl = { 0 };
    if (prompts_read_lines(&pl, c.pos_path, &err) || prompts_read_lines(&nl, c.neg_path, &err))
        return prompts_free(&pl), prompts_free(&nl), fail(err.msg);
    if (pl.n != nl.n || pl.n == 0) {
        snprintf(msg, sizeof msg, "%s has %d prompts and %s %d: want the same number, at least one", c.pos_path, pl.n,
                 c.neg_path, nl.n);
        return prompts_free(&pl), prompts_free(&nl), fail(msg);
    }
    session s;
    int rc = session_open(&s, &c.so, &err);
    if (rc == 0) {
        rc = train(&s, &c, &pl, &nl, &err);
        session_close(&s);
    }
    int pairs = pl.n;
    prompts_free(&pl), prompts_free(&nl);
    if (rc) return fail(err.msg);
    fprintf(stderr, "varent cvector: wrote %s (%d pairs, %s)\n", c.out, pairs, c.method);
    return 0;
}
