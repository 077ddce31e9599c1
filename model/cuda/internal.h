// internal.h: the whole device forward (model/forward_cuda.h): the core and the parts
// built on it, composed; shared by step.c (the layers of a step) and forward.c (the
// public calls, graphs and waits). By convention `d` names the cuda_forward and `f` its
// core (f = &d->core), as in the files below it. Only for builds with VARENT_CUDA.
#ifndef VARENT_CUDA_INTERNAL_H
#define VARENT_CUDA_INTERNAL_H

#include "model/cuda/arm.h"
#include "model/cuda/core.h"
#include "model/cuda/hooks.h"
#include "model/cuda/lora.h"
#include "model/cuda/tp.h"
#include "model/forward_cuda.h"

// A captured decode step of B rows, per capture layer and scratch buffer.
typedef struct {
    cudaGraphExec_t exec;
    int cap;                   // capture layer it was captured with (-1: none)
    void *scratch;             // ctx.scratch it was captured with
    long hook_gen;             // dev_hooks.gen it was captured with
    int hook_cap;              // the HK_* captures it holds
    long lora_gen;             // dev_lora.gen it was captured with
    int arm;                   // ARM_* kind of the draws captured after the step (0: none)
    int arm_k;                 // and their number
    long arm_gen;              // dev_arm.gen it was captured with (the armed buffers)
    void *sample_buf;          // ctx.sample_buf it was captured with (the sampler's arrays)
    long launches;             // kernels and cuBLAS calls captured into it
    long nodes;                // its nodes (the launches plus the step block's copy, and an
                               // armed step's three copies)
} graph_slot;

// --decode-kernel auto (model/cuda/tune.c): the first one-row steps alternate the graph
// path and the persistent kernel, timed on the device; the rest take the faster.
typedef struct {
    int step;                  // one-row steps scheduled so far (the warm-ups, then the timed)
    int want;                  // the step now queued tries the persistent kernel
    int decided, pick;         // the choice is made, and which (1: the persistent kernel)
    cudaEvent_t ev[4 * CUDA_TUNE_TIMED];  // each timed step's start and end (made at the first)
    int n_ev;
    float ms[2][CUDA_TUNE_TIMED];   // [graph, persistent][k]: the timed steps' device milliseconds
    float med[2];              // and their medians
    char why[256];             // a choice made without timing: why ("": timed)
} dev_tune;

// The persistent decode kernel (model/cuda/persist.c, kernels/cuda/persist.cu): a one-row
// decode step in one cooperative launch, when chosen and the step allows it; the graph
// path otherwise (a fallback, counted with its reason).
typedef struct {
    int on;                    // --decode-kernel: 0 graph, 1 persistent, 2 auto (tune)
    dev_tune tune;             // auto's timings and choice
    int grid;                  // blocks (0: as many as the device holds at once)
    int ring;                  // the weight ring's bytes a block asked for (-1: as many as fit; 0: none)
    int stage;                 // stage a phase's input in shared memory where it fits (0: never)
    int ahead;                 // staged phases fill the ring a unit ahead (0: the first unit only)
    cuda_persist_fit fit;      // the last persistent step's blocks, ring and staging (cuda_persist_check's)
    int fit_ok;                // fit holds for the settings (each setter clears it) and the scratch below
    const void *fit_scratch;   // ctx->scratch and its bytes when fit was checked,
    size_t fit_scratch_bytes;
    const unsigned *fit_count; // and ctx->att_count and its length (the check requires them)
    int fit_count_n;
    long checks;               // cuda_persist_check calls (one a setting, not one a step)
    int min_blocks, sleep_ns;  // blocks an SM (3 or 4; 0: 3), and the pause between counter polls
    cuda_persist_layer *d_layers;  // device [n_layers] (NULL until the first persistent step)
    unsigned *ctr;             // device dataflow counters
    unsigned long long *argmax;    // device: the packed greedy token
    long steps, fallbacks;     // one-row decode steps run persistent, and on the graph path instead
    char why[160];             // the last fallback's reason
    char trace_path[512];      // the phase trace's TSV ("": no trace; model/cuda/persist_trace.c)
    unsigned long long *trace, *h_trace;  // device and host [trace_len] (cuda_persist_trace_len)
    size_t trace_len;
} dev_persist;

// The device decode loop (model/cuda/loop.c): one-row steps that feed their own draw,
// queued ahead by the host, which reads the ring a few steps behind.
#define ARM_LOOP_GREEDY 4  // graph slot kinds: a loop step (no step block copy) with its
#define ARM_LOOP_STOCK 5   // argmax, or its stock draw, the bookkeeping and the ring's copy back
typedef struct {
    int on;                    // a loop is running: steps read the step block the device advances
    int greedy, cap, depth;    // its draw, capture layer and ring slots
    loop_state *d_state;       // device
    loop_entry *d_ring, *h_ring;   // [CUDA_LOOP_DEPTH] device, pinned
    sample_cfg *d_cfgs, *h_cfgs;   // [CUDA_LOOP_DEPTH] the stock draws' configurations, filled ahead
    sample_cfg *d_cfg;         // the step's (cuda_loop_pick)
    sample_out *d_draw;        // the step's draw
    cudaEvent_t ev[CUDA_LOOP_DEPTH];  // [slot]: recorded after the step of that slot
    int n_ev;                  // events created
    int queued, known, read;   // steps queued, known done (their event waited for), and read
    kv_cache *dst;             // the view's cache the steps append to, its length and the
    int len0, n_trunk0;        // view's trunk count at the start
    long runs, steps, discarded;   // loops, their steps, and steps run past the stop (truncated)
} dev_loop;

