// session.h: everything one generation needs, opened from a model directory:
// the model, the forward scratch, the KV cache, the tokenizer (when the directory
// has one) and the sampler.
#ifndef VARENT_SESSION_H
#define VARENT_SESSION_H

#include "model/kv_cache.h"
#include "host/runtime/metrics.h"
#include "host/runtime/sampler.h"
#include "host/runtime/steer.h"
#include "model/forward.h"
#include "host/formats/model_path.h"
#include "tokenizer/tokenizer.h"

// One LoRA adapter to apply: a PEFT directory and its scale (--lora DIR: 1).
typedef lora_spec session_lora;

typedef struct {
    const char *model_dir;  // a -m value: a model directory or a GGUF file (host/formats/model_path.h)
    const model_path_progress *progress;  // a GGUF's first use (hashing, conversion); NULL: silent
    int ctx;          // 0: min(max_position_embeddings, 4096)
    int threads;      // 0: all cores
    const char *device;  // "cpu" (default) or "cuda[:N]"
    int max_batch;    // prefill chunk size (0: 256)
    steer_spec steer; // control vectors, head ablation, layer skipping (host/runtime/steer.h)
    const session_lora *lora;  // [n_lora] adapters loaded and applied to every pass (model/lora.h)
    int n_lora;
    const char *ctx_name;  // what set ctx, for messages (NULL: "--ctx")
    int kv_bf16;      // CPU: a bf16 KV cache (--kv-type bf16); the GPU's is always bf16
    int weights_mmap; // CPU: read the weights from the file mapping (--mmap), not a huge-page copy
    int tp;           // tensor-parallel degree (0, 1: the whole model here; model/tp.h)
    tp_comm *tp_comm; // the group's communicator (host/runtime/tp_mpi.h) when tp > 1
    double tp_timeout;   // seconds a CUDA rank waits for the others in a step (0: forever)
    const char *tp_devices;  // --devices: tp > 1 in one process, one rank per listed GPU (session_tpl.c)
    int decode_persistent;   // CUDA: one-row decode steps as the persistent kernel (--decode-kernel persistent)
    int lookahead;           // CUDA: generate()'s decode steps queued ahead on the device (--lookahead;
                             // 0: the per-token loop; at most CUDA_LOOP_DEPTH)
} session_opts;

// Called around every forward call of a session (collective under tensor parallelism):
// the MPI server's slots take turns with it (host/serve/follow.c). begin returns -1 with
// err to fail the call; end follows every begin that returned 0.
typedef struct {
    int (*begin)(void *ud, verr *err);
    void (*end)(void *ud);
    void *ud;
} session_turn;

typedef struct {
    model m;
    forward_state fw;
    kv_cache kv;
    tokenizer *tok;   // NULL when the model dir has no tokenizer.json
    sampler smp;
    int ctx;
    double load_s;    // seconds spent loading
    int stop[16];     // extra stop ids (chat end-of-turn tokens)
    int n_stop;
    int borrowed;     // model and tokenizer belong to another session (session_open_shared)
    struct cuda_forward *cu;  // CUDA backend state (host/runtime/session_cuda.c); NULL on the CPU
    int decode_persistent;    // CUDA: session_opts.decode_persistent (shared sessions take base's)
    int lookahead;            // CUDA: session_opts.lookahead (shared sessions take base's)
    steer *steer;     // the interventions (fw.hooks points at steer->hooks); NULL: none.
                      // Shared sessions borrow their base's.
    lora_adapter *adapters;   // [n_adapters] loaded from session_opts.lora (a shared session borrows base's)
    lora_use *lora;           // [n_adapters] with their scales: what every pass applies by default
    int n_adapters;
    struct session_tpl *tpl;  // tensor parallelism in one process: ranks 1.. (session_tpl.c); NULL: none
    const session_turn *turn; // NULL: none (not copied by session_open_shared)
} session;

