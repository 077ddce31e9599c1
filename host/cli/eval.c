// eval.c: `varent eval -m DIR --tasks LIST [--samplers LIST]`: accuracy of decoding
// arms on tasks with known answers, every arm on the same items, prompts and seeds,
// with intervals and paired tests (docs/research.md). Per-trial JSONL with -o, a
// markdown summary on stdout (or --summary FILE). `--write FILE` writes the tasks'
// items as JSONL and stops (no model needed).
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/cli/entropix_opts.h"
#include "host/cli/interp_opts.h"
#include "host/cli/prompts.h"
#include "host/eval/arm.h"
#include "host/eval/builtin.h"
#include "host/eval/match.h"
#include "host/eval/prompt.h"
#include "host/eval/summary.h"
#include "host/decode/sched.h"
#include "host/util/interrupt.h"
#include "host/util/json_out.h"
#include "host/util/outfile.h"
#include "host/util/progress.h"

static const cli_opt eval_opts[] = {
    { "--tasks", "LIST", "tasks", NULL,
      "built-in tasks (add2, add3, decimal, count-letters, count-items, recall, decimal-choice; all = the first six) "
      "and/or task files FILE.jsonl, comma-separated", 0 },
    { "--items", "N", "tasks", "200", "items per built-in task", 0 },
    { "-s|--seed", "S", "tasks", "0", "item generator and decoding seed", 0 },
    { "--write", "FILE", "tasks", NULL, "write the tasks' items as JSONL and exit (no model needed)", 0 },
    { "--skip", "N", "tasks", "0", "leave out the first N items of the run (finish a run split across machines)", 0 },
    { "--samplers", "LIST", "arms", "greedy,standard,entropix",
      "arms: greedy, standard, entropix[:PROFILE], branch[:PROFILE], agents (PROFILE: seed, jax, frog or a FILE.json)", 0 },
    { "--repeats", "R", "arms", "1", "runs per item and arm, each with its own seed", 0 },
    { "-n|--n-predict|--max-tokens", "N", "arms", "48", "tokens per answer at most", 0 },
    { "--temp|--temperature", "T", "arms", "0.7", "temperature of the standard arm", 0 },
    { "--top-p", "P", "arms", "0.9", "top-p of the standard arm", 0 },
    { "--top-k", "K", "arms", "0", "top-k of the standard arm (0: off)", 0 },
    { "--min-p", "P", "arms", "0", "min-p of the standard arm (0: off)", 0 },
    { "--profile", "NAME|FILE", "arms", "seed", "profile of entropix and branch arms without :PROFILE", 0 },
    { "--branch", "K:B", "arms", "3:8", "branching of branch arms (adds a branch arm)", 0 },
    { "--agents", "T:K,...", "arms", "8 agents", "the agents arm's agents (adds an agents arm)", 0 },
    { "--check-every", "N", "arms", "5", "the agents' critic: every N steps (0: no critic)", 0 },
    { "--rollback", "N", "arms", "5", "the agents' critic: tokens rolled back on BAD", 0 },
    { "-o|--out", "FILE", "output", NULL, "one JSONL record per item, repeat and arm", 0 },
    { "--force", NULL, "output", NULL, "replace an existing -o, --metrics-out or capture file", 0 },
    { "--metrics-out", "FILE", "output", NULL,
      "per-token metrics as JSONL, each line with its item, repeat and arm (not with the agents arm)", 0 },
    { "--summary", "FILE", "output", "markdown on stdout", "the summary: markdown, or JSON when FILE ends in .json", 0 },
    { "--from", "FILE,...", "output", NULL, "no model: summarize the trial records of earlier -o files", 0 },
    { "-q|--quiet", NULL, "output", NULL, "no progress on stderr", 0 },
    { "--stats", NULL, "output", NULL, "the scheduler's batches and reuse on stderr", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const eval_tables[] = { cli_opts_session, cli_opts_llama, cli_opts_kv, cli_opts_tp,  cli_opts_lora, eval_opts, cli_opts_chat,
                                              cli_opts_logit_bias, cli_opts_steer, cli_opts_probe, cli_opts_sched, NULL };
const cli_spec cli_eval_spec = {
    "eval", "-m DIR --tasks LIST [--samplers LIST] [options]",
    "Accuracy of decoding arms on tasks with known answers, with intervals and paired tests.",
    "Every arm sees the same items, prompts and seeds. Per-trial JSONL with -o, a markdown summary on stdout "
    "(or --summary FILE); --write and --from need no model. docs/research.md.",
    eval_tables, NULL, NULL,
};

static int fail(const char *msg) { return cli_error("eval", "%s", msg); }

typedef struct {
    session_opts so;
    const char *tasks, *write, *samplers, *branch, *agents, *out, *summary, *from, *metrics;
    probe_spec ps;  // the captures (host/cli/interp_opts.h)
    cli_sched sc;   // --parallel, --kv-pool-mb, --no-prefix-cache
    int items, repeats, quiet, force, skip, stats;
    uint64_t seed;
    eval_prompter pr;
    eval_arm_opts ao;
    session_lora lora[CLI_MAX_LORA];  // --lora, --lora-scaled (so.lora points here)
    logit_bias bias[CLI_MAX_BIAS];    // -l (ao.bias points here)
    char bad[4400];                   // what was wrong with them
} eval_args;

// Every option, read in one place; -1 with e->bad when --lora or -l is malformed.
static int read_args(args *a, eval_args *e) {
    memset(e, 0, sizeof *e);
    cli_session_opts(a, &e->so);
    gen_opts biased = { 0 };
    int bad = cli_lora_opts(a, &e->so, e->lora, CLI_MAX_LORA, e->bad, sizeof e->bad) ||
              cli_logit_bias(a, &biased, e->bias, CLI_MAX_BIAS, e->bad, sizeof e->bad);
    e->ao.bias = biased.bias, e->ao.n_bias = biased.n_bias;
    e->tasks = args_str(a, "--tasks", NULL);
    e->items = (int)args_int_range(a, "--items", 200, 1, 1000000);
    e->seed = (uint64_t)args_int_range(a, "-s|--seed", 0, 0, LONG_MAX);
    e->write = args_str(a, "--write", NULL);
    e->samplers = args_str(a, "--samplers", "greedy,standard,entropix");
    e->repeats = (int)args_int_range(a, "--repeats", 1, 1, 1000);
    e->skip = (int)args_int_range(a, "--skip", 0, 0, INT_MAX);
    e->ao.max_new = (int)args_int_range(a, "-n|--max-tokens", 48, 1, 1 << 20);
    e->ao.sp.temperature = (float)args_float_range(a, "--temp|--temperature", 0.7, 0, 100);
    e->ao.sp.top_p = (float)args_float_range(a, "--top-p", 0.9, 1e-9, 1);
    e->ao.sp.top_k = (int)args_int_range(a, "--top-k", 0, 0, 1 << 30);
    e->ao.sp.min_p = (float)args_float_range(a, "--min-p", 0, 0, 0.999999);
    e->ao.profile = args_str(a, "--profile", "seed");
    e->branch = args_str(a, "--branch", NULL);
    e->agents = args_str(a, "--agents", NULL);
    e->ao.check_every = (int)args_int_range(a, "--check-every", 5, 0, 1 << 20);
    e->ao.rollback = (int)args_int_range(a, "--rollback", 5, 1, 1 << 20);
    e->pr.chat = args_flag(a, "--chat");
    e->pr.system = args_str(a, "--system", NULL);
    e->pr.template_name = args_str(a, "--chat-template", NULL);
    e->pr.think = !args_flag(a, "--no-think");
    e->pr.chat |= !e->pr.think || e->pr.system || e->pr.template_name;  // they only mean something in a chat prompt
    e->out = args_str(a, "-o|--out", NULL);
    e->summary = args_str(a, "--summary", NULL);
    e->from = args_str(a, "--from", NULL);
    e->force = args_flag(a, "--force");
    e->metrics = args_str(a, "--metrics-out", NULL);
    cli_probe_opts(a, &e->ps);
    e->ps.force = e->force;
    e->quiet = args_flag(a, "-q|--quiet");
    e->stats = args_flag(a, "--stats");
    cli_sched_opts(a, &e->sc);
    return bad ? -1 : 0;
}

// --tasks: built-in names (and "all") or JSONL files, comma-separated.
static int load_tasks(const eval_args *e, eval_set *set, verr *err) {
    char buf[4096];
    if (strlen(e->tasks) >= sizeof buf) return verr_set(err, "--tasks: list too long");
    snprintf(buf, sizeof buf, "%s", e->tasks);
    memset(set, 0, sizeof *set);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        if (!*t) continue;
        int rc;
        if (!strcmp(t, "all")) {
            char all[256];
            snprintf(all, sizeof all, "%s", eval_builtin_all());
            rc = 0;
            for (char *s2 = NULL, *b = strtok_r(all, ",", &s2); rc == 0 && b; b = strtok_r(NULL, ",", &s2))
                rc = eval_builtin(set, b, e->items, e->seed, err);
        } else if (eval_builtin_known(t)) {
            rc = eval_builtin(set, t, e->items, e->seed, err);
        } else if (strchr(t, '/') || strchr(t, '.')) {
            rc = eval_set_read(set, t, err);
        } else {
            rc = verr_set(err, "--tasks: unknown task '%s' (built-in: %s, all; or a FILE.jsonl)", t, eval_builtin_names());
        }
        if (rc) return eval_set_free(set), -1;
    }
    if (set->n == 0) return verr_set(err, "--tasks: empty list");
    return 0;
}

static int write_tasks(const eval_args *e, const eval_set *set) {
    verr err = { { 0 } };
    outfile o;
    outfile_opts oo = { .flag = "--write" };
    if (outfile_open(&o, e->write, &oo, &err)) return fail(err.msg);
    for (int i = 0; i < set->n; i++) eval_item_write(o.f, &set->it[i]), fputc('\n', o.f);
    if (outfile_commit(&o, &err)) return fail(err.msg);
    fprintf(stderr, "varent eval: wrote %d items to %s\n", set->n, e->write);
    return 0;
}

// The arms: --samplers plus a branch arm for --branch and an agents arm for --agents
// when the list has none.
static int build_arms(eval_args *e, eval_arm *arms, verr *err) {
    e->ao.branch_k = 3, e->ao.branch_b = 8;
    if (e->branch) {
        char *end;
        long k = strtol(e->branch, &end, 10), b = *end == ':' ? strtol(end + 1, &end, 10) : -1;
        if (*end || k < 1 || k > 64 || b < 1 || b > 1024)
            return verr_set(err, "--branch: '%s' is not K:B with 1 <= K <= 64 and 1 <= B <= 1024 (e.g. 3:8)", e->branch);
        e->ao.branch_k = (int)k, e->ao.branch_b = (int)b;
    }
    sampler_params base = { 1, 0, 1, 0 };
    e->ao.n_agents = e->agents ? agents_parse(e->agents, e->ao.agents, base, err) : agents_default(e->ao.agents, base);
    if (e->ao.n_agents < 0) return -1;
    char list[4200];
    snprintf(list, sizeof list, "%s", e->samplers);
    int n = eval_arms_parse(list, &e->ao, arms, err);
    if (n < 0) return -1;
    int has_branch = 0, has_agents = 0;
    for (int i = 0; i < n; i++) has_branch |= arms[i].branch, has_agents |= arms[i].kind == ARM_AGENTS;
    if ((e->branch && !has_branch) || (e->agents && !has_agents)) {
        snprintf(list, sizeof list, "%s%s%s", e->samplers, e->branch && !has_branch ? ",branch" : "",
                 e->agents && !has_agents ? ",agents" : "");
        n = eval_arms_parse(list, &e->ao, arms, err);
    }
    return n;
}

static uint64_t trial_seed(uint64_t seed, int item, int rep) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t)item * 0xbf58476d1ce4e5b9ull + (uint64_t)rep * 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) & 0x7fffffffffffffffull;
}

