// ops_cuda.h: the CUDA half of the op interface (kernels/cuda/*.cu). Each cuda_<op>
// mirrors cpu_<op> in ops.h with the same argument meaning, plus a leading cuda_ctx.
// Differences from the CPU twins:
//   - every pointer (activations, weights, ids, positions, inv_freq, scores) is a
//     device pointer; index arrays (ids, pos) live on the device so a captured
//     CUDA graph can be replayed with new values;
//   - the KV cache (kv_span buffers) is bf16, [positions, n_kv_heads * head_dim];
//   - ops are asynchronous on ctx->stream and return 0, or -1 with ctx->err filled
//     (bad arguments, too little scratch, launch failures). Kernel faults surface at
//     the next cuda_sync / cuda_download.
//   - no op allocates: ops that need temporary memory (cuda_matmul for T > 1,
//     cuda_attention) use ctx->scratch, sized once with cuda_reserve_scratch() from
//     cuda_matmul_scratch_bytes() / cuda_attention_scratch_bytes().
// Only compiled in with VARENT_CUDA (nvcc found at build time).
#ifndef VARENT_OPS_CUDA_H
#define VARENT_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "host/util/err.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cublasContext;  // == cublasHandle_t's pointee, kept opaque for C callers
struct cuda_blas;      // cuBLAS's entry points, loaded at cuda_init (kernels/cuda/blas.cuh)

typedef struct cuda_ctx {
    int device;                   // CUDA device index
    int n_sm;                     // multiprocessor count (sizes split-KV attention)
    int smem_optin;               // opt-in shared memory per block, bytes (read at init)
    int pdl;                      // decode kernels use programmatic dependent launch (sm_90+;
                                  // VARENT_CUDA_PDL=0 turns it off)
    int mv_deep;                  // one-row matvecs of 2048+ inputs keep 8 chunks a lane in flight,
                                  // not 4 (the same sums; VARENT_CUDA_MV_DEEP=1; default off
                                  // until a GPU window times it)
    int att_split_keys;           // decode attention: keys per live split (-1: one key tile;
                                  // 0: every split of the capacity); VARENT_CUDA_ATT_SPLIT_KEYS
    int prefill_tiled;            // prefill attention in tiles of keys shared by a block's
                                  // queries (head_dim 64, 128; the same bits as the kernel of
                                  // one block per query and head); VARENT_CUDA_PREFILL_TILED=0: off
    cudaStream_t stream;          // every op runs on this stream
    struct cublasContext *cublas; // cuBLAS handle bound to stream
    struct cuda_blas *blas;       // the functions cublas is used through (owned)
    void *scratch;                // device scratch shared by ops (one stream: no overlap)
    size_t scratch_bytes;
    unsigned *att_count;          // [att_count_n] decode attention's split counters (self-resetting)
    void *sample_buf;             // cuda_sample's candidate arrays (grown on first need)
    size_t sample_bytes;
    int att_count_n;
    verr err;                     // message of the last failed op
    // Work counters, for `varent bench`'s decode-step line (never reset; callers diff).
    long n_launches;              // kernels and cuBLAS calls queued (or captured) on stream
    long n_syncs;                 // host waits on stream
    long n_mv_deep;               // of n_launches: matvecs on the deep kernel (mv_deep)
} cuda_ctx;

// ---- device helpers (kernels/cuda/device.cu) ---------------------------------------

