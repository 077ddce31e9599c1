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
#include "host/cli/common.h"
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

// --metrics-out opens before the model loads (a bad path fails early); metrics need a
// profile for the quadrants (the default one, as `run` uses).
static int capture_open_log(struct chat_capture *k, gen_opts *g, int force, verr *err) {
    if (entropix_profile_load("seed", &k->ex.ex, err)) return -1;
    g->ex = &k->ex.ex;
    return entropix_cli_open(&k->ex, force, err);
}

// Once the session is open: the log's callback and the probe (the files cover every
// position: the last generated token of each reply is fed too).
static int capture_start(struct chat_capture *k, session *s, gen_opts *g, verr *err) {
    if (k->ex.log && entropix_cli_start(&k->ex, s, g, err)) return -1;
    if (!probe_spec_active(&k->ps)) return 0;
    if (probe_open(&k->pr, &k->ps, s, err)) return -1;
    k->ex.probe = k->pr;
    g->feed_last = k->ps.acts_path || k->ps.attn_path;
    return 0;
}

// At the end of the chat: keep writes the files and commits the log. -1 after a message.
static int capture_close(struct chat_capture *k, int keep) {
    verr err = { { 0 } };
    int rc = probe_close(k->pr, keep && !k->failed, k->fed, k->n_fed, &err);
    if (rc) fprintf(stderr, "varent chat: %s\n", err.msg);
    if (entropix_cli_close(&k->ex, keep, &err)) rc = -1, fprintf(stderr, "varent chat: %s\n", err.msg);
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

// Drops the oldest turn after the system prompt: its user message and the replies up to
// the next user message. 0 when nothing but the newest message is left.
static int drop_oldest_turn(chat_conv *conv) {
    int first = conv->n > 0 && !strcmp(conv->msgs[0].role, "system");
    if (conv->n - first <= 1) return 0;
    chat_remove_message(conv, first);
    while (conv->n - first > 1 && strcmp(conv->msgs[first].role, "user") != 0) chat_remove_message(conv, first);
    return 1;
}

// The prompt ids of the conversation, shifted until the prompt and room for a reply
// (min(-n, ctx / 2) tokens) fit the context. -1 with err when even the newest message
// alone does not fit.
static int fit_context(chat_state *c, int **ids, verr *err) {
    int ctx = c->s->ctx, reserve = c->g.max_new < ctx / 2 ? c->g.max_new : ctx / 2, dropped = 0, n;
    for (;;) {
        n = chat_conv_ids(&c->conv, c->s, ids, err);
        if (n < 0 || n + reserve <= ctx || !drop_oldest_turn(&c->conv)) break;
        free(*ids);
        *ids = NULL;
        dropped++;
    }
    if (dropped)
        fprintf(stderr, "[context full (%d tokens): dropped the oldest %d turn%s%s]\n", ctx, dropped,
                dropped == 1 ? "" : "s", c->system ? ", kept the system prompt" : "");
    if (n >= ctx) {
        free(*ids);
        *ids = NULL;
        return verr_set(err, "this message makes a prompt of %d tokens, more than the context of %d holds (raise --ctx)",
                        n, ctx);
    }
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

static int chat_turn(chat_state *c, verr *err) {
    int *ids = NULL, n = fit_context(c, &ids, err);
    if (n < 0) return -1;
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
    int rc = out.ts ? generate(s, ids + keep, n - keep, &c->g, &st, err) : verr_set(err, "out of memory");
    if (c->cap) capture_turn(c->cap, ids + keep, n - keep, out.ids, out.n, probe_rows(c->cap->pr) - rows);
    const char *tail;
    int k = rc == 0 ? tokenizer_stream_flush(out.ts, &tail) : 0;
    if (k > 0) fwrite(tail, 1, (size_t)k, stdout);
    printf("\n");
    fflush(stdout);
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
    fprintf(stderr, "context %d tokens; replies up to %d tokens; sampler: ", c->s->ctx, c->g.max_new);
    if (p->temperature == 0) fprintf(stderr, "greedy");
    else fprintf(stderr, "temp %g, top-p %g, top-k %d, min-p %g", p->temperature, p->top_p, p->top_k, p->min_p);
    fprintf(stderr, ", seed %llu\n", (unsigned long long)c->g.seed);
    if (c->system) fprintf(stderr, "system prompt: %s\n", c->system);
    fprintf(stderr, "/help for commands; Ctrl-C stops a reply; Ctrl-D quits%s\n",
            repl_editing(c->in) ? "" : " (no line editing: built without libedit)");
}

// A message that failed leaves the conversation as it was before it.
static void send_message(chat_state *c, const char *text) {
    verr err = { { 0 } };
    int before = c->conv.n;
    if (chat_conv_add(&c->conv, "user", text, &err) == 0 && chat_turn(c, &err) == 0) return;
    fprintf(stderr, "varent chat: %s\n", err.msg);
    while (c->conv.n > before) chat_remove_message(&c->conv, c->conv.n - 1);
    c->n_cached = 0;
}

static int chat_loop(chat_state *c) {
    int armed = 0;  // the last thing was a Ctrl-C at an empty prompt
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
    { "-sys|--system|--system-prompt", "TEXT", "chat", NULL, "system message, kept across /reset", 0 },
    { "--chat-template", "NAME", "chat", "the model's", "chat format instead of the detected one", 0 },
    { "--no-think", NULL, "chat", NULL, "Qwen3: an empty thinking block, no reasoning", 0 },
    { "--metrics-out", "FILE", "output", NULL, "per-token metrics as JSONL, one line per generated token, with its turn", 0 },
    { "--force", NULL, "output", NULL, "replace an existing --metrics-out file", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const chat_tables[] = { cli_opts_session, cli_opts_kv, cli_opts_tp,    cli_opts_lora,  chat_cli_opts, cli_opts_sampling,
                                              cli_opts_logit_bias, cli_opts_steer, cli_opts_probe, NULL };
const cli_spec cli_chat_spec = {
    "chat", "-m DIR [options]", "Interactive multi-turn chat in the model's chat template.",
    "Type a message and Enter; /reset starts over, /quit (or end of input) leaves. Each turn reuses the\n"
    "cached prefix of the conversation. `varent run -cnv` starts the same chat.",
    chat_tables, NULL, NULL,
};

int cmd_chat(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_chat_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    session_lora lora[CLI_MAX_LORA];
    char lora_msg[4400], bad[256];
    int lora_rc = cli_lora_opts(&a, &so, lora, CLI_MAX_LORA, lora_msg, sizeof lora_msg);
    chat_state c = { 0 };
    cli_sampling_opts(&a, &c.g);
    logit_bias bias[CLI_MAX_BIAS];
    int bias_rc = cli_logit_bias(&a, &c.g, bias, CLI_MAX_BIAS, bad, sizeof bad);
    long n_max = args_int_range(&a, "-n", 512, -1, INT_MAX);
    c.g.max_new = n_max < 0 ? INT_MAX : (int)n_max;
    const char *system = args_str(&a, "-sys", NULL), *tmpl = args_str(&a, "--chat-template", NULL);
    int think = !args_flag(&a, "--no-think"), force = args_flag(&a, "--force");
    struct chat_capture cap = { 0 };
    cap.ex.metrics_path = args_str(&a, "--metrics-out", NULL), cap.ex.sampler_name = "standard";
    cli_probe_opts(&a, &cap.ps);
    if (args_finish(&a, 0)) return cli_usage_error("chat", "%s", a.err);
    if (!so.model_dir) return cli_usage_error("chat", "missing -m MODEL (a model directory or a .gguf file)");
    if (lora_rc) return cli_usage_error("chat", "%s", lora_msg);
    if (bias_rc) return cli_usage_error("chat", "%s", bad);
    if (cli_probe_check(&cap.ps, "--metrics-out", cap.ex.metrics_path != NULL, 0, bad, sizeof bad))
        return cli_usage_error("chat", "%s", bad);
    verr err = { { 0 } };
    if (cap.ex.metrics_path || probe_spec_active(&cap.ps)) c.cap = &cap;
    if (c.cap && capture_open_log(&cap, &c.g, force, &err)) return fprintf(stderr, "varent chat: %s\n", err.msg), 1;
    session s;
    if (session_open(&s, &so, &err)) {
        entropix_cli_close(&cap.ex, 0, &err);
        return fprintf(stderr, "varent chat: %s\n", err.msg), 1;
    }
    c.s = &s;
    int rc = 1;
    if (c.cap && capture_start(&cap, &s, &c.g, &err)) {
        fprintf(stderr, "varent chat: %s\n", err.msg);
    } else if (chat_conv_init(&c.conv, &s, tmpl, think, &err) || (system && chat_set_system(&c, system, &err))) {
        fprintf(stderr, "varent chat: %s\n", err.msg);
    } else if (!(c.in = repl_open())) {
        fprintf(stderr, "varent chat: out of memory\n");
    } else {
        c.tty = repl_tty(c.in);
        if (c.tty) banner(&c, so.model_dir);
        rc = chat_loop(&c);
    }
    repl_close(c.in);
    chat_conv_free(&c.conv);
    free(c.system), free(c.cached);
    if (c.cap && capture_close(&cap, rc == 0 || rc == INTERRUPT_EXIT) && rc == 0) rc = 1;
    session_close(&s);
    return rc;
}
