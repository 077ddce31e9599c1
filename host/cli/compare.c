// compare.c: `varent compare -m DIR --prompts FILE [--samplers LIST]`: every prompt
// under every sampler with the same seed, side by side. Per run: the text, decode
// tokens/s, mean entropy, quadrant counts, distinct-n and the mean log-probability of
// the generated tokens under the model (teacher-forced, raw logits: what the model
// thinks of the text, whatever sampler chose it). Markdown on stdout, JSONL with -o.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/decode/batch.h"
#include "host/decode/sched.h"
#include "host/cli/commands.h"
#include "host/cli/entropix_opts.h"
#include "host/cli/interp_opts.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/util/interrupt.h"
#include "host/util/outfile.h"
#include "host/decode/perplexity.h"
#include "host/util/progress.h"
#include "host/cli/prompts.h"

#define MAX_SAMPLERS 16
#define MAX_DISTINCT 3

static int fail(const char *msg) { return cli_error("compare", "%s", msg); }

static const cli_opt compare_opts[] = {
    { "--prompts", "FILE", "prompt", NULL, "one prompt per line", 0 },
    { "--prompt-csv", "FILE", "prompt", NULL, "the prompt column of a CSV file", 0 },
    { "-n|--n-predict|--max-tokens", "N", "sampling", "64", "tokens to generate per run at most", 0 },
    { "--samplers", "LIST", "entropix", "standard,greedy,entropix:seed,entropix:jax",
      "arms: standard (the sampling options), greedy, entropix (--profile) or entropix:PROFILE", 0 },
    { "--profile", "NAME|FILE", "entropix", "seed", "profile (stock name or NAME.json) of a plain entropix arm, and of the quadrant counts", 0 },
    { "-o|--out", "FILE", "output", NULL, "also one JSONL row per prompt and sampler, flushed as it finishes", 0 },
    { "--format", "md|jsonl", "output", "md", "what stdout gets: a markdown table or the JSONL rows", 0 },
    { "--text-width", "N", "output", "60", "characters of each text in the markdown table", 0 },
    { "--metrics-out", "FILE", "output", NULL, "per-token metrics as JSONL, each line with its prompt_index and sampler", 0 },
    { "--force", NULL, "output", NULL, "replace an existing -o, --metrics-out or capture file", 0 },
    { "-q|--quiet", NULL, "output", NULL, "no progress on stderr", 0 },
    { "--stats", NULL, "output", NULL, "the scheduler's batches and reuse on stderr", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const compare_tables[] = { cli_opts_session, cli_opts_llama, cli_opts_kv, cli_opts_tp, cli_opts_lora,       cli_opts_chat, cli_opts_sampling,
                                                 compare_opts,     cli_opts_logit_bias, cli_opts_steer, cli_opts_probe,
                                                 cli_opts_sched, NULL };
const cli_spec cli_compare_spec = {
    "compare", "-m DIR (--prompts FILE | --prompt-csv FILE) [--samplers LIST] [options]",
    "Every prompt under every sampler with the same seed, side by side.",
    "Per run: the text, decode tok/s, mean entropy, quadrant counts, distinct-n and the mean log-probability\n"
    "of the generated tokens under the model. Docs: docs/research.md.",
    compare_tables, NULL, NULL,
};

typedef struct {
    char name[48];
    gen_sampler kind;
    int greedy;
    entropix_config ex;  // entropix: its profile; standard/greedy: the classification profile
} sampler_spec;

typedef struct {
    int prompt, sampler;
    batch_result r;
    int n_prompt;
    double distinct[MAX_DISTINCT];  // distinct-1..3 over generated ids (NAN: no n-grams)
    double mean_logp;               // nats per generated token (NAN: none generated)
    gen_opts g;                     // the scheduler's run: its options and collector
    batch_job job;
} row;

// "standard", "greedy", "entropix" (the --profile) or "entropix:PROFILE".
static int parse_one(const char *spec, const char *def_profile, sampler_spec *o, verr *err) {
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", spec);
    const char *profile = def_profile;
    if (!strcmp(spec, "standard") || !strcmp(spec, "greedy")) {
        o->kind = GEN_STANDARD, o->greedy = spec[0] == 'g';
    } else if (!strcmp(spec, "entropix") || !strncmp(spec, "entropix:", 9)) {
        o->kind = GEN_ENTROPIX;
        if (spec[8] == ':') profile = spec + 9;
    } else {
        return verr_set(err, "--samplers: unknown sampler '%s' (use standard, greedy, entropix or entropix:PROFILE)", spec);
    }
    if (entropix_profile_load(profile, &o->ex, err)) return verr_set(err, "--samplers: '%s': %.900s", spec, err->msg);
    return 0;
}

static int parse_samplers(const char *list, const char *def_profile, sampler_spec *out, verr *err) {
    int n = 0;
    char buf[1024];
    if (strlen(list) >= sizeof buf) return verr_set(err, "--samplers: list too long");
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        for (size_t k = strlen(t); k > 0 && t[k - 1] == ' ';) t[--k] = 0;
        if (!*t) continue;
        if (n == MAX_SAMPLERS) return verr_set(err, "--samplers: at most %d samplers", MAX_SAMPLERS);
        if (parse_one(t, def_profile, &out[n++], err)) return -1;
    }
    if (n == 0) return verr_set(err, "--samplers: empty list");
    return n;
}

// Distinct n-grams / all n-grams of ids[0..len) (Li et al. 2016), NAN when len < n.
static double distinct_n(const int *ids, int len, int n) {
    int total = len - n + 1, uniq = 0;
    if (total <= 0) return NAN;
    for (int i = 0; i < total; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !memcmp(ids + i, ids + j, sizeof(int) * (size_t)n);
        uniq += !seen;
    }
    return (double)uniq / total;
}

// Mean ln p of the generated ids given the prompt and the ids before them: from the
// logits each was drawn from, or, where some stayed on the device (CUDA), by scoring the
// prompt and the ids again.
static int mean_logprob(session *s, const int *prompt, int n_prompt, const batch_result *r, double *out, verr *err) {
    *out = NAN;
    if (r->n == 0) return 0;
    if (r->n_logp == r->n) {
        *out = r->sum_logp / r->n;
        return 0;
    }
    int n = n_prompt + r->n;
    int *all = malloc(sizeof(int) * (size_t)n);
    double *lp = malloc(sizeof(double) * (size_t)n);
    int rc = all && lp ? 0 : verr_set(err, "out of memory");
    if (rc == 0) {
        memcpy(all, prompt, sizeof(int) * (size_t)n_prompt);
        memcpy(all + n_prompt, r->ids, sizeof(int) * (size_t)r->n);
        rc = ppl_score(s, all, n, n_prompt, lp, err);
    }
    double sum = 0;
    for (int i = n_prompt; rc == 0 && i < n; i++) sum += lp[i];
    if (rc == 0) *out = sum / r->n;
    free(all), free(lp);
    return rc;
}

// The captures and the per-token log (docs/research.md): a capture file per prompt and
// arm, FILE with ".pI.ARM" inserted before its extension; the log's records carry the
// prompt index and the arm.
typedef struct {
    probe_spec ps;
    entropix_cli ex;  // --metrics-out: ex.log, NULL without
} compare_cap;

// path with ".pI.ARM" before its extension (the last '.' of the file name), or after it.
static int arm_path(const char *path, int prompt, const char *arm, char *out, size_t n, verr *err) {
    char name[64], tag[96];
    cli_probe_name(arm, name, sizeof name);
    snprintf(tag, sizeof tag, "p%d.%s", prompt, name);
    return cli_probe_path(path, tag, out, n, err);
}

// Opens run (prompt, arm)'s probe, with its file names, and points the log at it.
static int cap_start(compare_cap *cap, session *s, gen_opts *g, const sampler_spec *sp, int prompt, probe **pr,
                     verr *err) {
    if (cap->ex.log) {
        cap->ex.sampler_name = sp->name;
        snprintf(cap->ex.tag, sizeof cap->ex.tag, "\"prompt_index\":%d,", prompt);
        g->on_record = entropix_cli_record, g->record_ud = &cap->ex;
    }
    if (!probe_spec_active(&cap->ps)) return 0;
    probe_spec ps = cap->ps;
    char acts[4200], attn[4200];
    if (ps.acts_path && arm_path(ps.acts_path, prompt, sp->name, acts, sizeof acts, err)) return -1;
    if (ps.attn_path && arm_path(ps.attn_path, prompt, sp->name, attn, sizeof attn, err)) return -1;
    ps.acts_path = ps.acts_path ? acts : NULL, ps.attn_path = ps.attn_path ? attn : NULL;
    if (probe_open(pr, &ps, s, err)) return -1;
    cap->ex.probe = *pr;
    g->feed_last = ps.acts_path || ps.attn_path;  // the files cover every position
    return 0;
}

// Closes the run's probe before anything else runs on the session: its files are kept
// when the run finished (not interrupted), with the prompt and generated ids.
static int cap_close(compare_cap *cap, probe *pr, int keep, const int *ids, int n, const batch_result *r, verr *err) {
    cap->ex.probe = NULL;
    if (!pr) return 0;
    int *all = keep ? malloc(sizeof(int) * (size_t)(n + r->n + 1)) : NULL;
    int oom = keep && !all;
    if (all) memcpy(all, ids, sizeof(int) * (size_t)n), memcpy(all + n, r->ids, sizeof(int) * (size_t)r->n);
    int rc = probe_close(pr, keep && !oom, all, n + r->n, err);
    free(all);
    return oom ? verr_set(err, "out of memory") : rc;
}

// The options of the run of prompt i under sampler sp.
static gen_opts arm_opts(const gen_opts *base, const sampler_spec *sp) {
    gen_opts g = *base;
    g.sampler = sp->kind, g.ex = &sp->ex;
    if (sp->greedy) g.sp.temperature = 0;
    return g;
}

// What a finished run adds: distinct-n and the mean log-probability of its tokens.
static int finish_row(session *s, const int *ids, int n, row *w, verr *err) {
    w->n_prompt = n;
    for (int k = 0; k < MAX_DISTINCT; k++) w->distinct[k] = distinct_n(w->r.ids, w->r.n, k + 1);
    return mean_logprob(s, ids, n, &w->r, &w->mean_logp, err);
}

// One run on the session, with its captures and per-token log (the one-by-one path).
static int run_one(session *s, const gen_opts *base, const sampler_spec *sp, const int *ids, int n, row *w,
                   compare_cap *cap, int prompt, verr *err) {
    gen_opts g = arm_opts(base, sp);
    probe *pr = NULL;
    if (cap_start(cap, s, &g, sp, prompt, &pr, err)) return -1;
    int rc = batch_generate(s, ids, n, &g, &w->r, err);
    if (rc == 0) rc = probe_check(pr, err);
    if (rc == 0 && cap->ex.log && (fflush(cap->ex.log) != 0 || ferror(cap->ex.log)))
        rc = verr_set(err, "--metrics-out %s: write failed (disk full?)", cap->ex.metrics_path);
    if (cap_close(cap, pr, rc == 0 && !w->r.st.interrupted, ids, n, &w->r, err) && rc == 0) rc = -1;
    if (rc) return -1;  // probe_check's and cap_close's failures leave r to the caller, freed with the rows
    return finish_row(s, ids, n, w, err);
}

static void write_row(FILE *f, const row *w, const prompt_list *pl, const sampler_spec *sp, uint64_t seed) {
    const batch_result *r = &w->r;
    fprintf(f, "{\"prompt_index\":%d,\"line\":%d,\"prompt\":", w->prompt, pl->line[w->prompt]);
    json_out_str(f, pl->text[w->prompt]);
    fputs(",\"sampler\":", f);
    json_out_str(f, sp->name);
    fputs(",\"profile\":", f);
    json_out_str(f, sp->ex.name);
    fprintf(f, ",\"seed\":%llu,\"text\":", (unsigned long long)seed);
    if (r->text) json_out_str(f, r->text);
    else fputs("null", f);
    fputs(",\"ids\":[", f);
    for (int k = 0; k < r->n; k++) fprintf(f, k ? ",%d" : "%d", r->ids[k]);
    fprintf(f, "],\"tokens\":%d,\"prompt_tokens\":%d,\"stop\":\"%s\",\"tok_per_s\":", r->n, w->n_prompt,
            batch_stop_reason(r));
    json_out_num(f, batch_tok_s(r));
    fputs(",\"mean_logprob\":", f);
    json_out_num(f, w->mean_logp);
    fputs(",\"distinct\":{", f);
    for (int k = 0; k < MAX_DISTINCT; k++) {
        fprintf(f, "%s\"%d\":", k ? "," : "", k + 1);
        json_out_num(f, w->distinct[k]);
    }
    fputs("},", f);
    batch_json_metrics(f, r);
    fputs("}\n", f);
}

// A table cell: newlines and tabs become spaces, '|' is escaped, and the text is cut
// after `width` characters (never inside a UTF-8 sequence).
static void md_cell(FILE *f, const char *s, int width) {
    int chars = 0;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if ((*p & 0xc0) != 0x80 && chars++ == width) {
            fputs("...", f);
            return;
        }
        if (*p == '\n' || *p == '\r' || *p == '\t') fputc(' ', f);
        else if (*p == '|') fputs("\\|", f);
        else fputc(*p, f);
    }
}

