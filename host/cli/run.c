// run.c: `varent run` (generate text, for one prompt or a batch from a file) and
// `varent logits` (dump logits).
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/args.h"
#include "host/cli/batch_resume.h"
#include "host/cli/commands.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/decode/batch.h"
#include "host/decode/sched.h"
#include "host/cli/entropix_opts.h"
#include "host/cli/interp_opts.h"
#include "host/util/json_in.h"
#include "host/decode/generate.h"
#include "host/util/fileio.h"
#include "host/util/interrupt.h"
#include "host/util/outfile.h"
#include "host/util/progress.h"
#include "model/forward_cuda.h"
#include "host/cli/prompts.h"
#include "host/decode/stopstr.h"

static int fail(const char *cmd, const char *msg) { return cli_error(cmd, "%s", msg); }

// A text prompt became a user turn by default (prompt_style_auto): said once, on stderr.
static void chat_note(void) {
    fprintf(stderr, "varent run: the model has a chat template: the prompt is a user turn in it (--raw or -no-cnv "
                    "for plain text)\n");
}

typedef struct {
    session *s;
    tokenizer_stream *ts;
    int *ids, n_ids;  // prompt and generated ids (for the --dump-acts "ids" tensor)
    stopstr stop;  // -r: the text is cut before a stop string (n == 0: none)
} run_out;

// Text to stdout through the stop strings; 1 when one was hit.
static int put_text(run_out *o, const char *text, size_t n) {
    if (!o->stop.n) return fwrite(text, 1, n, stdout), 0;
    const char *safe;
    size_t k;
    int hit = stopstr_push(&o->stop, text, n, &safe, &k);
    if (k) fwrite(safe, 1, k, stdout);
    return hit != 0;
}

static int print_token(void *ud, int id) {
    run_out *o = ud;
    int hit = 0;
    if (o->ids) o->ids[o->n_ids++] = id;
    if (!o->ts) {
        printf("%d ", id);
    } else {
        const char *text;
        verr err;
        int n = tokenizer_stream_push(o->ts, id, &text, &err);
        if (n > 0) hit = put_text(o, text, (size_t)n);
    }
    return fflush(stdout) != 0 || hit;  // stdout gone (disk full, closed): stop, run_finish reports it
}

// The end of the text: the tokenizer's held bytes, then what the stop strings held.
static void print_tail(run_out *o) {
    const char *tail;
    int k = o->ts ? tokenizer_stream_flush(o->ts, &tail) : 0;
    if (k > 0 && !o->stop.hit) put_text(o, tail, (size_t)k);
    size_t n = 0;
    if (o->stop.n && !o->stop.hit) stopstr_flush(&o->stop, &tail, &n);
    if (n) fwrite(tail, 1, n, stdout);
}

// After a generation that ran: a log or stdout that could not be written is an error
// (exit 1), Ctrl-C gives INTERRUPT_EXIT; the text and the log are flushed either way.
static int run_finish(entropix_cli *ex, const gen_stats *st) {
    if (ex->log && (fflush(ex->log) != 0 || ferror(ex->log))) {
        char msg[4300];
        snprintf(msg, sizeof msg, "--metrics-out %s: write failed after %d tokens: %s (disk full?)", ex->metrics_path,
                 st->n_gen, strerror(errno));
        return fail("run", msg);
    }
    if (ferror(stdout)) return fail("run", "writing the generated text to stdout failed");
    if (st->interrupted) {
        fprintf(stderr, "varent run: interrupted after %d tokens\n", st->n_gen);
        return INTERRUPT_EXIT;
    }
    return 0;
}

// Closes the --metrics-out log as the run ended (cli_outfile_end): kept after a run that
// generated, its finished records after Ctrl-C (never over an existing file); after a
// failure only a file this run created is removed (host/util/outfile.h).
static int run_close_log(entropix_cli *ex, outfile_end how) {
    verr err = { { 0 } };
    return entropix_cli_close(ex, how, &err) ? fail("run", err.msg) : 0;
}

// The prompt: --ids, -p TEXT, or BOS alone.
static int prompt_ids(session *s, const char *ids_arg, const char *text, int **ids, verr *err) {
    if (ids_arg) return parse_id_list(ids_arg, ids, err);
    if (text) return session_encode_prompt(s, text, ids, err);
    int bos = s->m.cfg.bos_id >= 0 ? s->m.cfg.bos_id : s->tok ? tokenizer_bos_id(s->tok) : -1;
    if (bos < 0) return verr_set(err, "the model has no BOS token: give a prompt with -p or --ids");
    *ids = malloc(sizeof(int));
    if (!*ids) return verr_set(err, "out of memory");
    **ids = bos;
    return 1;
}

// Batch runs: --prompts FILE (one per line) or --prompt-csv FILE (a "prompt" column).
// Each prompt is generated exactly as a single `varent run -p PROMPT` with the same
// options and seed would be, and gives one JSONL line (host/decode/batch.h).
typedef struct {
    const char *lines_path, *csv_path, *out_path;
    int quiet, stats;
    int force, resume;  // -o: replace an existing file / continue it
    int seed_given;     // --seed N (not -1): a resumed file's seed must be N
    char *settings;     // every record's "settings" (host/cli/batch_resume.h)
    cli_sched sc;       // --parallel, --kv-pool-mb, --no-prefix-cache
} batch_args;

