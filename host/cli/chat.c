// chat.c: `varent chat -m MODEL`, an interactive multi-turn chat (docs/chat.md).
// Each turn re-renders the conversation, keeps the KV cache for the longest common
// token prefix with what is already cached, and prefills only the rest. When the
// conversation no longer fits the context, the oldest turns are dropped (the system
// prompt stays) with a one-line notice. Lines come from host/cli/repl.c: line editing
// on a terminal, plain lines from a pipe (one message per line, as scripts drive it).
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/cli/args.h"
#include "host/cli/chat_cmds.h"
#include "host/cli/commands.h"
#include "host/cli/entropix_opts.h"
#include "host/cli/interp_opts.h"
#include "host/cli/prompts.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/util/interrupt.h"

// --metrics-out and the captures (docs/research.md): the log gets one record per
// generated token, each with its "turn"; the capture files cover every position fed
// over the whole conversation, in order (each turn's prompt tokens past the cached
// prefix, then its generated tokens), with the ids fed and their positions.
struct chat_capture {
    probe_spec ps;
    entropix_cli ex;  // --metrics-out (the standard sampler's metrics, with ex.probe's members)
    probe *pr;
    int *fed, n_fed, cap_fed;  // the ids fed, in order: the "ids" tensor
    int turn;
    int failed;  // a capture or the log could not be written: the chat ends
};

// The ids this turn fed: the first `rows` of its prompt tail a[na], then its generated b[nb].
static int capture_fed(struct chat_capture *k, const int *a, int na, const int *b, int nb, long rows) {
    if (k->n_fed + rows > k->cap_fed) {
        int cap = (int)(k->n_fed + rows) * 2 + 256;
        int *p = realloc(k->fed, sizeof(int) * (size_t)cap);
        if (!p) return -1;
        k->fed = p, k->cap_fed = cap;
    }
    for (long i = 0; i < rows && i < na + nb; i++) k->fed[k->n_fed++] = i < na ? a[i] : b[i - na];
    return 0;
}

// After a turn: a capture that failed or a log write that failed ends the chat.
static void capture_turn(struct chat_capture *k, const int *a, int na, const int *b, int nb, long rows) {
    verr err = { { 0 } };
    if (capture_fed(k, a, na, b, nb, rows)) verr_set(&err, "out of memory recording the ids fed");
    else if (probe_check(k->pr, &err) == 0 && k->ex.log && (fflush(k->ex.log) != 0 || ferror(k->ex.log)))
        verr_set(&err, "--metrics-out %s: write failed (disk full?)", k->ex.metrics_path);
    if (!err.msg[0]) return;
    fprintf(stderr, "varent chat: %s\n", err.msg);
    k->failed = 1;
}

typedef struct {
    tokenizer_stream *ts;
    int *ids;  // generated ids of this turn
    int n, cap;
} turn_out;

// Once the session is open (and entropix_cli_start set the log's callback): the probe
// (the files cover every position: the last generated token of each reply is fed too).
static int capture_start(struct chat_capture *k, session *s, gen_opts *g, verr *err) {
    if (!probe_spec_active(&k->ps)) return 0;
    if (probe_open(&k->pr, &k->ps, s, err)) return -1;
    k->ex.probe = k->pr;
    g->feed_last = k->ps.acts_path || k->ps.attn_path;
    return 0;
}

// At the end of the chat, as it ended (host/util/outfile.h): the files written and the log
// committed, or dropped. -1 after a message.
static int capture_close(struct chat_capture *k, outfile_end how) {
    verr err = { { 0 } };
    int rc = probe_close(k->pr, k->failed ? OUTFILE_DROP : how, k->fed, k->n_fed, &err);
    if (rc) fprintf(stderr, "varent chat: %s\n", err.msg);
    if (entropix_cli_close(&k->ex, how, &err)) rc = -1, fprintf(stderr, "varent chat: %s\n", err.msg);
    free(k->fed);
    return rc;
}

static int on_token(void *ud, int id) {
    turn_out *o = ud;
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 256;
        int *p = realloc(o->ids, (size_t)cap * sizeof *p);
        if (!p) return 1;
        o->ids = p, o->cap = cap;
    }
    o->ids[o->n++] = id;
    const char *text;
    verr err;
    int k = tokenizer_stream_push(o->ts, id, &text, &err);
    if (k > 0) fwrite(text, 1, (size_t)k, stdout);
    fflush(stdout);
    return 0;
}