static void md_num(FILE *f, double x, const char *fmt) {
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("-", f);
}

static const entropix_quadrant shown_q[] = { Q_LELV, Q_HELV, Q_LEHV, Q_HEHV, Q_ADAPTIVE, Q_BRANCH };
#define N_SHOWN ((int)(sizeof shown_q / sizeof *shown_q))

static void md_header(FILE *f, int with_text) {
    fputs("| sampler | tokens | tok/s | mean H (bits) |", f);
    for (int q = 0; q < N_SHOWN; q++) fprintf(f, " %s |", entropix_quadrant_name(shown_q[q]));
    fputs(" distinct-1 | distinct-2 | mean log p (nats) |", f);
    fputs(with_text ? " text |\n|---|" : "\n|---|", f);
    for (int i = 0; i < 3 + N_SHOWN + 3; i++) fputs("--:|", f);
    fputs(with_text ? "---|\n" : "\n", f);
}

static void md_row(FILE *f, const row *w, const sampler_spec *sp, int width) {
    const batch_result *r = &w->r;
    fprintf(f, "| %s | %d | ", sp->name, r->n);
    md_num(f, batch_tok_s(r), "%.1f");
    fputs(" | ", f);
    md_num(f, r->n_metrics ? r->st.sum_entropy / r->n_metrics : NAN, "%.3f");
    for (int q = 0; q < N_SHOWN; q++) fprintf(f, " | %d", r->st.quadrant_count[shown_q[q]]);
    for (int k = 0; k < 2; k++) fputs(" | ", f), md_num(f, w->distinct[k], "%.3f");
    fputs(" | ", f);
    md_num(f, w->mean_logp, "%.3f");
    fputs(" | ", f);
    md_cell(f, r->text, width);
    fputs(" |\n", f);
}