// One record, flushed: 0, or the errno of a failed write. chat: the prompt was a user
// turn in the chat template.
static int write_result(FILE *f, int i, const prompt_list *pl, const batch_result *r, uint64_t seed, int chat,
                        const char *settings) {
    errno = 0;
    fprintf(f, "{\"index\":%d,\"line\":%d,\"prompt\":", i, pl->line[i]);
    json_out_str(f, pl->text[i]);
    fputs(",\"text\":", f);
    if (r->text) json_out_str(f, r->text);
    else fputs("null", f);
    fputs(",\"ids\":[", f);
    for (int k = 0; k < r->n; k++) fprintf(f, k ? ",%d" : "%d", r->ids[k]);
    fprintf(f, "],\"tokens\":%d,\"prompt_tokens\":%d,\"tok_per_s\":", r->st.n_gen, r->st.n_prompt);
    json_out_num(f, batch_tok_s(r));
    fprintf(f, ",\"seed\":%llu,\"stop\":\"%s\",\"chat\":%s,\"settings\":%s,", (unsigned long long)seed,
            batch_stop_reason(r), chat ? "true" : "false", settings);
    batch_json_metrics(f, r);
    fputs("}\n", f);
    if (fflush(f) != 0 || ferror(f)) return errno ? errno : EIO;
    return 0;
}

// The batch through the scheduler (host/decode/sched.h): the prompts decode together,
// and each record is written in the prompts' order as soon as every prompt before it has
// ended. Prompts with LEHV branching run one by one at their turn.
typedef struct {
    session *s;
    const gen_opts *g;
    const prompt_list *pl;
    int **ids;
    const int *n;
    FILE *f;
    const char *where;
    const unsigned char *skip;
    int chat;              // the prompts were user turns in the chat template
    const char *settings;  // every record's "settings"
    progress pg;
    long *n_tok;
    int *done;
    batch_job *jobs;      // [pl->n] the scheduler's generations
    batch_result *res;    // [pl->n]
} batch_run;

static int batch_submit(void *ud, int i, sched_seq *r, verr *err) {
    batch_run *b = ud;
    if ((b->skip && b->skip[i]) || (b->g->sampler == GEN_ENTROPIX && b->g->branch_k > 0)) return 1;
    if (batch_job_begin(&b->jobs[i], b->s, b->g, &b->res[i], err)) return -1;
    r->prompt = b->ids[i], r->n_prompt = b->n[i], r->g = &b->jobs[i].o;
    return 0;
}

// Prompt i's turn: its record (generated now when it is run one by one).
static int batch_take(void *ud, int i, int rc, const gen_stats *st, const char *why, verr *err) {
    batch_run *b = ud;
    if (b->skip && b->skip[i]) return 0;  // --resume: already in the output
    batch_result *r = &b->res[i];
    if (rc == 1) rc = batch_generate(b->s, b->ids[i], b->n[i], b->g, r, err);
    else {
        if (rc) verr_set(err, "%s", why);
        rc = batch_job_end(&b->jobs[i], rc, st, err);
    }
    if (rc) return -1;
    if (r->st.interrupted) {
        batch_result_free(r);
        return 1;
    }
    progress_pause(&b->pg);  // a record on a terminal's stdout must not share the bar's line
    int werr = write_result(b->f, i, b->pl, r, b->g->seed, b->chat, b->settings);
    progress_resume(&b->pg);
    if (werr) {
        batch_result_free(r);
        return verr_set(err, "%s: write failed after %d records: %s", b->where, *b->done, strerror(werr));
    }
    *b->done += 1;
    *b->n_tok += r->st.n_gen;
    char detail[64];
    snprintf(detail, sizeof detail, "%d tokens, %.1f tok/s", r->st.n_gen, batch_tok_s(r));
    batch_result_free(r);
    progress_update(&b->pg, i + 1, detail);
    return 0;
}

static void batch_where(void *ud, int i, char *buf, size_t len) {
    const batch_run *b = ud;
    snprintf(buf, len, "prompt %d (line %d)", i + 1, b->pl->line[i]);
}