// Number of usable CUDA devices; 0 when there is no driver or no GPU. Never fails.
int cuda_device_count(void);
// Select device, create the stream and cuBLAS handle. Clear error when no GPU.
int cuda_init(cuda_ctx *ctx, int device, verr *err);
// Release scratch, cuBLAS handle and stream (safe on a zeroed or failed ctx).
void cuda_destroy(cuda_ctx *ctx);
// Loads cuBLAS as cuda_init does, without a device: 0, or -1 with err saying what is missing.
int cuda_blas_probe(verr *err);
// cudaMalloc wrapper; on failure the message names `what`, bytes needed and bytes free.
int cuda_malloc(void **p, size_t bytes, const char *what, verr *err);
void cuda_free(void *p);
// Grow ctx->scratch to at least `bytes` (never shrinks). Call at setup, not per token.
int cuda_reserve_scratch(cuda_ctx *ctx, size_t bytes);
// Room for n (>= B x n_kv_heads) decode-attention counters, zeroed: with them the split
// blocks of a (row, KV head) combine their partials themselves, the last one to finish
// doing it (one launch instead of split + combine). Without (n too small): two launches.
// Call at setup; never shrinks.
int cuda_reserve_attention(cuda_ctx *ctx, int n);
// Synchronous copies on ctx->stream (they wait for queued work first).
int cuda_upload(cuda_ctx *ctx, void *dst_dev, const void *src_host, size_t bytes);
int cuda_download(cuda_ctx *ctx, void *dst_host, const void *src_dev, size_t bytes);
// Async memset on ctx->stream (0xFF fills fp32 buffers with NaN: the tests' poison).
int cuda_memset(cuda_ctx *ctx, void *p, int byte, size_t bytes);
// Wait for everything queued on ctx->stream; reports asynchronous kernel faults.
int cuda_sync(cuda_ctx *ctx);
// "NVIDIA H100 80GB HBM3, 132 SMs, 79.1 GiB" into buf (bench and info output).
int cuda_describe(cuda_ctx *ctx, char *buf, size_t n);
// ---- the machine (kernels/cuda/probe.cu): varent bench --probe, the GPU window ----------
typedef struct cuda_facts {
    char name[256];
    int n_sm;
    int l2_bytes;                 // L2 cache
    size_t mem_bytes;             // device memory
    int sm_clock_khz;             // peak SM clock
    int mem_clock_khz;            // peak memory clock
    int bus_bits;                 // memory bus width
    int ecc;                      // 1: ECC on
    int driver, runtime;          // CUDA versions, 1000 * major + 10 * minor
} cuda_facts;
int cuda_device_facts(cuda_ctx *ctx, cuda_facts *f);
// One read of `bytes` of device memory at buf (16-byte aligned) by the probe kernel:
// *sum the 32-bit word sum (the buffer zero-padded to whole words: cpu_read_checksum's),
// *ms its time (events). Synchronous; uses ctx->scratch.
int cuda_read_probe(cuda_ctx *ctx, const void *buf, size_t bytes, uint32_t *sum, float *ms);
// The counter wait's watchdog (sync.cuh, CTR_WAIT_TIMEOUT_NS): one thread waits with
// timeout_ns for a counter nothing releases. *end: the stream's end (a GPU: the trap's
// launch error, within about timeout_ns; cudaSuccess would be a wait that gave up
// without trapping), *ms the host's wall time of the launch and wait. After a trap the
// context is unusable (a sticky error): the last CUDA call of a process. GPU only (the
// emulated device parks the wait and reports a deadlock instead). -1 on a setup error.
int cuda_wait_probe(cuda_ctx *ctx, unsigned long long timeout_ns, cudaError_t *end, double *ms);
// Read bandwidth over a fresh buffer of `bytes` (make it several times the L2), the
// best of reps timed reads after one warm-up; *checked 1 when every read summed right.
int cuda_read_gbs(cuda_ctx *ctx, size_t bytes, int reps, double *gbs, int *checked);
// Make ctx->device current on the calling thread (the current device is per thread).
int cuda_activate(cuda_ctx *ctx);
// Async device-to-device copy of `height` rows of `width` bytes between pitched
// buffers on ctx->stream (commits a branch's KV tail: one row per layer).
int cuda_copy_2d(cuda_ctx *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                 size_t width, size_t height);
// Device-to-device copy bandwidth (read + write bytes per second / 1e9), best of a few
// cudaMemcpyAsync of up to 256 MiB: the bound the decode bandwidth is compared with.
int cuda_copy_gbs(cuda_ctx *ctx, double *gbs);

// Scratch each op family needs at its largest shapes.
size_t cuda_matmul_scratch_bytes(int max_T, int max_n_in);
size_t cuda_attention_scratch_bytes(const cuda_ctx *ctx, int max_keys, attn_shape s);
// cuda_attention_decode_rows over B rows needs B times the decode partials.
size_t cuda_attention_rows_scratch_bytes(const cuda_ctx *ctx, int max_keys, attn_shape s, int B);