// Per sampler over all prompts: token-weighted mean entropy and log p, summed
// quadrant counts, mean distinct-n and tok/s over the runs.
static void md_summary(FILE *f, const row *rows, int n_rows, const sampler_spec *sp, int n_sp) {
    fputs("\n### All prompts, per sampler\n\n", f);
    md_header(f, 0);
    for (int j = 0; j < n_sp; j++) {
        double tok_s = 0, ent = 0, lp = 0, dist[2] = { 0, 0 };
        int runs = 0, toks = 0, n_met = 0, nd[2] = { 0, 0 }, quad[Q_COUNT] = { 0 };
        for (int i = 0; i < n_rows; i++) {
            const row *w = &rows[i];
            if (w->sampler != j) continue;
            runs++, toks += w->r.n, tok_s += batch_tok_s(&w->r);
            ent += w->r.st.sum_entropy, n_met += w->r.n_metrics;
            if (w->r.n) lp += w->mean_logp * w->r.n;
            for (int q = 0; q < Q_COUNT; q++) quad[q] += w->r.st.quadrant_count[q];
            for (int k = 0; k < 2; k++)
                if (isfinite(w->distinct[k])) dist[k] += w->distinct[k], nd[k]++;
        }
        fprintf(f, "| %s | %d | ", sp[j].name, toks);
        md_num(f, runs ? tok_s / runs : NAN, "%.1f");
        fputs(" | ", f);
        md_num(f, n_met ? ent / n_met : NAN, "%.3f");
        for (int q = 0; q < N_SHOWN; q++) fprintf(f, " | %d", quad[shown_q[q]]);
        for (int k = 0; k < 2; k++) fputs(" | ", f), md_num(f, nd[k] ? dist[k] / nd[k] : NAN, "%.3f");
        fputs(" | ", f);
        md_num(f, toks ? lp / toks : NAN, "%.3f");
        fputs(" |\n", f);
    }
}

