// common.c: see common.h.
#include "host/cli/common.h"

#include "host/cli/interp_opts.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

// CLI state: the command's load bar while one is drawn, else a bar per stage.
static progress *load_pg;
static int load_quiet;  // inside a -q command's load: draw nothing
static progress own_pg;
static int own_running;

static void on_model_stage(void *ud, const char *stage, long done, long total) {
    if (load_quiet) return;
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

void cli_session_opts(args *a, session_opts *o) {
    o->model_dir = args_str(a, "-m|--model", NULL);
    o->progress = &model_progress;
    o->ctx = (int)args_int_range(a, "--ctx", 0, 0, INT_MAX);
    o->threads = (int)args_int_range(a, "-t|--threads", 0, 0, 4096);
    o->device = args_str(a, "--device", "cpu");
    o->max_batch = (int)args_int_range(a, "--batch", 0, 0, INT_MAX);
    cli_steer_opts(a, &o->steer);
}

void cli_sampling_opts(args *a, gen_opts *g, int def_n, float def_temp, float def_top_p) {
    g->max_new = (int)args_int(a, "-n|--max-tokens", def_n);
    g->sp.temperature = (float)args_float(a, "--temp|--temperature", def_temp);
    g->sp.top_k = (int)args_int(a, "--top-k", 0);
    g->sp.top_p = (float)args_float(a, "--top-p", def_top_p);
    g->sp.min_p = (float)args_float(a, "--min-p", 0.0);
    g->seed = (uint64_t)args_int(a, "--seed", (long)time(NULL));
}

int cli_check_sampling(const gen_opts *g, char *msg, size_t len) {
    const sampler_params *p = &g->sp;
    if (!(p->temperature >= 0)) return snprintf(msg, len, "--temp %g: must be >= 0", p->temperature), -1;
    if (p->top_k < 0) return snprintf(msg, len, "--top-k %d: must be >= 0 (0 = off)", p->top_k), -1;
    if (!(p->top_p > 0 && p->top_p <= 1)) return snprintf(msg, len, "--top-p %g: must be in (0, 1]", p->top_p), -1;
    if (!(p->min_p >= 0 && p->min_p < 1)) return snprintf(msg, len, "--min-p %g: must be in [0, 1)", p->min_p), -1;
    if (g->max_new < 0) return snprintf(msg, len, "-n %d: must be >= 0", g->max_new), -1;
    return 0;
}

int cli_logit_bias(args *a, gen_opts *g, logit_bias *buf, int cap, char *msg, size_t len) {
    int n = 0;
    for (const char *v; (v = args_str(a, "-l|--logit-bias", NULL));) {  // each call takes the next one
        verr err;
        if (n == cap) return snprintf(msg, len, "--logit-bias: more than %d biases", cap), -1;
        if (logit_bias_parse(v, &buf[n], &err)) return snprintf(msg, len, "%s", err.msg), -1;
        n++;
    }
    g->bias = buf, g->n_bias = n;
    return 0;
}

int cli_lora_opts(args *a, session_opts *o, session_lora *buf, int cap, char *msg, size_t len) {
    int n = 0;
    for (const char *d; (d = args_str(a, "--lora", NULL));) {
        if (n == cap) return snprintf(msg, len, "--lora: more than %d adapters", cap), -1;
        buf[n++] = (session_lora){ d, 1.0f };
    }
    const char *scale;
    for (const char *d; (d = args_str2(a, "--lora-scaled", &scale));) {
        char *end;
        double v = strtod(scale, &end);
        if (end == scale || *end || !isfinite(v))
            return snprintf(msg, len, "--lora-scaled %s %s: the scale must be a number", d, scale), -1;
        if (n == cap) return snprintf(msg, len, "--lora: more than %d adapters", cap), -1;
        buf[n++] = (session_lora){ d, (float)v };
    }
    o->lora = buf, o->n_lora = n;
    return 0;
}