typedef struct {
    eval_args *e;
    const eval_set *set;
    const eval_arm *arms;
    int n_arms;
    eval_outcome *res;
    FILE *jsonl;
    session *s;
    eval_runner run;
    entropix_cli ex;  // --metrics-out: ex.log, NULL without
    probe *pr;        // the trial's (or choice's) captures
    int item;         // the choice item being scored
} eval_ctx;

// The captures (docs/research.md): a file per generation trial, FILE with ".iI.rR.ARM"
// before its extension, and per choice of a choice item (".iI.cC", the choice's scoring
// pass); the --metrics-out records carry the item, repeat and arm.
static int cap_open(eval_ctx *c, const char *tag, int files_only, verr *err) {
    probe_spec ps = c->e->ps;
    if (files_only) ps.attn_layers = ps.attn_path ? ps.attn_layers : NULL, ps.logit_lens = 0;
    if (!probe_spec_active(&ps)) return 0;
    char acts[4200], attn[4200];
    if (ps.acts_path && cli_probe_path(ps.acts_path, tag, acts, sizeof acts, err)) return -1;
    if (ps.attn_path && cli_probe_path(ps.attn_path, tag, attn, sizeof attn, err)) return -1;
    ps.acts_path = ps.acts_path ? acts : NULL, ps.attn_path = ps.attn_path ? attn : NULL;
    if (probe_open(&c->pr, &ps, c->s, err)) return -1;
    c->ex.probe = c->pr;
    return 0;
}