static void write_markdown(FILE *f, const row *rows, int n_rows, const prompt_list *pl, const sampler_spec *sp, int n_sp,
                           const gen_opts *g, int width) {
    fprintf(f, "## varent compare: %d prompt%s x %d sampler%s, seed %llu, up to %d tokens\n", pl->n,
            pl->n == 1 ? "" : "s", n_sp, n_sp == 1 ? "" : "s", (unsigned long long)g->seed, g->max_new);
    for (int i = 0; i < n_rows; i++) {
        if (rows[i].sampler == 0) {
            fprintf(f, "\n### Prompt %d (line %d): ", rows[i].prompt + 1, pl->line[rows[i].prompt]);
            md_cell(f, pl->text[rows[i].prompt], width);
            fputs("\n\n", f);
            md_header(f, 1);
        }
        md_row(f, &rows[i], &sp[rows[i].sampler], width);
    }
    md_summary(f, rows, n_rows, sp, n_sp);
}

typedef struct {
    const char *prompts, *csv, *samplers, *profile, *out, *format;
    int width, quiet;
    int force;  // -o: replace an existing file
    int stats;  // --stats: the scheduler's line on stderr
    cli_sched sc;
} compare_args;

// Every run through the scheduler (host/decode/sched.h), rows written in order as they
// end; with captures or --metrics-out each run goes one by one at its turn.
typedef struct {
    session *s;
    const compare_args *c;
    const gen_opts *g;
    const prompt_list *pl;
    const sampler_spec *sp;
    int n_sp;
    row *rows;
    int **ids, *n;  // [pl->n] each prompt's ids
    FILE *jsonl;
    compare_cap *cap;
    progress pg;
} compare_run;

