// loop.c: `varent agents`: parallel entropy-minimised generation with decoding
// agents, a critic with rollback, lookahead branches and device replicas
// (host/agents/loop.h, docs/agents.md). Logs: JSONL (--log) and the seed's text form
// (--log-text), each record flushed as written.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/agents/loop.h"
#include "host/cli/args.h"
#include "host/decode/chat_prompt.h"
#include "host/cli/commands.h"
#include "host/cli/interp_opts.h"
#include "host/cli/common.h"
#include "host/decode/generate.h"
#include "host/util/interrupt.h"
#include "host/util/json_out.h"
#include "host/util/outfile.h"

static const char *usage =
    "usage: varent agents -m DIR (-p TEXT | --ids 1,2,3) [--chat] [options]\n"
    "  -n N                 tokens to generate (default 128)\n"
    "  --agents T:K,...     agent configurations (default 8 from 0.3:10 to 1.5:100; K=0: no top-k)\n"
    "  --top-p P --min-p M  applied by every agent (default off)\n"
    "  --max-parallel N     agents evaluated at once (default all)\n"
    "  --check-every N      critic every N steps (default 5, 0: no critic)\n"
    "  --rollback N         tokens a BAD verdict removes (default 5)\n"
    "  --critic-model DIR   critic model (default: the same model, second context)\n"
    "  --lookahead W        each agent extends a W-token branch (default off)\n"
    "  --devices LIST       cpu, cpu,cpu, cuda:0, 0,1 ... (default cpu)\n"
    "  --seed S             (default: time)\n"
    "  --log FILE.jsonl --log-text FILE --dump-logits FILE.f32 --stats\n"
    "  --force              replace existing log files (kept as they are otherwise)\n"
    "  --ctx N -t THREADS --batch N --system TEXT --chat-template NAME\n"
    "  --control-vector FILE --control-vector-scaled FILE S --control-vector-layer-range A B\n"
    "  --ablate-head L:H --skip-layer L   (docs/research.md)\n"
    "  --lora DIR, --lora-scaled DIR SCALE   PEFT LoRA adapters (repeatable; docs/research.md)\n";

typedef struct {
    session_opts so;
    const char *ids_arg, *text, *system, *chat_template, *agents_spec, *devices, *critic_model;
    const char *log_path, *text_path, *dump_path;
    int chat, stats, lookahead, max_parallel, check_every, rollback, max_new, force;
    uint64_t seed;
    sampler_params base;
    session_lora lora[CLI_MAX_LORA];  // --lora, --lora-scaled (so.lora points here)
    char lora_msg[4400];
    int lora_bad;
} agents_args;

typedef struct {
    outfile out[3];           // --log, --log-text, --dump-logits (records; host/util/outfile.h)
    FILE *log, *text, *dump;  // their streams while open, else NULL
    const agents_args *a;
    const session *s;  // tokenizer for texts
    int write_failed;         // 1 + the index in out[] of the first log a write failed on; 0: none
    int write_errno;          // its errno
    int interrupted;
} agents_logs;

static int fail(const char *msg) {
    fprintf(stderr, "varent agents: %s\n", msg);
    return 1;
}