// Closes the captures: keep writes the files, with the ids a[na] then b[nb].
static int cap_close(eval_ctx *c, int keep, const int *a, int na, const int *b, int nb, verr *err) {
    probe *pr = c->pr;
    c->pr = NULL, c->ex.probe = NULL;
    if (!pr) return 0;
    int *all = keep ? malloc(sizeof(int) * (size_t)(na + nb + 1)) : NULL, oom = keep && !all;
    if (all && na > 0) memcpy(all, a, sizeof(int) * (size_t)na);
    if (all && nb > 0) memcpy(all + na, b, sizeof(int) * (size_t)nb);  // b is NULL for a choice item
    int rc = keep && !oom ? probe_check(pr, err) : 0;
    if (probe_close(pr, keep && !oom && rc == 0, all, na + nb, err) && rc == 0) rc = -1;
    free(all);
    return oom ? verr_set(err, "out of memory") : rc;
}

static int choice_begin(void *ud, int choice, verr *err) {
    eval_ctx *c = ud;
    char tag[64];
    snprintf(tag, sizeof tag, "i%d.c%d", c->item, choice);
    return cap_open(c, tag, 1, err);
}

static int choice_end(void *ud, int choice, int keep, const int *ids, int n, verr *err) {
    (void)choice;
    return cap_close(ud, keep, ids, n, NULL, 0, err);
}

