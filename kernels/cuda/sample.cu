// sample.cu: exact sampling on the device, any number of configurations drawn from the
// same row of logits (the agents draw 8+ per step), in three launches:
//   1. argmax partials, one block per SAMPLE_CHUNK tokens;
//   2. each configuration's candidates (fixed-point mass q > 0, passing min-p) with
//      their keys, masses and entropy terms, computed once per token by many blocks
//      and compacted into global arrays;
//   3. one block per configuration searches its array (copied to shared memory when it
//      fits, up to 12288, as the device's opt-in shared memory allows): no pass
//      re-reads the row or recomputes an exp.
// Top-k, top-p and the draw are each "the smallest key whose cumulative weight reaches a
// target", found by a radix descent over the 64-bit sort key, 8 bits per pass, stopping
// early once the chosen bucket holds one candidate. Histograms sum integers, so every
// result is exact and independent of thread order: the same as the CPU twin
// (kernels/cpu/sample.c), which sorts instead. kernels/sample_core.h has the arithmetic.
#include "kernels/cuda/common.cuh"
#include "kernels/sample_core.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_PREP_THREADS 256
#define SAMPLE_CHUNK 4096     // tokens per block of the argmax and mass passes
#define SAMPLE_CAP_MAX 12288  // shared candidates, 16 bytes each (key, mass): 192 KiB

typedef unsigned long long u64;

struct sample_sh {
    u64 hw[256];       // histogram: weight per digit
    unsigned hc[256];  // histogram: candidates per digit
    u64 red[32];
    float redf[33];
    int redi[33];
    u64 prefix, below, key;  // radix descent state, fetched key
    int single, m;
};

// The candidates of one configuration (sample_mass_kernel's compacted arrays, in no
// particular order: every result below is an integer sum or a key comparison, which do
// not depend on it): keys and masses in shared memory when they fit, else in global
// memory; the entropy terms always in global memory (read once or twice per draw).
struct cand_src {
    const u64 *keys, *qs, *es;  // [m]
    int m;
};

__device__ __forceinline__ int cand_limit(const cand_src &s) { return s.m; }

// Element i: whether it is a candidate, and its key and mass.
__device__ __forceinline__ bool cand_get(const cand_src &s, int i, u64 &key, u64 &q) {
    if (i >= s.m) return false;
    key = s.keys[i], q = s.qs[i];
    return true;
}

// Adds w to bucket b for the lanes with on set. Lanes sharing a bucket are summed
// first (one shared atomic per bucket per warp): the top digits of nearby logits
// coincide, and per-lane atomics on one address would serialise the whole row.
// w < 2^45, so its 22-bit halves sum over 32 lanes without overflow.
__device__ __forceinline__ void hist_add(sample_sh &sh, bool on, unsigned b, u64 w) {
    unsigned act = __ballot_sync(0xffffffffu, on);
    if (!on) return;
    unsigned grp = __match_any_sync(act, b);
    unsigned lo = __reduce_add_sync(grp, (unsigned)(w & 0x3fffffu));
    unsigned hi = __reduce_add_sync(grp, (unsigned)(w >> 22));
    if ((int)(threadIdx.x & 31) == __ffs(grp) - 1) {
        atomicAdd(&sh.hw[b], ((u64)hi << 22) + lo);
        atomicAdd(&sh.hc[b], (unsigned)__popc(grp));
    }
}

// Warp 0: the first bucket where the cumulative weight reaches target; extends the
// prefix by it at digit position d.
__device__ void pick_bucket(sample_sh &sh, int d, u64 target) {
    int lane = threadIdx.x;
    u64 below = sh.below, sum = 0;
    for (int j = 0; j < 8; j++) sum += sh.hw[lane * 8 + j];
    u64 incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64 v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    unsigned hit = __ballot_sync(0xffffffffu, below + incl >= target);
    int f = hit ? __ffs(hit) - 1 : 31;  // target <= total weight, so hit != 0
    if (lane != f) return;
    u64 acc = below + incl - sum;
    int b = lane * 8;
    for (int j = 0; j < 7 && acc + sh.hw[b] < target; j++) acc += sh.hw[b++];
    sh.prefix |= (u64)b << d;
    sh.below = acc;
    sh.single = sh.hc[b] == 1;
}