// Reuse the cached prefix: cached[0..n_cached) are the ids whose keys/values are in
// the cache. Returns how many leading ids of ids[] need no recompute.
static int common_prefix(const int *cached, int n_cached, const int *ids, int n) {
    int k = 0;
    while (k < n_cached && k < n - 1 && cached[k] == ids[k]) k++;  // keep >= 1 id to run
    return k;
}

// How many messages the oldest turn after the system prompt spans in msgs[first..n):
// its user message and the replies up to the next user message; 0 when nothing but the
// newest message is left.
static int oldest_turn(const chat_msg *msgs, int n, int first) {
    if (n - first <= 1) return 0;
    int k = 1;
    while (n - first - k > 1 && strcmp(msgs[first + k].role, "user") != 0) k++;
    return k;
}

// The prompt ids of the conversation without its first `drop` messages after the system
// prompt (a view: nothing is removed).
static int ids_without(const chat_conv *conv, const session *s, int first, int drop, int **ids, verr *err) {
    if (drop == 0) return chat_conv_ids(conv, s, ids, err);
    chat_conv view = *conv;
    if (!(view.msgs = malloc(sizeof *view.msgs * (size_t)conv->n))) return verr_set(err, "out of memory");
    memcpy(view.msgs, conv->msgs, sizeof *view.msgs * (size_t)first);
    memcpy(view.msgs + first, conv->msgs + first + drop, sizeof *view.msgs * (size_t)(conv->n - first - drop));
    view.n = conv->n - drop;
    int n = chat_conv_ids(&view, s, ids, err);
    free(view.msgs);
    return n;
}

// The prompt ids of the conversation, its oldest turns shifted out until the prompt and
// room for a reply (min(-n, ctx / 2) tokens) fit the context. When even the newest
// message alone does not fit, -1 with err, and the conversation is as it was.
static int fit_context(chat_state *c, int **ids, verr *err) {
    chat_conv *conv = &c->conv;
    int ctx = c->s->ctx, reserve = c->g.max_new < ctx / 2 ? c->g.max_new : ctx / 2, n;
    int first = conv->n > 0 && !strcmp(conv->msgs[0].role, "system"), drop = 0, turns = 0;
    for (;;) {
        n = ids_without(conv, c->s, first, drop, ids, err);
        int k = n < 0 || n + reserve <= ctx ? 0 : oldest_turn(conv->msgs + drop, conv->n - drop, first);
        if (k == 0) break;
        free(*ids);
        *ids = NULL;
        drop += k, turns++;
    }
    if (n >= ctx) {
        free(*ids);
        *ids = NULL;
        return verr_set(err, "this message makes a prompt of %d tokens, more than the context of %d holds (raise "
                             "--ctx); it was not sent, and the conversation is as it was", n, ctx);
    }
    if (n < 0) return -1;
    for (int i = 0; i < drop; i++) chat_remove_message(conv, first);
    if (turns)
        fprintf(stderr, "[context full (%d tokens): dropped the oldest %d turn%s%s]\n", ctx, turns, turns == 1 ? "" : "s",
                c->system ? ", kept the system prompt" : "");
    return n;
}

// The cache now holds the prompt and every generated id but the last (unforwarded).
static void remember_cache(chat_state *c, const int *ids, int n, const turn_out *out, int ok) {
    int *p = realloc(c->cached, sizeof(int) * (size_t)(n + out->n + 1));
    if (!p) {
        c->n_cached = 0;
        return;
    }
    c->cached = p;
    c->n_cached = 0;
    if (!ok) return;
    memcpy(p, ids, sizeof(int) * (size_t)n);
    memcpy(p + n, out->ids, sizeof(int) * (size_t)out->n);
    c->n_cached = c->s->kv.len;
}

// --stats: one reply's timings and the seed, then the quadrant counts.
static void turn_stats(const chat_state *c, const gen_stats *st) {
    fprintf(stderr, "[prefill %d tokens %.1f tok/s | decode %d tokens %.1f tok/s | seed %llu]\n", st->n_prompt,
            st->n_prompt / (st->prefill_s > 0 ? st->prefill_s : 1e-9), st->n_gen,
            st->n_gen > 1 ? (st->n_gen - 1) / st->decode_s : 0.0, (unsigned long long)c->g.seed);
    entropix_cli_report(c->ex, st);
}