static void read_args(args *a, agents_args *g) {
    memset(g, 0, sizeof *g);
    g->so.model_dir = args_str(a, "-m|--model", NULL);
    g->so.ctx = (int)args_int(a, "--ctx", 0);
    g->so.threads = (int)args_int(a, "-t|--threads", 0);
    g->so.max_batch = (int)args_int(a, "--batch", 0);
    cli_steer_opts(a, &g->so.steer);
    g->ids_arg = args_str(a, "--ids", NULL);
    g->text = args_str(a, "-p|--prompt", NULL);
    g->chat = args_flag(a, "--chat");
    g->system = args_str(a, "--system", NULL);
    g->chat_template = args_str(a, "--chat-template", NULL);
    g->max_new = (int)args_int(a, "-n|--max-tokens", 128);
    g->agents_spec = args_str(a, "--agents", NULL);
    g->base = (sampler_params){ 1, 0, (float)args_float(a, "--top-p", 1.0), (float)args_float(a, "--min-p", 0.0) };
    g->max_parallel = (int)args_int(a, "--max-parallel", 0);
    g->check_every = (int)args_int(a, "--check-every", 5);
    g->rollback = (int)args_int(a, "--rollback", 5);
    g->critic_model = args_str(a, "--critic-model", NULL);
    g->lookahead = (int)args_int(a, "--lookahead", 0);
    g->devices = args_str(a, "--devices", "cpu");
    g->seed = (uint64_t)args_int(a, "--seed", (long)time(NULL));
    g->log_path = args_str(a, "--log", NULL);
    g->text_path = args_str(a, "--log-text", NULL);
    g->dump_path = args_str(a, "--dump-logits", NULL);
    g->stats = args_flag(a, "--stats");
    g->force = args_flag(a, "--force");
    g->lora_bad = cli_lora_opts(a, &g->so, g->lora, CLI_MAX_LORA, g->lora_msg, sizeof g->lora_msg);
}

// Range checks; 0, or -1 with msg naming the option.
static int check_args(const agents_args *g, char *msg, size_t n) {
    if (!g->so.model_dir) return snprintf(msg, n, "missing -m MODEL_DIR"), -1;
    if (g->lora_bad) return snprintf(msg, n, "%.1000s", g->lora_msg), -1;
    if (g->ids_arg && g->text) return snprintf(msg, n, "give either --ids or -p, not both"), -1;
    if (g->chat && !g->text) return snprintf(msg, n, "--chat needs a user message with -p"), -1;
    if (g->max_new < 0) return snprintf(msg, n, "-n %d: must be >= 0", g->max_new), -1;
    const sampler_params *b = &g->base;
    if (!(b->top_p > 0 && b->top_p <= 1)) return snprintf(msg, n, "--top-p %g: must be in (0, 1]", b->top_p), -1;
    if (!(b->min_p >= 0 && b->min_p < 1)) return snprintf(msg, n, "--min-p %g: must be in [0, 1)", b->min_p), -1;
    if (g->max_parallel < 0)
        return snprintf(msg, n, "--max-parallel %d: must be >= 1 (0: all agents)", g->max_parallel), -1;
    if (g->check_every < 0)
        return snprintf(msg, n, "--check-every %d: must be >= 0 (0: no critic)", g->check_every), -1;
    if (g->rollback < 1) return snprintf(msg, n, "--rollback %d: must be >= 1", g->rollback), -1;
    if (g->lookahead < 0 || g->lookahead > 256)
        return snprintf(msg, n, "--lookahead %d: must be in 0..256", g->lookahead), -1;
    if (g->critic_model && g->check_every == 0) return snprintf(msg, n, "--critic-model needs --check-every > 0"), -1;
    return 0;
}

// ---- logs ----


// Token text as the logs show it (special tokens kept); "" without a tokenizer.
static char *token_text(const session *s, const int *ids, int n) {
    verr err;
    char *t = s->tok ? tokenizer_decode(s->tok, ids, n, 0, &err) : NULL;
    return t ? t : strdup("");
}

// The text log's one-line form: newlines and tabs escaped.
static void put_line_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '\n') fputs("\\n", f);
        else if (*s == '\t') fputs("\\t", f);
        else if (*s == '\r') fputs("\\r", f);
        else fputc(*s, f);
    }
}

// The shortest decimal that reads back as the same float (0.3, not 0.300000012).
static void put_float(FILE *f, float x) {
    char b[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, x);
        if (strtof(b, NULL) == x) break;
    }
    fputs(b, f);
}

static void put_ids(FILE *f, const int *ids, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
    fputc(']', f);
}

