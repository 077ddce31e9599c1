// ppl.c: `varent ppl -m DIR -f TEXT [--ctx N] [--stride S | --protocol llamacpp [--chunks N]]
// [--json] [--per-token FILE.jsonl]`: perplexity of a text file with its standard error
// (host/decode/perplexity.h documents which tokens are scored with which context under
// each protocol: strided windows, or llama-perplexity's chunks), and optionally every
// token's logprob.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/ranks.h"
#include "host/cli/commands.h"
#include "host/cli/interp_opts.h"
#include "host/cli/common.h"
#include "host/util/fileio.h"
#include "host/decode/perplexity.h"
#include "host/util/json_out.h"
#include "host/util/outfile.h"
#include "host/util/progress.h"

static int fail(const char *msg) { return cli_error("ppl", "%s", msg); }

static const cli_opt ppl_opts[] = {
    { "-f|--file", "FILE", "prompt", NULL, "the text to score (required)", 0 },
    { "--stride", "S", "prompt", "ctx / 2", "tokens each window moves on; each scores its last S tokens", 0 },
    { "--protocol", "P", "prompt", "strided", "strided (the windows above) or llamacpp (llama-perplexity's "
      "non-overlapping chunks of --ctx, second halves scored)", 0 },
    { "--chunks", "N", "prompt", "all", "--protocol llamacpp: score only the first N chunks", 0 },
    { "--json", NULL, "output", NULL, "one JSON object instead of the PPL line", 0 },
    { "--per-token", "FILE", "output", NULL, "every token's logprob as JSONL ({pos, id, text, logprob})", 0 },
    { "-q|--quiet", NULL, "output", NULL, "no progress on stderr", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const ppl_tables[] = { cli_opts_session, cli_opts_kv, cli_opts_tp, cli_opts_lora, ppl_opts, cli_opts_steer, NULL };
const cli_spec cli_ppl_spec = {
    "ppl", "-m DIR -f TEXT [--ctx N] [--stride S | --protocol llamacpp [--chunks N]] [--json]",
    "Perplexity of a text file with its standard error, in sliding windows of --ctx tokens.",
    "docs/research.md says which tokens are scored with which context.", ppl_tables, NULL, NULL,
};

typedef struct {
    progress p;
    char detail[64];
} window_report;

static int on_window(void *ud, int w, int n_windows, const ppl_result *r) {
    window_report *wr = ud;
    snprintf(wr->detail, sizeof wr->detail, "ppl %.4f +/- %.4f", r->ppl, r->ppl_se);
    progress_update(&wr->p, w + 1, wr->detail);
    return 0;
}

static void print_result(const ppl_result *r, int ctx, int stride, int json) {
    if (json) {
        printf("{\"ppl\":%.17g,\"ppl_se\":%.17g,\"nll_mean\":%.17g,\"nll_se\":%.17g,\"tokens\":%d,"
               "\"scored\":%d,\"windows\":%d,\"ctx\":%d,\"stride\":%d,\"protocol\":\"strided\"}\n",
               r->ppl, r->ppl_se, r->nll_mean, r->nll_se, r->n_tokens, r->n_scored, r->n_windows, ctx, stride);
        return;
    }
    printf("PPL = %.4f +/- %.5f (mean NLL %.5f +/- %.5f nats; %d of %d tokens scored in %d window%s, ctx %d, "
           "stride %d)\n",
           r->ppl, r->ppl_se, r->nll_mean, r->nll_se, r->n_scored, r->n_tokens, r->n_windows,
           r->n_windows == 1 ? "" : "s", ctx, stride);
}

static void print_chunks_result(const ppl_result *r, int ctx, int json) {
    if (json) {
        printf("{\"ppl\":%.17g,\"ppl_se\":%.17g,\"nll_mean\":%.17g,\"nll_se\":%.17g,\"tokens\":%d,"
               "\"scored\":%d,\"chunks\":%d,\"ctx\":%d,\"protocol\":\"llamacpp\"}\n",
               r->ppl, r->ppl_se, r->nll_mean, r->nll_se, r->n_tokens, r->n_scored, r->n_windows, ctx);
        return;
    }
    printf("PPL = %.4f +/- %.5f (mean NLL %.5f +/- %.5f nats; %d of %d tokens scored in %d chunk%s of %d, "
           "llama.cpp protocol)\n",
           r->ppl, r->ppl_se, r->nll_mean, r->nll_se, r->n_scored, r->n_tokens, r->n_windows,
           r->n_windows == 1 ? "" : "s", ctx);
}

// --per-token: one line per token of the text, {"pos","id","text","logprob"}; text is
// what the token adds to the decoded text (special tokens skipped; a character split
// over tokens comes with its last one), so the texts join to the decoded text; the
// first token has no context and its logprob is null, as is every token a protocol does
// not score (NaN in logp). Written whole, then renamed.
static int write_per_token(const char *path, const session *s, const int *ids, int n, const double *logp,
                           verr *err) {
    outfile out;
    outfile_opts oo = { .flag = "--per-token" };
    if (outfile_open(&out, path, &oo, err)) return -1;
    tokenizer_stream *ts = tokenizer_stream_new(s->tok, 1);
    if (!ts) return outfile_abort(&out), verr_set(err, "out of memory");
    for (int i = 0; i < n; i++) {
        const char *piece = "";
        verr e;
        int k = tokenizer_stream_push(ts, ids[i], &piece, &e), tail = 0;
        const char *rest = "";
        if (i == n - 1) tail = tokenizer_stream_flush(ts, &rest);
        fprintf(out.f, "{\"pos\":%d,\"id\":%d,\"text\":", i, ids[i]);
        char *t = malloc((size_t)(k > 0 ? k : 0) + (size_t)(tail > 0 ? tail : 0) + 1);
        if (!t) return tokenizer_stream_free(ts), outfile_abort(&out), verr_set(err, "out of memory");
        size_t len = 0;
        if (k > 0) memcpy(t, piece, (size_t)k), len = (size_t)k;
        if (tail > 0) memcpy(t + len, rest, (size_t)tail), len += (size_t)tail;
        t[len] = 0;
        json_out_str(out.f, t);
        free(t);
        fputs(",\"logprob\":", out.f);
        if (i == 0 || isnan(logp[i])) fputs("null", out.f);
        else json_out_num(out.f, logp[i]);
        fputs("}\n", out.f);
    }
    tokenizer_stream_free(ts);
    return outfile_commit(&out, err);
}

// --protocol llamacpp and --chunks: 0, or the exit status of a usage error.
static int protocol_opts(args *a, int stride, int *llamacpp, int *chunks) {
    const char *protocol = args_str(a, "--protocol", "strided");
    *chunks = (int)args_int_range(a, "--chunks", 0, 1, INT_MAX);
    *llamacpp = !strcmp(protocol, "llamacpp");
    if (!*llamacpp && strcmp(protocol, "strided"))
        return cli_usage_error("ppl", "--protocol %s: unknown protocol (use strided or llamacpp)", protocol);
    if (*llamacpp && stride)
        return cli_usage_error("ppl", "--stride does not apply to --protocol llamacpp (its chunks do not overlap)");
    if (!*llamacpp && *chunks) return cli_usage_error("ppl", "--chunks applies only to --protocol llamacpp");
    return 0;
}

// --protocol llamacpp: llama-perplexity's chunks, BOS in front of each when the
// tokenizer adds one; logp (optional) gets the scored tokens, NaN elsewhere.
static int run_chunks(session *s, const int *ids, int n, int chunks, int quiet, int json, double *logp, verr *err) {
    int bos = s->tok && tokenizer_add_bos(s->tok) ? tokenizer_bos_id(s->tok) : -1;
    int n_chunks = ppl_count_chunks(n, s->ctx, chunks, err);
    if (n_chunks < 0) return -1;
    for (int i = 0; logp && i < n; i++) logp[i] = NAN;
    window_report wr;
    progress_start(&wr.p, "ppl", n_chunks, quiet);
    ppl_result r;
    if (ppl_eval_chunks(s, ids, n, s->ctx, bos, chunks, logp, on_window, &wr, &r, err)) {
        progress_stop(&wr.p);
        return -1;
    }
    progress_finish(&wr.p, NULL);
    print_chunks_result(&r, s->ctx, json);
    return 0;
}

int cmd_ppl(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_ppl_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    session_lora lora[CLI_MAX_LORA];
    char lora_msg[4400];
    int lora_rc = cli_lora_opts(&a, &so, lora, CLI_MAX_LORA, lora_msg, sizeof lora_msg);
    const char *path = args_str(&a, "-f", NULL), *per_token = args_str(&a, "--per-token", NULL);
    int stride = (int)args_int_range(&a, "--stride", 0, 1, INT_MAX), json = args_flag(&a, "--json");
    int quiet = args_flag(&a, "-q"), llamacpp, chunks, bad_protocol = protocol_opts(&a, stride, &llamacpp, &chunks);
    if (bad_protocol) return bad_protocol;
    if (args_finish(&a, 0)) return cli_usage_error("ppl", "%s", a.err);
    if (!so.model_dir) return cli_usage_error("ppl", "missing -m DIR (the model directory)");
    if (!path) return cli_usage_error("ppl", "missing -f FILE (the text to score)");
    if (lora_rc) return cli_usage_error("ppl", "%s", lora_msg);

    verr err = { { 0 } };
    char *text = cli_read_all(path, &err);
    if (!text) return fail(err.msg);
    progress pg;
    cli_load_begin(&pg, quiet);
    session s;
    if (session_open(&s, &so, &err)) {
        cli_load_end(&pg, 0);
        free(text);
        return fail(err.msg);
    }
    cli_load_end(&pg, 1);
    int *ids = NULL, rc = 0;
    int n = session_encode_prompt(&s, text, &ids, &err);
    free(text);
    if (n < 0) verr_set(&err, "-f %s: %s", path, err.msg);
    int ctx = s.ctx, step = stride > 0 ? stride : ctx / 2 > 0 ? ctx / 2 : 1;
    if (n >= 0 && llamacpp) {
        double *logp = per_token ? malloc(sizeof(double) * (size_t)n) : NULL;
        if (per_token && !logp) rc = fail("out of memory");
        else if (run_chunks(&s, ids, n, chunks, quiet, json, logp, &err) ||
                 (per_token && write_per_token(per_token, &s, ids, n, logp, &err)))
            rc = fail(err.msg);
        free(logp), free(ids);
        session_close(&s);
        return rc;
    }
    if (n >= 0 && n < 3)
        verr_set(&err, "%s: the text is %d token%s%s; perplexity needs at least 3 (2 scored)", path, n,
                 n == 1 ? "" : "s", s.tok && tokenizer_add_bos(s.tok) ? " with BOS" : "");
    int n_windows = n < 0 || n < 3 ? -1 : ppl_count_windows(n, ctx, step, &err);
    if (n_windows < 0) {
        rc = fail(err.msg);
    } else {
        window_report wr;
        progress_start(&wr.p, "ppl", n_windows, quiet);
        ppl_result r;
        double *logp = per_token ? malloc(sizeof(double) * (size_t)n) : NULL;
        if (per_token && !logp) {
            progress_stop(&wr.p);
            rc = fail("out of memory");
        } else if (ppl_eval(&s, ids, n, ctx, step, logp, on_window, &wr, &r, &err) ||
                   (per_token && write_per_token(per_token, &s, ids, n, logp, &err))) {
            progress_stop(&wr.p);
            rc = fail(err.msg);
        } else {
            progress_finish(&wr.p, NULL);
            print_result(&r, ctx, step, json);
        }
        free(logp);
    }
    free(ids);
    session_close(&s);
    return rc;
}