// One turn: -2 when the message was refused before anything changed (it does not fit
// the context), -1 on another error.
static int chat_turn(chat_state *c, verr *err) {
    int *ids = NULL, n = fit_context(c, &ids, err);
    if (n < 0) return -2;
    session *s = c->s;
    int keep = common_prefix(c->cached, c->n_cached, ids, n);
    kv_cache_truncate(&s->kv, keep);
    turn_out out = { tokenizer_stream_new(s->tok, 1), NULL, 0, 0 };
    c->g.on_token = on_token, c->g.ud = &out;
    c->g.context = ids, c->g.n_context = keep;  // the penalties see the whole conversation
    interrupt_install();  // Ctrl-C: stop this reply after the current token
    c->g.interrupt = interrupt_flag();
    gen_stats st = { 0 };
    long rows = c->cap ? probe_rows(c->cap->pr) : 0;
    if (c->cap) snprintf(c->cap->ex.tag, sizeof c->cap->ex.tag, "\"turn\":%d,", ++c->cap->turn);
    cli_prefill bar = { .shown = 0 };
    if (!c->cap || !c->cap->pr) cli_prefill_watch(&bar, &c->g);  // a capture sees each turn's prompt as one forward
    int rc = out.ts ? generate(s, ids + keep, n - keep, &c->g, &st, err) : verr_set(err, "out of memory");
    cli_prefill_done(&bar);
    if (c->cap) capture_turn(c->cap, ids + keep, n - keep, out.ids, out.n, probe_rows(c->cap->pr) - rows);
    const char *tail;
    int k = rc == 0 ? tokenizer_stream_flush(out.ts, &tail) : 0;
    if (k > 0) fwrite(tail, 1, (size_t)k, stdout);
    printf("\n");
    fflush(stdout);
    if (rc == 0 && c->stats) turn_stats(c, &st);
    if (rc == 0 && st.interrupted) fprintf(stderr, "[stopped]\n");
    else if (rc == 0 && st.hit_ctx) fprintf(stderr, "[the reply filled the context; the next turn drops the oldest]\n");
    remember_cache(c, ids, n, &out, rc == 0);
    // An interrupted reply is kept as far as it went: the conversation holds what was shown.
    char *reply = rc == 0 ? tokenizer_decode(s->tok, out.ids, out.n, 1, err) : NULL;
    if (reply) rc = chat_conv_add(&c->conv, "assistant", reply, err);
    else if (rc == 0) rc = -1;
    free(reply), free(out.ids), free(ids);
    if (out.ts) tokenizer_stream_free(out.ts);
    return rc;
}

static void banner(const chat_state *c, const char *model_arg) {
    const model_config *m = &c->s->m.cfg;
    const sampler_params *p = &c->g.sp;
    fprintf(stderr, "varent chat: %s (%s, %.1f M params)\n", model_arg, m->arch_name, c->s->m.n_params / 1e6);
    fprintf(stderr, "context %d tokens; ", c->s->ctx);
    if (c->g.max_new == INT_MAX) fprintf(stderr, "replies until end of turn or a full context; sampler: ");
    else fprintf(stderr, "replies up to %d tokens; sampler: ", c->g.max_new);
    if (c->g.sampler == GEN_ENTROPIX) fprintf(stderr, "entropix (profile %s)", c->ex->ex.name);
    else if (p->temperature == 0) fprintf(stderr, "greedy");
    else fprintf(stderr, "temp %g, top-p %g, top-k %d, min-p %g", p->temperature, p->top_p, p->top_k, p->min_p);
    fprintf(stderr, ", seed %llu\n", (unsigned long long)c->g.seed);
    if (c->system) fprintf(stderr, "system prompt: %s\n", c->system);
    fprintf(stderr, "/help for commands; Ctrl-C stops a reply; Ctrl-D quits%s\n",
            repl_editing(c->in) ? "" : " (no line editing: built without libedit)");
}

// A message that failed leaves the conversation as it was before it (and one refused
// before it ran, the cache too).
static void send_message(chat_state *c, const char *text) {
    verr err = { { 0 } };
    int before = c->conv.n, rc = chat_conv_add(&c->conv, "user", text, &err);
    if (rc == 0 && (rc = chat_turn(c, &err)) == 0) return;
    fprintf(stderr, "varent chat: %s\n", err.msg);
    while (c->conv.n > before) chat_remove_message(&c->conv, c->conv.n - 1);
    if (rc != -2) c->n_cached = 0;
}

