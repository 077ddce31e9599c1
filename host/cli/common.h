// common.h: options shared by the commands that load a model and sample from it.
#ifndef VARENT_CLI_COMMON_H
#define VARENT_CLI_COMMON_H

#include "host/cli/args.h"
#include "host/decode/generate.h"
#include "host/util/progress.h"

// -m, --ctx, -t/--threads, --device, --batch, and the interventions of
// host/cli/interp_opts.h (control vectors, --ablate-head, --skip-layer); a GGUF's first
// use reports its progress (cli_model_progress).
void cli_session_opts(args *a, session_opts *o);
// The progress of resolving -m (hashing and converting a GGUF on its first use): drawn
// as stages of the command's "load" bar between cli_load_begin and cli_load_end, else
// as bars of their own.
const model_path_progress *cli_model_progress(void);
void cli_load_begin(progress *pg, int quiet);
// ok: "load: done" (else the bar is cleared silently, an error follows).
void cli_load_end(progress *pg, int ok);
// -n, --temp, --top-k, --top-p, --min-p, --seed with the command's defaults.
void cli_sampling_opts(args *a, gen_opts *g, int def_n, float def_temp, float def_top_p);
// -l/--logit-bias ID(+|-)BIAS, repeatable, into buf[cap] (g->bias, g->n_bias point there).
// 0, or -1 with a message naming the bad value. Ids are checked against the vocab by generate().
#define CLI_MAX_BIAS 1024
int cli_logit_bias(args *a, gen_opts *g, logit_bias *buf, int cap, char *msg, size_t len);
// --lora DIR and --lora-scaled DIR SCALE, repeatable, into buf[cap] (o->lora, o->n_lora
// point there). 0, or -1 with a message naming the bad value.
#define CLI_MAX_LORA 16
int cli_lora_opts(args *a, session_opts *o, session_lora *buf, int cap, char *msg, size_t len);
// Range checks; 0, or -1 with a message naming the option and its value.
int cli_check_sampling(const gen_opts *g, char *msg, size_t len);

#endif
