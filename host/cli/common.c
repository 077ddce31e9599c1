// common.c: see common.h.
#include "host/cli/common.h"

#include <limits.h>
#include <stdio.h>
#include <time.h>

void cli_session_opts(args *a, session_opts *o) {
    o->model_dir = args_str(a, "-m|--model", NULL);
    o->ctx = (int)args_int_range(a, "--ctx", 0, 0, INT_MAX);
    o->threads = (int)args_int_range(a, "-t|--threads", 0, 0, 4096);
    o->device = args_str(a, "--device", "cpu");
    o->max_batch = (int)args_int_range(a, "--batch", 0, 0, INT_MAX);
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
