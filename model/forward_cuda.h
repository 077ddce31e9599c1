// forward_cuda.h: the transformer forward pass on the CUDA backend, the device twin of
// model/forward.c. Weights are uploaded once (bf16/f16 as stored, f32 matrices rounded
// to bf16, norms and biases widened to f32); activations stay on the GPU; the KV cache
// is a device kv_cache (bf16, kv_cache_init_cuda) with the same trunk/tail kv_view
// semantics as the CPU. Only the last token's logits come back, into the host
// forward_state the session already has, plus, with a capture layer, 8 floats of
// entropix statistics computed on the device (fw->logit_stats, fw->attn_stats); the
// captured scores only with fw->copy_scores. T == 1 steps are captured once in a CUDA
// graph and replayed; so is a batch of B rows (cuda_forward_batch), one graph per B up
// to 8 and one per row bucket (16, 32, 48, 64: padding rows) above.
// Only functional in builds with VARENT_CUDA; otherwise every call reports that.
#ifndef VARENT_FORWARD_CUDA_H
#define VARENT_FORWARD_CUDA_H

#include "model/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"

typedef struct cuda_forward cuda_forward;
struct cuda_ctx;

// Opens the device forward of m on GPU `device` for fw's shapes (fw->max_T tokens per
// chunk, fw->ctx positions). share == NULL: uploads m's weights (freed on close);
// otherwise borrows share's weights (same model and device), and share must outlive
// this forward. Until cuda_forward_close, fw->logits and fw->attn_scores point at
// page-locked buffers of the same sizes (fast copies); close puts fw's own buffers
// back, so it must come before forward_free(fw).
int cuda_forward_open(cuda_forward **out, const model *m, forward_state *fw, int device,
                      const cuda_forward *share, verr *err);