// 0, -1 with err, or 1 when Ctrl-C stopped it (*done prompts were written). where
// names f in messages ("-o PATH" or "stdout").
static int generate_all(session *s, sched *q, const gen_opts *g, const prompt_list *pl, int **ids, const int *n,
                        FILE *f, const char *where, const unsigned char *skip, int quiet, int chat,
                        const char *settings, long *n_tok, int *done, verr *err) {
    batch_run b = { s, g, pl, ids, n, f, where, skip, chat, settings, { 0 }, n_tok, done,
                    calloc((size_t)pl->n, sizeof(batch_job)), calloc((size_t)pl->n, sizeof(batch_result)) };
    if (!b.jobs || !b.res) {
        free(b.jobs), free(b.res);
        return verr_set(err, "out of memory");
    }
    progress_start(&b.pg, "run", pl->n, quiet);
    sched_map_fns fns = { batch_submit, batch_take, &b, 0, batch_where };
    int rc = sched_map(q, pl->n, &fns, err);
    if (rc == 1) progress_finish(&b.pg, "interrupted");
    else if (rc) progress_finish(&b.pg, err->msg[0] && strstr(err->msg, "write failed") ? "write failed" : NULL);
    else progress_finish(&b.pg, NULL);
    for (int i = 0; i < pl->n; i++) {  // those not taken (a stop)
        batch_job_drop(&b.jobs[i]);
        batch_result_free(&b.res[i]);
    }
    free(b.jobs), free(b.res);
    return rc;
}

// -o: records appended and flushed one by one, so Ctrl-C or a signal keeps the
// finished ones; --resume continues such a file (with its settings and seed: g->seed
// becomes the recorded one), --force replaces it. Checked, and its records read, before
// the model loads (a bad path fails early); opened once every prompt encodes (a FIFO is
// opened only for a run that will write to it).
static outfile_opts batch_out_opts(const batch_args *b) {
    return (outfile_opts){ .records = 1, .force = b->force, .resume = b->resume, .can_resume = 1, .flag = "-o" };
}

// Before the model loads: the path checked and --resume's records read. 1 when every
// prompt is done already.
static int check_batch_out(const batch_args *b, const prompt_list *pl, batch_done *d, gen_opts *g, verr *err) {
    if (!b->out_path) return 0;
    if (b->resume) {
        if (batch_done_read(b->out_path, pl, d, err) || batch_done_check(d, b->settings, b->out_path, err)) return -1;
        if (d->has_seed && b->seed_given && d->seed != g->seed)
            return verr_set(err, "--resume: %s was written with seed %llu, this run has --seed %llu; resume without "
                            "--seed (or with its seed), or start over with --force", b->out_path,
                            (unsigned long long)d->seed, (unsigned long long)g->seed);
        if (d->has_seed) g->seed = d->seed;
        if (d->n_done == pl->n) return 1;
        if (d->n_done > 0 && !b->quiet)
            fprintf(stderr, "varent run: resuming %s: %d of %d prompts done; seed %llu%s\n", b->out_path, d->n_done,
                    pl->n, (unsigned long long)g->seed, d->has_seed ? " (its records')" : "");
    }
    outfile_opts oo = batch_out_opts(b);
    return outfile_check(b->out_path, &oo, err);
}

// The end of -o: finished records are kept after Ctrl-C or a failure (--resume continues
// them; never over an existing file, host/util/outfile.h).
static int close_batch_out(outfile *out, int rc, int done, verr *err) {
    outfile_end how = rc == 0 ? OUTFILE_DONE : done > 0 ? OUTFILE_PARTIAL : OUTFILE_DROP;
    verr cerr = { { 0 } };
    if (outfile_finish(out, how, &cerr) && rc != -1) {
        *err = cerr;
        return -1;
    }
    return rc;
}

static int run_batch(const batch_args *b, const session_opts *so, gen_opts *g, entropix_cli *ex, prompt_style *ps) {
    const char *path = b->lines_path ? b->lines_path : b->csv_path;
    verr err = { { 0 } };
    prompt_list pl;
    if ((b->lines_path ? prompts_read_lines : prompts_read_csv)(&pl, path, &err)) return fail("run", err.msg);
    outfile out = { 0 };
    batch_done d = { 0 };
    int checked = check_batch_out(b, &pl, &d, g, &err), n_before = d.n_done;
    if (checked == 1) fprintf(stderr, "varent run: nothing to do: %d of %d prompts are done in %s\n", d.n_done, pl.n,
                              b->out_path);
    if (checked) {
        batch_done_free(&d), prompts_free(&pl);
        return checked == 1 ? 0 : fail("run", err.msg);
    }
    progress pg;
    cli_load_begin(&pg, b->quiet);
    session s;
    int **ids = calloc((size_t)pl.n, sizeof *ids), *n = calloc((size_t)pl.n, sizeof *n), rc = -1;
    long n_tok = 0;
    int done = 0;
    double t0 = gen_now();
    interrupt_install();  // Ctrl-C: stop after the current token; -o keeps the finished records
    g->interrupt = interrupt_flag();
    if (!ids || !n || session_open(&s, so, &err) != 0) {
        if (!ids || !n) verr_set(&err, "out of memory");
        cli_load_end(&pg, 0);
    } else {
        cli_load_end(&pg, 1);
        if (prompt_style_auto(&s, ps) && !b->quiet) chat_note();
        rc = prompts_encode_all(&s, ps, &pl, path, ids, n, &err);
        if (rc == 0 && b->out_path) {
            outfile_opts oo = batch_out_opts(b);
            rc = outfile_open(&out, b->out_path, &oo, &err);
        }
        if (rc == 0) rc = entropix_cli_start(ex, &s, g, &err);
        sched *q = NULL;
        if (rc == 0) rc = cli_sched_open(&q, &s, &b->sc, g->interrupt, &err);
        if (rc == 0)
            rc = generate_all(&s, q, g, &pl, ids, n, out.f ? out.f : stdout, out.f ? out.shown : "stdout", d.skip,
                              b->quiet, ps->chat, b->settings, &n_tok, &done, &err);
        if (rc == 0 && b->stats && q) sched_report(q, stderr);
        sched_close(q);
        session_close(&s);
    }
    int had_out = out.f != NULL;
    rc = close_batch_out(&out, rc, done, &err);
    if (rc == 1)
        verr_set(&err, "interrupted after %d of %d prompts%s%s%s", n_before + done, pl.n,
                 had_out ? "; finished records are in " : "", had_out ? outfile_where(&out) : "",
                 had_out ? " (--resume continues)" : "");
    if (rc == 0 && b->stats)
        fprintf(stderr, "batch: %d prompts, %ld tokens in %.2f s | seed %llu\n", pl.n, n_tok, gen_now() - t0,
                (unsigned long long)g->seed);
    for (int i = 0; ids && i < pl.n; i++) free(ids[i]);
    free(ids), free(n);
    batch_done_free(&d);
    prompts_free(&pl);
    return rc == 1 ? (fail("run", err.msg), INTERRUPT_EXIT) : rc ? fail("run", err.msg) : 0;
}