// ---- device-resident KV descriptions (for CUDA graph replay) ---------------------------
// A captured decode step must not bake per-token values into kernel arguments, so the
// kernels below read the KV segment pointers and lengths from device memory; the host
// rewrites them before each replay. Segments are bf16 [positions, kv_dim], 16-byte
// aligned (cudaMalloc'd base + whole rows).
typedef struct {
    const void *k_trunk, *v_trunk;  // positions 0 .. n_trunk-1
    const void *k_tail, *v_tail;    // positions n_trunk .. n_keys-1 (NULL without a tail)
    void *k_dst, *v_dst;            // where cuda_kv_store_dev writes (tail, else trunk)
} cuda_kv_layer;

typedef struct {
    int n_trunk;  // keys read from the trunk segment
    int n_keys;   // all keys, the newest position included
    // A paged trunk (a sequence of the scheduler's device pool, model/kv_pool.h): k_trunk
    // and v_trunk are the pool's rows of the layer and key j is row
    // (table[j >> shift] << shift) + (j & (2^shift - 1)); n_trunk == n_keys, no tail, and
    // the store's rows are pool rows. The same bits as the keys stored contiguously.
    const int *table;  // device int [blocks]; NULL: contiguous segments
    int shift;
} cuda_kv_lens;

// ---- ops (kernels/cuda/*.cu) ----------------------------------------------------------

// out[T, dim] = table[ids[t], :]  (ids: device int[T])
int cuda_embed(cuda_ctx *ctx, float *out, wref table, const int *ids, int T, int dim);
// out[T, dim] = x / rms(x) * w   (in-place allowed: out == x)
// Qwen3 q/k norm: call with T*n_heads rows of head_dim.
int cuda_rmsnorm(cuda_ctx *ctx, float *out, const float *x, wref w, int T, int dim, float eps);
// Fused residual: x[T, dim] += y[T, dim]; out = rmsnorm(x) * w  (out != x, out != y)
int cuda_rmsnorm_residual(cuda_ctx *ctx, float *out, float *x, const float *y, wref w,
                          int T, int dim, float eps);
// out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T. T == 1: hand-written matvec (fp32
// activations, fp32 accumulation). T > 1: cuBLAS GEMM with x rounded to the weight's
// 16-bit type in scratch (bf16/f16 inputs, fp32 compute and output); f32 weights run
// a full fp32 GEMM. Needs cuda_matmul_scratch_bytes(T, n_in) of scratch for T > 1.
int cuda_matmul(cuda_ctx *ctx, float *out, const float *x, wref w, int T, int n_in, int n_out);
// cuda_matmul over consecutive row ranges of one matrix (a fused q|k|v or gate|up):
// outs[i][T, n_outs[i]] = x @ (rows n_outs[0] + ... + n_outs[i-1] onward of w)^T, x
// rounded to 16 bits once for all parts; each part the bits of cuda_matmul on its rows.
int cuda_matmul_parts(cuda_ctx *ctx, float *const *outs, const float *x, wref w, int T, int n_in,
                      const int *n_outs, int n_parts);
// Batch-1 matvec only: out[n_out] = w[n_out, n_in] @ x[n_in]
int cuda_matvec(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out);
// The matvec for B sequences of one token each (batched decode): row r of x [B, n_in]
// times w, every weight tile read once per 8 rows, and one launch for all B rows (its
// passes of 8 over a tile run side by side, so the tile comes from DRAM once). Each row is summed exactly as cuda_matvec
// sums it (same kernel shape for the same n_out and n_in), so a row's result does not
// depend on B or on the other rows. The output is planar by segment: columns [0, s1),
// [s1, s2) and [s2, n_out) of all rows are three row-major blocks one after the other,
// [B, s1] then [B, s2 - s1] then [B, n_out - s2], so the q|k|v or gate|up parts of a
// fused matrix come out as separate arrays (the prefill layout). s1 = s2 = n_out gives
// plain [B, n_out]; with B == 1 every split is the plain layout.
#define CUDA_MATVEC_ROWS 8  // rows one weight load serves (more rows: passes of 8 in the same launch)
int cuda_matvec_rows(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out, int B, int s1,
                     int s2);