void cuda_forward_close(cuda_forward *f);
// The context (device, stream) device KV caches of this forward are allocated on.
struct cuda_ctx *cuda_forward_ctx(cuda_forward *f);
int cuda_forward_device(const cuda_forward *f);
// Device bytes of the uploaded weights (lm_head once, the embedding table included).
size_t cuda_forward_weight_bytes(const cuda_forward *f);
// CUDA graphs for T == 1 steps: on by default. Off: the same kernels launched one by one.
void cuda_forward_set_graphs(cuda_forward *f, int on);
// What a one-row decode step costs the host (varent bench's "decode step" line).
typedef struct {
    long launches;     // kernels and cuBLAS calls of the last one-row decode step
    long graph_nodes;  // nodes of its CUDA graph (0: launched one by one)
    long syncs;        // host waits on the stream so far (diff two readings)
    long captures;     // CUDA graphs captured and instantiated so far (diff two readings)
    int persistent;    // the last one-row decode step ran the persistent kernel
    long persist_steps, persist_fallbacks;  // so far: steps it ran, and steps that took the
                                            // graph path while it was chosen (diff readings)
    const char *fallback_why;  // the last fallback's reason (NULL: none; valid until close)
    int persist_ring;          // the last persistent step's weight ring, bytes a block (0: none)
    int persist_stage;         // its staged input, floats a block (0: none)
    long persist_checks;       // its shape and fit checks: one for each setting, not one a step
    int tune;                  // --decode-kernel auto: 0 not chosen, 1 timing, 2 chosen
    int tune_pick;             // the choice: 1 the persistent kernel, 0 the graph path
    float tune_ms[2];          // the median device ms of the graph path's and the persistent
                               // kernel's timed steps (0 when chosen without timing)
    const char *tune_why;      // a choice made without timing: why (NULL: timed)
} cuda_step_counts;
void cuda_forward_counts(const cuda_forward *f, cuda_step_counts *out);
// The decode kernel of one-row steps (--decode-kernel): the graph path (0, the default)
// or the persistent kernel (1: one cooperative launch a step, kernels/cuda/persist.cu;
// steps it does not support yet take the graph path, counted in cuda_step_counts), or
// auto (2: the first one-row steps alternate the two, timed on the device, and the rest
// take the faster; one host wait, once; model/cuda/tune.c). Each call starts afresh.
// grid: the persistent kernel's blocks (0: as many as the device holds at once).
void cuda_forward_set_decode_kernel(cuda_forward *f, int persistent, int grid);
#define CUDA_TUNE_TIMED 3  // auto's timed steps of each kernel, after an untimed one of each
// Auto's choice (model/cuda/tune.c): the median of n (1..CUDA_TUNE_TIMED) times (0 for
// another n), and 1 when the persistent kernel's median is strictly below the graph
// path's (a tie keeps the graph path), the two medians into med.
float cuda_tune_median(const float *v, int n);
int cuda_tune_pick(const float graph_ms[CUDA_TUNE_TIMED], const float persist_ms[CUDA_TUNE_TIMED], float med[2]);
// The persistent kernel's weight ring (docs/cuda.md): bytes of shared memory a block for
// the next phase's weights, copied while the phase before runs (-1, the default: as many
// as fit beside the attention's at 4 blocks an SM; 0: none, every weight loaded as it is
// used). The bits are the same either way.
void cuda_forward_set_persist_ring(cuda_forward *f, int bytes);
// Its blocks an SM (3, the default: 168 registers a thread, no spills in a loop; 4: 128,
// with spills in the attention's loops), its counter waits' pause between polls in ns (0, the default: none),
// whether a phase's input is staged in shared memory, a block at a time, where it fits
// (nonzero, the default) or read through L2 by each warp (0), and whether a staged
// phase's warps fill their ring a unit ahead (nonzero, the default) or for their first
// unit only (0). The bits are the same.
void cuda_forward_set_persist_tuning(cuda_forward *f, int min_blocks, int sleep_ns, int stage, int ahead);
// The persistent kernel's phase trace (docs/cuda.md "The phase trace"): with a path
// (NULL or "": none), every persistent step writes each block's stamps of each phase
// there as a TSV (the last step's; one host wait a step). -1 when the path is too long.
int cuda_forward_set_persist_trace(cuda_forward *f, const char *path, verr *err);
// As forward(): appends T tokens to the sequence in kv (device caches of this forward's
// device) and leaves the last token's logits in fw->logits. When fw->attn_layer is a
// layer: fw->attn_keys, the device statistics in fw->logit_stats / fw->attn_stats with
// fw->dev_stats = 1, and with fw->copy_scores the capture in fw->attn_scores. Fails
// without touching kv on bad ids or a full context.
int cuda_forward_run(cuda_forward *f, forward_state *fw, kv_view *kv, const int *ids, int T, verr *err);
// Copies the logits of the last step into fw->logits when that step left them on the
// device (fw->lazy_logits); nothing otherwise.
int cuda_forward_logits(cuda_forward *f, forward_state *fw, verr *err);
// Waits until the device has run every step queued so far (a lazy step that nothing
// waited for: one host sync, counted; nothing when none is left). Kernel faults surface here.
int cuda_forward_wait(cuda_forward *f, verr *err);
// B sequences decode one token each in one pass, the device twin of forward_batch: row
// b appends ids[b] to views[b] (each row writing its own cache: a tail, or its own
// trunk); logits [B, vocab] (host) receives every row's (NULL: they stay on the device,
// for cuda_forward_sample_rows or session_logits' last row). Up to cuda_forward_rows
// rows run as one step (more: steps of that many); the matvecs read each weight tile
// once per 8 rows, in one launch, and each row's logits equal those of a
// one-token cuda_forward_run on its view (the same kernels sum every row alike). With a
// capture layer and stats != NULL, stats [B, 8] (host) receives each row's device
// statistics {max, lse, entropy, varentropy, attn_entropy, attn_varentropy, agreement,
// interaction_strength}; the captures stay on the device. fw->logits (and, with a
// capture layer, fw's device statistics) become the last row's. Fails without touching
// any view on a bad id, a full view, a host or foreign cache, or two rows sharing a cache.
int cuda_forward_batch(cuda_forward *f, forward_state *fw, kv_view *views, const int *ids, int B, float *logits,
                       float *stats, verr *err);
