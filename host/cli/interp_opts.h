// interp_opts.h: the command-line options of experiments on weights (docs/research.md).
// Interventions, read by every command that loads a model (cli_session_opts):
//   --control-vector FILE   --control-vector-scaled FILE S   (repeatable; they sum)
//   --control-vector-layer-range A B   --ablate-head L:H   --skip-layer L   (repeatable)
// Captures, read by run, logits, chat, ppl, compare, eval, agents and serve (cli_probe_opts):
//   --dump-acts FILE.safetensors --dump-layers LIST|all --dump-points P,P,...
//   --attn-layers LIST|all   --dump-attn FILE.safetensors   --logit-lens
// Errors are recorded in the args (args_finish reports them), naming the flag.
#ifndef VARENT_INTERP_OPTS_H
#define VARENT_INTERP_OPTS_H

#include "host/cli/args.h"
#include "host/runtime/probe.h"
#include "host/runtime/steer.h"

// Their tables (host/cli/args.h): every command that calls cli_session_opts lists
// cli_opts_steer; the commands that capture list cli_opts_probe.
extern const cli_opt cli_opts_steer[], cli_opts_probe[];

void cli_steer_opts(args *a, steer_spec *sp);
void cli_probe_opts(args *a, probe_spec *p);
// The captures with the command's other options: --attn-layers and --logit-lens need the
// per-token log (log_flag names it, has_log: given), --branch (branch) decodes outside
// the captured sequence. 0, or -1 with msg.
int cli_probe_check(const probe_spec *p, const char *log_flag, int has_log, int branch, char *msg, size_t n);

// A name as part of a file name: characters other than letters, digits, '-' and '_' become
// '_' ("entropix:jax" -> "entropix_jax").
void cli_probe_name(const char *name, char *out, size_t n);
// path with ".TAG" before its extension (the last '.' of the file name), or after it: the
// capture file of one of a command's runs (acts.safetensors -> acts.p0.greedy.safetensors).
int cli_probe_path(const char *path, const char *tag, char *out, size_t n, verr *err);

#endif