// Opens the captures once the prompt is known: ids holds the prompt and, through
// print_token, the generated ids.
static int start_probe(const probe_spec *p, session *s, gen_opts *g, entropix_cli *ex, run_out *out, const int *ids,
                       int n, probe **pr, verr *err) {
    if (!probe_spec_active(p)) return 0;
    if (!(out->ids = malloc(sizeof(int) * ((size_t)n + g->max_new + 1)))) return verr_set(err, "out of memory");
    memcpy(out->ids, ids, sizeof(int) * (size_t)n);
    out->n_ids = n;
    if (probe_open(pr, p, s, err)) return -1;
    ex->probe = *pr;
    g->feed_last = p->acts_path || p->attn_path;  // the files cover every position
    return 0;
}

static const cli_opt run_opts[] = {
    { "-n|--n-predict|--max-tokens", "N", "sampling", "256", "tokens to generate at most; -1: until EOS or a full context", 0 },
    { "--ignore-eos", NULL, "sampling", NULL, "go on past end-of-sequence tokens (up to -n)", 0 },
    { "--metrics-out", "FILE", "output", NULL, "per-token metrics as JSONL, one line per token", 0 },
    { "-r|--reverse-prompt|--stop", "TEXT", "sampling", NULL, "stop before TEXT, which is not printed (the server's stop)",
      ARG_REPEAT },
    { "-cnv|--conversation|-i|--interactive", NULL, "chat", NULL, "the interactive chat: varent chat with these "
      "options (-p TEXT: its first message)", 0 },
    { "--prompts", "FILE", "prompt", NULL, "batch: one prompt per line", 0 },
    { "--prompt-csv", "FILE", "prompt", NULL, "batch: the prompt column of a CSV file", 0 },
    { "-o|--out", "FILE", "output", "stdout", "batch: JSONL results, each record flushed as its prompt finishes", 0 },
    { "--resume", NULL, "output", NULL, "batch: continue -o FILE, skipping the prompts already in it", 0 },
    { "--force", NULL, "output", NULL, "replace an existing -o, --metrics-out, --dump-acts or --dump-attn file", 0 },
    { "-q|--quiet", NULL, "output", NULL, "batch: no progress on stderr", 0 },
    { "--stats", NULL, "output", NULL, "timings, the seed and the quadrant counts on stderr", 0 },
    { "--display-prompt", NULL, "output", NULL, "print the prompt before the generated text (llama.cpp's default)", 0 },
    { "--no-display-prompt", NULL, "output", "on", "print only the generated text", 0 },
    { "-v|--verbose", NULL, "output", NULL, "the model, device, context, prompt length, sampler and seed on stderr", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

static const cli_opt *const run_tables[] = { cli_opts_session,   cli_opts_llama,     cli_opts_llama_text, cli_opts_kv,
                                             cli_opts_tp,        cli_opts_lora,      cli_opts_prompt,     cli_opts_chat,
                                             cli_opts_raw,       cli_opts_sampling,  cli_opts_penalties,  cli_opts_logit_bias,
                                             run_opts,           cli_opts_entropix,  cli_opts_steer,      cli_opts_probe,
                                             cli_opts_sched,     NULL };

const cli_spec cli_run_spec = {
    "run", "-m DIR [-p TEXT | -f FILE | --ids LIST | --prompts FILE [-o OUT.jsonl]] [options]",
    "Generate text from a prompt, or from each prompt of a file (a batch).",
    "The text streams to stdout. Without -p, -f or --ids, a piped stdin is the prompt; with none at all,\n"
    "generation starts from BOS. When the model has a chat template, a text prompt is a user turn in it\n"
    "(as llama-cli's conversation mode, one turn; a note on stderr says so): --raw (-no-cnv) keeps it plain\n"
    "text. A batch writes one JSONL record per prompt (to -o FILE or stdout), each generated exactly as a\n"
    "single run with the same options and seed would be.",
    run_tables, NULL, NULL,
};

typedef struct {
    session_opts so;
    gen_opts g;
    entropix_cli ex;
    int ex_rc;
    verr xerr;
    prompt_style chat;
    batch_args b;
    probe_spec ps;  // --dump-acts, --attn-layers, --dump-attn, --logit-lens (host/cli/interp_opts.h)
    session_lora lora[CLI_MAX_LORA];  // --lora, --lora-scaled (so.lora points here)
    logit_bias bias[CLI_MAX_BIAS];    // -l (g.bias points here)
    char bad[4400];                   // a bad --lora or -l value
    int bad_rc;
    const char *ids_arg, *p, *file, *stop[16];
    int n_stop, display, verbose, conversation, escape;
    char *escaped[18];  // -e: the unescaped copies of -p, --system and -r (freed by run_free)
    int n_escaped;
} run_args;

static void run_read(args *a, run_args *r) {
    memset(r, 0, sizeof *r);
    cli_session_opts(a, &r->so);
    r->bad_rc = cli_lora_opts(a, &r->so, r->lora, CLI_MAX_LORA, r->bad, sizeof r->bad);
    r->ids_arg = args_str(a, "--ids", NULL), r->p = args_str(a, "-p", NULL), r->file = args_str(a, "-f", NULL);
    cli_sampling_opts(a, &r->g);
    char msg[256];
    if (cli_logit_bias(a, &r->g, r->bias, CLI_MAX_BIAS, msg, sizeof msg) && !r->bad_rc)
        r->bad_rc = -1, snprintf(r->bad, sizeof r->bad, "%s", msg);
    long n = args_int_range(a, "-n", 256, -1, INT_MAX);
    r->g.max_new = n < 0 ? INT_MAX : (int)n;
    r->g.ignore_eos = args_flag(a, "--ignore-eos");
    for (const char *t; (t = args_each(a, "-r"));)
        if (r->n_stop < 16) r->stop[r->n_stop++] = t;
        else r->n_stop = 17;
    r->conversation = args_flag(a, "-cnv");
    r->ex_rc = entropix_cli_read(a, &r->g, &r->ex, &r->xerr);
    r->ex.metrics_path = args_str(a, "--metrics-out", NULL);
    cli_penalty_opts(a, &r->g.pen);
    prompt_style_read(a, &r->chat);
    prompt_style_read_raw(a, &r->chat);
    r->escape = cli_llama_text_opts(a);
    cli_probe_opts(a, &r->ps);
    r->b = (batch_args){ args_str(a, "--prompts", NULL), args_str(a, "--prompt-csv", NULL), args_str(a, "-o", NULL),
                         args_flag(a, "-q"), args_flag(a, "--stats"), args_flag(a, "--force"), args_flag(a, "--resume"),
                         cli_seed_given(a), NULL, { 0, 0, 0, 0 } };
    r->ps.force = r->b.force;
    cli_sched_opts(a, &r->b.sc);
    r->display = args_bool(a, "--display-prompt", "--no-display-prompt", 0);
    r->verbose = args_flag(a, "-v");
}

// Combinations that cannot work: CLI_EXIT_USAGE after the message, else 0.
static int run_check(const run_args *r) {
    const batch_args *b = &r->b;
    if (!r->so.model_dir) return cli_usage_error("run", "missing -m DIR (the model directory)");
    if (r->bad_rc) return cli_usage_error("run", "%s", r->bad);
    if (r->n_stop > 16) return cli_usage_error("run", "-r: at most 16 stop strings");
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i][0]) return cli_usage_error("run", "-r: a stop string is empty");
    if (r->p && !r->p[0]) return cli_usage_error("run", "-p: the prompt is empty (leave -p out to start from BOS)");
    if (r->p && r->file) return cli_usage_error("run", "give the prompt either with -p or with -f, not both");
    if (r->chat.raw && r->chat.chat)
        return cli_usage_error("run", "--raw (-no-cnv) is plain text, --chat (--system, --chat-template, --no-think) "
                                      "the chat template: give one of them");
    if (r->ids_arg && (r->p || r->file)) return cli_usage_error("run", "give either --ids or -p/-f, not both");
    if (r->ids_arg && r->chat.chat) return cli_usage_error("run", "--chat renders text: give the message with -p, not --ids");
    if (b->lines_path && b->csv_path) return cli_usage_error("run", "give either --prompts or --prompt-csv, not both");
    if (b->resume && b->force) return cli_usage_error("run", "give either --resume or --force, not both");
    if (b->lines_path || b->csv_path) {
        if (r->ids_arg || r->p || r->file)
            return cli_usage_error("run", "--prompts/--prompt-csv take the prompts from the file: drop -p/-f/--ids");
        if (r->ex.metrics_path) return cli_usage_error("run", "--metrics-out is for a single prompt, not a batch run");
        if (r->n_stop) return cli_usage_error("run", "-r/--reverse-prompt is for a single prompt, not a batch run");
        if (probe_spec_active(&r->ps))
            return cli_usage_error("run", "--dump-acts, --attn-layers, --dump-attn and --logit-lens are for a single prompt");
        if (!b->out_path && b->resume) return cli_usage_error("run", "--resume is for -o FILE");
        return 0;
    }
    if (b->out_path) return cli_usage_error("run", "-o/--out is for batch runs (--prompts, --prompt-csv); a single run prints to stdout");
    if (b->resume) return cli_usage_error("run", "--resume is for batch runs with -o (--prompts, --prompt-csv)");
    if (b->quiet) return cli_usage_error("run", "-q/--quiet is for batch runs (--prompts, --prompt-csv)");
    if (b->sc.parallel || b->sc.pool_mb || b->sc.pool_tokens || b->sc.no_reuse)
        return cli_usage_error("run", "--parallel, --kv-pool-mb, --kv-pool-tokens and --no-prefix-cache are for batch "
                                      "runs (--prompts, --prompt-csv)");
    char bad[256];
    int branch = r->g.sampler == GEN_ENTROPIX && r->g.branch_k > 0;
    if (cli_probe_check(&r->ps, "--metrics-out", r->ex.metrics_path != NULL, branch, bad, sizeof bad))
        return cli_usage_error("run", "%s", bad);
    return 0;
}

