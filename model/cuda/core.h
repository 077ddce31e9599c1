// core.h: the core of the device forward (model/forward_cuda.h): the context, the
// weights as the kernels read them, the activation buffers, the per-step block and the
// step's statistics. Everything else of model/cuda/ builds on it and it knows none of
// them (tools/check-layout.py): upload fills its weights; tp, lora, hooks and arm add
// collectives, deltas, captures and draws around its buffers; step.c runs the layers;
// forward.c is the public API. By convention `f` names the core in every file.
// Only for builds with VARENT_CUDA.
#ifndef VARENT_CUDA_CORE_H
#define VARENT_CUDA_CORE_H

#include <cuda_runtime_api.h>

#include "kernels/ops_cuda.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"

// A failed CUDA runtime call: name it, with file and line.
#define CK(call)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            return verr_set(err, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, \
                            __LINE__);                                                           \
    } while (0)
// A failed op: its message (call, file, line) is in f->ctx.err (f: the core).
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
} dev_weights;

// The per-step block, same layout on the device and in its pinned host twin. A prefill
// chunk uses record 0; a batch of B decode rows records 0..B-1 (one token per row).
typedef struct {
    cuda_kv_lens *lens;        // [rows]
    cuda_kv_layer *layers;     // [n_layers][rows]: the records of one layer are adjacent
    int *ids, *pos, *rows;     // [max_T] each: the chunk's tokens, or one per decode row
} step_params;

#define CUDA_ROWS 64               // decode rows per step at most (the scheduler's --parallel default)
#define CUDA_ROWS_SCORES_MB 256     // ...fewer (halved, down to 8) where [rows, n_heads, ctx] captures outgrow this
#define CUDA_SAMPLE_RESERVE 16      // draws per launch the sampler's arrays are sized for at open

typedef struct cuda_core {
    cuda_ctx ctx;              // device, stream, cuBLAS handle, scratch
    const model *m;
    const dev_weights *w;      // uploaded by this forward or borrowed from the one it shares
    forward_state *fw;         // its logits / attn_scores point at the pinned buffers below
    float *fw_logits, *fw_scores;    // fw's own buffers, put back on close
    float *pin_logits, *pin_scores;  // page-locked [vocab], [n_heads, max_ctx]
    int max_T, max_ctx;
    int rows;                  // decode rows per step: min(CUDA_ROWS, max_T), less at long contexts
    void *act;                 // activation arena
    float *x, *xb, *y;         // [max_T, dim] (x and y padded by cuda_core_pad for the TP reduce-scatter)
    float *qkv;                // [max_T, q_dim + 2*kv_dim]
    float *att;                // [max_T, q_dim]
    float *hb;                 // [max_T, 2*hidden]
    float *logits;             // [rows, vocab]
    float *scores;             // [rows, n_heads, max_ctx] attention captures
    float *rope_tab;           // [max_ctx, head_dim/2, 2]: (cos, sin) of each position's angles (cuda_rope_table)
    float *stats;              // [8 * rows]: vocab stats [rows, 4] {max, lse, H, V}, then attention [rows, 4]
    float *h_stats;            // pinned [8 * rows], their host copy
    void *d_par, *h_par;       // step block: device, pinned host
    size_t par_bytes;
    int par_pending;           // a copy from h_par may still be queued
    int last_keys;             // n_keys of the last row of the last step
    int sample_row;            // the logits row a draw reads
    int logits_stale;          // the last step's logits are on the device only (lazy_logits)
    int logits_valid;          // f->logits hold the last successful step's (0 after a failure)
    int logits_overrun;        // not valid because a device loop ran past its stop (not a failure)
    int batch_rows;            // rows of the last batch whose logits are all in f->logits (0: none)
    uint16_t *pad_kv;          // device bf16 [2][n_layers][rows][kv_dim]: each padding row's one-key cache
    int *d_tables, *h_tables;  // device, pinned [rows, table_cap]: the paged rows' block tables
    int table_cap;             // blocks per row (0 until a paged cache is seen)
} cuda_core;

// Floats of padding x and y need past [max_T, dim]: the shard count, for the padded
// reduce-scatter of a tensor-parallel step.
static inline size_t cuda_core_pad(const cuda_core *f) { return (size_t)f->m->tp.size; }
// Row block [r0, r0 + rows) of a row-major matrix with `cols` columns (or of a vector: cols 1).
static inline wref cuda_rows_of(wref w, size_t r0, size_t cols) {
    return (wref){ (const char *)w.data + r0 * cols * wtype_size(w.type), w.type };
}

// The step block at base (f->d_par or f->h_par).
step_params cuda_core_params(const cuda_core *f, void *base);
// Opens the context on `device` for fw's shapes (no buffers yet).
int cuda_core_init(cuda_core *f, const model *m, forward_state *fw, int device, verr *err);
// Activations, step block, statistics and scratch for f's shapes.
int cuda_core_alloc(cuda_core *f, verr *err);
// Page-locked fw->logits / fw->attn_scores (optional: skipped when pinning fails).
void cuda_core_pin_host(cuda_core *f);
// Teardown (errors are cleared, not reported): waits for the stream; then, once the
// parts built on the core have freed theirs, puts fw's buffers back and frees the core's
// memory and context.
void cuda_core_quiesce(cuda_core *f);
void cuda_core_free(cuda_core *f);
// The host step block for a prefill chunk of T tokens appended to kv (record 0), or for
// a decode step of one token on each of B views (record b for row b).
void cuda_core_fill_prefill(cuda_core *f, const kv_view *kv, const int *ids, int T);
void cuda_core_fill_decode(cuda_core *f, const kv_view *views, const int *ids, int B);
// Rows [B, nb) of the host step block as padding rows of a step padded to nb rows (a
// captured graph per row bucket): token 0 at position 0, stored into and read from the
// row's own key of f->pad_kv, so they touch no sequence's cache; their results are
// never read.
void cuda_core_fill_pad(cuda_core *f, int B, int nb);
// Queues the upload of the block tables of the views' paged trunks (a sequence of the
// device pool, model/kv_pool.h) for rows [0, B); nothing when none is paged. Call it
// after the previous step's wait and before the fill (the records point into the area).
int cuda_core_tables(cuda_core *f, const kv_view *views, int B, verr *err);
// Queues the step's statistics: vocab stats of the B logits rows, attention stats of
// each row's capture (row b's key count read from its record in dp).
int cuda_core_stats(cuda_core *f, int B, step_params dp, verr *err);
// The error of a non-finite logit v of token id at position pos (the CPU forward's words).
int cuda_core_nonfinite(const cuda_core *f, int pos, int id, float v, verr *err);

#endif