static void log_step(agents_logs *L, const agents_event *e) {
    int la = L->a->lookahead > 1;
    const agents_proposal *w = &e->props[e->chosen];
    if (L->log) {
        fprintf(L->log, "{\"event\":\"step\",\"step\":%d,\"pos\":%d,\"proposals\":[", e->step, e->pos);
        for (int i = 0; i < e->n_props; i++) {
            const agents_proposal *p = &e->props[i];
            char *t = token_text(L->s, p->tok, p->n_tok);
            fprintf(L->log, "%s{\"agent\":%d,\"temperature\":", i ? "," : "", p->agent);
            put_float(L->log, p->sp.temperature);
            fprintf(L->log, ",\"top_k\":%d,\"token\":%d,\"text\":", p->sp.top_k, p->tok[0]);
            json_out_str(L->log, t);
            fprintf(L->log, ",\"entropy\":%.17g", p->entropy);
            if (la) fputs(",\"tokens\":", L->log), put_ids(L->log, p->tok, p->n_tok);
            fputc('}', L->log);
            free(t);
        }
        fprintf(L->log, "],\"chosen_agent\":%d,\"token\":%d", e->chosen, w->tok[0]);
        if (la) fputs(",\"tokens\":", L->log), put_ids(L->log, w->tok, w->n_tok);
        fputs("}\n", L->log);
    }
    if (L->text) {
        char *t = token_text(L->s, w->tok, w->n_tok);
        fprintf(L->text, "Step %d: chosen=", e->step);
        put_line_text(L->text, t);
        fprintf(L->text, " (entropy=%.3f)\n", w->entropy);
        free(t);
    }
    if (L->dump) fwrite(e->logits, sizeof(float), (size_t)L->s->m.cfg.vocab_size, L->dump);
}

static void log_critic(agents_logs *L, const agents_event *e) {
    static const char *action[] = { "none", "rollback", "accept" };
    const critic_verdict *v = &e->verdict;
    if (L->log)
        fprintf(L->log,
                "{\"event\":\"critic\",\"step\":%d,\"pos\":%d,\"verdict\":\"%s\",\"logp_good\":%.17g,\"logp_bad\":%.17g,"
                "\"action\":\"%s\"}\n",
                e->step, e->pos, v->good ? "GOOD" : "BAD", v->logp_good, v->logp_bad, action[e->action]);
    if (L->text && e->action == CRITIC_NONE) fprintf(L->text, "Evaluator after step %d: GOOD\n", e->step);
    if (L->text && e->action == CRITIC_ACCEPT)
        fprintf(L->text, "Evaluator after step %d: BAD → accepted (already rolled back %d times at position %d)\n",
                e->step, AGENTS_ROLLBACK_GUARD, e->pos);
}

static void log_rollback(agents_logs *L, const agents_event *e) {
    int removed = e->from_pos - e->to_pos;
    if (L->log)
        fprintf(L->log, "{\"event\":\"rollback\",\"step\":%d,\"from_pos\":%d,\"to_pos\":%d,\"tokens_removed\":%d}\n",
                e->step, e->from_pos, e->to_pos, removed);
    if (L->text) fprintf(L->text, "Evaluator after step %d: BAD → rolling back %d tokens\n", e->step, removed);
}

static int flush_all(agents_logs *L) {
    FILE *fs[3] = { L->log, L->text, L->dump };
    for (int i = 0; i < 3 && !L->write_failed; i++) {
        errno = 0;
        if (fs[i] && (fflush(fs[i]) != 0 || ferror(fs[i]))) {
            L->write_failed = 1 + i;
            L->write_errno = errno ? errno : EIO;
        }
    }
    return L->write_failed != 0;
}

static int write_error(const agents_logs *L, verr *err) {
    return verr_set(err, "%s: write failed: %s", L->out[L->write_failed - 1].shown, strerror(L->write_errno));
}

static int on_event(void *ud, const agents_event *e) {
    agents_logs *L = ud;
    if (e->kind == AGENTS_STEP) log_step(L, e);
    else if (e->kind == AGENTS_CRITIC) log_critic(L, e);
    else log_rollback(L, e);
    if (interrupt_requested()) L->interrupted = 1;  // Ctrl-C: stop after this record
    return flush_all(L) || L->interrupted;  // a failed write stops generation; the command reports it
}