static void record_head(FILE *f, const eval_item *it, int item, int rep, const eval_arm *a, uint64_t seed, int n_prompt) {
    fputs("{\"task\":", f), json_out_str(f, it->task);
    fputs(",\"id\":", f), json_out_str(f, it->id ? it->id : "");
    fprintf(f, ",\"item\":%d,\"line\":%d,\"repeat\":%d,\"arm\":", item, it->line, rep);
    json_out_str(f, a->name);
    fputs(",\"profile\":", f), json_out_str(f, a->ex.name);
    fprintf(f, ",\"seed\":%llu,\"prompt_tokens\":%d", (unsigned long long)seed, n_prompt);
}

static void record_gen(FILE *f, const eval_item *it, const eval_gen *g, const char *extracted, const eval_outcome *o) {
    fputs(",\"answer\":", f), json_out_str(f, it->answer);
    fprintf(f, ",\"match\":\"%s\"", eval_match_name(it->match));
    if (it->match == MATCH_NUMBER) fprintf(f, ",\"pick\":\"%s\"", it->pick_last ? "last" : "first");
    if (it->nocase) fputs(",\"nocase\":true", f);
    fputs(",\"output\":", f);
    json_out_str(f, g->text ? g->text : "");
    fputs(",\"extracted\":", f), json_out_str(f, extracted);
    fprintf(f, ",\"correct\":%s,\"tokens\":%d,\"compute\":%ld,\"wall_s\":", o->correct ? "true" : "false", o->tokens,
            o->compute);
    json_out_num(f, o->wall_s);
    fputs(",\"entropy\":", f), json_out_num(f, o->h);
    fputs(",\"varentropy\":", f), json_out_num(f, o->v);
    fprintf(f, ",\"stop\":\"%s\",\"rollbacks\":%d}\n", g->stop, g->rollbacks);
}

static void record_choice(FILE *f, const eval_item *it, const double *ll, const int *nt, int chosen, double wall) {
    fputs(",\"choices\":[", f);
    for (int c = 0; c < it->n_choices; c++) fputs(c ? "," : "", f), json_out_str(f, it->choices[c]);
    fprintf(f, "],\"gold\":%d,\"loglik\":[", it->gold);
    for (int c = 0; c < it->n_choices; c++) fputs(c ? "," : "", f), json_out_num(f, ll[c]);
    fputs("],\"choice_tokens\":[", f);
    for (int c = 0; c < it->n_choices; c++) fprintf(f, c ? ",%d" : "%d", nt[c]);
    fprintf(f, "],\"chosen\":%d,\"correct\":%s,\"tokens\":0,\"compute\":0,\"wall_s\":", chosen,
            chosen == it->gold ? "true" : "false");
    json_out_num(f, wall);
    fputs(",\"entropy\":null,\"varentropy\":null}\n", f);
}