static int chat_loop(chat_state *c, const char *first) {
    int armed = 0;  // the last thing was a Ctrl-C at an empty prompt
    if (first) {  // -p TEXT: the first message, shown as if typed
        if (c->tty) printf("> %s\n", first), fflush(stdout);
        send_message(c, first);
        if (c->cap && c->cap->failed) return 1;
    }
    for (;;) {
        const char *line;
        repl_status st = repl_read(c->in, "> ", "... ", &line);
        if (st == REPL_EOF) {
            if (c->tty) fputs("\n", stdout);  // leave the shell prompt on a line of its own
            break;
        }
        if (st == REPL_INTERRUPT) {
            if (line[0]) {  // Ctrl-C on a typed line only clears it
                armed = 0;
                continue;
            }
            if (armed) return INTERRUPT_EXIT;
            armed = 1;
            if (c->tty) fprintf(stderr, "(Ctrl-C again or Ctrl-D to quit)\n");
            continue;
        }
        armed = 0;
        if (!line[0]) continue;
        repl_history_add(c->in, line);
        if (line[0] == '/' && line[1] != '/') {
            if (chat_command(c, line) == CHAT_CMD_QUIT) break;
            continue;
        }
        send_message(c, line[0] == '/' ? line + 1 : line);
        if (c->cap && c->cap->failed) return 1;
    }
    return 0;
}