static void log_done(agents_logs *L, const char *text, const agents_result *r) {
    double tps = r->gen_s > 0 ? r->n_gen / r->gen_s : 0;
    if (L->log) {
        fputs("{\"event\":\"done\",\"text\":", L->log);
        json_out_str(L->log, text);
        fprintf(L->log, ",\"tokens\":%d,\"rollbacks\":%d,\"critic_checks\":%d,\"tok_per_s\":%.6g}\n", r->n_gen,
                r->rollbacks, r->checks, tps);
    }
    if (L->text) fprintf(L->text, "\nFinal text:\n%s\n", text);
    flush_all(L);
}

// Creates the log files before anything runs. An existing regular file is an error
// unless --force; a device node or FIFO is written in place (host/util/outfile.h).
static int open_logs(agents_logs *L, const agents_args *a, char *msg, size_t n) {
    const char *paths[3] = { a->log_path, a->text_path, a->dump_path };
    const char *names[3] = { "--log", "--log-text", "--dump-logits" };
    FILE **fs[3] = { &L->log, &L->text, &L->dump };
    for (int i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        outfile_opts oo = { .records = 1, .force = a->force, .flag = names[i] };
        verr err = { { 0 } };
        if (outfile_open(&L->out[i], paths[i], &oo, &err)) {
            snprintf(msg, n, "%s", err.msg);
            return -1;
        }
        *fs[i] = L->out[i].f;
    }
    return 0;
}

// keep: the run generated (or was interrupted): the logs are committed. Otherwise
// only what this run created is removed. -1 with msg when a commit failed.
static int close_logs(agents_logs *L, int keep, char *msg, size_t n) {
    FILE **fs[3] = { &L->log, &L->text, &L->dump };
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        if (!*fs[i]) continue;
        *fs[i] = NULL;
        verr err = { { 0 } };
        if (!keep) outfile_abort(&L->out[i]);
        else if (outfile_commit(&L->out[i], &err) && rc == 0) rc = (snprintf(msg, n, "%s", err.msg), -1);
    }
    return rc;
}

// ---- prompt ----

static int prompt_ids(session *s, const agents_args *a, int **ids, verr *err) {
    if (a->chat) {
        chat_conv conv;
        int rc = chat_conv_init(&conv, s, a->chat_template, 1, err);
        if (rc == 0 && a->system) rc = chat_conv_add(&conv, "system", a->system, err);
        if (rc == 0) rc = chat_conv_add(&conv, "user", a->text, err);
        int n = rc == 0 ? chat_conv_ids(&conv, s, ids, err) : -1;
        chat_conv_free(&conv);
        return n;
    }
    if (a->ids_arg) return parse_id_list(a->ids_arg, ids, err);
    if (a->text) return session_encode_prompt(s, a->text, ids, err);
    int bos = s->m.cfg.bos_id >= 0 ? s->m.cfg.bos_id : s->tok ? tokenizer_bos_id(s->tok) : -1;
    if (bos < 0) return verr_set(err, "the model has no BOS token: give a prompt with -p or --ids");
    if (!(*ids = malloc(sizeof(int)))) return verr_set(err, "out of memory");
    **ids = bos;
    return 1;
}

// ---- devices, replicas, critic ----

typedef struct {
    const agents_args *a;
    device_spec dev[DEVICES_MAX];
    int n_dev, critic_dev;
    unsigned opened;       // replicas open
    dev_pool *pool;
    session reps[DEVICES_MAX];
    critic cr;
    int has_critic, rc;
    verr err;
} agents_rig;

static void job_open_critic(void *ud, int d) {
    agents_rig *g = ud;
    if (!g->a->critic_model) {
        const session *base = &g->reps[d];
        int ctx = base->ctx + 128 < base->m.cfg.max_pos ? base->ctx + 128 : base->m.cfg.max_pos;  // room for the question
        g->rc = critic_open_shared(&g->cr, base, ctx, &g->err);
        return;
    }
    session_opts o = g->a->so;
    o.model_dir = g->a->critic_model, o.device = g->dev[d].name, o.ctx = 0;
    memset(&o.steer, 0, sizeof o.steer);  // interventions steer the generating model, not another critic
    o.lora = NULL, o.n_lora = 0;  // the adapters are the agents' model's, not another critic's
    g->rc = critic_open_model(&g->cr, &o, &g->err);
}