int session_open(session *s, const session_opts *o, verr *err);
// session_open's tensor-parallel step (host/runtime/session_tp.c), on every rank of
// o->tp_comm after the load (failed: whether it failed here, err saying why): agree on
// the load, check the plan and that every rank loaded the same checkpoint, then keep
// this rank's share. Returns alike on every rank.
int session_tp_shard(session *s, const session_opts *o, int failed, int cuda_dev, verr *err);
// The GPU of this rank of an MPI launch: --device cuda:K as given, plain --device cuda
// the node-local rank modulo the n_devices GPUs (one rank per GPU). cuda_dev elsewhere.
int session_tp_device(const session_opts *o, int cuda_dev, int n_devices);
// After the device forward of a shard is open, on every rank: rank 0's NCCL unique id
// goes to every rank over o->tp_comm and each joins the NCCL group. Alike on every rank.
int session_tp_join_cuda(session *s, const session_opts *o, verr *err);
// Tensor parallelism in one process over the GPUs of o->tp_devices (host/runtime/
// session_tpl.c). session_tpl_shard, after the load: checks the devices, cuts ranks 1..
// their shares and s->m rank 0's, and sets *cuda_dev to rank 0's GPU; session_tpl_open,
// once rank 0's forward and cache are open: opens the other ranks and the NCCL group.
// session_tpl_forward / _batch run a forward call on every rank at once (rank 0's
// results are the session's); session_tpl_leave, then session_tpl_close before the
// session's model is freed.
int session_tpl_shard(session *s, const session_opts *o, int *cuda_dev, verr *err);
int session_tpl_open(session *s, const session_opts *o, verr *err);
int session_tpl_forward(session *s, kv_view *kv, const int *ids, int T, verr *err);
int session_tpl_batch(session *s, kv_view *views, const int *ids, int B, float *logits, float *stats, verr *err);
// The adapters of every open rank's forward (session_set_lora under one-process TP).
int session_tpl_set_lora(session *s, const lora_use *u, int n, verr *err);
void session_tpl_close(session *s);
// Every rank leaves the NCCL group at once (before any rank's forward is closed).
void session_tpl_leave(session *s);
// session_open_shared on a one-process group: after s's rank 0 forward is open in base's
// group, ranks 1.. of s (their forwards and KV shares) on base's devices and threads.
int session_tpl_open_shared(session *s, const session *base, verr *err);
// A second context on base's model: its own forward scratch, KV cache (ctx positions,
// 0: base's) and sampler, borrowing base's weights, tokenizer and interventions, which
// must outlive it.
// Used for the critic, server slots and agent replicas on one device. On a tensor-
// parallel model it joins base's group: every rank opens it alike (the MPI form) and its
// forward calls are collective with base's, one context's call at a time.
int session_open_shared(session *s, const session *base, int ctx, verr *err);
void session_close(session *s);
// The adapters the next passes apply: u[0..n) (n 0: the base model alone); u must
// outlive their use. session_open applies s->lora; the server swaps per request.
// On CUDA the adapters are uploaded to the device on first use. -1 with err when out of
// memory.
int session_set_lora(session *s, const lora_use *u, int n, verr *err);
// The forward pass on the session's backend: appends T tokens to the sequence in kv
// and leaves the last token's logits in s->fw.logits (host memory on every backend),
// plus the attention capture when s->fw.attn_layer >= 0. Use this, not forward().
int session_forward(session *s, kv_view *kv, const int *ids, int T, verr *err);
// s->turn's begin and end (no-ops without one): for collectives outside a forward call.
int session_turn_begin(session *s, verr *err);
void session_turn_end(session *s);
// session_forward that also writes every new position's logits to out [T, vocab], host
// memory (perplexity, scoring). The CUDA backend feeds one token at a time for now.
int session_forward_all(session *s, kv_view *kv, const int *ids, int T, float *out, verr *err);
// n draws from the last forward's logits, each with its own temperature/top-k/top-p/
// min-p and uniform (cfg[i].u, read only when temperature > 0): on CUDA all in one
// launch on the device, only the results crossing the bus; on the CPU host/runtime/sampler.c.
// Both give the same tokens (kernels/sample_core.h). out[i].entropy is the bits of
// draw i's truncated distribution (0 for argmax). host/runtime/session_sample.c.
int session_sample(session *s, const sample_cfg *cfg, int n, sample_out *out, verr *err);
// Arms the next session_forward of a one-device CUDA session (cuda_forward_arm_entropix
// in model/forward_cuda.h): the entropix decision of profile c and its draws with the
// peeked uniforms u[k] are made on the device right after the statistics and come back
// with them; the session_sample that asks for those draws then costs no second wait.
// A no-op on the CPU and under tensor parallelism. host/runtime/session_sample.c.
struct entropix_config_s;
int session_arm_entropix(session *s, const struct entropix_config_s *c, const double *u, int k, int prev_token,
                         int clarifier, verr *err);
