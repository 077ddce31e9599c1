// forward_cuda_internal.h: the state shared by model/forward_cuda.c (the steps) and
// model/forward_cuda_upload.c (weights and buffers). Only for builds with VARENT_CUDA.
#ifndef VARENT_FORWARD_CUDA_INTERNAL_H
#define VARENT_FORWARD_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "kernels/ops_cuda.h"
#include "kernels/entropix_core.h"
#include "model/forward_cuda.h"

// A failed CUDA runtime call: name it, with file and line.
#define CK(call)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            return verr_set(err, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, \
                            __LINE__);                                                           \
    } while (0)
// A failed op: its message (call, file, line) is in f->ctx.err.
#define OP(call)                                                                                 \
    do {                                                                                         \
        if ((call) != 0) return verr_set(err, "%s", f->ctx.err.msg);                             \
    } while (0)

// Device copies of one layer's weights (wref.data are device pointers).
typedef struct {
    wref attn_norm, ffn_norm;  // f32 [dim]
    wref wqkv;                 // [q_dim + 2*kv_dim, dim]: wq rows, then wk, then wv
    wref bqkv;                 // f32 [q_dim + 2*kv_dim]; data NULL without biases
    wref q_norm, k_norm;       // f32 [head_dim]; data NULL unless Qwen3
    wref wo;                   // [dim, q_dim]
    wref w_gu;                 // [2*hidden, dim]: gate rows, then up
    wref w_down;               // [dim, hidden]
} dev_layer;

typedef struct {
    void *arena;               // one cudaMalloc holding every tensor below
    size_t bytes;
    wref embed, final_norm, lm_head;  // lm_head == embed when tied
    const float *inv_freq;     // [head_dim/2]
    dev_layer *layers;         // host array [n_layers] of device refs
    struct dev_lora_reg *lora; // LoRA adapters uploaded to this device (model/forward_cuda_lora.c)
} dev_weights;

// The per-step block, same layout on the device and in its pinned host twin. A prefill
// chunk uses record 0; a batch of B decode rows records 0..B-1 (one token per row).
typedef struct {
    cuda_kv_lens *lens;        // [rows]
    cuda_kv_layer *layers;     // [n_layers][rows]: the records of one layer are adjacent
    int *ids, *pos, *rows;     // [max_T] each: the chunk's tokens, or one per decode row
} step_params;

// The forward hooks (model/hooks.h) as the device runs them (model/forward_cuda_hooks.c):
// host copies of what decides the launches, the control vectors on the device, and the
// capture arenas. All zero / NULL until a forward first sees hooks.
typedef struct {
    long gen;                  // bumped whenever what decides the launches changes
    int active;                // the last sync saw hooks (0: the plain pass)
    const forward_hooks *h;    // the hooks of the current forward call (their callbacks)
    unsigned char *skip;       // [n_layers]
    unsigned char *cvec_on;    // [n_layers]
    unsigned char *ablate;     // [n_layers * n_heads]
    unsigned char *act_on;     // [n_layers * HOOK_NPOINTS]: the point is captured
    unsigned char *attn_on;    // [n_layers]: the last query's scores are captured
    unsigned char *next;       // [the five above]: the sync's scratch
    size_t flags_bytes;        // of each of skip..attn_on together, and of next
    float *h_cvec;             // [n_layers, dim]: the values now on the device
    float *d_cvec;             // device [n_layers, dim]
    int *act_slot, n_act;      // [n_layers * HOOK_NPOINTS]: slot in the arenas (-1: none)
    int *attn_slot, n_attn;    // [n_layers]
    float *d_acts, *h_acts;    // [n_act, T, dim] of a chunk of T rows: device, pinned host
    float *d_attn, *h_attn;    // [n_attn, n_heads, max_ctx]: device, pinned ([n_attn, n_heads, keys])
    int acts_cap, attn_cap;    // slots the arenas hold
} dev_hooks;

// The LoRA adapters a forward applies (model/forward_cuda_lora.c): the uses with a
// non-zero scale, their device pairs and scratch. n == 0: the base model's launches.
typedef struct {
    const struct dev_adapter *d;
    float coef;                // scale * lora_alpha / r (or / sqrt(r))
} dev_lora_use;