// -cnv/-i: `varent chat` with the other arguments; -p or -f is its first message (as
// llama-cli takes it), then the chat reads its messages itself.
static int run_as_chat(const run_args *r, int argc, char **argv) {
    if (r->ids_arg)
        return cli_usage_error("run", "-cnv/-i starts the interactive chat, whose messages are text: drop --ids "
                                      "(-p TEXT is the first message, -sys TEXT the system message)");
    char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
    if (!rest) return cli_error("run", "out of memory");
    int n = 0, opts = 1;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (opts && !strcmp(s, "--")) opts = 0;
        if (!(opts && (!strcmp(s, "-cnv") || !strcmp(s, "--conversation") || !strcmp(s, "-i") || !strcmp(s, "--interactive"))))
            rest[n++] = argv[i];
    }
    rest[n] = NULL;
    int rc = cmd_chat(n, rest);
    free(rest);
    return rc;
}

static void run_verbose(const run_args *r, const session *s, int n_prompt) {
    const model_config *c = &s->m.cfg;
    const sampler_params *p = &r->g.sp;
    fprintf(stderr, "varent run: model %s (%s, %.1f M parameters, %s weights) | device %s | %d threads | context %d | "
                    "prompt %d tokens%s\n", r->so.model_dir, c->arch_name, s->m.n_params / 1e6, wtype_name(s->m.embed.type),
            r->so.device, cpu_set_threads(0), s->ctx, n_prompt, r->chat.chat ? " (chat template)" : "");
    fprintf(stderr, "varent run: sampler %s (profile %s) | temp %g top-k %d top-p %g min-p %g | -n %d%s | seed %llu\n",
            r->ex.sampler_name, r->ex.ex.name, p->temperature, p->top_k, p->top_p, p->min_p, r->g.max_new,
            r->g.ignore_eos ? " (ignoring EOS)" : "", (unsigned long long)r->g.seed);
}