// A choice item: scored once (no arm changes a log-likelihood), the same outcome for every trial.
static int run_choice(eval_ctx *c, int i, const int *ids, int n, verr *err) {
    const eval_item *it = &c->set->it[i];
    double ll[256], t0 = gen_now();
    int nt[256], best = 0;
    if (it->n_choices > 256) return verr_set(err, "at most 256 choices");
    const probe_spec *ps = &c->e->ps;
    eval_choice_hooks h = { choice_begin, choice_end, ps->attn_path != NULL, c };
    c->item = i;
    if (eval_choices(c->s, it, ids, n, ps->acts_path || ps->attn_path ? &h : NULL, ll, nt, err)) return -1;
    for (int k = 1; k < it->n_choices; k++)
        if (ll[k] > ll[best]) best = k;
    double wall = gen_now() - t0;
    for (int r = 0; r < c->e->repeats; r++)
        for (int a = 0; a < c->n_arms; a++) {
            eval_outcome *o = &c->res[((long)i * c->e->repeats + r) * c->n_arms + a];
            *o = (eval_outcome){ 1, best == it->gold, 0, 0, wall, NAN, NAN };
            if (!c->jsonl) continue;
            record_head(c->jsonl, it, i, r, &c->arms[a], trial_seed(c->e->seed, i, r), n);
            record_choice(c->jsonl, it, ll, nt, best, wall);
        }
    return 0;
}

// 0 when everything written to f so far reached the file, else the errno of the failure.
static int write_error(FILE *f) {
    errno = 0;
    if (fflush(f) == 0 && !ferror(f)) return 0;
    return errno ? errno : EIO;
}

// A generation trial's outcome and record, once it has run.
static void trial_done(eval_ctx *c, int i, int r, int a, int n, eval_gen *g) {
    const eval_item *it = &c->set->it[i];
    const eval_arm *arm = &c->arms[a];
    eval_outcome *o = &c->res[((long)i * c->e->repeats + r) * c->n_arms + a];
    char extracted[256];
    *o = (eval_outcome){ 1, eval_judge(it, g->text ? g->text : "", extracted, sizeof extracted), g->n, g->compute,
                         g->wall_s, g->n_metrics ? g->sum_h / g->n_metrics : NAN, g->n_metrics ? g->sum_v / g->n_metrics : NAN };
    if (c->jsonl) {
        record_head(c->jsonl, it, i, r, arm, trial_seed(c->e->seed, i, r), n);
        record_gen(c->jsonl, it, g, extracted, o);
    }
}

// A trial run one by one at its turn (agents and branch arms, captures).
static int run_gen(eval_ctx *c, int i, int r, int a, const int *ids, int n, verr *err) {
    const eval_item *it = &c->set->it[i];
    const eval_arm *arm = &c->arms[a];
    uint64_t seed = trial_seed(c->e->seed, i, r);
    eval_gen g;
    char name[64], tag[128];
    cli_probe_name(arm->name, name, sizeof name);
    snprintf(tag, sizeof tag, "i%d.r%d.%s", i, r, name);
    if (c->ex.log) {
        c->ex.sampler_name = arm->name, c->ex.seed = seed;
        snprintf(c->ex.tag, sizeof c->ex.tag, "\"item\":%d,\"repeat\":%d,", i, r);
    }
    if (cap_open(c, tag, 0, err)) return -1;
    int rc = eval_generate(&c->run, arm, it, ids, n, seed, &g, err), have = rc == 0;  // g is freed on failure
    int e = rc == 0 && c->ex.log ? write_error(c->ex.log) : 0;
    if (e) rc = verr_set(err, "--metrics-out %s: write failed: %s", c->e->metrics, strerror(e));
    if (cap_close(c, rc == 0, ids, n, have ? g.ids : NULL, have ? g.n : 0, err) && rc == 0) rc = -1;
    if (rc && have) eval_gen_free(&g);
    if (rc) return -1;
    trial_done(c, i, r, a, n, &g);
    eval_gen_free(&g);
    return 0;
}

// The progress detail: this task's trials so far and how many were right ("arith: 7 of
// 12 right"), counted afresh when the task changes.
typedef struct {
    const char *task;
    long done, right;
} task_tally;

static void tally_item(task_tally *t, const eval_ctx *c, int i, char *detail, size_t len) {
    const eval_item *it = &c->set->it[i];
    if (!t->task || strcmp(t->task, it->task) != 0) t->task = it->task, t->done = t->right = 0;
    for (long k = (long)i * c->e->repeats * c->n_arms; k < (long)(i + 1) * c->e->repeats * c->n_arms; k++)
        if (c->res[k].done) t->done++, t->right += c->res[k].correct;
    snprintf(detail, len, "%.60s: %ld of %ld right", it->task, t->right, t->done);
}