typedef struct {
    long gen;                  // bumped when the uses, their coefficients or the scratch change
    dev_lora_use *use;         // [n]
    int n;
    unsigned char *on;         // [n_layers * LORA_N_PROJ]: some use adapts the projection
    float *tmp, *dy;           // device [max_T, rank], [max_T, widest projection output]
    int rank;
} dev_lora;

// What a step captures for the hooks (bits): activations, last-query attention scores.
#define HK_ACTS 1
#define HK_ATTN 2

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

// Tensor parallelism on the device (model/forward_cuda_tp.c): this forward holds rank
// `rank` of `size`'s shard (f->m->tp) and meets the other ranks in NCCL collectives on
// its stream. comm NULL: the whole model on this device. A second context on the same
// shard (cuda_forward_tp_share) borrows its lead's communicator: lead points at the
// lead's dev_tp, which holds the group's state (comm, broken, why); the buffers are
// each forward's own.
typedef struct dev_tp {
    void *comm;                // ncclComm_t (a borrower: a copy of the lead's, used only through the lead)
    struct dev_tp *lead;       // NULL: this forward joined the group itself
    int rank, size;
    int *head0, *n_heads;      // [size] every rank's query heads (host)
    int *vocab0, *n_vocab;     // [size] and vocabulary rows
    float *part_logits;        // device [rows, max_vocab]: this rank's vocabulary slice of each row
    float *part_scores;        // device [rows, max_heads, max_ctx]: its heads' attention captures
    float *gather;             // device [size, rows * max(max_vocab, max_heads * max_ctx)]
    double timeout_s;          // a wait on the stream gives up after this long (0: never)
    int broken;                // a collective failed: the group is out of step, every call fails
    char why[512];             // what failed
} dev_tp;

#define CUDA_ROWS CUDA_MATVEC_ROWS  // decode rows per pass (the batched matvec's widest launch)

// An armed step: its draws are made on the device right after the step and come back
// with its one wait. ARM_ENTROPIX (cuda_forward_arm_entropix): the device decides from
// the statistics, then draws; ARM_STOCK (cuda_forward_arm_sample): the configurations
// are known before the forward.
#define ARM_ENTROPIX 1
#define ARM_STOCK 2

// The per-step values of an armed step, one block copied host to device by the step
// itself (a memcpy node of its graph, which reads the pinned block's content at every
// replay): the profile, {prev_token, clarifier}, then the uniforms [cap] and the stock
// configurations [cap] at arm_in_u / arm_in_cfg.
typedef struct {
    struct entropix_config_s c;
    int tokens[2];             // the sequence's last token, the clarifier
} arm_head;

typedef struct {
    int armed;                   // ARM_* kind: the next cuda_forward_run draws (0: not armed)
    int ready;                   // h_cfg / h_out hold the last step's draws (-1: queued)
    int k;                       // draws of the armed step
    void *d_in, *h_in;           // the per-step block (device, pinned)
    size_t in_bytes;
    long gen;                    // bumped when the buffers move (a graph captured them)
    sample_cfg *d_cfg, *h_cfg;   // [cap] the configurations the device drew with
    sample_out *d_out, *h_out;   // [cap] its draws
    int cap;
    int off;                     // VARENT_CUDA_ARM=0: arming is refused (every draw is ordinary)
    long hits, misses;           // draw requests answered from armed draws, and ones that differed
} dev_arm;

