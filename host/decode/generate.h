// generate.h: the decode loop: prefill the prompt as one batch, then sample and
// feed back one token at a time until EOS, max_new tokens or a full context.
// The sampler is either the stock one (sp) or entropix (host/decode/entropix.h), which picks
// its parameters per token from the uncertainty metrics (host/runtime/metrics.h).
#ifndef VARENT_GENERATE_H
#define VARENT_GENERATE_H

#include <signal.h>

#include "host/decode/entropix.h"
#include "host/runtime/logit_bias.h"
#include "host/runtime/session.h"

typedef enum { GEN_STANDARD = 0, GEN_ENTROPIX = 1 } gen_sampler;

// One generated token and how it was chosen.
typedef struct {
    int pos, token;           // position the token occupies in the sequence
    token_metrics m;          // of the distribution it was drawn from (raw logits)
    entropix_quadrant q;      // by the profile's thresholds, also under the standard sampler
    sampler_params sp;        // parameters actually used (greedy: temperature 0, top_k 1)
    double score;             // ADAPTIVE: the winning draw's score, else 0
    const float *logits;      // [vocab] the raw logits it was drawn from, host memory, valid
                              // during on_record; NULL when they stayed on the device (CUDA
                              // without need_logits) or for a branch's tokens
    int has_logit;            // logit holds the token's raw logit though logits is NULL (a
    float logit;              // draw the device made from a batch row: the scheduler)
} gen_record;

typedef struct {
    int max_new;
    sampler_params sp;
    uint64_t seed;
    int (*on_token)(void *ud, int id);  // called per generated token; non-zero stops
    void *ud;
    // Uncertainty-aware decoding; all zero gives plain stock sampling without metrics.
    gen_sampler sampler;
    const entropix_config *ex;  // thresholds and constants; required for entropix and metrics
    int attn_layer_given, attn_layer;   // layer of the attention metrics (default: last)
    int clarifier;              // HELV's inserted token (entropix)
    sampler_penalties pen;      // repeat, presence, frequency, window, no-repeat n-gram (all 0: off;
                                // host/runtime/sampler.h): they make the draws read a host copy
    const int *context;         // [n_context] the ids before the prompt already in the cache (a chat's
    int n_context;              // earlier turns): the penalties' history starts with them
    const logit_bias *bias;     // [n_bias] added to the logits the draws see (host/runtime/logit_bias.h);
    int n_bias;                 // metrics, entropix scores and logprobs still read the raw logits
    int branch_k, branch_b;     // LEHV branching: K candidates, B steps each (0: off)
    int want_metrics;           // compute metrics under the standard sampler too
    int ignore_eos;             // keep going past stop ids (benchmarks)
    int feed_last;              // also run the last generated token through the model, so
                                // forward hooks see every position (activation captures)
    int (*on_record)(void *ud, const gen_record *r);  // per token, before on_token
    int record_stop;            // on_record also sees the stop token that ends generation (not
                                // emitted: no on_token, not in n_gen; st->hit_eos says it came)
    int need_logits;            // on_record reads s->fw.logits (otherwise on CUDA they may
                                // stay on the device: session_logits fetches them)
    void *record_ud;
    const volatile sig_atomic_t *interrupt;  // set (e.g. by Ctrl-C): stop before the next token
    // A prompt longer than the session's prefill chunk is fed chunk by chunk (the chunks
    // the forward makes anyway, so the numbers are the same), calling this after each:
    // done of total prompt tokens (a progress bar; done == total: the prefill is over).
    // NULL: one forward.
    void (*on_prefill)(void *ud, int done, int total);
    void *prefill_ud;
} gen_opts;

typedef struct {
    int n_prompt, n_gen;
    double prefill_s, decode_s;
    int hit_eos, hit_ctx;
    int interrupted;              // stopped by gen_opts.interrupt
    int quadrant_count[Q_COUNT];  // per generated token, when metrics were computed
    double sum_entropy;
    int n_metrics;
    long branch_fed;              // forward rows the LEHV branches ran (kept and discarded)
    // CUDA: the decode loop on the device (host/decode/devloop.c): its steps and the ones
    // run past the stop and truncated, or why the per-token loop ran instead (NULL: it ran)
    int loop_steps, loop_discarded;
    const char *loop_why;
} gen_stats;

int generate(session *s, const int *prompt, int n_prompt, const gen_opts *o, gen_stats *st, verr *err);
double gen_now(void);
// HELV's clarifier: " ..." encoded by the model's tokenizer (its only or last id); -1 without one.
int gen_find_clarifier(const session *s);

#endif
