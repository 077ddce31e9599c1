// common.h: options shared by the commands that load a model and sample from it, their
// tables (host/cli/args.h), and reading a prompt from -p, -f or stdin.
#ifndef VARENT_CLI_COMMON_H
#define VARENT_CLI_COMMON_H

#include "host/cli/args.h"
#include "host/decode/generate.h"
#include "host/util/outfile.h"
#include "host/util/progress.h"
#include "model/forward_cuda.h"

// -m, -c/--ctx, -t/--threads, --device, -b/--batch.
extern const cli_opt cli_opts_session[];
// --kv-type f32|bf16 (read by cli_session_opts; cli_kv_bf16 for the commands with
// tables of their own).
extern const cli_opt cli_opts_kv[];
int cli_kv_bf16(args *a);
// --decode-kernel graph|persistent|auto (read by cli_session_opts; this for bench's own
// table): 0, 1 or 2 (cuda_forward_set_decode_kernel's); another value is a usage error.
int cli_decode_persistent(args *a);
// What --decode-kernel auto chose and why, as a line for --stats and bench, into buf;
// 0 (buf untouched) when auto was not asked for.
int cli_tune_line(const cuda_step_counts *c, char *buf, size_t n);
// --decode-kernel persistent (decode_persistent 1): the steps it ran, its ring and staged
// inputs, and the steps that took the graph path with the last reason; 0 otherwise.
int cli_persist_line(int decode_persistent, const cuda_step_counts *c, char *buf, size_t n);
// --lookahead N (0..CUDA_LOOP_DEPTH, default CUDA_LOOP_DEPTH): session_opts.lookahead.
int cli_lookahead(args *a);
// --tp, --tp-timeout, --devices: tensor parallelism under mpirun or over the GPUs of one
// process (host/cli/ranks.h), read by cli_session_opts.
extern const cli_opt cli_opts_tp[];
extern const cli_opt cli_opts_tp_replicas[];  // cli_opts_tp without --devices (agents: theirs)
// --temp, --top-k, --top-p, --min-p, -s/--seed: the one set of defaults (host/decode/defaults.h).
extern const cli_opt cli_opts_sampling[];

// --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty,
// --no-repeat-ngram (host/runtime/sampler.h), read by cli_penalty_opts.
extern const cli_opt cli_opts_penalties[];
void cli_penalty_opts(args *a, sampler_penalties *p);

// --parallel, --kv-pool-mb, --kv-pool-tokens, --no-prefix-cache: the scheduler of batch runs, compare and
// eval (host/decode/sched.h), read by cli_sched_opts.
struct sched;
extern const cli_opt cli_opts_sched[];
typedef struct {
    int parallel;
    long pool_mb, pool_tokens;
    int no_reuse;
} cli_sched;
void cli_sched_opts(args *a, cli_sched *o);
// A scheduler on s with o (NULL when s is tensor-parallel: the caller runs items one by
// one), 0, or -1 with err.
int cli_sched_open(struct sched **q, session *s, const cli_sched *o, const volatile sig_atomic_t *interrupt, verr *err);

// -p/--prompt, -f/--file, --ids (cli_prompt_text reads the first two).
extern const cli_opt cli_opts_prompt[];

// -m, -c/--ctx, -t/--threads, --device, -b/--batch, and the interventions of
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
// A long prompt's prefill on the terminal: a "prefill" bar on stderr, chunk by chunk
// (gen_opts.on_prefill), when stderr is a terminal; cli_prefill_done clears it before
// the text.
typedef struct {
    progress pg;
    int shown;
} cli_prefill;
void cli_prefill_watch(cli_prefill *p, gen_opts *g);
void cli_prefill_done(cli_prefill *p);
// The sampling options into g (the seed: --seed, or random when absent or -1).
void cli_sampling_opts(args *a, gen_opts *g);
// -s/--seed: the seed given, or a random one from the OS for -1 or none.
uint64_t cli_seed(args *a);
// 1 when -s/--seed N (not -1) is on the command line.
int cli_seed_given(args *a);
// The CPUs this process may run on (the most -t accepts).
int cli_cpu_count(void);

// -l/--logit-bias ID(+|-)BIAS (repeatable): their table and the reader, into buf[cap]
// (g->bias, g->n_bias point there). 0, or -1 with a message naming the bad value. Ids
// are checked against the vocab by generate().
#define CLI_MAX_BIAS 1024
extern const cli_opt cli_opts_logit_bias[];
int cli_logit_bias(args *a, gen_opts *g, logit_bias *buf, int cap, char *msg, size_t len);
// --lora DIR and --lora-scaled DIR SCALE (repeatable): their table and the reader, into
// buf[cap] (o->lora, o->n_lora point there). 0, or -1 with a message naming the bad value.
#define CLI_MAX_LORA 16
extern const cli_opt cli_opts_lora[];
int cli_lora_opts(args *a, session_opts *o, session_lora *buf, int cap, char *msg, size_t len);

// The prompt text: -p TEXT, "-p -" (stdin), -f FILE, or, when other_source is 0 and
// stdin is not a terminal, stdin. One trailing newline of stdin or a file is dropped.
// *text is NULL when there is none; *owned is what to free. 0, or -1 with err.
int cli_prompt_text(const char *p, const char *file, int other_source, const char **text, char **owned, verr *err);

// How a command's output files end for its exit status (host/util/outfile.h): 0 finished
// them, INTERRUPT_EXIT (Ctrl-C) keeps what was finished without replacing an existing
// file, anything else drops them.
outfile_end cli_outfile_end(int rc);

#endif