struct cuda_forward {
    cuda_ctx ctx;              // device, stream, cuBLAS handle, scratch
    const model *m;
    dev_weights own;           // uploaded here (arena NULL when borrowed)
    const dev_weights *w;      // &own, or the sharing forward's
    forward_state *fw;         // its logits / attn_scores point at the pinned buffers below
    float *fw_logits, *fw_scores;    // fw's own buffers, put back on close
    float *pin_logits, *pin_scores;  // page-locked [vocab], [n_heads, max_ctx]
    int max_T, max_ctx;
    int rows;                  // decode rows per pass: min(CUDA_ROWS, max_T)
    void *act;                 // activation arena
    float *x, *xb, *y;         // [max_T, dim]
    float *qkv;                // [max_T, q_dim + 2*kv_dim]
    float *att;                // [max_T, q_dim]
    float *hb;                 // [max_T, 2*hidden]
    float *logits;             // [rows, vocab]
    float *scores;             // [rows, n_heads, max_ctx] attention captures
    float *stats;              // [8 * rows]: vocab stats [rows, 4] {max, lse, H, V}, then attention [rows, 4]
    float *h_stats;            // pinned [8 * rows], their host copy
    void *d_par, *h_par;       // step block: device, pinned host
    size_t par_bytes;
    int par_pending;           // a copy from h_par may still be queued
    int last_keys;             // n_keys of the last row of the last step
    int sample_row;            // the logits row cuda_forward_sample draws from
    int logits_stale;          // the last step's logits are on the device only (lazy_logits)
    int logits_valid;          // f->logits hold the last successful step's (0 after a failure)
    graph_slot graphs[CUDA_ROWS + 1];  // [B]: the decode step of B rows
    graph_slot armed_graph;    // the one-row step with its draws (dev_arm), kept apart from
                               // graphs[1] so steps that alternate replay both
    long n_captures;           // graphs instantiated so far
    int use_graph;
    cuda_step_counts step;     // the last one-row decode step's launches and graph nodes
    sample_cfg *d_cfg, *h_cfg; // [smp_cap] cuda_forward_sample's configurations (device, pinned)
    sample_out *d_out, *h_out; // [smp_cap] and results
    int smp_cap;
    dev_hooks hk;              // forward hooks (model/forward_cuda_hooks.c)
    dev_tp tp;                 // tensor parallelism (model/forward_cuda_tp.c)
    dev_lora lora;             // LoRA adapters (model/forward_cuda_lora.c)
    dev_arm arm;               // entropix decided and drawn on the device (model/forward_cuda_arm.c)
};

#define CUDA_SAMPLE_RESERVE 16  // draws per launch the sampler's arrays are sized for at open

// ---- armed steps (model/forward_cuda_arm.c) ----
// The ARM_* kind the next step of capture layer cap queues its draws for (0: none, the
// draw request then launches its own).
int cuda_arm_kind(const cuda_forward *f, int cap);
// Before capturing an armed step: the sampler's arrays sized for its draws (growing them
// waits for the device, which a capture cannot).
int cuda_arm_prepare(cuda_forward *f, verr *err);
// Queues the armed step's draws after its statistics: the block's copy up, the decision
// (entropix), the draws and both copies back, read by the step's one wait (the caller's
// fetch). Graph-capturable. Sets ready to -1; the caller's wait makes it 1.
int cuda_arm_queue(cuda_forward *f, verr *err);
// After the chunks of a step that did not queue them in its graph (a prompt, the
// no-graph mode): the same, when armed.
int cuda_arm_enqueue(cuda_forward *f, int cap, verr *err);
// The error of a non-finite logit v of token id at position pos (the CPU forward's words).
int cuda_nonfinite_err(const cuda_forward *f, int pos, int id, float v, verr *err);
// The armed draws when cfg[n] is what the device drew with (1: out filled), else 0.
int cuda_arm_take(cuda_forward *f, const sample_cfg *cfg, int n, sample_out *out);
void cuda_arm_free(cuda_forward *f);

// ---- LoRA (model/forward_cuda_lora.c) ----
// The registry of adapters uploaded to the device, held by the forward that uploaded
// the weights (own.lora) and shared with every forward borrowing them.
int cuda_lora_reg_new(cuda_forward *f, verr *err);
void cuda_lora_reg_free(struct dev_lora_reg *g);
// Some adapter in use adapts projection p of layer l.
static inline int cuda_lora_on(const cuda_forward *f, int l, lora_proj p) {
    return f->lora.n && f->lora.on[(size_t)l * LORA_N_PROJ + p];
}
// y[T, n_out] += coef * B (A x) over the uses, x [T, n_in] (this share's widths). decode:
// T rows of one token (the matvec rows kernels, graph-friendly); else a prefill chunk.
int cuda_lora_apply(cuda_forward *f, int l, lora_proj p, float *y, const float *x, int T, int decode, verr *err);
// The forward's uses and scratch, and the registry when f owns it.
void cuda_lora_free(cuda_forward *f);

