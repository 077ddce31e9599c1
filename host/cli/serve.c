// serve.c: `varent serve`: load the model, start the server (host/serve/server.h),
// and on SIGINT/SIGTERM stop accepting, let in-flight requests finish, exit 0.
// A second signal (or --drain-timeout) cancels what is still running.
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/cli/interp_opts.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/decode/defaults.h"
#include "host/serve/server.h"

static int fail(const char *msg) { return cli_error("serve", "%s", msg); }

static const cli_opt serve_opts[] = {
    { "--host", "ADDR", "server", "127.0.0.1", "address to listen on", 0 },
    { "--port", "N", "server", "8080", "TCP port (0: any free port)", 0 },
    { "--parallel", "N", "server", "1", "sequences decoded together, one forward for all of them per token (the "
      "choices of every request; docs/server.md, The scheduler)", 0 },
    { "--kv-pool-mb", "MB", "server", "--parallel contexts", "the paged KV cache the sequences share, in device "
      "memory on CUDA (a full pool queues the next sequence)", 0 },
    { "--kv-pool-tokens", "N", "server", NULL, "the same pool given in positions instead", 0 },
    { "--no-prefix-cache", NULL, "server", NULL, "prefill every prompt in full (no reuse of earlier prompts' "
      "positions)", 0 },
    { "-a|--alias|--model-id", "NAME", "server", "-m's file or directory name", "the model's id in /v1/models and responses",
      0 },
    { "--strict-model", NULL, "server", NULL,
      "a request's \"model\" must be the id (else a 404); default: any name runs the model, but with --lora-modules "
      "only the id and their names", 0 },
    { "--metrics", NULL, "output", NULL,
      "completions carry per-token metrics unless they ask otherwise (default: only with \"metrics\": true; on with "
      "--attn-layers or --logit-lens)", 0 },
    { "--chat-template", "NAME", "chat", "the model's", "chat format for /v1/chat/completions", 0 },
    { "--sampler", "NAME", "entropix", "standard", "sampler of requests that name none: standard or entropix", 0 },
    { "--profile", "NAME", "entropix", "seed", "entropix profile of requests that name none", 0 },
    { "--max-tokens-limit", "N", "limits", "4096", "a request asking for more tokens gets a 400", 0 },
    { "--max-body", "BYTES", "limits", "1048576", "a larger request body gets a 413", 0 },
    { "--max-queue", "N", "limits", "256", "waiting requests beyond this get a 503 with Retry-After", 0 },
    { "--max-connections", "N", "limits", "256", "open connections at most; those waiting for a request's headers "
      "may hold all but N/8 of them (the longest-waiting is closed for a new one)", 0 },
    { "--max-connections-per-ip", "N", "limits", "64", "open connections from one client address", 0 },
    { "--timeout", "S", "limits", "60", "idle connection timeout once a request's headers are in (0: none)", 0 },
    { "--header-timeout", "S", "limits", "5", "seconds a connection has, in all, to send a request's headers (a "
      "new one, or a kept-alive one between requests)", 0 },
    { "--drain-timeout", "S", "limits", "60", "after SIGINT/SIGTERM, wait this long for requests to finish", 0 },
    { "--token-delay-ms", "MS", "limits", "0", "sleep per generated token (demos and tests)", 0 },
    { "--allowed-hosts", "LIST", "security", NULL, "comma-separated Host names a loopback server also answers to", 0 },
    { "--cors", "LIST", "security", NULL, "comma-separated browser Origins allowed besides the page's own (*: any)", 0 },
    { "--escape-special", NULL, "security", NULL, "special-token text in chat messages is plain text", 0 },
    { "-v|--verbose", NULL, "output", NULL, "one stderr line per request", 0 },
    { "--lora-modules", "NAME=DIR", "model", NULL, "a LoRA adapter a request selects with \"model\": NAME (vLLM's flag)",
      ARG_REPEAT },
    { "--dump-max-files", "N", "captures", "100",
      "here --dump-acts and --dump-attn name directories, a file per choice: capture N choices at most", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const serve_tables[] = { cli_opts_session, cli_opts_llama, cli_opts_kv, cli_opts_tp, cli_opts_lora, serve_opts, cli_opts_steer, cli_opts_probe, NULL };
const cli_spec cli_serve_spec = {
    "serve", "-m DIR [--host 127.0.0.1] [--port 8080] [--parallel N] [options]",
    "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) with a live entropy page.",
    "A request that omits a sampling field gets the defaults of varent run and chat (docs/cli.md):\n"
    "temperature " GEN_STR(GEN_DEFAULT_TEMP) ", top_k " GEN_STR(GEN_DEFAULT_TOP_K) " (off), top_p " GEN_STR(GEN_DEFAULT_TOP_P)
    ", min_p " GEN_STR(GEN_DEFAULT_MIN_P) " (off), a new seed per request. SIGINT or\n"
    "SIGTERM stops accepting and lets running requests finish; a second signal cancels them. Docs:\n"
    "docs/server.md.",
    serve_tables, NULL, NULL,
};

// --lora-modules NAME=DIR, repeatable (vLLM's flag; a request selects one with "model": NAME).
typedef struct {
    lora_spec spec[CLI_MAX_LORA];
    const char *name[CLI_MAX_LORA];
    char names[CLI_MAX_LORA][256];
} lora_modules;

// Every occurrence is read; 0, or -1 with msg for the first bad one.
static int read_lora_modules(args *a, server_opts *o, lora_modules *lm, char *msg, size_t len) {
    int n = 0, rc = 0;
    for (const char *v; (v = args_each(a, "--lora-modules"));) {
        const char *eq = strchr(v, '=');
        if (rc) continue;
        if (!eq || eq == v || !eq[1] || (size_t)(eq - v) >= sizeof lm->names[0])
            rc = -1, snprintf(msg, len, "--lora-modules '%.300s': expected NAME=DIR", v);
        else if (n == CLI_MAX_LORA)
            rc = -1, snprintf(msg, len, "--lora-modules: more than %d adapters", CLI_MAX_LORA);
        else {
            snprintf(lm->names[n], sizeof lm->names[n], "%.*s", (int)(eq - v), v);
            lm->name[n] = lm->names[n], lm->spec[n] = (lora_spec){ eq + 1, 1.0f };
            n++;
        }
    }
    o->lora_modules = lm->spec, o->lora_names = lm->name, o->n_lora_modules = n;
    return rc;
}

// Reads everything but the session options; 0, or -1 with msg.
static int read_opts(args *a, server_opts *o, double *drain_s, char *msg, size_t len) {
    o->host = args_str(a, "--host", "127.0.0.1");
    o->port = (int)args_int_range(a, "--port", 8080, 0, 65535);
    o->parallel = (int)args_int_range(a, "--parallel", 1, 1, 256);
    o->kv_pool_mb = args_int_range(a, "--kv-pool-mb", 0, 1, 1L << 24);
    o->kv_pool_tokens = args_int_range(a, "--kv-pool-tokens", 0, 1, 1L << 30);
    o->no_prefix_cache = args_flag(a, "--no-prefix-cache");
    o->max_tokens_limit = (int)args_int_range(a, "--max-tokens-limit", 4096, 1, INT_MAX);
    o->max_body = (size_t)args_int_range(a, "--max-body", 1 << 20, 1, 1L << 30);
    o->max_queue = (int)args_int_range(a, "--max-queue", 256, 0, 1 << 20);
    o->max_connections = (int)args_int_range(a, "--max-connections", 256, 1, 65536);
    o->timeout_s = (int)args_int_range(a, "--timeout", 60, 0, 86400);
    o->header_timeout_s = (int)args_int_range(a, "--header-timeout", 5, 1, 3600);
    o->max_per_ip = (int)args_int_range(a, "--max-connections-per-ip", 64, 1, 65536);
    o->model_id = args_str(a, "--alias", NULL);
    o->strict_model = args_flag(a, "--strict-model");
    o->metrics = args_flag(a, "--metrics");
    const char *smp = args_str(a, "--sampler", "standard");
    o->profile = args_str(a, "--profile", "seed");
    o->chat_template = args_str(a, "--chat-template", NULL);
    o->token_delay_ms = (int)args_int_range(a, "--token-delay-ms", 0, 0, 60000);
    o->allowed_hosts = args_str(a, "--allowed-hosts", NULL);
    o->cors = args_str(a, "--cors", NULL);
    o->escape_special = args_flag(a, "--escape-special");
    o->verbose = args_flag(a, "-v");
    *drain_s = args_float_range(a, "--drain-timeout", 60, 0, 86400);
    if (o->model_id && !o->model_id[0]) return snprintf(msg, len, "--alias: the name is empty"), -1;
    if (strcmp(smp, "standard") && strcmp(smp, "entropix"))
        return snprintf(msg, len, "--sampler '%s': use standard or entropix", smp), -1;
    if (o->kv_pool_mb && o->kv_pool_tokens)
        return snprintf(msg, len, "give the KV pool's size with --kv-pool-mb or --kv-pool-tokens, not both"), -1;
    o->sampler = strcmp(smp, "entropix") ? GEN_STANDARD : GEN_ENTROPIX;
    entropix_config ex;
    verr err;
    if (entropix_profile(o->profile, &ex, &err)) return snprintf(msg, len, "--profile: %.400s", err.msg), -1;
    return 0;
}

// The captures a server makes: --attn-layers and --logit-lens join each token's metrics
// object in the responses; --dump-acts DIR and --dump-attn DIR get a file per choice
// (host/serve/capture.h), at most --dump-max-files (docs/research.md). 0, or -1 with msg.
static int check_probe(const probe_spec *ps, server_opts *o, const char *max_files, char *msg, size_t n) {
    if (max_files && !ps->acts_path && !ps->attn_path)
        return snprintf(msg, n, "--dump-max-files bounds the files of --dump-acts DIR and --dump-attn DIR: give one"), -1;
    if (!probe_spec_active(ps)) return 0;
    const char *dir[2] = { ps->acts_path, ps->attn_path }, *flag[2] = { "--dump-acts", "--dump-attn" };
    struct stat st[2];
    for (int k = 0; k < 2; k++)
        if (dir[k] && (stat(dir[k], &st[k]) || !S_ISDIR(st[k].st_mode)))
            return snprintf(msg, n, "%s %.200s: not a directory (a server writes a file per choice there: make it first)",
                            flag[k], dir[k]), -1;
    if (dir[0] && dir[1] && st[0].st_dev == st[1].st_dev && st[0].st_ino == st[1].st_ino)
        return snprintf(msg, n, "--dump-acts and --dump-attn name one directory (%.200s): the files would share names",
                        dir[0]), -1;
    char *end;
    long v = max_files ? strtol(max_files, &end, 10) : 100;
    if (max_files && (end == max_files || *end || v < 1 || v > 1000000000))
        return snprintf(msg, n, "--dump-max-files '%.40s': want a count of 1 or more", max_files), -1;
    o->probe = ps, o->dump_max_files = (int)v;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// After the first signal: wait for in-flight requests; a second signal or the drain
// timeout cancels them, and 2 s after that we stop regardless (clients not reading).
static void drain(server *srv, const sigset_t *set, double drain_s) {
    server_quiesce(srv);
    int n = server_inflight(srv);
    if (n) fprintf(stderr, "varent serve: finishing %d request(s) (signal again to cancel)\n", n);
    double t0 = now_s(), cancelled_at = 0;
    while (server_inflight(srv) > 0) {
        struct timespec ts = { 0, 100000000L };
        int sig = sigtimedwait(set, NULL, &ts);
        if (!cancelled_at && (sig > 0 || now_s() - t0 > drain_s)) {
            fprintf(stderr, "varent serve: cancelling %d request(s)\n", server_inflight(srv));
            server_cancel_all(srv);
            cancelled_at = now_s();
        }
        if (cancelled_at && now_s() - cancelled_at > 2) break;
    }
}

// The ranks other than 0 of a tensor-parallel server: rank 0's requests, until it stops.
// Signals keep their default action here: mpirun stops these ranks with them.
static int follow(const session_opts *so, const server_opts *o) {
    verr err = { { 0 } };
    session s;
    if (session_open(&s, so, &err)) return fail(err.msg);
    int rc = server_follow(&s, o, &err);
    session_close(&s);
    return rc ? fail(err.msg) : 0;
}

int cmd_serve(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_serve_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    session_opts so = { 0 };
    cli_session_opts(&a, &so);
    session_lora lora[CLI_MAX_LORA];
    char lora_msg[4400];
    int lora_rc = cli_lora_opts(&a, &so, lora, CLI_MAX_LORA, lora_msg, sizeof lora_msg);
    server_opts o = { 0 };
    double drain_s;
    char msg[512];
    lora_modules lm;
    char lm_msg[512];
    int bad = read_opts(&a, &o, &drain_s, msg, sizeof msg), lm_bad = read_lora_modules(&a, &o, &lm, lm_msg, sizeof lm_msg);
    if (!bad && lm_bad) bad = lm_bad, snprintf(msg, sizeof msg, "%s", lm_msg);
    probe_spec ps;
    cli_probe_opts(&a, &ps);
    if (ps.attn_layers || ps.logit_lens) o.metrics = 1;  // they exist to add members to the metrics
    const char *max_files = args_str(&a, "--dump-max-files", NULL);
    if (args_finish(&a, 0)) return cli_usage_error("serve", "%s", a.err);
    if (!so.model_dir) return cli_usage_error("serve", "missing -m DIR (the model directory)");
    if (lora_rc) return cli_usage_error("serve", "%s", lora_msg);
    if (bad) return cli_usage_error("serve", "%s", msg);
    o.tp = so.tp_comm;
    o.model_path = so.model_dir;
    if (check_probe(&ps, &o, max_files, msg, sizeof msg)) return cli_usage_error("serve", "%s", msg);
    if (o.tp && o.tp->rank > 0) return follow(&so, &o);
    // Signals go to sigwait below: block them before any thread (OpenMP, slots,
    // libmicrohttpd) starts, so every thread inherits the mask.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal
    verr err = { { 0 } };
    session s;
    if (session_open(&s, &so, &err)) return fail(err.msg);
    server *srv = server_start(&s, &o, &err);
    if (!srv) {
        session_close(&s);
        return fail(err.msg);
    }
    const char *chat = server_chat_format(srv);
    fprintf(stderr, "varent serve: listening on http://%s%s%s:%d/ (%d slot%s, context %d, chat template %s)\n",
            strchr(o.host, ':') ? "[" : "", o.host, strchr(o.host, ':') ? "]" : "", server_port(srv),
            server_n_slots(srv), server_n_slots(srv) > 1 ? "s" : "", s.ctx, chat ? chat : "none: messages joined by newlines");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "varent serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    drain(srv, &set, drain_s);
    server_stop(srv);
    session_close(&s);
    fprintf(stderr, "varent serve: stopped\n");
    return 0;
}