static void job_close(void *ud, int d) {
    agents_rig *g = ud;
    if (g->has_critic && d == g->critic_dev) critic_close(&g->cr);
    if (g->opened & (1u << d)) session_close(&g->reps[d]);
}

// Which replicas to load: all with lookahead; else the first (generation) and, for a
// shared critic, the last.
static unsigned replica_mask(const agents_args *a, int n_dev, int critic_dev) {
    if (a->lookahead > 1) return (1u << n_dev) - 1;
    unsigned m = 1;
    if (a->check_every > 0 && !a->critic_model) m |= 1u << critic_dev;
    return m;
}

static int rig_open(agents_rig *g, verr *err) {
    const agents_args *a = g->a;
    g->critic_dev = g->n_dev - 1;
    if (dev_pool_start(&g->pool, g->n_dev, err)) return -1;
    unsigned mask = replica_mask(a, g->n_dev, g->critic_dev);
    session_opts so = a->so;
    int n_cpu = 0;
    for (int d = 0; d < g->n_dev; d++) n_cpu += !strcmp(g->dev[d].name, "cpu") && (mask & (1u << d));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    // Lookahead replicas run at once: CPU replicas share the cores.
    if (so.threads <= 0 && a->lookahead > 1 && n_cpu > 1) so.threads = cores / n_cpu > 0 ? (int)(cores / n_cpu) : 1;
    if (devices_open(g->pool, mask, g->dev, &so, g->reps, err)) return -1;
    g->opened = mask;
    if (a->check_every <= 0) return 0;
    dev_pool_run(g->pool, 1u << g->critic_dev, job_open_critic, g);
    if (g->rc) return verr_set(err, "critic on %s: %s", g->dev[g->critic_dev].name, g->err.msg);
    g->has_critic = 1;
    return 0;
}

static void rig_close(agents_rig *g) {
    if (!g->pool) return;
    dev_pool_run(g->pool, g->opened | (g->has_critic ? 1u << g->critic_dev : 0), job_close, g);
    dev_pool_stop(g->pool);
    g->pool = NULL;
}

// Every replica stops where replica 0 does (chat end-of-turn ids).
static int share_stops(agents_rig *g, verr *err) {
    for (int d = 1; d < g->n_dev; d++)
        for (int i = 0; (g->opened & (1u << d)) && i < g->reps[0].n_stop; i++)
            if (session_add_stop(&g->reps[d], g->reps[0].stop[i])) return verr_set(err, "too many stop tokens");
    return 0;
}

// ---- the command ----

static double median(double *x, int n) {
    for (int i = 1; i < n; i++)  // insertion sort: n is small
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            double t = x[j];
            x[j] = x[j - 1], x[j - 1] = t;
        }
    return n ? (n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2])) : 0;
}

static void print_stats(const agents_rig *g, const agents_opts *o, agents_result *r) {
    double load = 0;
    for (int d = 0; d < g->n_dev; d++)
        if (g->opened & (1u << d) && g->reps[d].load_s > load) load = g->reps[d].load_s;
    int steps = r->steps;
    double med = median(r->step_s, steps) * 1e3, med_cpu = median(r->step_cpu, steps) * 1e3;
    int k = r->checks > 0 ? r->checks : 1;
    fprintf(stderr, "agents %d | lookahead %d | devices %d | load %.3f s | prefill %d tokens %.3f s", o->n_agents,
            o->lookahead, g->n_dev, load, r->n_prompt, r->prefill_s);
    fprintf(stderr, " | %d steps, median %.3f ms/step (cpu %.3f ms) | %d tokens %.1f tok/s", steps, med, med_cpu,
            r->n_gen, r->gen_s > 0 ? r->n_gen / r->gen_s : 0.0);
    fprintf(stderr, " | critic %d checks %.3f ms/check (cpu %.3f ms) %.1f positions/check | %d rollbacks | seed %llu\n",
            r->checks, r->critic_s / k * 1e3, r->critic_cpu / k * 1e3, (double)r->critic_fed / k, r->rollbacks,
            (unsigned long long)o->seed);
    if (g->cr.template_unknown)
        fprintf(stderr, "note: the critic model's chat_template is not recognised; the critic prompt is plain text\n");
}

