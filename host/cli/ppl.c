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
#include "host/cli/compat.h"
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
    { "--force", NULL, "output", NULL, "replace an existing --dump-acts or --dump-attn file", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const ppl_tables[] = { cli_opts_session, cli_opts_llama, cli_opts_kv, cli_opts_tp, cli_opts_lora, ppl_opts, cli_opts_steer, cli_opts_probe, NULL };
const cli_spec cli_ppl_spec = {
    "ppl", "-m DIR -f TEXT [--ctx N] [--stride S | --protocol llamacpp [--chunks N]] [--json]",
    "Perplexity of a text file with its standard error, in sliding windows of --ctx tokens.",
    "docs/research.md says which tokens are scored with which context.", ppl_tables, NULL, NULL,
};

// One run: its progress, the --per-token file (written as the tokens are scored, which
// both protocols do in increasing order) and the captures with what each row fed.
typedef struct {
    progress p;
    char detail[64];
    const session *s;
    const int *ids;
    int n, next;               // the text's tokens; the next one --per-token writes
    long scored;               // tokens scored so far: the progress
    outfile out;               // --per-token; out.f NULL without
    tokenizer_stream *ts;
    probe *pr;
    int files;                 // --dump-acts or --dump-attn: the rows below are kept
    int *fed, *text_pos;       // per row captured: the id fed and the text token it stands for
    long n_fed, cap_fed;
} ppl_run;

// The progress counts scored tokens: each as it is scored, the running perplexity after
// each window.
static int on_window(void *ud, int w, int n_windows, const ppl_result *r) {
    ppl_run *wr = ud;
    snprintf(wr->detail, sizeof wr->detail, "window %d of %d, ppl %.4f +/- %.4f", w + 1, n_windows, r->ppl, r->ppl_se);
    wr->scored = r->n_scored;
    progress_update(&wr->p, wr->scored, wr->detail);
    return 0;
}

// --per-token: one line per token of the text, {"pos","id","text","logprob"}; text is
// what the token adds to the decoded text (special tokens skipped; a character split
// over tokens comes with its last one), so the texts join to the decoded text; the
// first token has no context and its logprob is null, as is every token a protocol does
// not score. A scored token's line carries the captures' members (attn_layers,
// logit_lens) of the forward that scored it. Written whole, then renamed.
static int per_token_line(ppl_run *r, int i, double logp, int scored) {
    FILE *f = r->out.f;
    const char *piece = "", *rest = "";
    verr e;
    int k = tokenizer_stream_push(r->ts, r->ids[i], &piece, &e), tail = i == r->n - 1 ? tokenizer_stream_flush(r->ts, &rest) : 0;
    fprintf(f, "{\"pos\":%d,\"id\":%d,\"text\":", i, r->ids[i]);
    char *t = malloc((size_t)(k > 0 ? k : 0) + (size_t)(tail > 0 ? tail : 0) + 1);
    if (!t) return -1;
    size_t len = 0;
    if (k > 0) memcpy(t, piece, (size_t)k), len = (size_t)k;
    if (tail > 0) memcpy(t + len, rest, (size_t)tail), len += (size_t)tail;
    t[len] = 0;
    json_out_str(f, t);
    free(t);
    fputs(",\"logprob\":", f);
    if (!scored || i == 0 || isnan(logp)) fputs("null", f);
    else json_out_num(f, logp);
    if (scored && probe_json(r->pr, f)) return -1;
    fputs("}\n", f);
    return 0;
}

static int on_token(void *ud, int i, double logp) {
    ppl_run *r = ud;
    progress_update(&r->p, ++r->scored, r->detail);
    if (!r->out.f) return 0;
    for (; r->next < i; r->next++)
        if (per_token_line(r, r->next, NAN, 0)) return -1;
    r->next = i + 1;
    return per_token_line(r, i, logp, 1);
}

static int on_feed(void *ud, const int *ids, int n, int text0) {
    ppl_run *r = ud;
    if (!r->files) return 0;
    if (r->n_fed + n > r->cap_fed) {
        long cap = (r->n_fed + n) * 2;
        int *a = realloc(r->fed, sizeof(int) * (size_t)cap);
        if (a) r->fed = a;
        int *b = realloc(r->text_pos, sizeof(int) * (size_t)cap);
        if (b) r->text_pos = b;
        if (!a || !b) return -1;
        r->cap_fed = cap;
    }
    for (int j = 0; j < n; j++) r->fed[r->n_fed + j] = ids[j], r->text_pos[r->n_fed + j] = text0 + j;
    r->n_fed += n;
    return 0;
}

// Opens --per-token and the captures before the first window.
static int run_open(ppl_run *r, session *s, const int *ids, int n, const char *per_token, const probe_spec *ps,
                    verr *err) {
    memset(r, 0, sizeof *r);
    r->s = s, r->ids = ids, r->n = n;
    outfile_opts oo = { .flag = "--per-token" };
    if (per_token && outfile_open(&r->out, per_token, &oo, err)) return -1;
    if (per_token && !(r->ts = tokenizer_stream_new(s->tok, 1))) return verr_set(err, "out of memory");
    r->files = ps->acts_path || ps->attn_path;
    return probe_spec_active(ps) ? probe_open(&r->pr, ps, s, err) : 0;
}

// Finishes (keep) or drops the files: the rest of --per-token, the captures with the ids
// fed and the text token of each row.
static int run_close(ppl_run *r, int keep, verr *err) {
    int rc = keep ? probe_check(r->pr, err) : 0;
    for (; keep && rc == 0 && r->out.f && r->next < r->n; r->next++)
        if (per_token_line(r, r->next, NAN, 0)) rc = verr_set(err, "--per-token: out of memory");
    if (keep && rc == 0 && r->files && (probe_add_i32(r->pr, "ids", r->fed, (int)r->n_fed, err) ||
                                     probe_add_i32(r->pr, "text_pos", r->text_pos, (int)r->n_fed, err)))
        rc = -1;
    if (r->pr && probe_close(r->pr, keep && rc == 0, NULL, 0, err) && keep && rc == 0) rc = -1;
    if (keep && rc == 0 && r->out.f && outfile_commit(&r->out, err)) rc = -1;
    outfile_abort(&r->out);
    if (r->ts) tokenizer_stream_free(r->ts);
    free(r->fed), free(r->text_pos);
    return rc;
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

typedef struct {
    const char *per_token;
    probe_spec ps;
    int llamacpp, chunks, step, quiet, json;
} ppl_args;

// The text's windows (or llama.cpp's chunks, BOS in front of each when the tokenizer adds
// one), with the per-token file and the captures; prints the result.
static int score_text(session *s, const int *ids, int n, const ppl_args *pa, verr *err) {
    int bos = s->tok && tokenizer_add_bos(s->tok) ? tokenizer_bos_id(s->tok) : -1;
    int n_windows = pa->llamacpp ? ppl_count_chunks(n, s->ctx, pa->chunks, err) : ppl_count_windows(n, s->ctx, pa->step, err);
    if (n_windows < 0) return -1;
    ppl_run run;
    int rc = run_open(&run, s, ids, n, pa->per_token, &pa->ps, err);
    // each: a forward per position, so that every query's attention and lens are captured
    ppl_watch w = { on_window, on_feed, on_token, pa->ps.attn_layers || pa->ps.attn_path || pa->ps.logit_lens, &run };
    ppl_result r;
    // the tokens to score: every one but the first, or the second half of each chunk (bar its first)
    long total = pa->llamacpp ? (long)n_windows * (s->ctx - s->ctx / 2 - 1) : n - 1L;
    run.detail[0] = 0;
    progress_start(&run.p, "ppl", total, pa->quiet);
    if (rc == 0) rc = pa->llamacpp ? ppl_eval_chunks(s, ids, n, s->ctx, bos, pa->chunks, &w, &r, err)
                                   : ppl_eval(s, ids, n, s->ctx, pa->step, &w, &r, err);
    if (run_close(&run, rc == 0, err) && rc == 0) rc = -1;
    if (rc) return progress_stop(&run.p), -1;
    progress_finish(&run.p, NULL);
    if (pa->llamacpp) print_chunks_result(&r, s->ctx, pa->json);
    else print_result(&r, s->ctx, pa->step, pa->json);
    return 0;
}

int cmd_ppl(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_ppl_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    session_lora lora[CLI_MAX_LORA];
    char lora_msg[4400], bad[256];
    int lora_rc = cli_lora_opts(&a, &so, lora, CLI_MAX_LORA, lora_msg, sizeof lora_msg);
    ppl_args pa = { .per_token = args_str(&a, "--per-token", NULL), .json = args_flag(&a, "--json"),
                    .quiet = args_flag(&a, "-q") };
    const char *path = args_str(&a, "-f", NULL);
    int stride = (int)args_int_range(&a, "--stride", 0, 1, INT_MAX);
    int bad_protocol = protocol_opts(&a, stride, &pa.llamacpp, &pa.chunks);
    if (bad_protocol) return bad_protocol;
    cli_probe_opts(&a, &pa.ps);
    pa.ps.force = args_flag(&a, "--force");
    if (args_finish(&a, 0)) return cli_usage_error("ppl", "%s", a.err);
    if (!so.model_dir) return cli_usage_error("ppl", "missing -m DIR (the model directory)");
    if (!path) return cli_usage_error("ppl", "missing -f FILE (the text to score)");
    if (lora_rc) return cli_usage_error("ppl", "%s", lora_msg);
    if (cli_probe_check(&pa.ps, "--per-token", pa.per_token != NULL, 0, bad, sizeof bad))
        return cli_usage_error("ppl", "%s", bad);

    verr err = { { 0 } };
    char *text = cli_read_all(path, &err);
    if (!text) return fail(err.msg);
    progress pg;
    cli_load_begin(&pg, pa.quiet);
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
    pa.step = stride > 0 ? stride : s.ctx / 2 > 0 ? s.ctx / 2 : 1;
    if (n < 0) verr_set(&err, "-f %s: %s", path, err.msg);
    else if (!pa.llamacpp && n < 3)
        n = verr_set(&err, "%s: the text is %d token%s%s; perplexity needs at least 3 (2 scored)", path, n,
                     n == 1 ? "" : "s", s.tok && tokenizer_add_bos(s.tok) ? " with BOS" : "");
    if (n < 0 || score_text(&s, ids, n, &pa, &err)) rc = fail(err.msg);
    free(ids);
    session_close(&s);
    return rc;
}