// LoRA adapters (model/lora.h) applied unmerged from the next forward call on, prefill
// and decode, in place of the previous set. Each adapter is uploaded once per device in
// its stored type (the first forward that uses it; forwards sharing the weights share
// the copy, which lives until the weights' owner closes). Uses with scale 0 are left
// out, so no adapter or scale 0 runs exactly the base model's launches. A changed set
// or scale makes the next decode step capture its graph again. On a shard (--tp) the
// adapters must be cut to the same share (lora_load does it on a sharded model).
int cuda_forward_set_lora(cuda_forward *f, const lora_use *u, int n, verr *err);
// n draws from the last forward's logits (after a batch: its last row's) with cuda_sample
// (kernels/ops_cuda.h): the configurations go up, the results come back; the logits
// stay on the device. An armed step's draws are returned without a launch when cfg is
// what the device drew with.
int cuda_forward_sample(cuda_forward *f, const sample_cfg *cfg, int n, sample_out *out, verr *err);
// One draw from each row of the last cuda_forward_batch (B rows, at most
// cuda_forward_rows: one step): row b with cfg[b] into out[b], as cuda_forward_sample on
// that row alone would draw (cuda_sample_rows), with only the draws crossing the bus.
// Not under tensor parallelism. The rows a batch step takes at most:
int cuda_forward_sample_rows(cuda_forward *f, const sample_cfg *cfg, int B, sample_out *out, verr *err);
int cuda_forward_rows(const cuda_forward *f);
struct entropix_config_s;  // kernels/entropix_core.h
// Arms the next cuda_forward_run (one token or a prompt, with a capture layer, not
// sharded): right after its statistics the device decides as entropix_decide does
// (kernels/entropix_core.h, profile c, the sequence's last token prev_token) and makes
// its k draws (k >= the profile's sample count) with the peeked uniforms u[k], and the
// step's one wait brings the draws back with the statistics. The host's own decision
// then takes them through cuda_forward_sample: one host round trip per entropix token.
int cuda_forward_arm_entropix(cuda_forward *f, const struct entropix_config_s *c, const double *u, int k,
                              int prev_token, int clarifier, verr *err);
// Arms the next cuda_forward_run for n stock draws cfg[n] (the standard sampler: the
// configurations, uniforms included, are known before the forward; not sharded): the
// step draws right after its logits (inside a decode step's graph) and its one wait
// brings the draws back; a later cuda_forward_sample with the same cfg to the bit takes
// them without a launch or a wait, any other falls back to an ordinary draw.
int cuda_forward_arm_sample(cuda_forward *f, const sample_cfg *cfg, int n, verr *err);
// Arming on (the default) or off: off, the arm calls do nothing and every draw launches
// its own (VARENT_CUDA_ARM=0; the same tokens either way).
void cuda_forward_set_arming(cuda_forward *f, int on);
// An armed greedy draw in a step's graph: the lm_head's argmax epilogue and one finishing
// launch (on, the default), or cuda_sample's launches (off: VARENT_CUDA_GREEDY_EPILOGUE=0;
// the same tokens either way).
void cuda_forward_set_greedy_epilogue(cuda_forward *f, int on);
// Draw requests answered from armed steps, and requests after an armed step whose
// configurations differed from the device's (they launched an ordinary draw).
void cuda_forward_arm_counts(const cuda_forward *f, long *hits, long *misses);

