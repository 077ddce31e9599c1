// chat.c: `varent chat -m DIR`, an interactive multi-turn chat on stdin.
// Each turn re-renders the conversation, keeps the KV cache for the longest common
// token prefix with what is already cached, and prefills only the rest.
// Commands: /reset clears the conversation, /quit (or end of input) leaves.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/args.h"
#include "host/decode/chat_prompt.h"
#include "host/cli/commands.h"
#include "host/cli/common.h"
#include "host/decode/generate.h"

typedef struct {
    tokenizer_stream *ts;
    int *ids;  // generated ids of this turn
    int n, cap;
} turn_out;

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

static int chat_turn(session *s, chat_conv *conv, gen_opts *g, int **cached, int *n_cached, verr *err) {
    int *ids = NULL, n = chat_conv_ids(conv, s, &ids, err);
    if (n < 0) return -1;
    int keep = common_prefix(*cached, *n_cached, ids, n);
    kv_cache_truncate(&s->kv, keep);
    turn_out out = { tokenizer_stream_new(s->tok, 1), NULL, 0, 0 };
    g->on_token = on_token, g->ud = &out;
    gen_stats st;
    int rc = out.ts ? generate(s, ids + keep, n - keep, g, &st, err) : verr_set(err, "out of memory");
    const char *tail;
    int k = rc == 0 ? tokenizer_stream_flush(out.ts, &tail) : 0;
    if (k > 0) fwrite(tail, 1, (size_t)k, stdout);
    printf("\n");
    // The cache now holds the prompt and every generated id but the last (unforwarded).
    int *c = realloc(*cached, sizeof(int) * (size_t)(n + out.n + 1));
    if (rc == 0 && c) {
        memcpy(c, ids, sizeof(int) * (size_t)n);
        memcpy(c + n, out.ids, sizeof(int) * (size_t)out.n);
        *cached = c;
        *n_cached = s->kv.len;
    } else if (c) {
        *cached = c, *n_cached = 0;
    }
    char *reply = rc == 0 ? tokenizer_decode(s->tok, out.ids, out.n, 1, err) : NULL;
    if (reply) rc = chat_conv_add(conv, "assistant", reply, err);
    free(reply), free(out.ids), free(ids);
    if (out.ts) tokenizer_stream_free(out.ts);
    return rc;
}

static int chat_loop(session *s, chat_conv *conv, const char *system, gen_opts *g) {
    int tty = isatty(0), *cached = NULL, n_cached = 0;
    char *line = NULL;
    size_t cap = 0;
    verr err = { { 0 } };
    if (system && chat_conv_add(conv, "system", system, &err)) return fprintf(stderr, "varent chat: %s\n", err.msg), 1;
    for (;;) {
        if (tty) fputs("> ", stdout), fflush(stdout);
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            chat_conv_reset(conv);
            if (system) chat_conv_add(conv, "system", system, &err);
            continue;
        }
        if (len == 0) continue;
        if (chat_conv_add(conv, "user", line, &err) || chat_turn(s, conv, g, &cached, &n_cached, &err)) {
            fprintf(stderr, "varent chat: %s\n", err.msg);
            if (conv->n > 0) conv->n--, free((char *)conv->msgs[conv->n].role), free((char *)conv->msgs[conv->n].content);
            n_cached = 0;
        }
    }
    free(line), free(cached);
    return 0;
}

int cmd_chat(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    gen_opts g = { 0 };
    cli_sampling_opts(&a, &g, 512, 0.7f, 0.9f);
    const char *system = args_str(&a, "--system", NULL), *tmpl = args_str(&a, "--chat-template", NULL);
    int think = !args_flag(&a, "--no-think");
    if (args_finish(&a, 0) || !so.model_dir) {
        fprintf(stderr, "varent chat: %s\nusage: varent chat -m DIR [--system TEXT] [--chat-template NAME] [--no-think] "
                        "[-n N] [--temp T] [--top-k K] [--top-p P] [--min-p M] [--seed S]\n",
                a.err[0] ? a.err : "missing -m MODEL_DIR");
        return 1;
    }
    char bad[256];
    if (cli_check_sampling(&g, bad, sizeof bad)) return fprintf(stderr, "varent chat: %s\n", bad), 1;
    verr err = { { 0 } };
    session s;
    if (session_open(&s, &so, &err)) return fprintf(stderr, "varent chat: %s\n", err.msg), 1;
    chat_conv conv;
    int rc = chat_conv_init(&conv, &s, tmpl, think, &err) ? (fprintf(stderr, "varent chat: %s\n", err.msg), 1)
                                                          : chat_loop(&s, &conv, system, &g);
    chat_conv_free(&conv);
    session_close(&s);
    return rc;
}