// What a decode matvec can do besides the product (NULL: nothing). norm (device f32
// [n_in]) folds the RMSNorm of each x row into it: out = W (x * rsqrt(mean(x^2) + eps)
// * norm), computed as rsqrt(...) * ((W * norm) x), so the normalised activations are
// never written. add: out += the product (the residual add; plain layout only). bias
// (device f32 [n_out], NULL: none) is added to the product (Qwen2's qkv bias). amax
// (device, NULL: none; plain layout): row 0's argmax goes into it by an integer atomicMax
// as the rows are stored (the greedy draw in the lm_head's epilogue; zero before the
// launch, cuda_argmax_finish turns it into the draw and zeroes it again).
typedef struct {
    const float *norm;
    float eps;
    int add;
    const float *bias;
    unsigned long long *amax;
} cuda_mv_fuse;
int cuda_matvec_rows_fused(cuda_ctx *ctx, float *out, const float *x, wref w, int n_in, int n_out, int B, int s1,
                           int s2, const cuda_mv_fuse *fz);
// out[B, hid] = silu(x @ gate^T) * (x @ up^T), w = gate|up [2*hid, n_in] (the MLP's
// first half in one launch; the same bits as cuda_matvec_rows with s1 = hid, s2 = 2*hid
// on the four-rows-per-warp kernel, then cuda_swiglu). Where the vector kernels do not
// apply (n_in % 8, alignment) it runs those two ops, through tmp [B, 2*hid] (which may
// hold out: out == tmp is allowed). fz: a folded norm (no add), or NULL.
int cuda_matvec_glu_rows(cuda_ctx *ctx, float *out, float *tmp, const float *x, wref w, int n_in, int hid, int B,
                         const cuda_mv_fuse *fz);
// x[T, n] += b[n]
int cuda_add_bias(cuda_ctx *ctx, float *x, wref b, int T, int n);
// Rotary embedding in place on x[T, n_heads, head_dim]; pos: device int[T];
// inv_freq: device float[head_dim/2]. interleaved as in cpu_rope.
int cuda_rope(cuda_ctx *ctx, float *x, const int *pos, int T, int n_heads, int head_dim,
              const float *inv_freq, int interleaved);
// The decode kernels' RoPE table (cpu_rope_table): tab (device [n_pos, half, 2] floats)
// = (cos, sin) of pos * inv_freq[i], by the sincosf cuda_rope calls, so a rotation read
// from it has cuda_rope's bits. The decode step's kernels read one position's row
// instead of computing half sines and cosines per head (and carry no sincosf slow path).
int cuda_rope_table(cuda_ctx *ctx, float *tab, const float *inv_freq, int half, int n_pos);
// Causal GQA attention over a bf16 kv_span, as cpu_attention. T == 1 runs the
// split-KV (flash-decoding) kernel; T > 1 the prefill kernel.
// last_scores (device [n_heads, n_keys], may be NULL): scaled pre-softmax scores of
// the last query (cuda_attn_stats turns them into the entropix metrics).
int cuda_attention(cuda_ctx *ctx, float *out, const float *q, kv_span kv, int T,
                   attn_shape s, float *last_scores);
// The same over a paged trunk (kv.n_tail 0), the device twin of cpu_attention_paged:
// pg.blocks is a device int table, and the result is bit for bit cuda_attention's on the
// same rows stored contiguously. pg.blocks NULL: cuda_attention.
int cuda_attention_paged(cuda_ctx *ctx, float *out, const float *q, kv_span kv, kv_pages pg, int T,
                         attn_shape s, float *last_scores);
// cpu_attn_stats on the device: out4 (device float[4]) = {attn_entropy, attn_varentropy,
// agreement, interaction_strength} of scores[n_heads, n_keys], summed in double.
// d_lens == NULL: n_keys = max_keys; otherwise n_keys = d_lens->n_keys, read on the
// device (graph replay), at most max_keys. Scratch: cuda_attn_stats_scratch_bytes
// (cuda_attention_scratch_bytes with the same max_keys covers it).
int cuda_attn_stats(cuda_ctx *ctx, float *out4, const float *scores, int n_heads, int max_keys,
                    const cuda_kv_lens *d_lens);