// Every trial through the scheduler (host/decode/sched.h), in the order of the items,
// repeats and arms: generation trials of the standard and entropix arms decode together,
// the rest (choice items, agents and branch arms, captures) run at their turn; records
// and outcomes are written in that order.
typedef struct {
    eval_ctx *c;
    int first, per_item;  // the first item run; trials per item (repeats x arms)
    int **ids, *n;        // [set->n] each item's prompt, kept while its trials run
    eval_job *jobs;       // [trials]
    eval_gen *gens;       // [trials]
    progress pg;
    long done;
    task_tally tally;
} eval_map;

// Item i's prompt ids (encoded once for all its trials); -1 with err.
static int item_ids(eval_map *m, int i, verr *err) {
    if (m->ids[i]) return 0;
    eval_ctx *c = m->c;
    int n = eval_prompt_ids(&c->e->pr, c->s, &c->set->it[i], &m->ids[i], err);
    if (n < 0) return -1;
    m->n[i] = n;
    return 0;
}

static int eval_submit(void *ud, int t, sched_seq *sq, verr *err) {
    eval_map *m = ud;
    eval_ctx *c = m->c;
    int i = m->first + t / m->per_item, r = t % m->per_item / c->n_arms, a = t % c->n_arms;
    const eval_item *it = &c->set->it[i];
    if (it->n_choices || !eval_job_scheduled(&c->run, &c->arms[a])) return 1;
    if (item_ids(m, i, err) ||
        eval_job_begin(&m->jobs[t], &c->run, &c->arms[a], it, trial_seed(c->e->seed, i, r), &m->gens[t], err))
        return verr_set(err, "%s item %d: %.900s", it->task, i, err->msg);
    sq->prompt = m->ids[i], sq->n_prompt = m->n[i], sq->g = &m->jobs[t].go;
    return 0;
}

static int eval_take(void *ud, int t, int rc, const gen_stats *st, const char *why, verr *err) {
    eval_map *m = ud;
    eval_ctx *c = m->c;
    int i = m->first + t / m->per_item, r = t % m->per_item / c->n_arms, a = t % c->n_arms;
    const eval_item *it = &c->set->it[i];
    int last = t % m->per_item == m->per_item - 1;
    if (rc == 1 && interrupt_requested()) rc = 2;
    else if (rc == 1 && (rc = item_ids(m, i, err)) == 0) {
        if (!it->n_choices) rc = run_gen(c, i, r, a, m->ids[i], m->n[i], err);
        else if (t % m->per_item == 0) rc = run_choice(c, i, m->ids[i], m->n[i], err);
    } else if (rc != 1) {
        if (rc) verr_set(err, "%s", why);
        rc = eval_job_end(&m->jobs[t], rc, st, err);
        if (rc == 0 && st->interrupted) eval_gen_free(&m->gens[t]), rc = 2;
        if (rc == 0) trial_done(c, i, r, a, m->n[i], &m->gens[t]), eval_gen_free(&m->gens[t]);
    }
    if (rc < 0) return verr_set(err, "%s item %d%s%.0d: %.900s", it->task, i, it->line ? " line " : "", it->line, err->msg);
    if (rc == 2) {
        progress_finish(&m->pg, "interrupted");
        return 1;
    }
    m->done++;
    if (!last) return 0;
    free(m->ids[i]), m->ids[i] = NULL;
    int e = c->jsonl ? write_error(c->jsonl) : 0;
    if (e) return verr_set(err, "-o %s: write failed: %s", c->e->out, strerror(e));
    char detail[96];
    tally_item(&m->tally, c, i, detail, sizeof detail);
    progress_update(&m->pg, m->done, detail);
    return 0;
}

static void eval_where(void *ud, int t, char *buf, size_t len) {
    const eval_map *m = ud;
    int i = m->first + t / m->per_item;
    const eval_item *it = &m->c->set->it[i];
    // the line of the task file too, as a one-by-one trial's error says (test_hostile_inputs row 5)
    if (it->line) snprintf(buf, len, "%s item %d line %d, %s", it->task, i, it->line, m->c->arms[t % m->c->n_arms].name);
    else snprintf(buf, len, "%s item %d, %s", it->task, i, m->c->arms[t % m->c->n_arms].name);
}

