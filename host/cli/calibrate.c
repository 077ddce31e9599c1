// calibrate.c: `varent calibrate -m DIR [-f CORPUS] [-o PROFILE.json]`: measure the
// model's entropy, varentropy and attention statistics over a corpus (teacher-forced)
// or over its own generations from built-in prompts, and write an entropix profile
// whose thresholds sit at quantiles of them (host/eval/calibration.h, docs/entropix.md).
// `--profile FILE` loads the result wherever entropix runs.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/cli/args.h"
#include "host/cli/ranks.h"
#include "host/cli/commands.h"
#include "host/cli/common.h"
#include "host/cli/compat.h"
#include "host/cli/interp_opts.h"
#include "host/cli/prompts.h"
#include "host/eval/builtin.h"
#include "host/eval/calibration.h"
#include "host/eval/prompt.h"
#include "host/util/fileio.h"
#include "host/util/outfile.h"
#include "host/util/progress.h"

static const cli_opt calibrate_opts[] = {
    { "-f|--file", "FILE", "corpus", "generations", "text corpus, scored teacher-forced (- reads stdin); default: the "
      "model's own generations from built-in prompts", 0 },
    { "--max-tokens", "N", "corpus", "4096", "corpus positions measured at most (0: all)", 0 },
    { "-n|--max-new", "N", "corpus", "64", "tokens generated per built-in prompt", 0 },
    { "-s|--seed", "S", "corpus", "0", "generation seed", 0 },
    { "--low", "Q", "profile", "0.25", "the quantile of the lower cut points", 0 },
    { "--high", "Q", "profile", "0.75", "the quantile of the upper cut points", 0 },
    { "--name", "NAME", "profile", "calibrated", "the profile's name", 0 },
    { "-o|--out", "FILE", "output", "calibrated.json", "the profile (JSON; --profile FILE loads it)", 0 },
    { "--dump", "FILE", "output", NULL, "every measured token's six metrics as JSONL", 0 },
    { "--force", NULL, "output", NULL, "replace an existing -o or --dump file", 0 },
    { "-q|--quiet", NULL, "output", NULL, "no progress on stderr", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const calibrate_tables[] = { cli_opts_session, cli_opts_llama, cli_opts_kv, cli_opts_tp, calibrate_opts, cli_opts_chat, cli_opts_steer, NULL };
const cli_spec cli_calibrate_spec = {
    "calibrate", "-m DIR [-f CORPUS.txt] [-o PROFILE.json] [options]",
    "An entropix profile whose thresholds sit at quantiles of the model's own metrics.",
    "Measures entropy, varentropy and the attention statistics over a corpus (teacher-forced) or over the model's "
    "generations from built-in prompts (as a chat turn with --chat), and writes a profile file. docs/entropix.md.",
    calibrate_tables, NULL, NULL,
};

static int fail(const char *msg) { return cli_error("calibrate", "%s", msg); }

typedef struct {
    session_opts so;
    const char *corpus, *out, *dump, *name;
    long max_tokens;
    int n_gen, quiet, force;
    uint64_t seed;
    double lo, hi;
    eval_prompter pr;
} calib_args;

// Every option, read in one place.
static void read_args(args *a, calib_args *c) {
    memset(c, 0, sizeof *c);
    cli_session_opts(a, &c->so);
    c->corpus = args_str(a, "-f|--file", NULL);
    c->max_tokens = args_int_range(a, "--max-tokens", 4096, 0, LONG_MAX);
    c->n_gen = (int)args_int_range(a, "-n|--max-new", 64, 1, 1 << 20);
    c->seed = (uint64_t)args_int_range(a, "-s|--seed", 0, 0, LONG_MAX);
    c->lo = args_float_range(a, "--low", 0.25, 1e-9, 1 - 1e-9);
    c->hi = args_float_range(a, "--high", 0.75, 1e-9, 1 - 1e-9);
    c->name = args_str(a, "--name", "calibrated");
    c->out = args_str(a, "-o|--out", "calibrated.json");
    c->dump = args_str(a, "--dump", NULL);
    c->pr.chat = args_flag(a, "--chat");
    c->pr.system = args_str(a, "--system", NULL);
    c->pr.template_name = args_str(a, "--chat-template", NULL);
    c->pr.think = !args_flag(a, "--no-think");
    c->pr.chat |= !c->pr.think || c->pr.system || c->pr.template_name;  // they only mean something in a chat prompt
    c->quiet = args_flag(a, "-q|--quiet");
    c->force = args_flag(a, "--force");
}

// -o and --dump replace an existing file only with --force (host/util/outfile.h's
// refuse_existing), checked before the model loads; a stream or device is written in place.
static outfile_opts calib_out_opts(const calib_args *c, const char *flag) {
    return (outfile_opts){ .refuse_existing = 1, .force = c->force, .flag = flag };
}

static int check_outputs(const calib_args *c, verr *err) {
    outfile_opts o = calib_out_opts(c, "-o"), d = calib_out_opts(c, "--dump");
    if (c->out && outfile_check(c->out, &o, err)) return -1;
    return c->dump ? outfile_check(c->dump, &d, err) : 0;
}

static const char *const PROMPTS[] = {
    "Once upon a time",
    "Write a short story about a lighthouse keeper.",
    "Explain why the sky is blue.",
    "What is the capital of France, and what is it known for?",
    "Give three tips for learning a new language.",
    "Describe how a bicycle works.",
    "Write a haiku about autumn.",
    "What are the benefits of regular exercise?",
    "Summarize the plot of a famous fairy tale.",
    "How do plants make their food?",
    "Write a polite email declining a meeting invitation.",
    "List five animals that live in the ocean.",
    "What is the difference between weather and climate?",
    "Tell me a joke about computers.",
    "Explain what a prime number is, with examples.",
    "Write the opening paragraph of a mystery novel.",
};
#define N_PROMPTS ((int)(sizeof PROMPTS / sizeof *PROMPTS))

// The built-in prompts: the list above and four items of each built-in generation task.
static int builtin_prompts(eval_set *set, uint64_t seed, verr *err) {
    memset(set, 0, sizeof *set);
    for (int i = 0; i < N_PROMPTS; i++) {
        eval_item it = { 0 };
        it.prompt = strdup(PROMPTS[i]), it.task = strdup("prompts"), it.answer = strdup("");
        if (!it.prompt || !it.task || !it.answer || eval_set_add(set, &it, err)) return eval_item_free(&it), -1;
    }
    char all[256];
    snprintf(all, sizeof all, "%s", eval_builtin_all());
    for (char *save = NULL, *t = strtok_r(all, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (eval_builtin(set, t, 4, seed + 1000, err)) return -1;
    return 0;
}

static int measure_generated(calib_args *c, session *s, calib_samples *out, verr *err) {
    eval_set set;
    if (builtin_prompts(&set, c->seed, err)) return eval_set_free(&set), -1;
    int rc = eval_prompter_open(&c->pr, s, &set, err);
    progress pg;
    progress_start(&pg, "calibrate", set.n, c->quiet);
    for (int i = 0; rc == 0 && i < set.n; i++) {
        int *ids = NULL, n = eval_prompt_ids(&c->pr, s, &set.it[i], &ids, err);
        rc = n < 0 ? -1 : calib_generate(s, ids, n, c->n_gen, c->seed + (uint64_t)i, out, err);
        free(ids);
        char detail[64];
        snprintf(detail, sizeof detail, "%ld tokens", out->n);
        progress_update(&pg, i + 1, detail);
    }
    if (rc) progress_stop(&pg);
    else progress_finish(&pg, NULL);
    eval_prompter_close(&c->pr);
    eval_set_free(&set);
    return rc;
}

static int measure_corpus(calib_args *c, session *s, calib_samples *out, verr *err) {
    char *text = cli_read_all(c->corpus, err);
    if (!text) return -1;
    int *ids = NULL, n = session_encode_prompt(s, text, &ids, err);
    free(text);
    if (n < 0) return -1;
    if (n < 3) return free(ids), verr_set(err, "%s: %d tokens; calibration needs at least 3", c->corpus, n);
    long measured = c->max_tokens && c->max_tokens < n - 1L ? c->max_tokens : n - 1L;  // each after the first
    if (!c->quiet) fprintf(stderr, "calibrate: measuring %ld tokens of %s\n", measured, c->corpus);
    int rc = calib_corpus(s, ids, n, c->max_tokens, out, err);
    free(ids);
    return rc;
}

static int write_dump(const calib_args *c, const char *path, const calib_samples *cs, verr *err) {
    outfile o;
    outfile_opts oo = calib_out_opts(c, "--dump");
    if (outfile_open(&o, path, &oo, err)) return -1;
    for (long k = 0; k < cs->n; k++) {
        const token_metrics *m = &cs->m[k];
        fprintf(o.f,
                "{\"entropy\":%.17g,\"varentropy\":%.17g,\"attn_entropy\":%.17g,\"attn_varentropy\":%.17g,"
                "\"agreement\":%.17g,\"interaction_strength\":%.17g}\n",
                m->entropy, m->varentropy, m->attn_entropy, m->attn_varentropy, m->agreement, m->interaction_strength);
    }
    return outfile_commit(&o, err);
}

static int write_outputs(calib_args *c, const calib_samples *cs, verr *err) {
    char source[4200];
    if (c->corpus) snprintf(source, sizeof source, "corpus %s (teacher-forced)", c->corpus);
    else snprintf(source, sizeof source, "generated: %d built-in prompts, %d tokens each at T 1, seed %llu%s",
                  N_PROMPTS + 24, c->n_gen, (unsigned long long)c->seed, c->pr.chat ? ", chat" : "");
    calib_fit fit;
    if (calib_fit_run(cs, c->lo, c->hi, c->name, &fit, err)) return -1;
    outfile o;
    outfile_opts oo = calib_out_opts(c, "-o");
    int rc = outfile_open(&o, c->out, &oo, err);
    if (rc == 0) {
        calib_write_profile(o.f, &fit, cs, c->so.model_dir, source);
        rc = outfile_commit(&o, err);
    }
    if (rc == 0 && c->dump) rc = write_dump(c, c->dump, cs, err);
    if (rc == 0) {
        calib_report_md(stdout, &fit, cs, c->so.model_dir, source);
        printf("\nprofile written to %s (use --profile %s)\n", c->out, c->out);
    }
    calib_fit_free(&fit);
    return rc;
}

int cmd_calibrate(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_calibrate_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    calib_args c;
    read_args(&a, &c);
    if (args_finish(&a, 0)) return cli_usage_error("calibrate", "%s", a.err);
    if (!c.so.model_dir) return cli_usage_error("calibrate", "missing -m DIR (the model directory)");
    if (!(c.lo < c.hi)) return cli_usage_error("calibrate", "--low must be below --high");
    verr err = { { 0 } };
    if (check_outputs(&c, &err)) return fail(err.msg);
    session s;
    if (session_open(&s, &c.so, &err)) return fail(err.msg);
    calib_samples cs = { 0 };
    int rc = c.corpus ? measure_corpus(&c, &s, &cs, &err) : measure_generated(&c, &s, &cs, &err);
    session_close(&s);
    if (rc == 0) rc = write_outputs(&c, &cs, &err);
    calib_samples_free(&cs);
    return rc ? fail(err.msg) : 0;
}