struct cuda_forward {
    cuda_core core;            // context, weights, buffers, step block
    dev_weights own;           // uploaded here (arena NULL when borrowed: core.w is the sharer's)
    struct dev_lora_reg *own_lora;  // the LoRA registry of own (NULL when borrowed)
    graph_slot graphs[CUDA_ROWS + 1];  // [nb]: the decode step of nb rows (padded: forward.c, step_rows)
    graph_slot armed_graph;    // the one-row step with its draws (dev_arm), kept apart from
                               // graphs[1] so steps that alternate replay both
    graph_slot greedy_graph;   // the one-row step with an ARM_GREEDY draw (the lm_head's argmax)
    graph_slot loop_graph;     // a device loop's step (ARM_LOOP_*)
    long n_captures;           // graphs instantiated so far
    int use_graph;
    cuda_step_counts step;     // the last one-row decode step's launches and graph nodes
    dev_sampler smp;           // ordinary draw requests (model/cuda/arm.c)
    dev_hooks hk;              // forward hooks (model/cuda/hooks.c)
    dev_tp tp;                 // tensor parallelism (model/cuda/tp.c)
    dev_lora lora;             // LoRA adapters (model/cuda/lora.c)
    dev_arm arm;               // entropix decided and drawn on the device (model/cuda/arm.c)
    dev_persist persist;       // the persistent decode kernel (model/cuda/persist.c)
    dev_loop loop;             // the device decode loop (model/cuda/loop.c)
    unsigned long long *greedy_amax;  // set while an ARM_GREEDY step is captured: its lm_head's
                                      // argmax epilogue (arm.h), read by cuda_step_decode
};

// ---- the layers of a step (model/cuda/step.c) ----
// Queues a prefill chunk of T > 1 tokens (cuBLAS GEMMs, the prefill attention), starting
// with the step block's upload. hk: the HK_* captures of the hooks.
int cuda_step_prefill(cuda_forward *d, int T, int cap, int hk, verr *err);
// Queues a decode step of B rows (1 <= B <= rows), one token each, every row with its
// own KV records. Reads per-step values only on the device, so it can be captured.
// hk: the HK_* captures of the hooks (single-sequence steps only).
int cuda_step_decode(cuda_forward *d, int B, int cap, int hk, verr *err);
// Tensor parallelism: the statistics after the step (graph), every rank's heads gathered
// into the capture first (where they go depends on each row's key count, which the host
// knows and a captured graph cannot).
int cuda_step_tp_stats(cuda_forward *d, int B, verr *err);

// ---- decode graphs (model/cuda/forward.c) ----
// Replays the captured one-row or B-row step of kind arm (0, ARM_*), capturing it first
// when stale.
int cuda_graph_decode(cuda_forward *d, int B, int cap, int hk, int arm, verr *err);

// ---- the device decode loop (model/cuda/loop.c) ----
// Inside a loop step's graph: before the layers (a stock draw's configuration), and after
// them (the draw, the bookkeeping, the ring's copy back).
int cuda_loop_head(cuda_forward *d, verr *err);
int cuda_loop_tail(cuda_forward *d, verr *err);
void cuda_loop_free(cuda_forward *d);

// ---- the persistent decode kernel (model/cuda/persist.c) ----
// Queues a one-row decode step (its block already filled) as the persistent kernel when
// it is on and the step allows it: 1 when queued (with the capture layer's statistics,
// and an armed greedy draw made inside it: *drawn = 1), 0 when the step must take the
// graph path (persist.why says why), -1 on error. hk: the step's HK_* captures.
int cuda_persist_step(cuda_forward *d, int cap, int hk, int *drawn, verr *err);
// A device loop's step (its block already on the device): the kernel with its greedy
// draw into draw (NULL: none) and the capture layer's statistics, when it is on and the
// step allows it: 1 when queued, 0 for the graph path (counted), -1 on error.
int cuda_persist_loop_step(cuda_forward *d, int cap, sample_out *draw, verr *err);
// A step the kernel does not take (a batch): counted as a fallback when it is on.
void cuda_persist_skip(cuda_forward *d, const char *why);
void cuda_persist_free(cuda_forward *d);
// The phase trace (model/cuda/persist_trace.c): plan->trace set when a path is (arm), the
// step's stamps written to it after the launch (write), the buffers freed.
int cuda_persist_trace_arm(cuda_forward *d, cuda_persist_plan *plan, verr *err);
int cuda_persist_trace_write(cuda_forward *d, const cuda_persist_plan *plan, verr *err);
void cuda_persist_trace_free(dev_persist *p);

// ---- --decode-kernel auto (model/cuda/tune.c) ----
// Whether the one-row step now queued tries the persistent kernel: always when it is
// chosen, by the schedule or the choice made under auto, never on the graph path.
int cuda_tune_wants(const cuda_forward *d);
// Around a one-row step's launches under auto until the choice is made: begin picks the
// step's kernel (cuda_tune_wants) and records a timed step's start; end (ran: whether
// the persistent kernel took the step) records its end, and after the last timed step
// waits once for the device and chooses. No-ops otherwise.
int cuda_tune_begin(cuda_forward *d, verr *err);
int cuda_tune_end(cuda_forward *d, int ran, verr *err);
void cuda_tune_reset(dev_tune *t);
void cuda_tune_free(dev_tune *t);

#endif
