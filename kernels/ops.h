// ops.h: the operator interface shared by the CPU (kernels/cpu) and CUDA
// (kernels/cuda) backends. Every op exists as cpu_<op> and cuda_<op> with the same
// arguments; CUDA variants take device pointers and a stream. Activations are fp32;
// weights stay in their stored dtype (F32, F16 or BF16) and are widened on the fly.
//
// Shapes are written [rows, cols], row-major. T is the number of tokens in the batch.
#ifndef VARENT_OPS_H
#define VARENT_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { WT_F32 = 0, WT_F16 = 1, WT_BF16 = 2 } wtype;

static inline size_t wtype_size(wtype t) { return t == WT_F32 ? 4 : 2; }
static inline const char *wtype_name(wtype t) {
    return t == WT_F32 ? "f32" : t == WT_F16 ? "f16" : "bf16";
}

// A weight tensor as the kernels see it: data in its stored dtype.
typedef struct {
    const void *data;
    wtype type;
} wref;

// The keys and values one attention call reads, as two segments: a shared trunk
// (positions 0..n_trunk-1) and an optional private tail (positions
// n_trunk..n_trunk+n_tail-1). Branches and agents share the prompt's trunk and keep
// only their own tail, so forking never copies the whole cache.
// Each buffer is [positions, n_kv_heads * head_dim] fp32 (CPU) or bf16 (CUDA).
typedef struct {
    const void *k_trunk, *v_trunk;
    int n_trunk;
    const void *k_tail, *v_tail;  // may be NULL when n_tail == 0
    int n_tail;
    int bf16;  // CPU: the rows are bf16 (a --kv-type bf16 cache), widened as they are read
} kv_span;

// CPU: a paged trunk (model/kv_pool.h) is read through its block table: position j is
// row (blocks[j >> shift] << shift) + (j & (2^shift - 1)) of k_trunk / v_trunk.
typedef struct {
    const int *blocks;  // the physical block of each logical block; NULL: contiguous rows
    int shift;          // log2 of the positions per block
} kv_pages;

// Attention geometry for one layer.
typedef struct {
    int n_heads, n_kv_heads, head_dim;
    float scale;  // 1/sqrt(head_dim)
} attn_shape;

// ---- CPU backend (kernels/cpu) -------------------------------------------------

// Set how many threads the CPU kernels use (0 = all cores). Returns the count in use.
int cpu_set_threads(int n);

// The instruction-set level of the CPU kernels (kernels/cpu/cpu_isa.c), chosen at run
// time: the best the CPU has, or lower through VARENT_CPU_ISA=generic|avx2|avx512|
// avx512bf16 or cpu_isa_set (tests force each path; a level above the CPU's is refused).
typedef enum { CPU_ISA_GENERIC = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2, CPU_ISA_AVX512BF16 = 3 } cpu_isa;
cpu_isa cpu_isa_best(void);
cpu_isa cpu_isa_active(void);
int cpu_isa_set(cpu_isa isa);            // 0, or -1 when the CPU lacks that level
int cpu_isa_parse(const char *name);     // the level named, or -1
const char *cpu_isa_name(cpu_isa isa);

// out[T, dim] = table[ids[t], :]
void cpu_embed(float *out, wref table, const int *ids, int T, int dim);
// out[T, dim] = x / rms(x) * w   (in-place allowed: out == x)
void cpu_rmsnorm(float *out, const float *x, wref w, int T, int dim, float eps);
// out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T   (fp32 accumulation)
void cpu_matmul(float *out, const float *x, wref w, int T, int n_in, int n_out);
// The same product where each row must be summed exactly as cpu_matmul sums one row
// alone (T == 1), whatever T: the rows of a decode batch (forward_batch), so batching
// changes no bit. Each weight block is still read from memory once for all T rows.
void cpu_matmul_rows(float *out, const float *x, wref w, int T, int n_in, int n_out);
// The same product for many tokens (prefill; cpu_matmul calls it for T > 8): packed
// weight panels reused across token tiles, micro-kernels of the active ISA. Returns -1
// (out incomplete) only when its scratch cannot be allocated.
int cpu_gemm(float *out, const float *x, wref w, int T, int n_in, int n_out);
// bf16 weights on AVX512_BF16: round the inputs x to bf16 too and use vdpbf16ps (as
// llama.cpp does; about 1.5x the fp32 FMA rate, inputs with 8 mantissa bits). Off by
// default (`--gemm-inputs bf16`, or VARENT_CPU_GEMM=bf16, turns it on): with fp32 inputs the logits stay within
// 1e-4 of the fp32 reference; bf16 inputs moved them by 0.5-0.9% of their range on the
// tiny test models (tests/py/test_logits_reference.py).
void cpu_set_gemm_bf16_inputs(int on);
int cpu_gemm_bf16_inputs(void);
// x[T, n] += b[n]
void cpu_add_bias(float *x, wref b, int T, int n);
// Rotary embedding in place on x[T, n_heads, head_dim] at positions pos[t].
// inv_freq[head_dim/2] already includes any frequency scaling (llama3).
// interleaved=0: HF rotate-half pairs (i, i+hd/2); 1: adjacent pairs (2i, 2i+1).
void cpu_rope(float *x, const int *pos, int T, int n_heads, int head_dim,
              const float *inv_freq, int interleaved);
