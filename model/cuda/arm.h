// arm.h: draws on the device. An armed step draws right after its statistics and its
// one wait brings the draws back: ARM_ENTROPIX, the device decides from the statistics
// as entropix_decide does, then draws; ARM_STOCK, the configurations are known before
// the forward. And the ordinary draw requests (dev_sampler).
#ifndef VARENT_CUDA_ARM_H
#define VARENT_CUDA_ARM_H

#include "kernels/entropix_core.h"
#include "model/cuda/core.h"
#include "model/cuda/tp.h"

#define ARM_ENTROPIX 1
#define ARM_STOCK 2
#define ARM_GREEDY 3  // a graph slot's kind: one greedy stock draw, made by the lm_head's argmax epilogue

// The per-step values of an armed step, one block copied host to device by the step
// itself (a memcpy node of its graph, which reads the pinned block's content at every
// replay): the profile, {prev_token, clarifier}, then the uniforms [cap] and the stock
// configurations [cap] at arm_in_u / arm_in_cfg.
typedef struct {
    struct entropix_config_s c;
    int tokens[2];             // the sequence's last token, the clarifier
} arm_head;

typedef struct {
    int armed;                   // ARM_* kind: the next forward call draws (0: not armed)
    int ready;                   // h_cfg / h_out hold the last step's draws (-1: queued)
    int k;                       // draws of the armed step
    void *d_in, *h_in;           // the per-step block (device, pinned)
    size_t in_bytes;
    long gen;                    // bumped when the buffers move (a graph captured them)
    sample_cfg *d_cfg, *h_cfg;   // [cap] the configurations the device drew with
    sample_out *d_out, *h_out;   // [cap] its draws
    int cap;
    int off;                     // VARENT_CUDA_ARM=0: arming is refused (every draw is ordinary)
    int greedy_off;              // VARENT_CUDA_GREEDY_EPILOGUE=0: greedy draws take cuda_sample in the graph
    unsigned long long *d_amax;  // the lm_head epilogue's packed argmax (zero between steps)
    long hits, misses;           // draw requests answered from armed draws, and ones that differed
} dev_arm;

// The arrays of ordinary draw requests: configurations up, results back.
typedef struct {
    sample_cfg *d_cfg, *h_cfg; // [cap] (device, pinned)
    sample_out *d_out, *h_out; // [cap]
    int cap;
} dev_sampler;

// Arms the next step (see cuda_forward_arm_entropix / cuda_forward_arm_sample); t: the
// waits for a queued step block's copy.
int cuda_arm_entropix(cuda_core *f, dev_arm *a, dev_tp *t, const struct entropix_config_s *c, const double *u, int k,
                      int prev_token, int clarifier, verr *err);
int cuda_arm_stock(cuda_core *f, dev_arm *a, dev_tp *t, const sample_cfg *cfg, int n, verr *err);
void cuda_arm_set(dev_arm *a, int on);
// The ARM_* kind the next step of capture layer cap queues its draws for (0: none, the
// draw request then launches its own). sharded: a tensor-parallel step (never armed).
int cuda_arm_kind(const dev_arm *a, int sharded, int cap);
// Before capturing an armed step: the sampler's arrays sized for its draws (growing them
// waits for the device, which a capture cannot).
int cuda_arm_prepare(cuda_core *f, const dev_arm *a, verr *err);
// Queues the armed step's draws after its statistics: the block's copy up, the decision
// (entropix), the draws and both copies back, read by the step's one wait (the caller's
// fetch). Graph-capturable. Sets ready to -1; the caller's wait makes it 1.
int cuda_arm_queue(cuda_core *f, dev_arm *a, verr *err);
// The armed step is one greedy stock draw (temperature <= 0), which a step that computes
// the argmax itself (the persistent decode kernel) answers: it writes the draw to
// a->d_out[0], and cuda_arm_drawn queues its copy back (the caller's wait brings it).
int cuda_arm_greedy(const dev_arm *a, int sharded);
int cuda_arm_drawn(cuda_core *f, dev_arm *a, verr *err);
// The graph path's kind for a step: cuda_arm_kind's, or ARM_GREEDY for one greedy stock
// draw (unless greedy_off): its lm_head then takes the argmax epilogue into d_amax
// (cuda_arm_greedy_prepare allocates it, before a capture) and cuda_arm_greedy_queue
// turns it into the draw and queues its copy back (one launch and one copy in the
// graph where cuda_arm_queue has three launches and three copies). After each replay,
// cuda_arm_greedy_cfg records the configuration drawn with, as cuda_arm_drawn does.
int cuda_arm_graph_kind(const dev_arm *a, int sharded, int cap);
int cuda_arm_greedy_prepare(dev_arm *a, verr *err);
int cuda_arm_greedy_queue(cuda_core *f, dev_arm *a, verr *err);
void cuda_arm_greedy_cfg(dev_arm *a);
// After the chunks of a step that did not queue them in its graph (a prompt, the
// no-graph mode): the same, when armed.
int cuda_arm_enqueue(cuda_core *f, dev_arm *a, int sharded, int cap, verr *err);
void cuda_arm_free(dev_arm *a);

// n draws from the last forward's logits (row f->sample_row): the armed draws when cfg
// is what the device drew with, else an ordinary draw through s.
int cuda_sample_draw(cuda_core *f, dev_sampler *s, dev_arm *a, dev_tp *t, const sample_cfg *cfg, int n,
                     sample_out *out, verr *err);
// One draw from each of the last batch's B rows (all its rows, one step): row b with
// cfg[b] into out[b], on the device, only the draws crossing the bus.
int cuda_sample_rows_draw(cuda_core *f, dev_sampler *s, dev_tp *t, const sample_cfg *cfg, int B, sample_out *out,
                          verr *err);
void cuda_sampler_free(dev_sampler *s);

#endif
