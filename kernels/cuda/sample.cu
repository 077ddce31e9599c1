// sample.cu: exact sampling on the device, one block per configuration, all from the
// same row of logits in one launch (the agents draw 8+ configurations per step).
//
// Each block: argmax, then the candidates (fixed-point mass q > 0, passing min-p) go to
// shared memory when they fit (up to 12288, as the device's opt-in shared memory
// allows), else every later pass re-reads the row and recomputes the masses.
// Top-k, top-p and the draw are each "the smallest key whose cumulative weight reaches a
// target", found by a radix descent over the 64-bit sort key, 8 bits per pass, stopping
// early once the chosen bucket holds one candidate. Histograms sum integers, so every
// result is exact and independent of thread order: the same as the CPU twin
// (kernels/cpu/sample.c), which sorts instead. kernels/sample_core.h has the arithmetic.
#include "kernels/cuda/common.cuh"
#include "kernels/sample_core.h"

#define SAMPLE_THREADS 1024
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

// Where the candidates come from: the shared list, or recomputed from the row.
struct cand_src {
    const float *x;
    int n;
    float mx, min_p;
    double inv_t;
    const u64 *keys, *qs;  // shared list [m]
    int m, shared;
};

__device__ __forceinline__ int cand_limit(const cand_src &s) { return s.shared ? s.m : s.n; }

// Element i: whether it is a candidate, and its key and mass.
__device__ __forceinline__ bool cand_get(const cand_src &s, int i, u64 &key, u64 &q) {
    if (s.shared) {
        if (i >= s.m) return false;
        key = s.keys[i], q = s.qs[i];
        return true;
    }
    if (i >= s.n) return false;
    float xi = s.x[i];
    double d = sample_logp(xi, s.mx, s.inv_t), p = exp(d);
    q = sample_q(p);
    if (q == 0 || (s.min_p > 0 && !(p >= (double)s.min_p) && d != 0)) return false;
    key = sample_key(xi, i);
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
    int lim = cand_limit(s);
    for (int i = threadIdx.x; i < lim; i += blockDim.x) {
        u64 key = 0, q = 0;
        if (!cand_get(s, i, key, q) || key > cut) continue;
        double d = sample_logp(s.x[sample_key_id(key)], s.mx, s.inv_t);
        c++, qs += q, es += sample_e(exp(d), d);
    }
    *cnt = block_sum(c, sh.red);
    *Q = block_sum(qs, sh.red);
    *E = block_sum(es, sh.red);
}

// Candidates into the shared list (warp-aggregated slots); returns their count, which
// may exceed cap (then the list is incomplete and unused).
__device__ int gather(sample_sh &sh, const cand_src &s, u64 *keys, u64 *qs, int cap) {
    int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) sh.m = 0;
    __syncthreads();
    for (int base = 0; base < s.n; base += blockDim.x) {
        u64 key = 0, q = 0;
        bool on = cand_get(s, base + threadIdx.x, key, q);
        unsigned bal = __ballot_sync(0xffffffffu, on);
        int slot = 0;
        if (lane == 0 && bal) slot = atomicAdd(&sh.m, __popc(bal));
        slot = __shfl_sync(0xffffffffu, slot, 0) + __popc(bal & ((1u << lane) - 1));
        if (on && slot < cap) keys[slot] = key, qs[slot] = q;
    }
    __syncthreads();
    return sh.m;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(sample_out *out, const float *x, int n, const sample_cfg *cfgs, int cap) {
    extern __shared__ u64 dyn[];  // keys[cap], masses[cap]
    __shared__ sample_sh sh;
    const sample_cfg cfg = cfgs[blockIdx.x];
    sample_out *o = out + blockIdx.x;
    int am = block_argmax(x, n, sh.redf, sh.redi);
    float mx = x[am];
    cand_src s = { x, n, mx, cfg.min_p, 1.0 / (double)cfg.temperature, dyn, dyn + cap, 0, 0 };
    int m = 0;
    if (cfg.temperature > 0 && isfinite(mx)) m = gather(sh, s, dyn, dyn + cap, cap);
    if (m == 0) {  // greedy, or no finite logit
        if (threadIdx.x == 0) *o = sample_out{ am, 1, x[am], 0.f, 0.0 };
        return;
    }
    s.m = m, s.shared = m <= cap;
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

extern "C" int cuda_sample(cuda_ctx *ctx, sample_out *out, const float *logits, int n, const sample_cfg *cfg,
                           int n_cfg) {
    CUDA_REQUIRE(ctx, n > 0 && n <= SAMPLE_MAX_VOCAB && n_cfg >= 0, "cuda_sample: bad shape n=%d n_cfg=%d", n,
                 n_cfg);
    if (n_cfg == 0) return 0;
    // The device's limit was read at init and the kernel's attribute is raised once per
    // context: no driver query on the per-token path.
    int cap = (ctx->smem_optin - (int)sizeof(sample_sh) - 1024) / (int)(2 * sizeof(u64));
    if (cap > SAMPLE_CAP_MAX) cap = SAMPLE_CAP_MAX;
    if (cap < 0) cap = 0;  // every pass then reads the row
    size_t smem = (size_t)cap * 2 * sizeof(u64);
    if (ctx->sample_smem != (int)smem) {
        CUDA_CHECK(ctx, cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ctx->sample_smem = (int)smem;
    }
    sample_kernel<<<n_cfg, SAMPLE_THREADS, smem, ctx->stream>>>(out, logits, n, cfg, cap);
    CUDA_CHECK_LAUNCH(ctx, "sample_kernel");
    return 0;
}