// The decode loop's line: on the device (its steps, and those run past the stop), or why not.
static void run_loop_stats(const gen_stats *st) {
    if (!st->loop_why)
        fprintf(stderr, "decode loop: on the device, %d steps queued ahead (%d past the stop, truncated)\n",
                st->loop_steps, st->loop_discarded);
    else
        fprintf(stderr, "decode loop: per token on the host: %s\n", st->loop_why);
}

static void run_stats(const session *s, const gen_stats *st, uint64_t seed) {
    fprintf(stderr, "load %.3f s | prefill %d tokens %.1f tok/s | decode %d tokens %.1f tok/s | seed %llu\n", s->load_s,
            st->n_prompt, st->n_prompt / (st->prefill_s > 0 ? st->prefill_s : 1e-9), st->n_gen,
            st->n_gen > 1 ? (st->n_gen - 1) / st->decode_s : 0.0, (unsigned long long)seed);
    if (!s->cu) return;
    long hits, misses;  // draws made inside the steps (model/cuda/arm.c), and ones drawn again
    cuda_forward_arm_counts(s->cu, &hits, &misses);
    fprintf(stderr, "device draws: %ld armed, %ld drawn again after a mismatch\n", hits, misses);
    run_loop_stats(st);
    cuda_step_counts c;
    cuda_forward_counts(s->cu, &c);
    char line[512];
    if (cli_tune_line(&c, line, sizeof line)) fprintf(stderr, "%s\n", line);
    // steps the persistent kernel does not support take the graph path
    if (cli_persist_line(s->decode_persistent, &c, line, sizeof line)) fprintf(stderr, "%s\n", line);
}