static const cli_opt chat_cli_opts[] = {
    { "-n|--n-predict|--max-tokens", "N", "sampling", "512", "tokens per reply at most; -1: until EOS or a full context", 0 },
    { "-p|--prompt", "TEXT", "prompt", NULL, "the first message, sent before the chat reads more (llama-cli's -cnv -p)", 0 },
    { "-f|--file", "FILE", "prompt", NULL, "the first message from FILE", 0 },
    { "-sys|--system|--system-prompt", "TEXT", "chat", NULL, "system message, kept across /reset", 0 },
    { "--chat-template", "NAME", "chat", "the model's", "chat format instead of the detected one", 0 },
    { "--no-think", NULL, "chat", NULL, "Qwen3: an empty thinking block, no reasoning", 0 },
    { "--metrics-out", "FILE", "output", NULL, "per-token metrics as JSONL, one line per generated token, with its turn", 0 },
    { "--stats", NULL, "output", NULL, "after each reply: its timings and the seed, and the quadrant counts, on stderr", 0 },
    { "--force", NULL, "output", NULL, "replace an existing --metrics-out, --dump-acts or --dump-attn file", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const chat_tables[] = { cli_opts_session,    cli_opts_llama, cli_opts_llama_text, cli_opts_kv,
                                              cli_opts_tp,         cli_opts_lora,  chat_cli_opts,       cli_opts_sampling,
                                              cli_opts_penalties,  cli_opts_logit_bias, cli_opts_entropix,  cli_opts_steer,
                                              cli_opts_probe,      NULL };
const cli_spec cli_chat_spec = {
    "chat", "-m DIR [options]", "Interactive multi-turn chat in the model's chat template.",
    "Type a message and Enter; /reset starts over, /quit (or end of input) leaves. Each turn reuses the\n"
    "cached prefix of the conversation. `varent run -cnv` starts the same chat.",
    chat_tables, NULL, NULL,
};

// What cmd_chat reads before the model loads.
typedef struct {
    session_opts so;
    session_lora lora[CLI_MAX_LORA];
    logit_bias bias[CLI_MAX_BIAS];
    const char *system, *tmpl, *first, *first_file;
    char *owned[2];  // the first message read from -f, and -e's copies
    int think, force;
    char bad[4400];  // the first bad value of -l, --lora or the entropix options
} chat_args;

static int chat_read(args *a, chat_args *o, chat_state *c, struct chat_capture *cap) {
    cli_session_opts(a, &o->so);
    int rc = cli_lora_opts(a, &o->so, o->lora, CLI_MAX_LORA, o->bad, sizeof o->bad);
    cli_sampling_opts(a, &c->g);
    cli_penalty_opts(a, &c->g.pen);
    char msg[512];
    if (cli_logit_bias(a, &c->g, o->bias, CLI_MAX_BIAS, msg, sizeof msg) && !rc) rc = -1, snprintf(o->bad, sizeof o->bad, "%s", msg);
    long n_max = args_int_range(a, "-n", 512, -1, INT_MAX);
    c->g.max_new = n_max < 0 ? INT_MAX : (int)n_max;
    o->first = args_str(a, "-p", NULL), o->first_file = args_str(a, "-f", NULL);
    o->system = args_str(a, "-sys", NULL), o->tmpl = args_str(a, "--chat-template", NULL);
    cli_check_template(a, o->tmpl);
    o->think = !args_flag(a, "--no-think"), o->force = args_flag(a, "--force");
    c->stats = args_flag(a, "--stats");
    c->g.want_metrics = c->stats;  // the quadrant counts under the standard sampler too
    int escape = cli_llama_text_opts(a);
    verr err = { { 0 } };
    if (entropix_cli_read(a, &c->g, &cap->ex, &err) && !rc) rc = -1, snprintf(o->bad, sizeof o->bad, "%s", err.msg);
    cap->ex.metrics_path = args_str(a, "--metrics-out", NULL);
    cli_probe_opts(a, &cap->ps);
    c->ex = &cap->ex;
    if (escape && o->first && (o->owned[0] = strdup(o->first))) cli_unescape(o->owned[0]), o->first = o->owned[0];
    if (escape && o->system && (o->owned[1] = strdup(o->system))) cli_unescape(o->owned[1]), o->system = o->owned[1];
    return rc;
}

// Usage errors: CLI_EXIT_USAGE after the message, else 0.
static int chat_check(args *a, chat_args *o, int bad_rc, const struct chat_capture *cap) {
    char bad[256];
    if (args_finish(a, 0)) return cli_usage_error("chat", "%s", a->err);
    if (!o->so.model_dir) return cli_usage_error("chat", "missing -m MODEL (a model directory or a .gguf file)");
    if (bad_rc) return cli_usage_error("chat", "%s", o->bad);
    if (o->first && !o->first[0]) return cli_usage_error("chat", "-p: the first message is empty");
    if (o->first && o->first_file) return cli_usage_error("chat", "give the first message either with -p or with -f, not both");
    if (cli_probe_check(&cap->ps, "--metrics-out", cap->ex.metrics_path != NULL, 0, bad, sizeof bad))
        return cli_usage_error("chat", "%s", bad);
    return 0;
}

// -f FILE: the first message (one trailing newline dropped).
static int read_first(chat_args *o, verr *err) {
    if (!o->first_file) return 0;
    const char *text;
    char *owned;
    if (cli_prompt_text(NULL, o->first_file, 0, &text, &owned, err)) return -1;
    free(o->owned[0]);
    o->owned[0] = owned, o->first = text;
    return 0;
}

int cmd_chat(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_chat_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    chat_args o = { 0 };
    chat_state c = { 0 };
    struct chat_capture cap = { 0 };
    int rc = chat_check(&a, &o, chat_read(&a, &o, &c, &cap), &cap);
    verr err = { { 0 } };
    if (rc == 0 && read_first(&o, &err)) rc = cli_error("chat", "%s", err.msg);
    if (rc) return free(o.owned[0]), free(o.owned[1]), rc;
    if (cap.ex.metrics_path || probe_spec_active(&cap.ps)) c.cap = &cap;
    cap.ps.force = o.force;
    // the metrics path is checked before the model loads and opened once it loaded (host/util/outfile.h)
    if (entropix_cli_check(&cap.ex, o.force, &err)) return free(o.owned[0]), free(o.owned[1]), cli_error("chat", "%s", err.msg);
    session s;
    if (session_open(&s, &o.so, &err)) {
        free(o.owned[0]), free(o.owned[1]);
        return cli_error("chat", "%s", err.msg);
    }
    c.s = &s;
    rc = 1;
    if (entropix_cli_open(&cap.ex, o.force, &err) || entropix_cli_start(&cap.ex, &s, &c.g, &err) ||
        (c.cap && capture_start(&cap, &s, &c.g, &err))) {
        fprintf(stderr, "varent chat: %s\n", err.msg);
    } else if (chat_conv_init(&c.conv, &s, o.tmpl, o.think, &err) || (o.system && chat_set_system(&c, o.system, &err))) {
        fprintf(stderr, "varent chat: %s\n", err.msg);
    } else if (!(c.in = repl_open())) {
        fprintf(stderr, "varent chat: out of memory\n");
    } else {
        c.tty = repl_tty(c.in);
        if (c.tty) banner(&c, o.so.model_dir);
        rc = chat_loop(&c, o.first);
    }
    repl_close(c.in);
    chat_conv_free(&c.conv);
    free(c.system), free(c.cached);
    if (capture_close(&cap, cli_outfile_end(rc)) && rc == 0) rc = 1;
    session_close(&s);
    free(o.owned[0]), free(o.owned[1]);
    return rc;
}
