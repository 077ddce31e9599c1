// common.h: options shared by the commands that load a model and sample from it.
#ifndef VARENT_CLI_COMMON_H
#define VARENT_CLI_COMMON_H

#include "host/cli/args.h"
#include "host/decode/generate.h"

// -m, --ctx, -t/--threads, --device, --batch.
void cli_session_opts(args *a, session_opts *o);
// -n, --temp, --top-k, --top-p, --min-p, --seed with the command's defaults.
void cli_sampling_opts(args *a, gen_opts *g, int def_n, float def_temp, float def_top_p);
// Range checks; 0, or -1 with a message naming the option and its value.
int cli_check_sampling(const gen_opts *g, char *msg, size_t len);

#endif