// The RoPE table of positions [0, n_pos): tab[p][i] = (cos, sin) of the fp32 angle
// p * inv_freq[i], i < half (cpu_rope's angles), as [n_pos, half, 2] floats.
void cpu_rope_table(float *tab, const float *inv_freq, int half, int n_pos);
// Causal GQA attention. q[T, n_heads*hd] holds queries at positions
// kv.n_trunk + kv.n_tail - T + t (the newest T positions, already in kv).
// out[T, n_heads*hd]. If last_scores != NULL it receives the scaled pre-softmax
// scores of the last query, [n_heads, n_keys] with n_keys = n_trunk + n_tail.
void cpu_attention(float *out, const float *q, kv_span kv, int T, attn_shape s,
                   float *last_scores);
// The same over a paged trunk: the rows are read through pg's block table, and the
// result is bit for bit that of the same rows stored contiguously.
void cpu_attention_paged(float *out, const float *q, kv_span kv, kv_pages pg, int T, attn_shape s,
                         float *last_scores);
// B sequences' decode rows in one call: row b (query q + b * n_heads * head_dim, output
// likewise) attends over kv[b] / pg[b] with its capture at last_scores[b] (last_scores or
// an entry NULL: none), the bits of cpu_attention_paged with T = 1 on that row, with
// every row's work in one parallel region.
void cpu_attention_rows(float *out, const float *q, const kv_span *kv, const kv_pages *pg, int B, attn_shape s,
                        float *const *last_scores);
// Entropix's attention metrics of one query's scaled scores[n_heads, n_keys] (filled
// keys only), in double, logs base 2: out4 = {attn_entropy, attn_varentropy (population,
// over heads), agreement, interaction_strength}; zeros when n_keys == 0. ws: scratch of
// n_keys + 2 * n_heads doubles. Formulas: docs/entropix.md.
void cpu_attn_stats(double out4[4], const float *scores, int n_heads, int n_keys, double *ws);
// out[n] = silu(gate[n]) * up[n]   (in-place allowed: out == gate)
void cpu_swiglu(float *out, const float *gate, const float *up, size_t n);
// x[n] += y[n]
void cpu_add(float *x, const float *y, size_t n);
// x[n] += s * y[n] (a LoRA delta joining its projection's output)
void cpu_add_scaled(float *x, const float *y, float s, size_t n);

// ---- exact sampling, many configurations from one row of logits ------------------
// A sampler's parameters (host/runtime/sampler.h; entropix picks them per step).
typedef struct {
    float temperature;  // 0: greedy argmax
    int top_k;          // 0: off
    float top_p;        // 1: off
    float min_p;        // 0: off
} sampler_params;

// One draw: temperature (<= 0: argmax), then min-p, top-k and top-p truncation (each
// off at 0, 0 and >= 1), then an exact categorical draw with uniform u in [0, 1).
// kernels/sample_core.h defines the arithmetic (fixed-point masses) both backends share.
typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    double u;
} sample_cfg;

typedef struct {
    int token;       // the drawn id
    int n_kept;      // candidates left after the truncations
    float logit;     // raw logits[token]
    float pad_;
    double entropy;  // bits, of the kept candidates renormalised (0 for argmax)
} sample_out;

// out[c] for each cfg[c], all from logits[n] (n <= 2^19). Returns -1 on bad arguments.
int cpu_sample(sample_out *out, const float *logits, int n, const sample_cfg *cfg, int n_cfg);

// The device decode loop (model/cuda/loop.c, docs/cuda.md "The device decode loop"): the
// loop's state on the device and one ring entry per step, which the host reads a few
// steps behind. The step block's token, position, cache row and key counts advance on
// the device (cpu_loop_advance / cuda_loop_advance), so steps queue without the host.
typedef struct {
    int step;    // steps run so far: the next writes ring slot step % depth
    int depth;   // ring slots (1..CUDA_LOOP_DEPTH)
    int tail;    // the view has a tail: the trunk's key count stays put
    int pad_;
} loop_state;

typedef struct {
    int token;       // the step's draw: the token the next step feeds
    int pos;         // the position that token will occupy
    float logit;     // its raw logit
    float stats[8];  // the capture layer's statistics {max, lse, H, V, attention 4} (0: none)
    int pad_;
} loop_entry;

// One step's bookkeeping, after its draw: ring[st->step % depth] = the draw (pos: pos[0]
// + 1) with the statistics vstats[4], astats[4] (NULL: zeros); then ids[0] = the token,
// pos[0], rows[0] and lens {n_trunk, n_keys} one further (n_trunk only without a tail),
// st->step + 1. The CPU twin of cuda_loop_advance.
void cpu_loop_advance(loop_state *st, loop_entry *ring, const sample_out *draw, const float *vstats,
                      const float *astats, int lens[2], int *ids, int *pos, int *rows);
// *out = cfgs[st->step % st->depth]: the step's draw configuration from a ring the host
// fills ahead. The CPU twin of cuda_loop_pick.
void cpu_loop_pick(sample_cfg *out, const sample_cfg *cfgs, const loop_state *st);

// The sum of a buffer's 32-bit little-endian words, the last one zero-padded: the
// read-bandwidth probe's result (cuda_read_probe), nothing the forward uses.
uint32_t cpu_read_checksum(const void *p, size_t bytes);

// Numeric conversions shared by loaders and kernels.
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
static inline uint16_t f32_to_bf16(float f) {  // round to nearest even
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);  // NaN
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1)) >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// ---- CUDA backend (kernels/cuda): same ops on device pointers ---------------------
#ifdef VARENT_CUDA
#include "kernels/ops_cuda.h"
#endif

#endif
