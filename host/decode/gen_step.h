// gen_step.h: one sequence's decoding state and one step of it, shared by generate()
// (one sequence, whose logits are the session's after each forward) and the scheduler
// (host/decode/sched.c: many sequences, each step's logits one row of a batched
// forward). The same code turns logits into tokens in both, so a sequence decodes to
// the same tokens whichever runs it.
#ifndef VARENT_GEN_STEP_H
#define VARENT_GEN_STEP_H

#include "host/decode/branch.h"
#include "host/decode/generate.h"

typedef struct {
    session *s;
    const gen_opts *o;
    rng r;                 // the sequence's own stream (seeded from o->seed)
    int *hist, n_hist;     // the context, the prompt and the generated ids (penalties, clarifier)
    float *work;           // [vocab] penalised logits
    int *count;            // [vocab] zeroed scratch of sampler_penalize
    metrics_ws ws;
    branch_set bs;
    int metrics;           // compute metrics at every step
    sample_cfg *cfg;       // [n_draw] one step's draws
    sample_out *drawn;     // [n_draw] their results
    int n_draw;
    int lazy;              // CUDA: steps leave their logits on the device (lazy_logits)
    int arm;               // CUDA: each step draws on the device (gen_ctx_arm)
    double *u;             // [n_draw] gen_ctx_arm's peeked uniforms
    // A step from a row of a batch (the scheduler): its host logits, metrics and the
    // position of the token it chooses. NULL row: the session's last forward.
    const float *row;
    token_metrics row_m;
    int row_pos;
} gen_ctx;

// rows 1: the steps' logits will come as rows (gen_ctx.row); LEHV branching, which
// forks the session's own cache, is refused then. Sets s->fw.attn_layer for the metrics.
int gen_ctx_init(gen_ctx *c, session *s, const gen_opts *o, const int *prompt, int n_prompt, int rows, verr *err);
void gen_ctx_free(gen_ctx *c);
// CUDA, before a forward whose logits the next step draws from: arms the device draw.
int gen_ctx_arm(gen_ctx *c, verr *err);
// The attention capture layer the metrics read (o->attn_layer or the last), checked.
int gen_capture_layer(const session *s, const gen_opts *o, int *layer, verr *err);
// The draws read the forward's own logits: no penalty or bias rewrites them.
int gen_raw_draws(const gen_opts *o);
// The standard sampler's parameters a step records (greedy at temperature 0 or below).
sampler_params gen_std_params(const gen_opts *o);
// A draw's configuration with p; its uniform (none when greedy) from the stream r.
sample_cfg gen_draw_cfg(sampler_params p, rng *r);
// One step: fills *toks / *recs (one / one_tok, or a committed branch's) and returns
// how many tokens (> 1 only for a committed LEHV branch), -1 with err.
int gen_ctx_step(gen_ctx *c, int n_gen, int **toks, gen_record **recs, gen_record *one, int *one_tok, verr *err);
// A step whose one draw is made elsewhere (the scheduler's device draws over a batch):
// gen_ctx_device_draw says whether this sequence's steps allow it (the standard sampler
// on the raw logits, which nothing on the host reads), gen_ctx_next_cfg takes the draw's
// configuration (its uniform from the sequence's stream, as gen_ctx_step would), and
// gen_ctx_step_drawn makes the step of its result d: the record gen_ctx_step would make
// for that token, from the row's metrics (c->row_m, c->row_pos), with no host logits.
int gen_ctx_device_draw(const gen_ctx *c);
sample_cfg gen_ctx_next_cfg(gen_ctx *c);
void gen_ctx_step_drawn(gen_ctx *c, const sample_out *d, gen_record *one, int *one_tok);
// Emits a step's tokens in order (stop ids, callbacks, max_new). 1 when generation is
// over, 0 to go on, -1 on error.
int gen_ctx_emit(gen_ctx *c, gen_stats *st, const int *toks, gen_record *recs, int n);

#endif
