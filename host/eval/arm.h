// arm.h: the arms of an evaluation, each a way of decoding, and running one item's
// prompt under one arm. Arms (the --samplers list):
//   greedy                 argmax
//   standard               stock sampling (the runner's T, top-k, top-p, min-p)
//   entropix[:PROFILE]     the entropix sampler; PROFILE a stock name or a profile file
//   branch[:PROFILE]       entropix with LEHV branching (K:B from the runner options)
//   agents                 parallel entropy-minimised agents with the critic
//                          (host/agents/loop.h; the agent list and critic settings from
//                          the runner options)
// Every arm sees the same prompt ids and seed; all of them measure the entropy and
// varentropy of the raw logits at each kept token (agents: of the step's shared logits).
#ifndef VARENT_EVAL_ARM_H
#define VARENT_EVAL_ARM_H

#include <stdint.h>

#include "host/agents/loop.h"
#include "host/decode/entropix.h"
#include "host/decode/generate.h"
#include "host/eval/task.h"

typedef enum { ARM_STANDARD, ARM_ENTROPIX, ARM_AGENTS } eval_arm_kind;

typedef struct {
    char name[160];
    eval_arm_kind kind;
    int greedy;
    int branch;           // entropix with branching
    entropix_config ex;   // entropix: its profile (standard: the seed profile, for the metrics)
} eval_arm;

// What every arm shares.
typedef struct {
    int max_new;
    sampler_params sp;            // standard: temperature, top-k, top-p, min-p
    const char *profile;          // entropix/branch without :PROFILE (default seed)
    int branch_k, branch_b;       // branch arms
    sampler_params agents[AGENTS_MAX];
    int n_agents;
    int check_every, rollback;    // the agents' critic (check_every 0: no critic)
    const logit_bias *bias;       // [n_bias] -l: added to the logits every arm draws from
    int n_bias;
} eval_arm_opts;

#define EVAL_MAX_ARMS 16

// Parses the comma-separated list into arms[]; returns the count or -1 with err naming the entry.
int eval_arms_parse(const char *list, const eval_arm_opts *o, eval_arm *arms, verr *err);

// The session and what the agents arm needs (a device pool of one, the critic).
typedef struct {
    session *s;
    const eval_arm_opts *o;
    int clarifier;
    dev_pool *pool;
    critic cr;
    int has_critic;
    metrics_ws ws;
    // Captures, set by the caller between trials (standard and entropix arms): every kept
    // token's record also goes to on_record, and feed_last runs the last token through
    // the model too (host/runtime/probe.h's files cover every position).
    int (*on_record)(void *ud, const gen_record *r);
    void *record_ud;
    int feed_last;
} eval_runner;

int eval_runner_open(eval_runner *r, session *s, const eval_arm_opts *o, int need_agents, verr *err);
void eval_runner_close(eval_runner *r);

// One generation under an arm.
typedef struct {
    char *text;            // decoded, cut at the first stop string
    int *ids, n;           // the kept ids (stop ids excluded)
    long compute;          // decode-time forward positions: kept and discarded tokens, branch
                           // rows, critic positions
    double wall_s;         // prefill + decode (+ critic)
    double sum_h, sum_v;   // over the kept tokens' distributions (bits, bits^2)
    int n_metrics;
    const char *stop;      // "eos", "stop" (a stop string), "length" or "context"
    int rollbacks;
} eval_gen;

int eval_generate(eval_runner *r, const eval_arm *a, const eval_item *it, const int *prompt, int n_prompt,
                  uint64_t seed, eval_gen *g, verr *err);
void eval_gen_free(eval_gen *g);

// eval_generate of a standard or entropix arm in two halves, for the scheduler
// (host/decode/sched.h) to run: begin fills j->go, the options to generate with; end,
// with the generation's outcome and statistics, finishes g (freed when it fails). j
// stays in place in between. Scheduled: not the agents or a branch arm, no captures.
typedef struct {
    eval_runner *r;
    eval_gen *g;
    const eval_item *it;
    tokenizer_stream *ts;
    size_t len, cap;
    int cap_ids, oom, hit_stop;
    gen_opts go;
} eval_job;
int eval_job_scheduled(const eval_runner *r, const eval_arm *a);
int eval_job_begin(eval_job *j, eval_runner *r, const eval_arm *a, const eval_item *it, uint64_t seed, eval_gen *g,
                   verr *err);
int eval_job_end(eval_job *j, int rc, const gen_stats *st, verr *err);
// A job begun and never ended (a stopped run) frees its stream; g stays the caller's.
void eval_job_drop(eval_job *j);

// Log-likelihood (natural log) of each choice after the prompt: the choice text is
// encoded on its own (no BOS, special-token text kept as text) and appended to the
// prompt ids; ll[i] is the sum of its tokens' log-probabilities, n_tok[i] their count.
// hooks (optional) see each choice's pass: begin before it, end after it with the ids fed
// (prompt and choice; the pass feeds all but the last), keep 0 when it failed; each: every
// position in its own forward (ppl_score_each). Non-zero from begin or end stops with err.
typedef struct {
    int (*begin)(void *ud, int choice, verr *err);
    int (*end)(void *ud, int choice, int keep, const int *ids, int n, verr *err);
    int each;
    void *ud;
} eval_choice_hooks;
int eval_choices(session *s, const eval_item *it, const int *prompt, int n_prompt, const eval_choice_hooks *h,
                 double *ll, int *n_tok, verr *err);

#endif
