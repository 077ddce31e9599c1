// loop.c: `varent agents`: parallel entropy-minimised generation with decoding
// agents, a critic with rollback, lookahead branches and device replicas
// (host/agents/loop.h, docs/agents.md). Logs: JSONL (--log) and the seed's text form
// (--log-text), each record flushed as written.
#include <errno.h>
#include <limits.h>
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
#include "host/cli/ranks.h"
#include "host/cli/prompts.h"
#include "host/decode/generate.h"
#include "host/util/interrupt.h"
#include "host/util/json_out.h"
#include "host/util/outfile.h"

static const cli_opt agents_cli_opts[] = {
    { "-n|--n-predict|--max-tokens", "N", "sampling", "128", "tokens to generate", 0 },
    { "--agents", "T:K,...", "agents", "8 from 0.3:10 to 1.5:100", "agent configurations: temperature:top-k (K=0: no top-k)", 0 },
    { "--top-p", "P", "sampling", "1 (off)", "nucleus, applied by every agent", 0 },
    { "--min-p", "P", "sampling", "0 (off)", "min-p, applied by every agent", 0 },
    { "-s|--seed", "N", "sampling", "random", "seed of the agents' streams; -1: random (from the OS)", 0 },
    { "--max-parallel", "N", "agents", "all", "agents evaluated at once", 0 },
    { "--check-every", "N", "agents", "5", "critic every N steps (0: no critic)", 0 },
    { "--rollback", "N", "agents", "5", "tokens a BAD verdict removes", 0 },
    { "--critic-model", "DIR", "agents", "the same model", "the critic's model (a second context)", 0 },
    { "--lookahead", "W", "agents", "off", "each agent extends a W-token branch", 0 },
    { "--devices", "LIST", "performance", "cpu", "replicas: cpu, cpu,cpu, cuda:0, 0,1 ...", 0 },
    { "--log", "FILE", "output", NULL, "JSONL: every step's proposals, critic verdicts, rollbacks", 0 },
    { "--log-text", "FILE", "output", NULL, "the same as readable text", 0 },
    { "--dump-logits", "FILE", "output", NULL, "each step's logits, vocab_size float32", 0 },
    { "--stats", NULL, "output", NULL, "timings, steps, critic checks and the seed on stderr", 0 },
    { "--force", NULL, "output", NULL, "replace existing log and capture files (kept as they are otherwise)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt agents_session_opts[] = {
    { "-m|--model", "DIR", "model", NULL, "model directory (config.json, *.safetensors, tokenizer.json) or .gguf file", 0 },
    { "-c|--ctx|--ctx-size", "N", "model", "the model's, at most 4096", "context length in tokens", 0 },
    { "-t|--threads", "N", "performance", "every CPU", "CPU threads (at most the CPUs this process may use)", 0 },
    { "-b|--batch|--batch-size", "N", "performance", "256", "prompt tokens per forward pass (prefill chunk)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const agents_tables[] = { agents_session_opts, cli_opts_kv, cli_opts_tp_replicas, cli_opts_lora, cli_opts_prompt, cli_opts_chat,
                                                cli_opts_logit_bias,
                                                agents_cli_opts,     cli_opts_steer, cli_opts_probe, NULL };
const cli_spec cli_agents_spec = {
    "agents", "-m DIR [-p TEXT | -f FILE | --ids LIST] [options]",
    "Parallel entropy-minimised decoding: agents propose, the lowest-entropy proposal wins, a critic rolls back.",
    "Docs: docs/agents.md.", agents_tables, NULL, NULL,
};

typedef struct {
    session_opts so;
    const char *ids_arg, *text, *file, *system, *chat_template, *agents_spec, *devices, *critic_model;
    const char *log_path, *text_path, *dump_path;
    char *owned_text;  // the prompt read from stdin or -f
    int chat, think, stats, lookahead, max_parallel, check_every, rollback, max_new, force;
    uint64_t seed;
    sampler_params base;
    session_lora lora[CLI_MAX_LORA];  // --lora, --lora-scaled (so.lora points here)
    char lora_msg[4400];
    int lora_bad;
    logit_bias bias[CLI_MAX_BIAS];  // -l/--logit-bias, added to the logits every agent draws from
    int n_bias, bias_bad;
    char bias_msg[512];
    probe_spec ps;  // the captures (docs/research.md)
} agents_args;

typedef struct {
    outfile out[3];           // --log, --log-text, --dump-logits (records; host/util/outfile.h)
    FILE *log, *text, *dump;  // their streams while open, else NULL
    const agents_args *a;
    const session *s;  // tokenizer for texts
    probe *probe;      // --attn-layers, --logit-lens: each step record's members
    int write_failed;         // 1 + the index in out[] of the first log a write failed on; 0: none
    int write_errno;          // its errno
    int interrupted;
} agents_logs;

static int fail(const char *msg) { return cli_error("agents", "%s", msg); }

static void read_args(args *a, agents_args *g) {
    memset(g, 0, sizeof *g);
    g->so.model_dir = args_str(a, "-m", NULL);
    g->so.ctx = (int)args_int_range(a, "-c", 0, 1, INT_MAX);
    g->so.threads = (int)args_int_range(a, "-t", 0, 1, cli_cpu_count());
    g->so.max_batch = (int)args_int_range(a, "-b", 0, 1, INT_MAX);
    g->so.kv_bf16 = cli_kv_bf16(a);
    g->so.weights_mmap = args_bool(a, "--mmap", "--no-mmap", 0);
    cli_steer_opts(a, &g->so.steer);
    cli_ranks_replicas();  // under mpirun the ranks are replica groups (--tp: ranks per group)
    cli_ranks_session(a, &g->so);
    g->ids_arg = args_str(a, "--ids", NULL);
    g->text = args_str(a, "-p", NULL);
    g->file = args_str(a, "-f", NULL);
    prompt_style ps;
    prompt_style_read(a, &ps);
    g->chat = ps.chat, g->think = ps.think, g->system = ps.system, g->chat_template = ps.template_name;
    g->max_new = (int)args_int_range(a, "-n", 128, 0, INT_MAX);
    g->agents_spec = args_str(a, "--agents", NULL);
    g->base = (sampler_params){ 1, 0, (float)args_float(a, "--top-p", 1.0), (float)args_float(a, "--min-p", 0.0) };
    if (!(g->base.top_p > 0 && g->base.top_p <= 1)) args_bad(a, "--top-p %g: must be in (0, 1]", g->base.top_p);
    if (!(g->base.min_p >= 0 && g->base.min_p < 1)) args_bad(a, "--min-p %g: must be in [0, 1)", g->base.min_p);
    g->max_parallel = (int)args_int_range(a, "--max-parallel", 0, 1, AGENTS_MAX);
    gen_opts biased = { 0 };
    g->bias_bad = cli_logit_bias(a, &biased, g->bias, CLI_MAX_BIAS, g->bias_msg, sizeof g->bias_msg) != 0;
    g->n_bias = biased.n_bias;
    g->check_every = (int)args_int_range(a, "--check-every", 5, 0, INT_MAX);
    g->rollback = (int)args_int_range(a, "--rollback", 5, 1, INT_MAX);
    g->critic_model = args_str(a, "--critic-model", NULL);
    g->lookahead = (int)args_int_range(a, "--lookahead", 0, 0, 256);
    g->devices = args_str(a, "--devices", "cpu");
    g->seed = cli_seed(a);
    g->log_path = args_str(a, "--log", NULL);
    g->text_path = args_str(a, "--log-text", NULL);
    g->dump_path = args_str(a, "--dump-logits", NULL);
    g->stats = args_flag(a, "--stats");
    g->force = args_flag(a, "--force");
    g->lora_bad = cli_lora_opts(a, &g->so, g->lora, CLI_MAX_LORA, g->lora_msg, sizeof g->lora_msg);
    cli_probe_opts(a, &g->ps);
    g->ps.force = g->force;
}

// Combinations that cannot work: CLI_EXIT_USAGE after the message, else 0.
static int check_args(const agents_args *g) {
    if (!g->so.model_dir) return cli_usage_error("agents", "missing -m DIR (the model directory)");
    if (g->lora_bad) return cli_usage_error("agents", "%.1000s", g->lora_msg);
    if (g->bias_bad) return cli_usage_error("agents", "%s", g->bias_msg);
    if (g->text && g->file) return cli_usage_error("agents", "give the prompt either with -p or with -f, not both");
    if (g->ids_arg && (g->text || g->file)) return cli_usage_error("agents", "give either --ids or -p/-f, not both");
    if (g->ids_arg && g->chat) return cli_usage_error("agents", "--chat renders text: give the message with -p, not --ids");
    if (g->critic_model && g->check_every == 0) return cli_usage_error("agents", "--critic-model needs --check-every > 0");
    char msg[256];
    if (cli_probe_check(&g->ps, "--log", g->log_path != NULL, 0, msg, sizeof msg)) return cli_usage_error("agents", "%s", msg);
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
        fprintf(L->log, "],\"chosen_agent\":%d,\"token\":%d,\"seed\":%llu", e->chosen, w->tok[0],
                (unsigned long long)L->a->seed);
        if (la) fputs(",\"tokens\":", L->log), put_ids(L->log, w->tok, w->n_tok);
        probe_json(L->probe, L->log);  // the step's shared forward: the query at pos - 1
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
                "\"action\":\"%s\",\"seed\":%llu}\n",
                e->step, e->pos, v->good ? "GOOD" : "BAD", v->logp_good, v->logp_bad, action[e->action],
                (unsigned long long)L->a->seed);
    if (L->text && e->action == CRITIC_NONE) fprintf(L->text, "Evaluator after step %d: GOOD\n", e->step);
    if (L->text && e->action == CRITIC_ACCEPT)
        fprintf(L->text, "Evaluator after step %d: BAD → accepted (already rolled back %d times at position %d)\n",
                e->step, AGENTS_ROLLBACK_GUARD, e->pos);
}

static void log_rollback(agents_logs *L, const agents_event *e) {
    int removed = e->from_pos - e->to_pos;
    if (L->log)
        fprintf(L->log,
                "{\"event\":\"rollback\",\"step\":%d,\"from_pos\":%d,\"to_pos\":%d,\"tokens_removed\":%d,\"seed\":%llu}\n",
                e->step, e->from_pos, e->to_pos, removed, (unsigned long long)L->a->seed);
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

// The log files: checked before the models load (check: a bad path fails early), created
// once they loaded, before anything runs. An existing regular file is an error unless
// --force; a device node or FIFO is written in place (host/util/outfile.h).
static int open_logs(agents_logs *L, const agents_args *a, int check, char *msg, size_t n) {
    const char *paths[3] = { a->log_path, a->text_path, a->dump_path };
    const char *names[3] = { "--log", "--log-text", "--dump-logits" };
    FILE **fs[3] = { &L->log, &L->text, &L->dump };
    for (int i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        outfile_opts oo = { .records = 1, .force = a->force, .flag = names[i] };
        verr err = { { 0 } };
        if (check ? outfile_check(paths[i], &oo, &err) : outfile_open(&L->out[i], paths[i], &oo, &err)) {
            snprintf(msg, n, "%s", err.msg);
            return -1;
        }
        if (!check) *fs[i] = L->out[i].f;
    }
    return 0;
}

// The logs as the run ended (cli_outfile_end): committed after a run that generated, the
// finished records kept after Ctrl-C (never over an existing file); otherwise only what
// this run created is removed. -1 with msg when a commit failed.
static int close_logs(agents_logs *L, outfile_end how, char *msg, size_t n) {
    FILE **fs[3] = { &L->log, &L->text, &L->dump };
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        if (!*fs[i]) continue;
        *fs[i] = NULL;
        verr err = { { 0 } };
        if (outfile_finish(&L->out[i], how, &err) && rc == 0) rc = (snprintf(msg, n, "%s", err.msg), -1);
    }
    return rc;
}

// ---- prompt ----

static int prompt_ids(session *s, const agents_args *a, int **ids, verr *err) {
    if (a->chat) {
        chat_conv conv;
        int rc = chat_conv_init(&conv, s, a->chat_template, a->think, err);
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

// --attn-layers, --logit-lens: a probe on replica 0 for the step records, paused but for
// each step's shared forward (host/agents/loop.h).
static int open_step_probe(const agents_args *a, session *s, probe **pr, verr *err) {
    probe_spec ps = { .attn_layers = a->ps.attn_layers, .logit_lens = a->ps.logit_lens };
    *pr = NULL;
    if (!probe_spec_active(&ps)) return 0;
    if (probe_open(pr, &ps, s, err)) return -1;
    probe_pause(*pr, 1);
    return 0;
}

typedef struct {
    probe_spec ps;
    session *s;
    const agents_result *r;
    outfile_end how;  // OUTFILE_PARTIAL: Ctrl-C stopped the run
    int rc;
    verr err;
} replay_job;

// The accepted sequence fed again on replica 0 as `run` feeds it: the prompt in one
// forward, then each generated id (the last one too), so the files hold exactly its
// positions; nothing of the lookahead branches, the rollbacks or the critic.
static void job_replay(void *ud, int d) {
    replay_job *j = ud;
    session *s = j->s;
    const agents_result *r = j->r;
    int n = r->n_prompt + r->n_gen, rc;
    probe *pr = NULL;
    (void)d;
    kv_cache_truncate(&s->kv, 0);
    rc = probe_open(&pr, &j->ps, s, &j->err);
    for (int i = 0; rc == 0 && i < n;) {
        int k = i == 0 ? r->n_prompt : 1;
        kv_view kv = kv_view_of(&s->kv);
        rc = session_forward(s, &kv, r->ids + i, k, &j->err);
        i += k;
    }
    if (rc == 0) rc = probe_check(pr, &j->err);
    if (probe_close(pr, rc == 0 ? j->how : OUTFILE_DROP, r->ids, n, &j->err)) rc = -1;
    j->rc = rc;
}

// --dump-acts, --dump-attn: the files of the accepted sequence, after generation.
static int replay(agents_rig *g, const agents_result *r, outfile_end how, verr *err) {
    const probe_spec *ps = &g->a->ps;
    replay_job j = { .ps = { .acts_path = ps->acts_path, .dump_layers = ps->dump_layers, .dump_points = ps->dump_points,
                             .attn_path = ps->attn_path, .attn_layers = ps->attn_path ? ps->attn_layers : NULL,
                             .force = ps->force },
                     .s = &g->reps[0], .r = r, .how = how };
    if (!probe_spec_active(&j.ps)) return 0;
    dev_pool_run(g->pool, 1u, job_replay, &j);
    return j.rc ? verr_set(err, "%s", j.err.msg) : 0;
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
                      .on_event = on_event, .ud = L, .bias = a->bias, .n_bias = a->n_bias };
    L->s = &g->reps[0];
    agents_result r = { 0 };
    int rc = open_step_probe(a, &g->reps[0], &L->probe, &err);
    o.probe = L->probe;
    if (rc == 0) rc = agents_generate(g->reps, g->pool, ids, n, &o, &r, &err);
    if (probe_close(L->probe, 0, NULL, 0, &err) && rc == 0) rc = -1;  // statistics only: no files
    L->probe = NULL;
    if (rc == 0) rc = replay(g, &r, L->interrupted ? OUTFILE_PARTIAL : OUTFILE_DONE, &err);
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

// --tp N outside mpirun with --devices listing N GPUs (or plain cuda: GPUs 0..N-1): one
// replica on a tensor-parallel group in this process (host/runtime/session_tpl.c). 1
// with *local the arguments for it and the rig cut to one device.
static int one_process_group(const agents_args *g, agents_rig *rig, agents_args *local) {
    static char first_n[DEVICES_MAX * 4];  // CLI state: the default list
    int tp = g->so.tp, plain = rig->n_dev == 1 && !strcmp(rig->dev[0].name, "cuda");
    if (tp <= 1 || g->so.tp_comm || (rig->n_dev != tp && !plain)) return 0;
    for (int d = 0; d < rig->n_dev; d++)
        if (strncmp(rig->dev[d].name, "cuda", 4) != 0) return 0;
    *local = *g;
    local->so.tp_devices = g->devices;
    if (plain) {
        size_t used = 0;
        for (int i = 0; i < tp && i < DEVICES_MAX; i++)
            used += (size_t)snprintf(first_n + used, sizeof first_n - used, "%s%d", i ? "," : "", i);
        local->so.tp_devices = first_n;
    }
    rig->n_dev = 1;  // the replica's thread drives the group (the session's own threads drive the ranks)
    return 1;
}

// Everything after the arguments: devices, logs, models, generation.
static int agents_main(const agents_args *g, char *msg, size_t len) {
    verr err = { { 0 } };
    sampler_params ag[AGENTS_MAX];
    int n_ag = g->agents_spec ? agents_parse(g->agents_spec, ag, g->base, &err) : agents_default(ag, g->base);
    if (n_ag < 0) return cli_usage_error("agents", "%s", err.msg);
    agents_rig rig = { .a = g };
    if ((rig.n_dev = devices_parse(g->devices, rig.dev, &err)) < 0) return cli_usage_error("agents", "%s", err.msg);
    agents_args local;
    if (one_process_group(g, &rig, &local)) g = rig.a = &local;
    else if (g->so.tp > 1 && rig.n_dev > 1)  // each device's thread would make the group's collectives at once
        return cli_usage_error("agents", "--devices %s with --tp %d: a tensor-parallel group holds one replica (launch "
                               "more ranks for more replicas, or list --tp GPUs outside mpirun)", g->devices, g->so.tp);
    interrupt_install();  // Ctrl-C: stop after the current record, print the text, keep the logs
    agents_logs L = { .a = g };
    if (open_logs(&L, g, 1, msg, len)) return fail(msg);
    int rc = rig_open(&rig, &err) ? fail(err.msg) : open_logs(&L, g, 0, msg, len) ? fail(msg) : 0;
    if (rc == 0) rc = generate_and_print(&rig, &L, ag, n_ag);
    rig_close(&rig);
    if (close_logs(&L, cli_outfile_end(rc), msg, len) && rc == 0) rc = fail(msg);
    return rc;
}

// The prompt from -p, -f or stdin; CLI_EXIT_USAGE or CLI_EXIT_RUNTIME after a message, else 0.
static int read_prompt(agents_args *g) {
    verr err = { { 0 } };
    const char *text;
    if (cli_prompt_text(g->text, g->file, g->ids_arg != NULL, &text, &g->owned_text, &err)) return fail(err.msg);
    g->text = text;
    if (g->chat && !g->text) return cli_usage_error("agents", "--chat needs a user message: -p TEXT, -f FILE or stdin");
    return 0;
}

int cmd_agents(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_agents_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    agents_args g;
    read_args(&a, &g);
    if (args_finish(&a, 0)) return cli_usage_error("agents", "%s", a.err);
    if ((rc0 = check_args(&g)) || (rc0 = read_prompt(&g))) return free(g.owned_text), rc0;
    char msg[1200];
    rc0 = agents_main(&g, msg, sizeof msg);
    free(g.owned_text);
    return rc0;
}