// Every item, repeat and arm. 1 when interrupted (the finished trials are kept).
static int run_all(eval_ctx *c, verr *err) {
    const eval_set *set = c->set;
    int first = c->e->skip < set->n ? c->e->skip : set->n;  // items keep their index (and seed) when skipping
    long per = (long)c->e->repeats * c->n_arms, trials = (long)(set->n - first) * per;
    if (trials > INT_MAX / 2) return verr_set(err, "%ld trials are too many for one run (use --skip)", trials);
    eval_map m = { c, first, (int)per, calloc((size_t)set->n + 1, sizeof(int *)), calloc((size_t)set->n + 1, sizeof(int)),
                   calloc((size_t)trials + 1, sizeof(eval_job)), calloc((size_t)trials + 1, sizeof(eval_gen)), { 0 }, 0, { 0 } };
    int rc = m.ids && m.n && m.jobs && m.gens ? 0 : verr_set(err, "out of memory");
    sched *q = NULL;
    if (rc == 0) rc = cli_sched_open(&q, c->s, &c->e->sc, interrupt_flag(), err);
    if (rc == 0) {
        progress_start(&m.pg, "eval", trials, c->e->quiet);
        sched_map_fns fns = { eval_submit, eval_take, &m, 0, eval_where };
        rc = sched_map(q, (int)trials, &fns, err);
        if (rc == 0) progress_finish(&m.pg, NULL);
        else if (rc < 0) progress_stop(&m.pg);
        if (rc == 0 && c->e->stats && q) sched_report(q, stderr);
    }
    sched_close(q);
    for (long t = 0; m.jobs && t < trials; t++) eval_job_drop(&m.jobs[t]);  // begun, not taken (a stop)
    for (long t = 0; m.gens && t < trials; t++) eval_gen_free(&m.gens[t]);
    for (int i = 0; m.ids && i < set->n; i++) free(m.ids[i]);
    free(m.ids), free(m.n), free(m.jobs), free(m.gens);
    return rc;
}

// The summary (how: OUTFILE_PARTIAL after Ctrl-C, which never replaces an existing file).
static int write_summary(const eval_args *e, const eval_set *set, const eval_arm *arms, int n_arms,
                         const eval_outcome *res, const eval_meta *m, outfile_end how, verr *err) {
    if (!e->summary) {
        eval_summary_md(stdout, set, arms, n_arms, res, m);
        return fflush(stdout) ? verr_set(err, "stdout: write failed") : 0;
    }
    size_t n = strlen(e->summary);
    int json = n > 5 && !strcmp(e->summary + n - 5, ".json");
    outfile o;
    outfile_opts oo = { .flag = "--summary" };
    if (outfile_open(&o, e->summary, &oo, err)) return -1;
    (json ? eval_summary_json : eval_summary_md)(o.f, set, arms, n_arms, res, m);
    return outfile_finish(&o, how, err);
}

// --from: a summary of earlier trial records, without a model.
static int summarize_records(const eval_args *e) {
    char buf[4096];
    verr err = { { 0 } };
    eval_results r = { 0 };
    snprintf(buf, sizeof buf, "%s", e->from);
    int rc = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); rc == 0 && t; t = strtok_r(NULL, ",", &save))
        rc = eval_results_read(&r, t, &err);
    if (rc == 0) rc = eval_results_finish(&r, &err);
    char label[4200];
    snprintf(label, sizeof label, "records %s", e->from);
    eval_meta m = { label, e->seed, r.repeats, e->ao.max_new, "as recorded" };
    if (rc == 0) rc = write_summary(e, &r.set, r.arms, r.n_arms, r.res, &m, OUTFILE_DONE, &err);
    eval_results_free(&r);
    return rc ? fail(err.msg) : 0;
}

// The captures and --metrics-out with the arms: the agents arm runs outside them (varent
// agents captures its accepted sequence), a branch arm decodes outside the captured
// sequence, and two arms must not share a file name. 0, or -1 with msg.
static int check_captures(const eval_args *e, const eval_arm *arms, int n, char *msg, size_t len) {
    int files = e->ps.acts_path || e->ps.attn_path, branch = 0;
    for (int i = 0; i < n; i++) {
        if (arms[i].kind == ARM_AGENTS && (e->metrics || probe_spec_active(&e->ps)))
            return snprintf(msg, len, "--metrics-out and the captures cover the greedy, standard, entropix and branch "
                            "arms: drop the agents arm (varent agents --log captures its runs)"), -1;
        branch |= arms[i].branch;
        for (int j = 0; files && j < i; j++) {
            char a[64], b[64];
            cli_probe_name(arms[i].name, a, sizeof a), cli_probe_name(arms[j].name, b, sizeof b);
            if (!strcmp(a, b))
                return snprintf(msg, len, "--samplers: arms %.60s and %.60s would write one capture file (.%.60s)",
                                arms[j].name, arms[i].name, a), -1;
        }
    }
    return cli_probe_check(&e->ps, "--metrics-out", e->metrics != NULL, branch, msg, len);
}