size_t cuda_attn_stats_scratch_bytes(const cuda_ctx *ctx, int n_heads, int max_keys);
// out[n] = silu(gate[n]) * up[n]   (in-place allowed: out == gate)
int cuda_swiglu(cuda_ctx *ctx, float *out, const float *gate, const float *up, size_t n);
// x[n] += y[n]
int cuda_add(cuda_ctx *ctx, float *x, const float *y, size_t n);
// x[n] += s * y[n], rounded after the product and after the sum (no FMA), as cpu_add_scaled
int cuda_add_scaled(cuda_ctx *ctx, float *x, const float *y, float s, size_t n);
// Store fp32 rows k[T, kv_dim], v[T, kv_dim] into bf16 caches [positions, kv_dim]
// at rows pos[t] (device int[T], relative to the given cache buffers).
int cuda_kv_store(cuda_ctx *ctx, void *k_cache, void *v_cache, const float *k, const float *v,
                  const int *pos, int T, int kv_dim);
// As cuda_kv_store, with the destination buffers read from d_layer->k_dst / v_dst
// (device record) and rows[t] (device int[T]) relative to them.
int cuda_kv_store_dev(cuda_ctx *ctx, const cuda_kv_layer *d_layer, const float *k, const float *v,
                      const int *rows, int T, int kv_dim);
// cuda_kv_store_dev for B sequences: row t's k[t], v[t] go to its own record
// d_layers[t] (B consecutive records), at rows[t].
int cuda_kv_store_rows(cuda_ctx *ctx, const cuda_kv_layer *d_layers, const float *k, const float *v,
                       const int *rows, int B, int kv_dim);
// A decode step's rope and KV store in one launch: q [B, n_heads*hd] rotated in place
// (HF rotate-half, positions pos[b]), k [B, kv_dim] rotated and v [B, kv_dim] stored as
// bf16 at cache row rows[b] of record d_layers[b]: the same bits as cuda_rope on q and
// k, then cuda_kv_store_rows (k is left unrotated: the attention reads the cache);
// rope_tab: cuda_rope_table's, covering every pos[b]. With
// q_norm and k_norm (device f32 [hd], Qwen3; NULL: none) each head is RMS-normalised
// first, as cuda_rmsnorm over heads would (within rounding: the sum runs in another order).
int cuda_rope_kv_store_rows(cuda_ctx *ctx, float *q, const float *k, const float *v, const int *pos,
                            const int *rows, const cuda_kv_layer *d_layers, int B, int n_heads, int n_kv,
                            int head_dim, const float *rope_tab, const float *q_norm, const float *k_norm, float eps);
// The splits a decode step of n_keys keys uses when the attention's grid is sized for
// max_keys (1: the split block writes the output, no partials and no combine).
int cuda_attention_live_splits(const cuda_ctx *ctx, int n_keys, int max_keys, attn_shape s);
// Decode attention (T == 1) as cuda_attention, with the KV segments and lengths read on
// the device from d_layer / d_lens. The launch shape depends only on max_keys and s, so
// one captured graph serves every length 1 <= d_lens->n_keys <= max_keys and any
// trunk/tail. Scratch: cuda_attention_scratch_bytes(ctx, max_keys, s). last_scores as
// in cuda_attention (rows are n_keys long, n_keys read on the device).
int cuda_attention_decode_dev(cuda_ctx *ctx, float *out, const float *q, const cuda_kv_layer *d_layer,
                              const cuda_kv_lens *d_lens, int max_keys, attn_shape s,
                              float *last_scores);
// cuda_attention_decode_dev for B sequences in one launch: row b's query q[b] (q, out:
// [B, n_heads * head_dim]) attends over its own segments d_layers[b] and lengths
// d_lens[b] (B consecutive records each). Row b's result equals a B == 1 call on its
// records. last_scores (optional): row b's capture at last_scores + b * n_heads *
// max_keys, laid out [n_heads, n_keys_b]. Scratch: cuda_attention_rows_scratch_bytes.
int cuda_attention_decode_rows(cuda_ctx *ctx, float *out, const float *q, const cuda_kv_layer *d_layers,
                               const cuda_kv_lens *d_lens, int B, int max_keys, attn_shape s,
                               float *last_scores);