static int compare_submit(void *ud, int k, sched_seq *r, verr *err) {
    compare_run *cr = ud;
    row *w = &cr->rows[k];
    int i = k / cr->n_sp, j = k % cr->n_sp;
    w->prompt = i, w->sampler = j;
    if (cr->cap->ex.log || probe_spec_active(&cr->cap->ps)) return 1;
    w->g = arm_opts(cr->g, &cr->sp[j]);
    if (batch_job_begin(&w->job, cr->s, &w->g, &w->r, err)) return -1;
    r->prompt = cr->ids[i], r->n_prompt = cr->n[i], r->g = &w->job.o;
    return 0;
}

static int compare_take(void *ud, int k, int rc, const gen_stats *st, const char *why, verr *err) {
    compare_run *cr = ud;
    row *w = &cr->rows[k];
    int i = k / cr->n_sp, j = k % cr->n_sp;
    const char *path = cr->c->prompts ? cr->c->prompts : cr->c->csv;
    if (rc == 1) rc = run_one(cr->s, cr->g, &cr->sp[j], cr->ids[i], cr->n[i], w, cr->cap, i, err);
    else {
        if (rc) verr_set(err, "%s", why);
        rc = batch_job_end(&w->job, rc, st, err);
        if (rc == 0 && !w->r.st.interrupted) rc = finish_row(cr->s, cr->ids[i], cr->n[i], w, err);
    }
    if (rc) return verr_set(err, "%s:%d: %s: %.900s", path, cr->pl->line[i], cr->sp[j].name, err->msg);
    if (w->r.st.interrupted) {
        verr_set(err, "interrupted after %d of %d runs%s", k, cr->pl->n * cr->n_sp,
                 cr->c->out ? "; finished rows are in " : "");
        return 1;
    }
    if (cr->jsonl) {
        progress_pause(&cr->pg);  // a record on a terminal's stdout must not share the bar's line
        write_row(cr->jsonl, w, cr->pl, &cr->sp[j], cr->g->seed);
        errno = 0;
        int bad = fflush(cr->jsonl) != 0 || ferror(cr->jsonl);  // each row whole as it finishes (a signal keeps it)
        progress_resume(&cr->pg);
        if (bad)
            return verr_set(err, "%s%s: write failed after %d rows: %s", cr->c->out ? "-o " : "",
                            cr->c->out ? cr->c->out : "stdout", k, strerror(errno ? errno : EIO));
    }
    char detail[160];
    snprintf(detail, sizeof detail, "prompt %d %.48s: %d tokens", i + 1, cr->sp[j].name, w->r.n);
    progress_update(&cr->pg, k + 1, detail);
    return 0;
}