static int evaluate(eval_args *e, const eval_set *set, const eval_arm *arms, int n_arms) {
    verr err = { { 0 } };
    outfile out = { 0 };
    outfile_opts oo = { .records = 1, .force = e->force, .flag = "-o" }, so = { .flag = "--summary" };
    session s;
    eval_outcome *res = calloc((size_t)set->n * e->repeats * n_arms, sizeof *res);
    eval_ctx c = { .e = e, .set = set, .arms = arms, .n_arms = n_arms, .res = res, .s = &s };
    c.ex.metrics_path = e->metrics;
    // the outputs: checked before the model loads, opened once it loaded (host/util/outfile.h)
    int need_agents = 0, rc = res ? entropix_cli_check(&c.ex, e->force, &err) : verr_set(&err, "out of memory");
    if (rc == 0 && e->out) rc = outfile_check(e->out, &oo, &err);
    if (rc == 0 && e->summary) rc = outfile_check(e->summary, &so, &err);
    for (int a = 0; a < n_arms; a++) need_agents |= arms[a].kind == ARM_AGENTS;
    progress pg;
    progress_start(&pg, "load", 1, e->quiet);
    if (rc == 0) rc = session_open(&s, &e->so, &err);
    if (rc) progress_stop(&pg);
    else progress_finish(&pg, NULL);
    if (rc == 0) {
        interrupt_install();  // Ctrl-C: stop after the current trial; the summary covers the finished ones
        if (e->out) rc = outfile_open(&out, e->out, &oo, &err);
        if (rc == 0) rc = entropix_cli_open(&c.ex, e->force, &err);
        c.jsonl = out.f;
        if (rc == 0) rc = eval_prompter_open(&e->pr, &s, set, &err);
        if (rc == 0 && (rc = eval_runner_open(&c.run, &s, &e->ao, need_agents, &err)) == 0) {
            c.ex.s = &s;
            if (c.ex.log) c.run.on_record = entropix_cli_record, c.run.record_ud = &c.ex;
            c.run.feed_last = e->ps.acts_path || e->ps.attn_path;  // the files cover every position
            rc = run_all(&c, &err);
            eval_runner_close(&c.run);
        }
        eval_prompter_close(&e->pr);
        session_close(&s);
        eval_meta m = { e->so.model_dir, e->seed, e->repeats, e->ao.max_new, e->pr.chat ? "on" : "off" };
        if (rc >= 0 && write_summary(e, set, arms, n_arms, res, &m, rc ? OUTFILE_PARTIAL : OUTFILE_DONE, &err)) rc = -1;
    }
    outfile_end how = rc == 0 ? OUTFILE_DONE : rc == 1 ? OUTFILE_PARTIAL : OUTFILE_DROP;  // 1: Ctrl-C
    verr cerr = { { 0 } }, lerr = { { 0 } };
    if (outfile_finish(&out, how, &cerr) && rc >= 0) err = cerr, rc = -1;
    if (entropix_cli_close(&c.ex, rc >= 0 ? how : OUTFILE_DROP, &lerr) && rc >= 0) err = lerr, rc = -1;
    free(res);
    if (rc == 1) return fprintf(stderr, "varent eval: interrupted; the summary covers the finished trials\n"), INTERRUPT_EXIT;
    return rc ? fail(err.msg) : 0;
}

int cmd_eval(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_eval_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    eval_args e;
    int bad = read_args(&a, &e);
    if (args_finish(&a, 0)) return cli_usage_error("eval", "%s", a.err);
    if (bad) return cli_usage_error("eval", "%s", e.bad);
    if (e.from)
        return e.tasks || e.so.model_dir ? cli_usage_error("eval", "--from summarizes records: no --tasks or -m with it")
                                         : summarize_records(&e);
    if (!e.tasks) return cli_usage_error("eval", "missing --tasks");
    verr err = { { 0 } };
    eval_set set;
    if (load_tasks(&e, &set, &err)) return fail(err.msg);
    if (e.write) {
        int rc = write_tasks(&e, &set);
        eval_set_free(&set);
        return rc;
    }
    if (!e.so.model_dir) return eval_set_free(&set), cli_usage_error("eval", "missing -m DIR (the model directory)");
    eval_arm arms[EVAL_MAX_ARMS];
    int n_arms = build_arms(&e, arms, &err), rc;
    if (n_arms < 0) rc = fail(err.msg);
    else if (check_captures(&e, arms, n_arms, e.bad, sizeof e.bad)) rc = cli_usage_error("eval", "%s", e.bad);
    else rc = evaluate(&e, &set, arms, n_arms);
    eval_set_free(&set);
    return rc;
}