// The step's RoPE and KV store for cuda_attention_decode_rows_rope (device pointers):
// k, v [B, kv_dim] as the qkv matvec wrote them, positions pos[B], cache rows rows[B]
// (relative to each record's k_dst / v_dst), the RoPE table (cuda_rope_table, covering
// every position), and Qwen3's per-head q_norm / k_norm ([head_dim] each, or both NULL).
typedef struct {
    const float *k, *v;
    const int *pos, *rows;
    const float *rope_tab, *q_norm, *k_norm;
    float eps;
} cuda_rope_kv;
// cuda_attention_decode_rows with cuda_rope_kv_store_rows fused in (rk NULL: without):
// q is the raw query [B, n_heads*hd], rotated in each split block's shared memory (q
// itself is not written); the block holding the newest key rotates it and stores it and
// the value in the cache. Results: the same bits as cuda_rope_kv_store_rows then
// cuda_attention_decode_rows, in one launch instead of two.
int cuda_attention_decode_rows_rope(cuda_ctx *ctx, float *out, const float *q, const cuda_rope_kv *rk,
                                    const cuda_kv_layer *d_layers, const cuda_kv_lens *d_lens, int B,
                                    int max_keys, attn_shape s, float *last_scores);
// 0 if the attention kernels support shape s (head_dim even and <= 512, GQA group fits
// the decode kernel's shared memory); -1 with ctx->err otherwise. For early errors.
int cuda_attention_validate(cuda_ctx *ctx, attn_shape s);
// One-pass softmax statistics of logits[rows, n]: out[rows, 4] = {max, lse (nats),
// entropy (bits), varentropy (bits^2)}.
int cuda_vocab_stats(cuda_ctx *ctx, float *out, const float *logits, int rows, int n);
// out[rows] = argmax of logits[rows, n] (first index on ties; NaN never wins).
int cuda_argmax(cuda_ctx *ctx, int *out, const float *logits, int rows, int n);
// cpu_sample on the device (three launches, kernels/cuda/sample.cu): out and cfg are
// device arrays [n_cfg], so a caller uploads the configurations (uniforms included)
// and downloads the results around it. Same tokens as cpu_sample.
int cuda_sample(cuda_ctx *ctx, sample_out *out, const float *logits, int n, const sample_cfg *cfg, int n_cfg);
// One draw from each row of logits [rows, ld] (row r's n logits at logits + r * ld, ld >= n)
// with cfg[r] into out[r]: row r's token is cuda_sample's (and cpu_sample's) on that row.
int cuda_sample_rows(cuda_ctx *ctx, sample_out *out, const float *logits, size_t ld, int n, const sample_cfg *cfg,
                     int rows);
// The greedy draw of a matvec's argmax epilogue (cuda_mv_fuse.amax over logits[n]): out
// as cuda_sample writes a greedy draw (token, 1 kept, its logit; token 0 when every
// logit was NaN), and *amax zeroed for the next step. One launch of one thread.
int cuda_argmax_finish(cuda_ctx *ctx, sample_out *out, const float *logits, unsigned long long *amax);
// The device decode loop's two launches of one thread each (kernels/cuda/loop.cu), the
// twins of cpu_loop_advance and cpu_loop_pick; every pointer is device memory (lens:
// the step block's record 0).
int cuda_loop_advance(cuda_ctx *ctx, loop_state *st, loop_entry *ring, const sample_out *draw, const float *vstats,
                      const float *astats, cuda_kv_lens *lens, int *ids, int *pos, int *rows);