static void compare_where(void *ud, int k, char *buf, size_t len) {
    const compare_run *cr = ud;
    const char *path = cr->c->prompts ? cr->c->prompts : cr->c->csv;
    snprintf(buf, len, "%s:%d: %s", path, cr->pl->line[k / cr->n_sp], cr->sp[k % cr->n_sp].name);
}

static int run_all(session *s, const compare_args *c, const prompt_style *ps, const gen_opts *g, const prompt_list *pl,
                   const sampler_spec *sp, int n_sp, row *rows, FILE *jsonl, compare_cap *cap, verr *err) {
    compare_run cr = { s, c, g, pl, sp, n_sp, rows, calloc((size_t)pl->n, sizeof(int *)),
                       calloc((size_t)pl->n, sizeof(int)), jsonl, cap, { 0 } };
    const char *path = c->prompts ? c->prompts : c->csv;
    // every prompt encoded before the first run
    int rc = !cr.ids || !cr.n ? verr_set(err, "out of memory") : prompts_encode_all(s, ps, pl, path, cr.ids, cr.n, err);
    sched *q = NULL;
    if (rc == 0) rc = cli_sched_open(&q, s, &c->sc, g->interrupt, err);
    if (rc == 0) {
        progress_start(&cr.pg, "compare", (long)pl->n * n_sp, c->quiet);
        sched_map_fns fns = { compare_submit, compare_take, &cr, 0, compare_where };
        rc = sched_map(q, pl->n * n_sp, &fns, err);
        if (rc == 1) progress_finish(&cr.pg, "interrupted");
        else if (rc && strstr(err->msg, "write failed")) progress_finish(&cr.pg, "write failed");
        else if (rc) progress_stop(&cr.pg);
        else progress_finish(&cr.pg, NULL);
        if (rc == 0 && c->stats && q) sched_report(q, stderr);
    }
    sched_close(q);
    for (int i = 0; cr.ids && i < pl->n; i++) free(cr.ids[i]);
    free(cr.ids), free(cr.n);
    return rc;
}

static int compare(const compare_args *c, const session_opts *so, const gen_opts *g, const prompt_style *ps,
                   const prompt_list *pl, const sampler_spec *sp, int n_sp, compare_cap *cap) {
    verr err = { { 0 } };
    outfile out = { 0 };
    outfile_opts oo = { .records = 1, .force = c->force, .flag = "-o" };
    // checked before the model loads, opened once it loaded (host/util/outfile.h)
    if ((c->out && outfile_check(c->out, &oo, &err)) || entropix_cli_check(&cap->ex, c->force, &err))
        return fail(err.msg);
    row *rows = calloc((size_t)pl->n * n_sp, sizeof *rows);
    int rc = rows ? 0 : verr_set(&err, "out of memory");
    progress pg;
    cli_load_begin(&pg, c->quiet);
    session s;
    if (rc != 0 || (rc = session_open(&s, so, &err)) != 0) {
        cli_load_end(&pg, 0);
    } else if ((c->out && (rc = outfile_open(&out, c->out, &oo, &err)) != 0) ||
               (rc = entropix_cli_open(&cap->ex, c->force, &err)) != 0) {
        cli_load_end(&pg, 1);
        session_close(&s);
    } else {
        cli_load_end(&pg, 1);
        gen_opts base = *g;
        base.clarifier = gen_find_clarifier(&s);
        interrupt_install();  // Ctrl-C: stop after the current token; -o keeps the finished rows
        base.interrupt = interrupt_flag();
        cap->ex.s = &s, cap->ex.seed = g->seed;
        int stdout_jsonl = !strcmp(c->format, "jsonl");
        rc = run_all(&s, c, ps, &base, pl, sp, n_sp, rows, out.f ? out.f : stdout_jsonl ? stdout : NULL, cap, &err);
        if (rc == 0 && !stdout_jsonl) write_markdown(stdout, rows, pl->n * n_sp, pl, sp, n_sp, &base, c->width);
        session_close(&s);
    }
    // finished rows are kept after Ctrl-C too, never over an existing file
    outfile_end how = rc == 0 ? OUTFILE_DONE : rc == 1 ? OUTFILE_PARTIAL : OUTFILE_DROP;
    verr cerr = { { 0 } }, lerr = { { 0 } };
    if (outfile_finish(&out, how, &cerr) && rc >= 0) err = cerr, rc = -1;
    if (entropix_cli_close(&cap->ex, rc >= 0 ? how : OUTFILE_DROP, &lerr) && rc >= 0) err = lerr, rc = -1;
    for (int i = 0; rows && i < pl->n * n_sp; i++) {  // a stopped run: those begun and not taken
        batch_job_drop(&rows[i].job);
        batch_result_free(&rows[i].r);
    }
    free(rows);
    if (rc == 1) {
        fprintf(stderr, "varent compare: %s%s\n", err.msg, c->out ? outfile_where(&out) : "");
        return INTERRUPT_EXIT;
    }
    return rc ? fail(err.msg) : 0;
}

