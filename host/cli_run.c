// cli_run.c: `varent run` (generate text) and `varent logits` (dump logits).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/args.h"
#include "host/cli.h"
#include "host/cli_common.h"
#include "host/chat_prompt.h"
#include "host/entropix_cli.h"
#include "host/generate.h"

static int fail(const char *cmd, const char *msg) {
    fprintf(stderr, "varent %s: %s\n", cmd, msg);
    return 1;
}

typedef struct {
    session *s;
    tokenizer_stream *ts;
} run_out;

static int print_token(void *ud, int id) {
    run_out *o = ud;
    if (!o->ts) {
        printf("%d ", id);
    } else {
        const char *text;
        verr err;
        int n = tokenizer_stream_push(o->ts, id, &text, &err);
        if (n > 0) fwrite(text, 1, (size_t)n, stdout);
    }
    fflush(stdout);
    return 0;
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

// --chat: the prompt becomes one user turn (after an optional --system turn),
// rendered with the model's chat template.
typedef struct {
    int on, think;
    const char *system, *template_name;
} chat_args;

static chat_args read_chat_args(args *a) {
    chat_args c = { .on = args_flag(a, "--chat"), .think = !args_flag(a, "--no-think") };
    c.system = args_str(a, "--system", NULL);
    c.template_name = args_str(a, "--chat-template", NULL);
    return c;
}

static int chat_prompt_ids(session *s, const chat_args *c, const char *text, int **ids, verr *err) {
    if (!text) return verr_set(err, "--chat needs a user message with -p");
    chat_conv conv;
    int rc = chat_conv_init(&conv, s, c->template_name, c->think, err);
    if (rc == 0 && c->system) rc = chat_conv_add(&conv, "system", c->system, err);
    if (rc == 0) rc = chat_conv_add(&conv, "user", text, err);
    int n = rc == 0 ? chat_conv_ids(&conv, s, ids, err) : -1;
    chat_conv_free(&conv);
    return n;
}

int cmd_run(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    const char *ids_arg = args_str(&a, "--ids", NULL), *text = args_str(&a, "-p|--prompt", NULL);
    gen_opts g = { 0 };
    cli_sampling_opts(&a, &g, 256, 1.0f, 1.0f);
    int stats = args_flag(&a, "--stats");
    verr xerr = { { 0 } };
    entropix_cli ex;  // --sampler, --profile, --metrics-out, ... (host/entropix_cli.h)
    int ex_rc = entropix_cli_read(&a, &g, &ex, &xerr);
    chat_args chat = read_chat_args(&a);
    if (args_finish(&a, 0)) return fail("run", a.err);
    if (!so.model_dir) return fail("run", "missing -m MODEL_DIR");
    if (ids_arg && text) return fail("run", "give either --ids or -p, not both");
    char bad[256];
    if (cli_check_sampling(&g, bad, sizeof bad)) return fail("run", bad);

    verr err = { { 0 } };
    session s;
    if (ex_rc || entropix_cli_open(&ex, &xerr)) return fail("run", xerr.msg);
    if (session_open(&s, &so, &err)) return entropix_cli_close(&ex), fail("run", err.msg);
    int *ids = NULL, rc = 0;
    int n = chat.on ? chat_prompt_ids(&s, &chat, text, &ids, &err) : prompt_ids(&s, ids_arg, text, &ids, &err);
    run_out out = { &s, s.tok ? tokenizer_stream_new(s.tok, 1) : NULL };
    g.on_token = print_token, g.ud = &out, g.want_metrics = stats;
    if (n >= 0 && entropix_cli_start(&ex, &s, &g, &err)) n = -1;
    gen_stats st;
    if (n < 0 || generate(&s, ids, n, &g, &st, &err)) {
        rc = fail("run", err.msg);
    } else {
        const char *tail;
        int k = out.ts ? tokenizer_stream_flush(out.ts, &tail) : 0;
        if (k > 0) fwrite(tail, 1, (size_t)k, stdout);
        printf("\n");
        fflush(stdout);  // the text before the stats line, even when both go to one terminal
        if (stats)
            fprintf(stderr, "load %.3f s | prefill %d tokens %.1f tok/s | decode %d tokens %.1f tok/s | seed %llu\n",
                    s.load_s, st.n_prompt, st.n_prompt / (st.prefill_s > 0 ? st.prefill_s : 1e-9), st.n_gen,
                    st.n_gen > 1 ? (st.n_gen - 1) / st.decode_s : 0.0, (unsigned long long)g.seed);
        if (stats) entropix_cli_report(&ex, &st);
    }
    if (out.ts) tokenizer_stream_free(out.ts);
    free(ids);
    entropix_cli_close(&ex);
    session_close(&s);
    return rc;
}

// Writes n floats to path atomically (tmp + rename): no partial file on failure.
static int write_floats(const char *path, const float *x, int n, verr *err) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return verr_set(err, "%s: cannot create: %s", tmp, strerror(errno));
    int ok = fwrite(x, sizeof(float), (size_t)n, f) == (size_t)n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return verr_set(err, "%s: write failed: %s", path, strerror(errno));
    }
    return 0;
}

int cmd_logits(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    const char *ids_arg = args_str(&a, "--ids", NULL), *out = args_str(&a, "-o|--out", NULL);
    int chunk = (int)args_int(&a, "--chunk", 0);
    if (args_finish(&a, 0)) return fail("logits", a.err);
    if (!so.model_dir || !ids_arg || !out) return fail("logits", "usage: varent logits -m DIR --ids 1,2,3 --out FILE [--chunk C]");
    if (chunk < 0) return fail("logits", "--chunk must be positive");
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
    if (n > s.ctx) rc = verr_set(&err, "%d ids do not fit the %d-token context (raise --ctx)", n, s.ctx);
    for (int i = 0; rc == 0 && i < n; i += step)
        rc = session_forward(&s, &kv, ids + i, n - i < step ? n - i : step, &err);
    if (rc == 0) rc = write_floats(out, s.fw.logits, s.m.cfg.vocab_size, &err);
    free(ids);
    session_close(&s);
    return rc ? fail("logits", err.msg) : 0;
}