int cuda_loop_pick(cuda_ctx *ctx, sample_cfg *out, const sample_cfg *cfgs, const loop_state *st);
// Room for cuda_sample's arrays (26 bytes per token and 40 KiB per configuration): call at
// setup, not per token, since growing them frees and allocates device memory, which
// waits for the device (other streams' collectives included). A draw with more
// configurations than reserved grows them then, so a draw captured into a graph after
// it allocates nothing.
int cuda_reserve_sample(cuda_ctx *ctx, int n, int n_cfg);
// The entropix decision on the device (kernels/entropix_core.h) from a step's logit
// stats {max, lse, H, V} and attention stats, into k >= 1 draw configurations cfg
// (device arrays, as c, the peeked uniforms u[k] and tokens {prev_token, clarifier}:
// read when the kernel runs, so a captured graph replays with new values): the step's
// draws, then argmax fillers. One launch; the same parameters as the host's
// entropix_decide.
struct entropix_config_s;
int cuda_entropix_arm(cuda_ctx *ctx, sample_cfg *cfg, int k, const float *logit_stats, const float *attn_stats,
                      const struct entropix_config_s *c, const double *u, const int *tokens);

// ---- the persistent decode kernel (kernels/cuda/persist.cu, docs/cuda.md) -------------
// One cooperative launch for a whole one-row decode step: the embedding, every layer
// and the lm_head, its blocks co-resident and passing work along by dataflow counters
// (release/acquire at GPU scope) instead of grid barriers. Each phase's rows and
// attention splits are computed by the same device functions as the graph path's
// kernels (kernels/cuda/matvec.cuh, attention_decode.cuh), so the logits are the same
// bits whichever path runs. Its CPU twin is the CPU forward (model/forward.c).

// One layer's device pointers (matrices of type cuda_persist_plan.wt, the rest f32).
typedef struct {
    const void *wqkv, *wo, *w_gu, *w_down;
    const float *attn_norm, *ffn_norm;
    const float *bqkv;              // NULL: no qkv bias
    const float *q_norm, *k_norm;   // NULL unless Qwen3
} cuda_persist_layer;

typedef struct {
    int n_layers, dim, n_heads, n_kv, head_dim, hidden, vocab;
    float eps, scale;
    int wt;                                  // WT_BF16 or WT_F16: every matrix
    const void *embed, *lm_head;
    const float *final_norm;
    const float *rope_tab;                   // device [max_ctx, head_dim/2, 2] (cuda_rope_table)
    const cuda_persist_layer *layers;        // device [n_layers]
    const int *ids, *pos, *rows;             // device: the step's token, position, cache row (row 0)
    const cuda_kv_layer *kv;                 // device: layer l's record at kv[l * kv_stride]
    int kv_stride;
    const cuda_kv_lens *lens;                // device: row 0's key counts
    float *x, *qkv, *att, *hb, *logits;      // activations [dim], [q+2kv], [q_dim], [hidden], [vocab]
    float *scores;                           // layer `cap`'s attention capture [n_heads, n_keys] (NULL: none)
    int cap;
    int max_ctx;                             // the attention's split count is the graph path's for it
    unsigned long long *argmax;              // device: the greedy token, packed (NULL: none; cuda_persist_token)
    sample_out *draw;                        // device: the greedy draw as cuda_sample writes it (NULL: none)
    unsigned *ctr;                           // device [cuda_persist_counters], zero before the first launch
    int grid;                                // blocks (0: as many as the device holds at once)
    int ring;                                // the weight ring's bytes a block (-1: as many as fit; 0: none)
    int min_blocks;                          // blocks an SM: 3 (168 registers a thread; 0: 3) or 4 (128)
    int sleep_ns;                            // a counter wait's pause between polls (0: none)
    int stage;                               // a phase's input staged in shared memory, a block at a
                                             // time, where it fits (nonzero), or read through L2 by
                                             // every warp (0)
    int ahead;                               // a staged phase's warps copy the next unit's first
                                             // weights into the ring while one runs (nonzero), or
                                             // only the first unit's, before the wait (0)
    unsigned long long *trace;               // device [cuda_persist_trace_len]: each phase's stamps
                                             // (NULL: none; cuda_persist_trace_len says where)
} cuda_persist_plan;

// What the device fits of a plan (cuda_persist_check): the co-resident blocks, the weight
// ring's bytes a block, and the floats of a phase's input a block stages (0: none; the
// phases whose input is longer read it through L2).
typedef struct {
    int grid, ring, stage;
} cuda_persist_fit;