// The smallest candidate key k <= cut at which the cumulative weight of candidates
// (1 each, or their mass) reaches target. Every thread gets it.
__device__ u64 radix_find(sample_sh &sh, const cand_src &s, u64 cut, bool by_mass, u64 target) {
    int tid = threadIdx.x, lim = cand_limit(s), d = 56;
    if (tid == 0) sh.prefix = 0, sh.below = 0, sh.single = 0;
    for (;; d -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) sh.hw[b] = 0, sh.hc[b] = 0;
        __syncthreads();
        u64 prefix = sh.prefix;
        for (int base = 0; base < lim; base += blockDim.x) {
            u64 key = 0, q = 0;
            bool on = cand_get(s, base + tid, key, q) && key <= cut &&
                      (d == 56 || (key >> (d + 8)) == (prefix >> (d + 8)));
            hist_add(sh, on, (unsigned)(key >> d) & 255u, by_mass ? q : 1);
        }
        __syncthreads();
        if (tid < 32) pick_bucket(sh, d, target);
        __syncthreads();
        if (sh.single || d == 0) break;
    }
    u64 prefix = sh.prefix;
    if (d > 0) {  // one candidate left in the bucket: fetch its full key
        for (int base = 0; base < lim; base += blockDim.x) {
            u64 key = 0, q = 0;
            if (cand_get(s, base + tid, key, q) && key <= cut && (key >> d) == (prefix >> d)) sh.key = key;
        }
        __syncthreads();
        prefix = sh.key;
    }
    __syncthreads();  // sh is reused by the caller's next step
    return prefix;
}

// Count, mass and entropy term of the candidates with key <= cut.
__device__ void cand_sums(sample_sh &sh, const cand_src &s, u64 cut, u64 *cnt, u64 *Q, u64 *E) {
    u64 c = 0, qs = 0, es = 0;
    for (int i = threadIdx.x; i < s.m; i += blockDim.x) {
        u64 key = 0, q = 0;
        if (!cand_get(s, i, key, q) || key > cut) continue;
        c++, qs += q, es += s.es[i];
    }
    *cnt = block_sum(c, sh.red);
    *Q = block_sum(qs, sh.red);
    *E = block_sum(es, sh.red);
}

// ---- the row's pass: argmax partials, then each token's key and masses once ----------
// (v, i) pairs: the largest value, the first index on ties, NaN never wins; every
// thread gets the winner's index (0 when every value is NaN, as block_argmax).
__device__ int block_amax_pairs(const float *pv, const int *pi, int np, float *sv, int *si) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < np; i += blockDim.x) amax_merge(bv, bi, pv[i], pi[i]);
    return block_amax_finish(bv, bi, sv, si);
}

// Block b: the argmax of tokens [b * SAMPLE_CHUNK, ...) as a partial; block 0 also
// clears the configurations' candidate counters for the mass pass that follows.
__global__ void __launch_bounds__(SAMPLE_PREP_THREADS)
    sample_argmax_kernel(const float *x, int n, float *part_v, int *part_i, unsigned *count, int n_cfg) {
    __shared__ float sv[33];
    __shared__ int si[33];
    int base = blockIdx.x * SAMPLE_CHUNK, len = n - base < SAMPLE_CHUNK ? n - base : SAMPLE_CHUNK;
    int i = base + block_argmax(x + base, len, sv, si);
    if (threadIdx.x == 0) part_v[blockIdx.x] = x[i], part_i[blockIdx.x] = i;
    if (blockIdx.x == 0)
        for (int c = threadIdx.x; c < n_cfg; c += blockDim.x) count[c] = 0;
}

