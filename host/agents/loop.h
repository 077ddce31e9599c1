// loop.h: parallel entropy-minimised decoding. N agents, each a sampler
// configuration (temperature, top-k, top-p, min-p), propose the next token from the
// same logits; the proposal whose own truncated, renormalised distribution has the
// lowest entropy (bits) wins, ties to the lower agent index. One forward per step
// serves every agent. Every check_every steps a critic (host/agents/critic.h) judges the
// text; BAD truncates the KV cache by `rollback` tokens (never into the prompt), and
// after 3 rollbacks at one position the text is accepted.
//
// Lookahead W >= 2: each agent extends its own branch to W tokens on a private KV
// tail (the trunk is shared); the branch with the lowest mean entropy is committed.
// Branches are spread over the device replicas (agent i on replica i mod D); the
// replicas exchange only token ids and entropies, and each replays the winning
// tokens into its own trunk. Without lookahead only replica 0 generates.
//
// Sequence state: ids[0..n-1] is the text; every replica's trunk holds the keys of
// ids[0..n-2] and ids[n-1] is fed at the start of the next step (its logits are the
// step's shared logits). A rollback to m truncates the trunks to m-1 positions.
#ifndef VARENT_AGENTS_H
#define VARENT_AGENTS_H

#include <stdint.h>

#include "host/agents/critic.h"
#include "host/runtime/devices.h"
#include "host/runtime/logit_bias.h"
#include "host/runtime/session.h"

#define AGENTS_MAX 64
#define AGENTS_ROLLBACK_GUARD 3  // rollbacks at one position before BAD is accepted

// "T:K,T:K,..." (T >= 0, K >= 0, 0 = no top-k); returns the count or -1 with err
// naming the entry. top_p/min_p of every agent come from base.
int agents_parse(const char *spec, sampler_params *out, sampler_params base, verr *err);
// The default 8 agents: T from 0.3 to 1.5 and K from 10 to 100, evenly spread.
int agents_default(sampler_params *out, sampler_params base);

typedef enum { AGENTS_STEP, AGENTS_CRITIC, AGENTS_ROLLBACK } agents_event_kind;
typedef enum { CRITIC_NONE, CRITIC_ROLLBACK, CRITIC_ACCEPT } critic_action;

// One agent's proposal: its branch (1 token without lookahead) and the entropy.
typedef struct {
    int agent;
    sampler_params sp;
    const int *tok;  // [n_tok]; the last may be a stop id
    int n_tok;
    double entropy;  // bits; the mean over the branch's tokens with lookahead
} agents_proposal;

typedef struct {
    agents_event_kind kind;
    int step;                       // 1-based, counts every step including rolled-back ones
    int pos;                        // STEP: position of the first proposed token; CRITIC: text length
    const agents_proposal *props;   // STEP: [n_props], by agent index
    int n_props, chosen;
    const float *logits;            // STEP: the shared logits the proposals started from [vocab]
    critic_verdict verdict;         // CRITIC
    critic_action action;
    int from_pos, to_pos;           // ROLLBACK: tokens_removed = from_pos - to_pos
} agents_event;

typedef struct {
    const sampler_params *agents;
    int n_agents;
    int max_parallel;      // agents evaluated at once (0: all)
    int max_new;
    uint64_t seed;
    int lookahead;         // tokens per branch; <= 1: one token per step, replica 0 only
    critic *cr;            // NULL: no critic
    int critic_dev;        // the replica whose thread runs the critic
    int check_every, rollback;
    int (*on_event)(void *ud, const agents_event *e);  // non-zero stops
    void *ud;
    // MPI launches (docs/distributed.md): one communicator rank per replica group (a
    // process, or a tensor-parallel group; the replicas above are this rank's). Agent
    // a runs on global replica a mod (ranks x local replicas); each step all-gathers
    // the proposals, so every rank picks the same winner; the critic runs on rank 0's
    // group and its verdict is shared. NULL: one process.
    tp_comm *ranks;
    const logit_bias *bias;  // [n_bias] added to the logits every agent draws from (the logged
    int n_bias;              // logits and the critic stay raw); ids checked against the vocab
    struct probe *probe;     // on replica 0 (host/runtime/probe.h): paused but for each step's shared
                             // forward, so it holds the statistics the step's proposals started from
} agents_opts;

typedef struct {
    int *ids;              // malloc'd: prompt then generated ids (final text)
    int n_prompt, n_gen;
    int steps, rollbacks, checks;
    int hit_eos, hit_ctx;
    double prefill_s, gen_s;     // gen_s: first step to the end, critic included
    double critic_s, critic_cpu; // time inside the critic (wall, process CPU)
    long critic_fed;             // ids the critic fed (the rest came from its cache)
    double *step_s;              // [steps] wall time of each step's forward + proposals + commit
    double *step_cpu;            // [steps] the same in process CPU time (steadier on a shared machine)
} agents_result;

// reps[d]: replica sessions on the pool's devices (stop ids and tokenizer from reps[0]).
int agents_generate(session *reps, dev_pool *pool, const int *prompt, int n_prompt, const agents_opts *o,
                    agents_result *res, verr *err);
void agents_result_free(agents_result *r);

#endif