static char *final_text(const session *s, const agents_result *r) {
    const int *gen = r->ids + r->n_prompt;
    verr err;
    if (s->tok) return tokenizer_decode(s->tok, gen, r->n_gen, 1, &err);
    size_t cap = (size_t)r->n_gen * 12 + 1, k = 0;
    char *t = malloc(cap);
    if (!t) return NULL;
    t[0] = 0;
    for (int i = 0; i < r->n_gen; i++) k += (size_t)snprintf(t + k, cap - k, i ? " %d" : "%d", gen[i]);
    return t;
}

// Generation once everything is open. Returns 0 or 1 (message printed).
static int generate_and_print(agents_rig *g, agents_logs *L, sampler_params *ag, int n_ag) {
    const agents_args *a = g->a;
    verr err = { { 0 } };
    int *ids = NULL;
    int n = prompt_ids(&g->reps[0], a, &ids, &err);
    if (n < 0 || share_stops(g, &err)) return free(ids), fail(err.msg);
    agents_opts o = { .agents = ag, .n_agents = n_ag, .max_parallel = a->max_parallel, .max_new = a->max_new,
                      .seed = a->seed, .lookahead = a->lookahead, .cr = g->has_critic ? &g->cr : NULL,
                      .critic_dev = g->critic_dev, .check_every = a->check_every, .rollback = a->rollback,
                      .on_event = on_event, .ud = L };
    L->s = &g->reps[0];
    agents_result r;
    int rc = agents_generate(g->reps, g->pool, ids, n, &o, &r, &err);
    free(ids);
    if (rc == 0 && L->write_failed) rc = write_error(L, &err);
    char *text = rc == 0 ? final_text(&g->reps[0], &r) : NULL;
    if (rc == 0 && !text) rc = verr_set(&err, "decoding the final text failed");
    if (rc == 0) {
        log_done(L, text, &r);
        if (flush_all(L)) rc = write_error(L, &err);
    }
    if (rc == 0) {
        printf("%s\n", text);
        fflush(stdout);
        if (a->stats) print_stats(g, &o, &r);
    }
    free(text);
    agents_result_free(&r);
    if (rc == 0 && L->interrupted) fprintf(stderr, "varent agents: interrupted; the text so far is above\n");
    return rc ? fail(err.msg) : L->interrupted ? INTERRUPT_EXIT : 0;
}

int cmd_agents(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    if (args_flag(&a, "-h|--help")) return fputs(usage, stdout), 0;
    agents_args g;
    read_args(&a, &g);
    if (args_finish(&a, 0)) return fprintf(stderr, "varent agents: %s\n%s", a.err, usage), 1;
    char msg[1200];
    if (check_args(&g, msg, sizeof msg)) return fail(msg);
    verr err = { { 0 } };
    sampler_params ag[AGENTS_MAX];
    int n_ag = g.agents_spec ? agents_parse(g.agents_spec, ag, g.base, &err) : agents_default(ag, g.base);
    if (n_ag < 0) return fail(err.msg);
    interrupt_install();  // Ctrl-C: stop after the current record, print the text, keep the logs
    agents_rig rig = { .a = &g };
    if ((rig.n_dev = devices_parse(g.devices, rig.dev, &err)) < 0) return fail(err.msg);
    agents_logs L = { .a = &g };
    if (open_logs(&L, &g, msg, sizeof msg)) return close_logs(&L, 0, msg, 0), fail(msg);
    int rc = rig_open(&rig, &err) ? fail(err.msg) : generate_and_print(&rig, &L, ag, n_ag);
    rig_close(&rig);
    if (close_logs(&L, rc == 0 || rc == INTERRUPT_EXIT, msg, sizeof msg) && rc == 0) rc = fail(msg);
    return rc;
}