// Two arms whose capture files would have one name (standard,standard; entropix:a.b and
// entropix:a_b): -1 with msg.
static int check_arm_files(const probe_spec *ps, const sampler_spec *sp, int n_sp, char *msg, size_t n) {
    if (!ps->acts_path && !ps->attn_path) return 0;
    for (int i = 0; i < n_sp; i++)
        for (int j = 0; j < i; j++) {
            char a[64], b[64];
            cli_probe_name(sp[i].name, a, sizeof a), cli_probe_name(sp[j].name, b, sizeof b);
            if (!strcmp(a, b))
                return snprintf(msg, n, "--samplers: arms %d (%.40s) and %d (%.40s) would write one capture file (.%.40s): "
                                "give each arm once", j + 1, sp[j].name, i + 1, sp[i].name, a), -1;
        }
    return 0;
}

int cmd_compare(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_compare_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    session_lora lora[CLI_MAX_LORA];
    char lora_msg[4400], bad[256];
    int lora_rc = cli_lora_opts(&a, &so, lora, CLI_MAX_LORA, lora_msg, sizeof lora_msg);
    gen_opts g = { 0 };
    cli_sampling_opts(&a, &g);
    g.max_new = (int)args_int_range(&a, "-n", 64, 0, INT_MAX);
    logit_bias bias[CLI_MAX_BIAS];
    int bias_rc = cli_logit_bias(&a, &g, bias, CLI_MAX_BIAS, bad, sizeof bad);
    prompt_style ps;
    prompt_style_read(&a, &ps);
    compare_args c = { args_str(&a, "--prompts", NULL), args_str(&a, "--prompt-csv", NULL),
                       args_str(&a, "--samplers", "standard,greedy,entropix:seed,entropix:jax"),
                       args_str(&a, "--profile", "seed"), args_str(&a, "-o", NULL), args_str(&a, "--format", "md"),
                       (int)args_int_range(&a, "--text-width", 60, 4, 100000), args_flag(&a, "-q"), args_flag(&a, "--force"),
                       args_flag(&a, "--stats"), { 0, 0, 0, 0 } };
    cli_sched_opts(&a, &c.sc);
    compare_cap cap = { 0 };
    cli_probe_opts(&a, &cap.ps);
    cap.ps.force = c.force;
    cap.ex.metrics_path = args_str(&a, "--metrics-out", NULL);
    if (args_finish(&a, 0)) return cli_usage_error("compare", "%s", a.err);
    if (!so.model_dir) return cli_usage_error("compare", "missing -m DIR (the model directory)");
    if (lora_rc) return cli_usage_error("compare", "%s", lora_msg);
    if (bias_rc) return cli_usage_error("compare", "%s", bad);
    if (!c.prompts == !c.csv) return cli_usage_error("compare", "give the prompts with --prompts FILE or --prompt-csv FILE");
    if (strcmp(c.format, "md") && strcmp(c.format, "jsonl")) return cli_usage_error("compare", "--format: use md or jsonl");
    verr err = { { 0 } };
    sampler_spec sp[MAX_SAMPLERS];
    int n_sp = parse_samplers(c.samplers, c.profile, sp, &err);
    if (n_sp < 0) return cli_usage_error("compare", "%s", err.msg);
    if (cli_probe_check(&cap.ps, "--metrics-out", cap.ex.metrics_path != NULL, 0, bad, sizeof bad) ||
        check_arm_files(&cap.ps, sp, n_sp, bad, sizeof bad))
        return cli_usage_error("compare", "%s", bad);
    prompt_list pl;
    if ((c.prompts ? prompts_read_lines : prompts_read_csv)(&pl, c.prompts ? c.prompts : c.csv, &err)) return fail(err.msg);
    int rc = compare(&c, &so, &g, &ps, &pl, sp, n_sp, &cap);
    prompts_free(&pl);
    return rc;
}