// Counters the plan needs (each launch leaves them at zero for the next).
size_t cuda_persist_counters(const cuda_persist_plan *p);
// The phase trace (plan.trace, docs/cuda.md "The phase trace"): phases 0 (the embedding),
// 1 + 5l + k (layer l's qkv, attention, o, gate|up, down: k = 0..4) and 5 n_layers + 1
// (the lm_head). The first grid words are the blocks' scratch; then for phase ph and
// block b, trace[grid + (ph * grid + b) * 3 + i] holds %globaltimer (ns) as thread 0
// saw it at the phase's entry (i = 0), after its first counter wait of the phase (1; 0
// when it waited for none) and at its exit (2: warp 0's units done). Every launch
// rewrites every word of its grid.
int cuda_persist_trace_phases(const cuda_persist_plan *p);
size_t cuda_persist_trace_len(const cuda_persist_plan *p, int grid);
// The shape checks (-1 with ctx->err saying why the step falls back to the graph path),
// and what fits: the grid (the co-resident block count, at most p->grid when set), the
// staged input (the longest of dim, q_dim and hidden, else of dim and q_dim, that fits
// an SM's share; docs/cuda.md) and the weight ring's bytes a block (p->ring, or as many
// as fit beside the attention's shared memory or the staged input, whichever is larger).
int cuda_persist_check(cuda_ctx *ctx, const cuda_persist_plan *p, cuda_persist_fit *fit);
// Queues the step on ctx->stream (one launch; ctx->scratch holds the attention partials,
// ctx->att_count the combine counters, as for cuda_attention_decode_rows). fit: what
// cuda_persist_check gave for this plan (model/cuda/persist.c checks once for each
// setting, not once a step).
int cuda_decode_persistent(cuda_ctx *ctx, const cuda_persist_plan *p, const cuda_persist_fit *fit);
// The greedy token of a packed argmax (first index on ties, NaN never wins); -1 when
// every logit was NaN.
static inline int cuda_persist_token(unsigned long long key) {
    return key ? (int)(0xffffffffu - (unsigned)(key & 0xffffffffu)) : -1;
}

// ---- a paged KV pool on the device (kernels/cuda/attention_paged.cu) --------------------
// The device twin of model/kv_pool.h: bf16 rows [n_blocks << shift, kv_dim] for keys and
// values; row b of a batch maps its position j to pool row (tables[b][j >> shift] << shift)
// + (j & (2^shift - 1)). Everything a step changes is read on the device, so one graph
// per row bucket replays for any lengths and tables.
typedef struct {
    void *k_pool, *v_pool;  // device bf16 [n_blocks << shift, kv_dim]
    const int *tables;      // device int [B, table_stride]: physical block of each logical block
    const int *lens;        // device int [B]: keys of row b, its newest included; 0: a padding row
    int table_stride;       // blocks per table (table_stride << shift >= max_keys)
    int shift;              // log2 of the positions per block
    int max_keys;           // the longest row the launch supports
} cuda_paged_kv;
// The rows of a padded decode step of more than 8 live sequences: multiples of 16 (8
// for 8 or fewer), so graphs are captured per bucket (model/cuda/forward.c: up to 8
// rows run unpadded) and the batched kernels work in tiles of 8.
int cuda_row_bucket(int rows);
// Row b's fp32 k[b], v[b] ([B, kv_dim]) stored as bf16 at its position pos[b] (device
// int [B]) through its table; padding rows store nothing.
int cuda_kv_store_paged(cuda_ctx *ctx, const cuda_paged_kv *pk, const float *k, const float *v, const int *pos,
                        int B, int kv_dim);
// Decode attention of B rows (q, out: [B, n_heads * head_dim]) over the paged pool, as
// cpu_attention_paged on each row (within the decode tolerance); padding rows give
// zeros. last_scores (optional): row b's scaled scores at last_scores + b * n_heads *
// max_keys, laid out [n_heads, n_keys_b]. Scratch: cuda_attention_paged_scratch_bytes.
int cuda_attention_decode_paged(cuda_ctx *ctx, float *out, const float *q, const cuda_paged_kv *pk, int B,
                                attn_shape s, float *last_scores);
size_t cuda_attention_paged_scratch_bytes(int max_keys, attn_shape s, int B);

#ifdef __cplusplus
}
#endif
#endif