// The same for n stock draws cfg[n] known before the forward (the standard sampler, its
// peeked uniforms included: cuda_forward_arm_sample): a session_sample with the same
// cfg to the bit is answered from them. A no-op on the CPU and under tensor parallelism.
int session_arm_sample(session *s, const sample_cfg *cfg, int n, verr *err);
// The last session_forward's logits in host memory (s->fw.logits): on CUDA after a
// step run with s->fw.lazy_logits they are copied now (once); NULL only when that copy
// fails (err set).
const float *session_logits(session *s, verr *err);
// The entropix metrics of the last session_forward's step (logits, and the attention
// capture at s->fw.attn_layer; attention metrics are 0 without one). CPU: computed from
// s->fw.logits and s->fw.attn_scores. CUDA: the statistics the device computed in the
// forward (log_z = its lse); only the logit metrics fall back to s->fw.logits when the
// step had no capture layer. -1 only when out of memory.
int session_metrics(const session *s, metrics_ws *ws, token_metrics *m);
// Scratch of session_forward_batch for the rows' attention captures (CPU, with metrics),
// owned by the caller: zero-initialise, it grows on demand; batch_ws_free releases it.
typedef struct {
    float *scores;  // [rows, n_heads, ctx]
    int *keys;      // [rows]
    long cap;       // floats in scores
    int rows;       // entries in keys
} batch_ws;
void batch_ws_free(batch_ws *w);
// B sequences decode one token each in one forward (branches, lookahead agents): row b
// appends ids[b] to views[b] (each row its own tail) and gets its logits in
// logits + b * vocab (host memory); with m (then bw too) also its entropix metrics m[b],
// which need a capture layer (s->fw.attn_layer) for the attention ones. CPU: one
// forward_batch per max_T rows (weights read once per step). CUDA: cuda_forward_batch
// (steps of up to 64 rows, one launch per matvec; metrics from the device's
// statistics). s->fw.logits is left undefined.
// host/runtime/session_batch.c.
int session_forward_batch(session *s, kv_view *views, const int *ids, int B, float *logits, token_metrics *m,
                          metrics_ws *ws, batch_ws *bw, verr *err);
// CUDA: the most rows one device step of session_forward_batch takes (more run as
// several steps); 0 where a batch has no such limit (the CPU).
int session_step_rows(const session *s);
// CUDA: the rows whose draws session_forward_batch_draw can make on the device (one
// device step of B rows, no tensor parallelism); 0 elsewhere.
int session_batch_draws(const session *s, int B);
// session_forward_batch, then one draw from each row with cfg[b] into out[b] on the
// device (cuda_forward_sample_rows: the token session_sample would draw from that row
// alone), so the logits never cross the bus. Needs session_batch_draws(s, B); metrics m
// (optional) need a capture layer (they come from the device's statistics).
int session_forward_batch_draw(session *s, kv_view *views, const int *ids, int B, const sample_cfg *cfg,
                               sample_out *out, token_metrics *m, batch_ws *bw, verr *err);
// Ids that end generation: config eos ids plus the tokenizer's eos.
int session_is_stop(const session *s, int id);
// Adds an id that ends generation; -1 when the table is full.
int session_add_stop(session *s, int id);
// Text to prompt ids, with BOS when the tokenizer config says so. *ids is malloc'd.
int session_encode_prompt(const session *s, const char *text, int **ids, verr *err);
// The same with special-token text parsed (parse_special 1) or kept as plain text (0).
int session_encode_text(const session *s, const char *text, int parse_special, int **ids, verr *err);

// Parses "1,2,3" into a malloc'd array; returns the count or -1 with err.
int parse_id_list(const char *s, int **ids, verr *err);

#endif