// --display-prompt: the prompt as given (or its ids decoded), before the text.
static void display_prompt(const session *s, const char *text, const int *ids, int n) {
    if (text) {
        fputs(text, stdout);
        return;
    }
    verr err;
    char *t = s->tok ? tokenizer_decode(s->tok, ids, n, 1, &err) : NULL;
    if (t) fputs(t, stdout);
    free(t);
}

// Where the prompt came from, for messages: "-f FILE", "-p", "--ids" or "stdin".
static void prompt_source(const run_args *r, char *buf, size_t len) {
    if (r->file) snprintf(buf, len, "-f %s", r->file);
    else snprintf(buf, len, "%s", r->ids_arg ? "--ids" : r->p && strcmp(r->p, "-") != 0 ? "-p" : "stdin");
}

// The prompt's ids: -1 with err naming where the prompt came from when it cannot run.
static int single_prompt(run_args *r, session *s, const char *text, int **ids, verr *err) {
    if (!r->ids_arg && text && prompt_style_auto(s, &r->chat)) chat_note();
    int n = r->chat.chat ? prompt_encode(s, &r->chat, text, ids, err) : prompt_ids(s, r->ids_arg, text, ids, err);
    if (n >= 0 && n < s->ctx) return n;
    char where[4200], why[sizeof err->msg];
    prompt_source(r, where, sizeof where);
    snprintf(why, sizeof why, "%s", err->msg);
    if (n < 0) return verr_set(err, "%.300s: %s", where, why);
    return verr_set(err, "%.300s: the prompt is %d tokens but the context holds %d (raise --ctx, up to %d)", where, n,
                    s->ctx, s->m.cfg.max_pos);
}

// One prompt, streamed to stdout.
static int run_single(run_args *r, const char *text) {
    verr err = { { 0 } };
    session s;
    entropix_cli *ex = &r->ex;
    if (entropix_cli_check(ex, r->b.force, &r->xerr)) return fail("run", r->xerr.msg);
    interrupt_install();  // Ctrl-C: stop generating, flush, exit 130
    r->g.interrupt = interrupt_flag();
    if (session_open(&s, &r->so, &err)) return fail("run", err.msg);
    int *ids = NULL, rc = 0;
    int n = single_prompt(r, &s, text, &ids, &err);
    run_out out = { .s = &s, .ts = s.tok ? tokenizer_stream_new(s.tok, 1) : NULL };
    stopstr_init(&out.stop, r->stop, r->n_stop);
    r->g.on_token = print_token, r->g.ud = &out, r->g.want_metrics = r->b.stats;
    probe *pr = NULL;
    if (n >= 0 && (entropix_cli_open(ex, r->b.force, &err) || entropix_cli_start(ex, &s, &r->g, &err) ||
                   start_probe(&r->ps, &s, &r->g, ex, &out, ids, n, &pr, &err)))
        n = -1;
    if (n >= 0 && r->verbose) run_verbose(r, &s, n);
    if (n >= 0 && r->display) {
        display_prompt(&s, text, ids, n);
        if (out.ts) tokenizer_stream_continue(out.ts);
    }
    gen_stats st;
    cli_prefill bar = { .shown = 0 };
    if (!probe_spec_active(&r->ps)) cli_prefill_watch(&bar, &r->g);  // a capture sees the prompt as one forward
    int gen_rc = n < 0 ? -1 : generate(&s, ids, n, &r->g, &st, &err);
    cli_prefill_done(&bar);
    if (gen_rc || probe_check(pr, &err)) {
        rc = fail("run", err.msg);
    } else {
        print_tail(&out);
        printf("\n");
        fflush(stdout);  // the text before the stats line, even when both go to one terminal
        if (st.hit_ctx)
            fprintf(stderr, "varent run: context full after %d tokens (they and the prompt's %d fill --ctx %d; raise "
                    "it)\n", st.n_gen, st.n_prompt, s.ctx);
        if (r->b.stats) run_stats(&s, &st, r->g.seed), entropix_cli_report(ex, &st);
        rc = run_finish(ex, &st);
    }
    if (out.ts) tokenizer_stream_free(out.ts);
    stopstr_free(&out.stop);
    free(ids);
    if (probe_close(pr, cli_outfile_end(rc), out.ids, out.n_ids, &err) && rc == 0) rc = fail("run", err.msg);
    free(out.ids);
    if (run_close_log(ex, cli_outfile_end(rc)) && rc == 0) rc = 1;
    session_close(&s);
    return rc;
}

// -e: a copy of s with its escapes processed (kept in r->escaped), or s.
static const char *unescaped(run_args *r, const char *s) {
    if (!r->escape || !s || r->n_escaped == (int)(sizeof r->escaped / sizeof *r->escaped)) return s;
    char *c = strdup(s);
    if (!c) return s;
    cli_unescape(c);
    return r->escaped[r->n_escaped++] = c;
}

static void run_free(run_args *r) {
    for (int i = 0; i < r->n_escaped; i++) free(r->escaped[i]);
    free(r->b.settings);
}