// Block (b, c): configuration c's candidates among tokens [b * SAMPLE_CHUNK, ...), each
// token's key, mass and entropy term computed once (one double exp), appended to c's
// arrays at warp-aggregated slots. Greedy configurations and rows with no finite
// maximum have none (the draw kernel takes the argmax).
__global__ void __launch_bounds__(SAMPLE_PREP_THREADS)
    sample_mass_kernel(const float *x, int n, const float *part_v, const int *part_i, int nb, const sample_cfg *cfgs,
                       unsigned *count, u64 *keys, u64 *qs, u64 *es) {
    __shared__ float sv[33];
    __shared__ int si[33];
    const sample_cfg cfg = cfgs[blockIdx.y];
    float mx = x[block_amax_pairs(part_v, part_i, nb, sv, si)];
    if (!(cfg.temperature > 0) || !isfinite(mx)) return;
    size_t off = (size_t)blockIdx.y * n;
    double inv_t = 1.0 / (double)cfg.temperature;
    int base = blockIdx.x * SAMPLE_CHUNK, end = base + SAMPLE_CHUNK < n ? base + SAMPLE_CHUNK : n;
    int lane = threadIdx.x & 31;
    for (int i0 = base; i0 < end; i0 += blockDim.x) {  // every lane of a warp takes part in the ballot
        int i = i0 + threadIdx.x;
        double d = 0, p = 0;
        u64 q = 0;
        if (i < end) {
            d = sample_logp(x[i], mx, inv_t);
            p = exp(d);
            q = sample_q(p);
        }
        bool on = q != 0 && !(cfg.min_p > 0 && !(p >= (double)cfg.min_p) && d != 0);
        unsigned bal = __ballot_sync(0xffffffffu, on);
        unsigned slot = 0;
        if (lane == 0 && bal) slot = atomicAdd(&count[blockIdx.y], (unsigned)__popc(bal));
        slot = __shfl_sync(0xffffffffu, slot, 0) + __popc(bal & ((1u << lane) - 1));
        if (on) {
            keys[off + slot] = sample_key(x[i], i);
            qs[off + slot] = q;
            es[off + slot] = sample_e(p, d);
        }
    }
}

// One block per configuration: the truncations and the draw over its candidates.
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(sample_out *out, const float *x, const sample_cfg *cfgs, int cap, const float *part_v,
                  const int *part_i, int nb, const unsigned *count, const u64 *keys, const u64 *qs, const u64 *es,
                  int n) {
    extern __shared__ u64 dyn[];  // keys[cap], masses[cap]
    __shared__ sample_sh sh;
    const sample_cfg cfg = cfgs[blockIdx.x];
    sample_out *o = out + blockIdx.x;
    int am = block_amax_pairs(part_v, part_i, nb, sh.redf, sh.redi), m = (int)count[blockIdx.x];
    if (!(cfg.temperature > 0) || !isfinite(x[am]) || m == 0) {  // greedy, or no finite logit
        if (threadIdx.x == 0) *o = sample_out{ am, 1, x[am], 0.f, 0.0 };
        return;
    }
    size_t off = (size_t)blockIdx.x * n;
    cand_src s = { keys + off, qs + off, es + off, m };
    if (m <= cap) {  // the searches' passes then read shared memory
        for (int i = threadIdx.x; i < m; i += blockDim.x) dyn[i] = s.keys[i], dyn[cap + i] = s.qs[i];
        __syncthreads();
        s.keys = dyn, s.qs = dyn + cap;
    }
    u64 cut = ~0ull, cnt, Q, E;
    if (cfg.top_k > 0 && cfg.top_k < m) cut = radix_find(sh, s, cut, false, (u64)cfg.top_k);
    if (cfg.top_p < 1) {
        cand_sums(sh, s, cut, &cnt, &Q, &E);
        cut = radix_find(sh, s, cut, true, sample_top_p_target(cfg.top_p, Q));
    }
    cand_sums(sh, s, cut, &cnt, &Q, &E);
    u64 key = radix_find(sh, s, cut, true, sample_draw_target(cfg.u, Q));
    if (threadIdx.x == 0) {
        int id = sample_key_id(key);
        *o = sample_out{ id, (int)cnt, x[id], 0.f, sample_entropy_bits(Q, E) };
    }
}

// Candidates sample_kernel keeps in shared memory: what the device's opt-in limit (read
// at init) leaves after the kernel's own state, at most SAMPLE_CAP_MAX.
static int sample_cap(const cuda_ctx *ctx) {
    int cap = (ctx->smem_optin - (int)sizeof(sample_sh) - 1024) / (int)(2 * sizeof(u64));
    if (cap > SAMPLE_CAP_MAX) cap = SAMPLE_CAP_MAX;
    return cap < 0 ? 0 : cap;  // 0: every pass reads the global arrays
}

