// entropix_opts.h: the sampler options `varent run` shares with other commands:
//   --sampler standard|entropix  --profile NAME  --sampler-config FILE.json
//   --set KEY=VALUE (repeatable)  --attn-layer N  --clarifier-token ID
//   --branch K:B
// and the per-token metrics log of --metrics-out (each command has that option itself;
// one JSON object per line, flushed per line).
#ifndef VARENT_ENTROPIX_CLI_H
#define VARENT_ENTROPIX_CLI_H

#include <stdio.h>

#include "host/cli/args.h"
#include "host/decode/generate.h"
#include "host/runtime/probe.h"
#include "host/util/outfile.h"

typedef struct {
    entropix_config ex;
    const char *metrics_path, *sampler_name;  // metrics_path: set by the command after entropix_cli_read
    int clarifier;   // -1: from the tokenizer
    outfile out;     // --metrics-out (records; host/util/outfile.h)
    FILE *log;       // out.f while open, else NULL
    const session *s;
    probe *probe;    // per-token attention statistics and logit lens for the log; NULL: none
    uint64_t seed;   // written in every record
    char tag[512];   // JSON members written first in every record, each with a trailing
                     // comma ("\"turn\":2,"); "" (the default): none
} entropix_cli;

// The table of these options.
extern const cli_opt cli_opts_entropix[];
// Reads the options into c and g (call before args_finish). -1 with err on a bad value.
int entropix_cli_read(args *a, gen_opts *g, entropix_cli *c, verr *err);
// Checks the metrics path without opening it (before the model loads, so that a bad
// path fails early), then opens it (once the model and the prompt are good, so that a
// FIFO is opened only for a run that can write to it). An existing regular file is an
// error unless force (then it is replaced when the run finishes).
int entropix_cli_check(const entropix_cli *c, int force, verr *err);
int entropix_cli_open(entropix_cli *c, int force, verr *err);
// After the session opens: the clarifier token and the metrics callback.
int entropix_cli_start(entropix_cli *c, const session *s, gen_opts *g, verr *err);
// --stats: tokens per quadrant and the mean entropy, on stderr.
void entropix_cli_report(const entropix_cli *c, const gen_stats *st);
// Closes the metrics file as the run ended (host/util/outfile.h: OUTFILE_DONE commits it,
// OUTFILE_PARTIAL keeps the finished records without replacing an existing file,
// OUTFILE_DROP removes only what this run created); -1 with err when that fails.
int entropix_cli_close(entropix_cli *c, outfile_end how, verr *err);
// gen_opts.on_record writing one JSONL line; ud is the entropix_cli.
int entropix_cli_record(void *ud, const gen_record *r);

#endif