// ---- the device decode loop (model/cuda/loop.c, docs/cuda.md "The device decode loop") ----
// One-row greedy or stock-sampled decode steps that feed their own draws: the token,
// position and key counts live on the device, so the host queues steps ahead and reads
// their tokens (with logits and statistics) from a pinned ring a few steps behind.
// CUDA_LOOP_DEPTH: the ring's slots, the most steps that can be queued ahead of the
// last one read (varent's --lookahead, default CUDA_LOOP_DEPTH).
#define CUDA_LOOP_DEPTH 8
// Why a loop cannot run with fw's settings (NULL: it can): what must reach the host every token.
const char *cuda_forward_loop_blocker(const cuda_forward *f, const forward_state *fw);
// Starts a loop on kv whose first step feeds token (greedy: argmax draws; else the
// stock draws of the configurations each queue call gives), with depth ring slots
// (1..CUDA_LOOP_DEPTH) and fw's capture layer. Queues the step block's copy; no wait.
int cuda_forward_loop_begin(cuda_forward *f, forward_state *fw, kv_view *kv, int token, int greedy, int depth,
                            verr *err);
// Queues the next step (step j = the steps queued so far: it feeds step j-1's draw, or
// the first token): cfg, its draw's configuration (ignored when greedy). A step may be
// queued only once the step depth before it has been read.
int cuda_forward_loop_queue(cuda_forward *f, const sample_cfg *cfg, verr *err);
// Step j's ring entry (queued, and not more than depth steps behind the newest). When
// step j is not known done, waits for step j + ahead - 1 (or the newest queued), one
// host sync counted, so reading in order costs one wait per `ahead` steps.
int cuda_forward_loop_read(cuda_forward *f, int j, int ahead, loop_entry *out, verr *err);
// Ends the loop keeping its first kept steps: the cache's length (kv's) becomes that of
// kept one-token forwards, the steps past them are discarded (one wait when any step
// was not waited for), fw's statistics are the last kept step's, and the logits stay
// on the device (cuda_forward_logits) unless steps were discarded (then none).
int cuda_forward_loop_end(cuda_forward *f, forward_state *fw, kv_view *kv, int kept, verr *err);
typedef struct {
    long runs, steps, discarded;  // loops, steps queued, steps run past a stop (so far)
} cuda_loop_counts;
void cuda_forward_loop_counts(const cuda_forward *f, cuda_loop_counts *out);

// ---- tensor parallelism (model/forward_cuda_tp.c, docs/distributed.md) ----
// A forward opened on a shard (model_shard: rank m->tp.rank of m->tp.size) joins its
// group with the group's NCCL unique id, which one rank makes (cuda_forward_tp_id) and
// every rank receives: over MPI, or in one process from the caller. Joining blocks until
// every rank has joined, so in one process each rank joins on its own thread. From then
// on every forward call is collective: all ranks make the same calls with the same
// tokens, and each gets the whole model's logits, statistics and capture. A wait on the
// stream gives up after timeout_s seconds (0: never) and aborts the group: a dead peer is
// an error, not a hang; after that every call on this forward fails.
#define CUDA_TP_ID_BYTES 128
int cuda_forward_tp_id(unsigned char id[CUDA_TP_ID_BYTES], verr *err);
int cuda_forward_tp_join(cuda_forward *f, const unsigned char id[CUDA_TP_ID_BYTES], double timeout_s, verr *err);
// A second context on the same shard (f opened sharing lead's weights): f joins lead's
// group by borrowing its communicator, which needs no collective. The contexts' steps
// must not overlap: every rank makes the same steps of the same contexts in the same
// order, one at a time (each tensor-parallel step waits for its stream before it
// returns). lead must outlive f; a failure of the group fails both.
int cuda_forward_tp_share(cuda_forward *f, cuda_forward *lead, verr *err);
// Leaves the group (ncclCommDestroy; NCCL may wait there for the peers, so in one
// process every rank leaves on its own thread at once). Later calls on f fail. A
// borrower only stops using the lead's communicator.
void cuda_forward_tp_leave(cuda_forward *f);

#endif