// Raises sample_kernel's dynamic shared memory limit once per context: no driver call on
// the per-token path, and none inside a graph capture once cuda_reserve_sample ran.
static int sample_attr(cuda_ctx *ctx) {
    int smem = sample_cap(ctx) * 2 * (int)sizeof(u64);
    if (ctx->sample_smem == smem) return 0;
    CUDA_CHECK(ctx, cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    ctx->sample_smem = smem;
    return 0;
}

static size_t sample_bytes(int n, int n_cfg, int nb) {
    return (size_t)nb * 8 + (size_t)n_cfg * 4 + 256 + (size_t)n_cfg * n * 24;
}

// The sampler's device arrays for n tokens and n_cfg configurations, grown (never
// shrunk) on the first call that needs more: argmax partials, counters, then per
// configuration n keys, masses and entropy terms.
static int sample_reserve(cuda_ctx *ctx, int n, int n_cfg, int nb) {
    size_t need = sample_bytes(n, n_cfg, nb);
    if (need <= ctx->sample_bytes) return 0;
    CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));  // queued draws may use the old arrays
    if (ctx->sample_buf) CUDA_CHECK(ctx, cudaFree(ctx->sample_buf));
    ctx->sample_buf = NULL;
    ctx->sample_bytes = 0;
    if (cuda_malloc(&ctx->sample_buf, need, "sampler candidates", &ctx->err)) return -1;
    ctx->sample_bytes = need;
    return 0;
}

extern "C" int cuda_reserve_sample(cuda_ctx *ctx, int n, int n_cfg) {
    CUDA_REQUIRE(ctx, n > 0 && n <= SAMPLE_MAX_VOCAB && n_cfg > 0 && n_cfg <= 65535,
                 "cuda_reserve_sample: bad shape n=%d n_cfg=%d", n, n_cfg);
    return sample_attr(ctx) || sample_reserve(ctx, n, n_cfg, (n + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK) ? -1 : 0;
}

__global__ void argmax_finish_kernel(sample_out *out, const float *logits, unsigned long long *amax) {
    pdl_trigger();
    pdl_wait();
    unsigned long long key = *amax;
    int tok = key ? (int)(0xffffffffu - (unsigned)(key & 0xffffffffu)) : 0;
    *out = sample_out{ tok, 1, logits[tok], 0.f, 0.0 };
    *amax = 0ull;
}

extern "C" int cuda_argmax_finish(cuda_ctx *ctx, sample_out *out, const float *logits, unsigned long long *amax) {
    CUDA_REQUIRE(ctx, out && logits && amax, "cuda_argmax_finish: NULL buffer");
    cudaError_t rc = LAUNCH_PDL(ctx, argmax_finish_kernel, dim3(1), dim3(1), 0, out, logits, amax);
    CUDA_CHECK_LAUNCH_RC(ctx, "argmax_finish_kernel", rc);
    return 0;
}

extern "C" int cuda_sample(cuda_ctx *ctx, sample_out *out, const float *logits, int n, const sample_cfg *cfg,
                           int n_cfg) {
    CUDA_REQUIRE(ctx, n > 0 && n <= SAMPLE_MAX_VOCAB && n_cfg >= 0 && n_cfg <= 65535,
                 "cuda_sample: bad shape n=%d n_cfg=%d", n, n_cfg);
    if (n_cfg == 0) return 0;
    int nb = (n + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK;
    if (sample_reserve(ctx, n, n_cfg, nb)) return -1;
    float *part_v = (float *)ctx->sample_buf;
    int *part_i = (int *)(part_v + nb);
    unsigned *count = (unsigned *)(part_i + nb);
    u64 *keys = (u64 *)(((uintptr_t)(count + n_cfg) + 255) & ~(uintptr_t)255);
    u64 *qs = keys + (size_t)n_cfg * n, *es = qs + (size_t)n_cfg * n;
    int cap = sample_cap(ctx);
    size_t smem = (size_t)cap * 2 * sizeof(u64);
    if (sample_attr(ctx)) return -1;  // a no-op after cuda_reserve_sample
    sample_argmax_kernel<<<nb, SAMPLE_PREP_THREADS, 0, ctx->stream>>>(logits, n, part_v, part_i, count, n_cfg);
    CUDA_CHECK_LAUNCH(ctx, "sample_argmax_kernel");
    sample_mass_kernel<<<dim3(nb, n_cfg), SAMPLE_PREP_THREADS, 0, ctx->stream>>>(logits, n, part_v, part_i, nb, cfg,
                                                                                   count, keys, qs, es);
    CUDA_CHECK_LAUNCH(ctx, "sample_mass_kernel");
    sample_kernel<<<n_cfg, SAMPLE_THREADS, smem, ctx->stream>>>(out, logits, cfg, cap, part_v, part_i, nb, count, keys,
                                                                qs, es, n);
    CUDA_CHECK_LAUNCH(ctx, "sample_kernel");
    return 0;
}