// ---- tensor parallelism (model/forward_cuda_tp.c) ----
// Floats of padding x and y need past [max_T, dim] for the padded reduce-scatter.
static inline size_t cuda_tp_pad(const cuda_forward *f) { return (size_t)f->m->tp.size; }
// The dev_tp that holds the group's communicator and state: the lead's for a borrower.
static inline dev_tp *cuda_tp_group(const cuda_forward *f) {
    return f->tp.lead ? f->tp.lead : (dev_tp *)&f->tp;
}
// y[n] summed over the ranks, in place, the same bits on every rank (reduce-scatter,
// then all-gather), queued on the stream. y has room for cuda_tp_pad more floats.
int cuda_tp_sum(cuda_forward *f, float *y, size_t n, verr *err);
// The B rows of this rank's vocabulary slice (part_logits, [B, n_vocab] packed) gathered
// into f->logits [B, vocab].
int cuda_tp_logits(cuda_forward *f, int B, verr *err);
// The B rows of this rank's heads' captures (part_scores: row b at b * n_heads_local *
// max_ctx, [n_heads_local, n_keys] packed) gathered into f->scores (row b at b * n_heads *
// max_ctx, [n_heads, n_keys] packed); lens: the rows' key counts (host).
int cuda_tp_scores(cuda_forward *f, int B, const cuda_kv_lens *lens, verr *err);
// One attention capture of this rank's heads ([n_heads_local, keys] packed, in a buffer
// of n_heads * max_ctx) replaced in place by every rank's ([n_heads, keys] packed).
int cuda_tp_gather_heads(cuda_forward *f, float *scores, int keys, verr *err);
// Waits for the stream: under tensor parallelism it polls, checks NCCL's asynchronous
// error and gives up after the timeout (aborting the communicator), so a dead peer is an
// error, not a hang. Without it, cudaStreamSynchronize.
int cuda_tp_wait(cuda_forward *f, verr *err);
void cuda_tp_free(cuda_forward *f);

step_params cuda_forward_params(void *base, int n_layers, int max_T, int rows);
// Uploads f->m's weights into f->own (one arena, progress bar on a terminal).
int cuda_forward_upload(cuda_forward *f, verr *err);
// Activations, step block, statistics and scratch for f's shapes.
int cuda_forward_alloc(cuda_forward *f, verr *err);
// Page-locked fw->logits / fw->attn_scores (optional: skipped when pinning fails).
void cuda_forward_pin_host(cuda_forward *f);

// ---- forward hooks (model/forward_cuda_hooks.c) ----
// Resolves h (fw->hooks, NULL: none) into f->hk before a forward call: bumps hk.gen
// when the launches must change, uploads changed control vectors, sizes the capture
// arenas. With no hooks before or now, one branch.
int cuda_hooks_sync(cuda_forward *f, const forward_hooks *h, verr *err);
// The HK_* captures a single-sequence call makes (batches: none).
int cuda_hooks_captures(const cuda_forward *f);
static inline int cuda_hooks_skip(const cuda_forward *f, int l) { return f->hk.active && f->hk.skip[l]; }
// Layer l's control vector on the device, or NULL.
static inline const float *cuda_hooks_cvec(const cuda_forward *f, int l) {
    return f->hk.active && f->hk.cvec_on[l] ? f->hk.d_cvec + (size_t)l * f->m->cfg.dim : NULL;
}
// 1 when a step with captures `cap` copies point p of layer l.
static inline int cuda_hooks_wants(const cuda_forward *f, int cap, int l, int p) {
    return (cap & HK_ACTS) && f->hk.act_on[l * HOOK_NPOINTS + p];
}
// Queues the copy of rows x [T, dim] of layer l's point p into the arena (when wanted).
int cuda_hooks_point(cuda_forward *f, int cap, int l, int p, const float *x, int T, verr *err);
// A skipped layer's points before its control vector: x for the residual ones, zeros
// for the block outputs.
int cuda_hooks_skipped(cuda_forward *f, int cap, int l, const float *x, int T, verr *err);
// Where layer l's last-query scores go for the hooks, or NULL.
float *cuda_hooks_scores(const cuda_forward *f, int cap, int l);
// Queues zeroing the ablated heads' columns of att [T, n_heads * head_dim] at layer l.
int cuda_hooks_ablate(cuda_forward *f, int l, float *att, int T, verr *err);
// After a chunk of T rows at positions pos0.. (keys: the last query's key count): one
// copy back per capture kind, a wait, then the callbacks in the CPU forward's order.
int cuda_hooks_deliver(cuda_forward *f, int cap, int T, int pos0, int keys, verr *err);
void cuda_hooks_free(cuda_forward *f);

#endif