// The batch: its settings, recorded in every record for --resume (host/cli/batch_resume.h).
static int run_batch_cmd(run_args *r) {
    r->b.settings = batch_settings_json(r->so.model_dir, &r->g, r->ex.sampler_name, r->ex.ex.name, &r->chat);
    if (!r->b.settings) return cli_error("run", "out of memory");
    return run_batch(&r->b, &r->so, &r->g, &r->ex, &r->chat);
}

static int run_main(run_args *r) {
    if (r->b.lines_path || r->b.csv_path) return run_batch_cmd(r);
    verr err = { { 0 } };
    const char *text;
    char *owned;
    if (cli_prompt_text(r->p, r->file, r->ids_arg != NULL, &text, &owned, &err)) return fail("run", err.msg);
    if (r->chat.chat && !text) {
        free(owned);
        return cli_usage_error("run", "--chat needs a user message: -p TEXT, -f FILE or stdin");
    }
    int rc = run_single(r, unescaped(r, text));
    free(owned);
    return rc;
}

int cmd_run(int argc, char **argv) {
    args a;
    int rc = args_init(&a, &cli_run_spec, argc, argv);
    if (rc >= 0) return rc;
    run_args r;
    run_read(&a, &r);
    if (r.conversation) return run_as_chat(&r, argc, argv);
    if (args_finish(&a, 0)) return cli_usage_error("run", "%s", a.err);
    r.chat.system = unescaped(&r, r.chat.system);
    for (int i = 0; i < r.n_stop && i < 16; i++) r.stop[i] = unescaped(&r, r.stop[i]);
    if ((rc = run_check(&r)) == 0) rc = r.ex_rc ? cli_usage_error("run", "%s", r.xerr.msg) : run_main(&r);
    run_free(&r);
    return rc;
}

static const cli_opt logits_opts[] = {
    { "--ids", "LIST", "prompt", NULL, "token ids, e.g. 1,2,3 (required)", 0 },
    { "-o|--out", "FILE", "output", NULL, "where the float32 logits go (required)", 0 },
    { "--chunk", "N", "performance", "all ids at once", "forward the ids N at a time", 0 },
    { "--force", NULL, "output", NULL, "replace an existing --dump-acts or --dump-attn file", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const logits_tables[] = { cli_opts_session, cli_opts_llama, cli_opts_kv, cli_opts_tp, cli_opts_lora, logits_opts, cli_opts_steer,
                                                cli_opts_probe, NULL };
const cli_spec cli_logits_spec = {
    "logits", "-m DIR --ids 1,2,3 -o FILE [options]",
    "Write the last position's logits (vocab_size float32, little-endian) after a forward of the ids.",
    NULL, logits_tables, NULL, NULL,
};

int cmd_logits(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_logits_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    session_lora lora[CLI_MAX_LORA];
    char lora_msg[4400];
    if (cli_lora_opts(&a, &so, lora, CLI_MAX_LORA, lora_msg, sizeof lora_msg)) return cli_usage_error("logits", "%s", lora_msg);
    const char *ids_arg = args_str(&a, "--ids", NULL), *out = args_str(&a, "-o", NULL);
    int chunk = (int)args_int_range(&a, "--chunk", 0, 1, INT_MAX);
    probe_spec ps;
    cli_probe_opts(&a, &ps);
    ps.force = args_flag(&a, "--force");
    if (args_finish(&a, 0)) return cli_usage_error("logits", "%s", a.err);
    if (!so.model_dir || !ids_arg || !out) return cli_usage_error("logits", "need -m DIR, --ids LIST and -o FILE");
    verr err = { { 0 } };
    int *ids = NULL;
    int n = parse_id_list(ids_arg, &ids, &err);
    if (n < 0) return fail("logits", err.msg);
    session s;
    if (session_open(&s, &so, &err)) {
        free(ids);
        return fail("logits", err.msg);
    }
    kv_view kv = kv_view_of(&s.kv);
    int rc = 0, step = chunk > 0 ? chunk : n;
    probe *pr = NULL;
    if (n > s.ctx) rc = verr_set(&err, "%d ids do not fit the %d-token context (raise --ctx)", n, s.ctx);
    if (rc == 0 && probe_spec_active(&ps)) rc = probe_open(&pr, &ps, &s, &err);
    for (int i = 0; rc == 0 && i < n; i += step)
        rc = session_forward(&s, &kv, ids + i, n - i < step ? n - i : step, &err);
    if (rc == 0) rc = probe_check(pr, &err);
    if (rc == 0) rc = outfile_write_all(out, s.fw.logits, sizeof(float) * (size_t)s.m.cfg.vocab_size, &err);
    if (rc == 0 && (ps.attn_layers || ps.logit_lens)) {  // the last position's, one JSON line on stdout
        printf("{\"pos\":%d", n - 1);
        probe_json(pr, stdout);
        printf("}\n");
        if (fflush(stdout) != 0) rc = verr_set(&err, "writing to stdout failed");
    }
    if (probe_close(pr, rc == 0, ids, n, &err)) rc = -1;
    free(ids);
    session_close(&s);
    return rc ? fail("logits", err.msg) : 0;
}
