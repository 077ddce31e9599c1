// common.c: see common.h.
#define _GNU_SOURCE
#include "host/cli/common.h"
#include "host/util/interrupt.h"
#include "host/util/seed.h"

#include "host/cli/compat.h"
#include "host/cli/interp_opts.h"
#include "host/cli/ranks.h"
#include "kernels/ops.h"
#include "model/forward_cuda.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/decode/defaults.h"
#include "host/decode/sched.h"
#include "host/util/fileio.h"

const cli_opt cli_opts_session[] = {
    { "-m|--model", "DIR", "model", NULL, "model directory (config.json, *.safetensors, tokenizer.json) or .gguf file", 0 },
    { "-c|--ctx|--ctx-size", "N", "model", "the model's, at most 4096", "context length in tokens", 0 },
    { "--device", "DEV", "performance", "cpu", "cpu or cuda[:N]", 0 },
    { "-t|--threads", "N", "performance", "every CPU", "CPU threads (at most the CPUs this process may use)", 0 },
    { "-b|--batch|--batch-size", "N", "performance", "256", "prompt tokens per forward pass (prefill chunk)", 0 },
    { "--decode-kernel", "graph|persistent|auto", "performance", "graph", "CUDA: decode steps as a graph of kernels, "
      "as one persistent kernel a token (docs/cuda.md; steps it does not support take the graph path), or auto: the "
      "first steps time both on the device and the rest take the faster (the same tokens either way)", 0 },
    { "--lookahead", "N", "performance", "8", "CUDA: generate()'s decode steps queued ahead on the device, tokens "
      "read a few steps behind (docs/cuda.md \"The device decode loop\"; 0: one host round trip per token; at most 8)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

const cli_opt cli_opts_kv[] = {
    { "--kv-type", "f32|bf16", "performance", "f32", "the CPU's KV cache elements: bf16 halves the bytes attention "
      "reads at depth (the GPU's cache is bf16)", 0 },
    { "--gemm-inputs", "f32|bf16", "performance", "f32", "the CPU GEMM's activations (prefill, batches) with bf16 "
      "weights: bf16 rounds them as llama.cpp does, for vdpbf16ps (faster; the logits move, docs/benchmarks.md)", 0 },
    { "--no-mmap", NULL, "performance", "on", "CPU: a copy of the weights in 2 MiB huge pages (llama.cpp's name)", 0 },
    { "--mmap", NULL, "performance", NULL, "CPU: read the weights from the file mapping instead of a copy in 2 MiB "
      "huge pages (less memory, slower decode: docs/benchmarks.md)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

const cli_opt cli_opts_sched[] = {
    { "--parallel", "N", "performance", "what fits", "sequences decoded together, one forward for all of them per "
      "token (docs/server.md, The scheduler); 1: one after another. The output is the same", 0 },
    { "--kv-pool-mb", "MB", "performance", "1024", "the paged KV cache the sequences share, in device memory "
      "on CUDA (a full pool queues the next sequence)", 0 },
    { "--kv-pool-tokens", "N", "performance", NULL, "the same pool given in positions instead", 0 },
    { "--no-prefix-cache", NULL, "performance", NULL, "prefill every prompt in full (no reuse of equal prompts or "
      "their whole --batch chunks)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

void cli_sched_opts(args *a, cli_sched *o) {
    o->parallel = (int)args_int_range(a, "--parallel", 0, 0, 256);
    o->pool_mb = args_int_range(a, "--kv-pool-mb", 0, 1, 1L << 24);
    o->pool_tokens = args_int_range(a, "--kv-pool-tokens", 0, 1, 1L << 30);
    o->no_reuse = args_flag(a, "--no-prefix-cache");
    // refused here, before the model loads (cli_sched_open checks again for library callers)
    if (o->pool_mb && o->pool_tokens) args_bad(a, "give the KV pool's size with --kv-pool-mb or --kv-pool-tokens, not both");
}

int cli_sched_open(sched **q, session *s, const cli_sched *o, const volatile sig_atomic_t *interrupt, verr *err) {
    *q = NULL;
    if (o->pool_mb && o->pool_tokens) return verr_set(err, "give the KV pool's size with --kv-pool-mb or --kv-pool-tokens, not both");
    if (s->m.tp.size > 1 || s->tpl) return 0;  // tensor parallelism: one by one
    sched_opts so = { .parallel = o->parallel, .pool_mb = o->pool_mb, .pool_tokens = o->pool_tokens,
                      .no_reuse = o->no_reuse, .interrupt = interrupt };
    return sched_open(q, s, &so, err);
}

#define OPT_TP { "--tp", "N", "performance", "the MPI ranks", "tensor parallelism: the model split over N ranks of an " \
                "MPI launch (mpirun -np N; docs/distributed.md), or over N GPUs in one process", 0 }
#define OPT_TP_TIMEOUT { "--tp-timeout", "S", "performance", "300", "seconds a rank waits for the others (MPI start-up, " \
                         "a collective) before it stops the launch (0: forever)", 0 }
const cli_opt cli_opts_tp[] = {
    OPT_TP,
    OPT_TP_TIMEOUT,
    { "--devices", "LIST", "performance", "0,1,... (--tp of them)", "with --tp N in one process: the N GPUs, one "
      "rank each (docs/distributed.md)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

// The agents' own --devices lists their replicas.
const cli_opt cli_opts_tp_replicas[] = {
    OPT_TP,
    OPT_TP_TIMEOUT,
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

const cli_opt cli_opts_sampling[] = {
    { "--temp|--temperature", "T", "sampling", GEN_STR(GEN_DEFAULT_TEMP), "temperature; 0 is greedy", 0 },
    { "--top-k", "K", "sampling", GEN_STR(GEN_DEFAULT_TOP_K), "keep the K most likely tokens (0: off)", 0 },
    { "--top-p", "P", "sampling", GEN_STR(GEN_DEFAULT_TOP_P), "nucleus: the smallest set holding P of the mass (1: off)", 0 },
    { "--min-p", "P", "sampling", GEN_STR(GEN_DEFAULT_MIN_P), "drop tokens below P times the top probability (0: off)", 0 },
    { "-s|--seed", "N", "sampling", "random", "sampling seed; -1: random (from the OS)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

const cli_opt cli_opts_penalties[] = {
    { "--repeat-penalty", "R", "sampling", "1", "divide the positive logits of the ids in the window by R, multiply the "
      "negative ones (1: off)", 0 },
    { "--presence-penalty", "P", "sampling", "0", "OpenAI's: take P off the logit of every id in the window (-2..2)", 0 },
    { "--frequency-penalty", "F", "sampling", "0", "OpenAI's: take F times its count in the window off each id's logit "
      "(-2..2)", 0 },
    { "--repeat-last-n", "N", "sampling", "-1", "the window of those penalties: the last N ids, prompt included (-1: "
      "all of them; 0: off)", 0 },
    { "--no-repeat-ngram", "N", "sampling", "0", "never repeat an n-gram of this length (0: off)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

void cli_penalty_opts(args *a, sampler_penalties *p) {
    p->repeat = (float)args_float_range(a, "--repeat-penalty", 1.0, 1e-6, 1e6);
    p->presence = (float)args_float_range(a, "--presence-penalty", 0, -2, 2);
    p->frequency = (float)args_float_range(a, "--frequency-penalty", 0, -2, 2);
    p->last_n = (int)args_int_range(a, "--repeat-last-n", -1, -1, INT_MAX);
    p->no_repeat_ngram = (int)args_int_range(a, "--no-repeat-ngram", 0, 0, 1 << 20);
}

const cli_opt cli_opts_prompt[] = {
    { "-p|--prompt", "TEXT", "prompt", NULL, "the prompt; - reads it from stdin (piped stdin is read without -p too)", 0 },
    { "-f|--file", "FILE", "prompt", NULL, "read the prompt from FILE (one trailing newline dropped)", 0 },
    { "--ids", "LIST", "prompt", NULL, "the prompt as token ids, e.g. 1,2,3", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

int cli_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static uint64_t seed_of(args *a);

// CLI state: the command's load bar while one is drawn, else a bar per stage.
static progress *load_pg;
static int load_quiet;  // inside a -q command's load: draw nothing
static progress own_pg;
static int own_running;

static void on_model_stage(void *ud, const char *stage, long done, long total) {
    if (load_quiet) return;
    if (!stage) {  // resolution is over: a stage cut short by an error ends too
        if (load_pg && strcmp(load_pg->label, "load") != 0) progress_relabel(load_pg, "load", 1);
        if (own_running) progress_stop(&own_pg), own_running = 0;
        return;
    }
    if (load_pg) {
        if (strcmp(load_pg->label, stage) != 0) progress_relabel(load_pg, stage, total);
        progress_update(load_pg, done, NULL);
        if (done >= total) progress_relabel(load_pg, "load", 1);
        return;
    }
    if (own_running && strcmp(own_pg.label, stage) != 0) progress_finish(&own_pg, NULL), own_running = 0;
    if (!own_running) progress_start(&own_pg, stage, total, 0), own_running = 1;
    progress_update(&own_pg, done, NULL);
    if (done >= total) progress_finish(&own_pg, NULL), own_running = 0;
}

static const model_path_progress model_progress = { on_model_stage, NULL };

const model_path_progress *cli_model_progress(void) { return &model_progress; }

void cli_load_begin(progress *pg, int quiet) {
    progress_start(pg, "load", 1, quiet);
    load_pg = quiet ? NULL : pg;
    load_quiet = quiet;
}

void cli_load_end(progress *pg, int ok) {
    load_pg = NULL;
    load_quiet = 0;
    if (ok) progress_finish(pg, NULL);
    else progress_stop(pg);
}

void cli_prefill_done(cli_prefill *p) {
    if (p->shown) progress_stop(&p->pg);
    p->shown = 0;
}

// The bar goes when the prefill is over: the text follows on the same terminal.
static void on_prefill(void *ud, int done, int total) {
    cli_prefill *p = ud;
    if (done >= total) return cli_prefill_done(p);
    if (!p->shown) progress_start(&p->pg, "prefill", total, 0), p->shown = 1;
    progress_update(&p->pg, done, "prompt tokens");
}

void cli_prefill_watch(cli_prefill *p, gen_opts *g) {
    p->shown = 0;
    if (isatty(2)) g->on_prefill = on_prefill, g->prefill_ud = p;
}

int cli_kv_bf16(args *a) {
    const char *kv = args_str(a, "--kv-type", "f32"), *gi = args_str(a, "--gemm-inputs", NULL);
    if (strcmp(kv, "bf16") != 0 && strcmp(kv, "f32") != 0) args_bad(a, "--kv-type %s: f32 or bf16", kv);
    if (gi && strcmp(gi, "bf16") != 0 && strcmp(gi, "f32") != 0) args_bad(a, "--gemm-inputs %s: f32 or bf16", gi);
    if (gi) cpu_set_gemm_bf16_inputs(!strcmp(gi, "bf16"));  // the process's CPU GEMM (else VARENT_CPU_GEMM)
    return !strcmp(kv, "bf16");
}

int cli_decode_persistent(args *a) {
    const char *dk = args_str(a, "--decode-kernel", "graph");
    if (!strcmp(dk, "graph")) return 0;
    if (!strcmp(dk, "persistent")) return 1;
    if (!strcmp(dk, "auto")) return 2;
    args_bad(a, "--decode-kernel %s: graph, persistent or auto", dk);
    return 0;
}

int cli_tune_line(const cuda_step_counts *c, char *buf, size_t n) {
    if (c->tune == 0) return 0;
    const char *pick = c->tune_pick ? "the persistent kernel" : "the graph path";
    int k = 0;
    if (c->tune == 1)
        k = snprintf(buf, n, "decode kernel: auto, no choice yet (it times the first %d one-row decode steps; "
                     "batched steps take the graph path)", 2 + 2 * CUDA_TUNE_TIMED);
    else if (c->tune_why)
        k = snprintf(buf, n, "decode kernel: auto, chose %s untimed: %s", pick, c->tune_why);
    else
        k = snprintf(buf, n, "decode kernel: auto, chose %s (median step %.3f ms on the graph path, %.3f ms on the "
                     "persistent kernel, %d timed steps each)", pick, c->tune_ms[0], c->tune_ms[1], CUDA_TUNE_TIMED);
    if (k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "; %ld steps ran persistent, %ld fell back", c->persist_steps,
                 c->persist_fallbacks);
    return 1;
}

int cli_persist_line(int decode_persistent, const cuda_step_counts *c, char *buf, size_t n) {
    if (decode_persistent != 1) return 0;
    snprintf(buf, n, "decode kernel: persistent, %ld steps (weight ring %d KiB a block, inputs staged up to %d floats); "
             "%ld on the graph path instead%s%s%s", c->persist_steps, c->persist_ring / 1024, c->persist_stage,
             c->persist_fallbacks, c->fallback_why ? " (last: " : "", c->fallback_why ? c->fallback_why : "",
             c->fallback_why ? ")" : "");
    return 1;
}

int cli_lookahead(args *a) { return (int)args_int_range(a, "--lookahead", CUDA_LOOP_DEPTH, 0, CUDA_LOOP_DEPTH); }

void cli_session_opts(args *a, session_opts *o) {
    o->model_dir = args_str(a, "-m", NULL);
    o->progress = &model_progress;
    o->ctx = (int)args_int_range(a, "-c", 0, 1, INT_MAX);
    o->threads = (int)args_int_range(a, "-t", 0, 1, cli_cpu_count());
    o->device = cli_device(a);
    o->max_batch = (int)args_int_range(a, "-b", 0, 1, INT_MAX);
    o->kv_bf16 = cli_kv_bf16(a);
    o->weights_mmap = args_bool(a, "--mmap", "--no-mmap", 0);
    o->decode_persistent = cli_decode_persistent(a);
    o->lookahead = cli_lookahead(a);
    cli_steer_opts(a, &o->steer);
    cli_ranks_session(a, o);
}

// Every rank of an MPI launch draws with rank 0's seed (a random one differs per rank).
uint64_t cli_seed(args *a) { return cli_ranks_same(seed_of(a)); }

int cli_seed_given(args *a) {
    const char *s = args_peek(a, "-s");
    return s && strcmp(s, "-1") != 0;
}

static uint64_t seed_of(args *a) {
    const char *s = args_str(a, "-s", NULL);
    if (s && strcmp(s, "-1") != 0) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (s[0] >= '0' && s[0] <= '9' && !*end && !errno) return (uint64_t)v;
        if (!a->err[0])
            snprintf(a->err, sizeof a->err, "%s '%.100s': not a seed (0..18446744073709551615, or -1 for random)",
                     args_typed(a, "-s"), s);
        return 0;
    }
    return seed_from_os();
}

// A probability option: in (0, 1] (top-p) or [0, 1) (min-p); -1 when it is not.
static double prob(args *a, const char *name, double def, int open_low) {
    double v = args_float(a, name, def);
    if (open_low ? v > 0 && v <= 1 : v >= 0 && v < 1) return v;
    args_bad(a, "%s %g: must be in %s", args_typed(a, name), v, open_low ? "(0, 1]" : "[0, 1)");
    return def;
}

void cli_sampling_opts(args *a, gen_opts *g) {
    g->sp.temperature = (float)args_float_range(a, "--temp", GEN_DEFAULT_TEMP, 0, HUGE_VAL);
    g->sp.top_k = (int)args_int_range(a, "--top-k", GEN_DEFAULT_TOP_K, 0, INT_MAX);
    g->sp.top_p = (float)prob(a, "--top-p", GEN_DEFAULT_TOP_P, 1);
    g->sp.min_p = (float)prob(a, "--min-p", GEN_DEFAULT_MIN_P, 0);
    g->seed = cli_seed(a);
}

static char *read_stream(FILE *f, const char *what, verr *err) {
    size_t n;
    char *b = fileio_read_stream(f, what, &n, err);
    if (b && strlen(b) != n) {
        free(b);
        verr_set(err, "%s holds a NUL byte: a prompt is text", what);
        return NULL;
    }
    return b;
}

static char *read_stdin(const char *what, verr *err) { return read_stream(stdin, what, err); }

// -f FILE: a regular file (or - for stdin), text without NUL bytes.
static char *read_prompt_file(const char *path, verr *err) {
    if (!strcmp(path, "-")) return cli_read_all(path, err);
    FILE *f = fileio_fopen_input(path, err);
    if (!f) return NULL;
    char *s = read_stream(f, path, err);
    fclose(f);
    return s;
}

static void drop_newline(char *s) {
    size_t n = strlen(s);
    if (n && s[n - 1] == '\n') s[--n] = 0;
    if (n && s[n - 1] == '\r') s[--n] = 0;
}

int cli_prompt_text(const char *p, const char *file, int other_source, const char **text, char **owned, verr *err) {
    *text = NULL, *owned = NULL;
    if (p && file) return verr_set(err, "give the prompt either with -p or with -f, not both");
    if ((p || file) && other_source) return verr_set(err, "give one prompt source: -p/-f or --ids or a prompts file");
    if (p && !p[0]) return verr_set(err, "-p: the prompt is empty (leave -p out to start from BOS)");
    if (p && strcmp(p, "-") != 0) {
        *text = p;
        return 0;
    }
    char *s = NULL;
    if (file) {
        s = read_prompt_file(file, err);
        if (s && strlen(s) == 0) {
            free(s);
            return verr_set(err, "-f %s: the file is empty", file);
        }
    } else if (p || (!other_source && !isatty(0))) {
        s = cli_ranks_read(read_stdin, "stdin", err);  // under mpirun stdin reaches rank 0 alone
        if (s && !s[0] && p) {
            free(s);
            return verr_set(err, "-p -: stdin is empty");
        }
    } else {
        return 0;
    }
    if (!s) return -1;
    drop_newline(s);
    *owned = s;
    *text = s[0] ? s : NULL;  // piped but empty: no prompt, as without stdin
    return 0;
}

const cli_opt cli_opts_logit_bias[] = {
    { "-l|--logit-bias", "ID(+|-)BIAS", "sampling", NULL, "add BIAS to token ID's logit, before truncation (e.g. 15043+1, "
      "2-inf)", ARG_REPEAT },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

int cli_logit_bias(args *a, gen_opts *g, logit_bias *buf, int cap, char *msg, size_t len) {
    int n = 0, rc = 0;
    for (const char *v; (v = args_each(a, "-l"));) {  // all of them are read, even after a bad one
        verr err;
        if (rc) continue;
        if (n == cap) rc = -1, snprintf(msg, len, "--logit-bias: more than %d biases", cap);
        else if (logit_bias_parse(v, &buf[n], &err)) rc = -1, snprintf(msg, len, "%s", err.msg);
        else n++;
    }
    g->bias = buf, g->n_bias = n;
    return rc;
}

const cli_opt cli_opts_lora[] = {
    { "--lora", "DIR", "model", NULL, "apply a PEFT LoRA adapter, unmerged (docs/research.md)", ARG_REPEAT },
    { "--lora-scaled", "DIR SCALE", "model", NULL, "the same, its update times SCALE", ARG_REPEAT },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

int cli_lora_opts(args *a, session_opts *o, session_lora *buf, int cap, char *msg, size_t len) {
    int n = 0, rc = 0;
    for (const char *d; (d = args_each(a, "--lora"));) {
        if (!rc && n == cap) rc = -1, snprintf(msg, len, "--lora: more than %d adapters", cap);
        if (!rc) buf[n++] = (session_lora){ d, 1.0f };
    }
    const char *d, *scale;
    while (args_each_pair(a, "--lora-scaled", &d, &scale)) {
        char *end;
        double v = strtod(scale, &end);
        if (!rc && (end == scale || *end || !(fabs(v) <= 1e30)))  // (float)v needs a float's range
            rc = -1, snprintf(msg, len, "--lora-scaled %s %s: the scale must be a number in -1e30..1e30", d, scale);
        if (!rc && n == cap) rc = -1, snprintf(msg, len, "--lora: more than %d adapters", cap);
        if (!rc) buf[n++] = (session_lora){ d, (float)v };
    }
    o->lora = buf, o->n_lora = n;
    return rc;
}

outfile_end cli_outfile_end(int rc) {
    return rc == 0 ? OUTFILE_DONE : rc == INTERRUPT_EXIT ? OUTFILE_PARTIAL : OUTFILE_DROP;
}
