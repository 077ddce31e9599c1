// sample.cu: exact sampling on the device, any number of configurations drawn from the
// same row of logits (the agents draw 8+ per step), or one from each row of a batch
// (cuda_sample_rows: the scheduler's rows), in three launches, the first two spread over
// the whole GPU:
//   1. sample_argmax_kernel: argmax and finite-minimum partials, one block per 1024
//      tokens; it also clears the histograms the next launch fills;
//   2. sample_mass_kernel, (2048-token chunks x configurations): every token's mass once
//      (one double exp); the candidates (q > 0, passing min-p) are counted into
//      SAMPLE_BUCKETS buckets of (x - max) / T, with their integer masses and entropy
//      terms, and each token's bucket is stored (2 bytes);
//   3. sample_kernel, one block per configuration: top-k, top-p and the draw are each
//      "the smallest key whose cumulative weight reaches a target". A prefix sum over
//      the histogram finds the bucket it lies in; one pass over the 2-byte buckets
//      gathers that bucket's tokens (a few dozen on real and near-flat rows), which are
//      ranked in shared memory. A bucket of more than SAMPLE_SORT_MAX tokens (mass
//      ties) goes to a radix descent over the 64-bit key, 8 bits per pass.
// Buckets are monotone in the key (descending logit, then ascending id), so a bucket's
// tokens are a contiguous run of the CPU twin's sorted order. Every sum is an integer
// sum, exact in any order: the result is the same as the CPU twin's
// (kernels/cpu/sample.c), which sorts instead. kernels/sample_core.h has the arithmetic.
#include "kernels/cuda/common.cuh"
#include "kernels/sample_core.h"

#define SAMPLE_THREADS 1024       // sample_kernel's block
#define SAMPLE_PREP_THREADS 256   // the argmax and mass passes' blocks
#define SAMPLE_MAX_CHUNK 1024     // tokens per block of the argmax pass (4 per thread)
#define SAMPLE_MASS_CHUNK 2048    // tokens per block of the mass pass (8 per thread)
#define SAMPLE_BUCKETS 2048       // buckets per configuration (2 per sample_kernel thread)
#define SAMPLE_SORT_MAX 1024      // a bucket's tokens ranked in shared memory (1 per thread)
#define SAMPLE_NONE 0xffffu       // the bucket of a token that is not a candidate
#define SAMPLE_RANGE 31.0         // d = (x - max) / T of any candidate is above -31 (q > 0: d > -30.5)

typedef unsigned long long u64;

// One configuration's candidates by bucket: counts, 2^44-scaled masses and entropy terms.
struct sample_hist {
    unsigned cnt[SAMPLE_BUCKETS];
    u64 q[SAMPLE_BUCKETS], e[SAMPLE_BUCKETS];
};

// Bucket width: the row's candidate range, (max - min finite) / T capped at SAMPLE_RANGE,
// split in SAMPLE_BUCKETS, so near-flat rows spread over all buckets too. 0 (one bucket)
// for a row without spread.
__device__ __forceinline__ double sample_scale(float mx, float mn, double inv_t) {
    double r = ((double)mx - (double)mn) * inv_t;
    if (!(r > 1e-30)) return 0;
    return SAMPLE_BUCKETS / (r < SAMPLE_RANGE ? r : SAMPLE_RANGE);
}

// A candidate's bucket: non-decreasing in -d, so in the key. d <= 0 and s finite.
__device__ __forceinline__ unsigned sample_bucket(double d, double s) {
    double v = -d * s;
    return v < (double)(SAMPLE_BUCKETS - 1) ? (unsigned)v : SAMPLE_BUCKETS - 1;
}

struct sample_sh {
    u64 hw[256];       // radix histogram: weight per digit
    unsigned hc[256];  // radix histogram: candidates per digit
    u64 red[32];
    float redf[33];
    int redi[33];
    u64 prefix, below, key;  // radix descent state, fetched key
    int single;
    u64 before, found;  // the bucket search: weight below the bucket, the key found
    unsigned bucket, bcnt;
    int nm, rank;  // gathered members, the rank found among them
};

// The tokens of one bucket: key, mass and entropy term, in no particular order.
struct sample_members {
    u64 key[SAMPLE_SORT_MAX], q[SAMPLE_SORT_MAX], e[SAMPLE_SORT_MAX];
    short perm[SAMPLE_SORT_MAX];  // perm[r]: the member of rank r
};

// A bucket too large for shared memory, in global memory (sample_kernel's fallback).
struct cand_src {
    const u64 *keys, *qs, *es;  // [m]
    int m;
};

// The lanes with on set that share bucket b: their mask (0 for the others). Lanes
// sharing a bucket are summed first and the group's lowest lane adds for all of them
// (one shared atomic per bucket per warp): ties and nearby logits share buckets, and
// per-lane atomics on one address would serialise.
__device__ __forceinline__ unsigned bucket_group(bool on, unsigned b) {
    unsigned act = __ballot_sync(0xffffffffu, on);
    return on ? __match_any_sync(act, b) : 0u;
}
__device__ __forceinline__ bool group_leader(unsigned grp) { return (int)(threadIdx.x & 31) == __ffs(grp) - 1; }
// The group's sum of w < 2^45 (22-bit halves: no overflow over 32 lanes). Called by
// every lane of grp.
__device__ __forceinline__ u64 group_sum(unsigned grp, u64 w) {
    unsigned lo = __reduce_add_sync(grp, (unsigned)(w & 0x3fffffu));
    unsigned hi = __reduce_add_sync(grp, (unsigned)(w >> 22));
    return ((u64)hi << 22) + lo;
}

// Adds w to digit b of the radix histogram for the lanes with on set.
__device__ __forceinline__ void hist_add(sample_sh &sh, bool on, unsigned b, u64 w) {
    unsigned grp = bucket_group(on, b);
    if (!on) return;
    u64 sum = group_sum(grp, w);
    if (group_leader(grp)) {
        atomicAdd(&sh.hw[b], sum);
        atomicAdd(&sh.hc[b], (unsigned)__popc(grp));
    }
}

// Inclusive prefix sum over the block in thread order; every thread gets its own.
__device__ u64 block_scan(u64 v, u64 *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64 u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    if (lane == 31) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        u64 w = lane < nw ? red[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            u64 u = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += u;
        }
        red[lane] = w;
    }
    __syncthreads();
    if (warp > 0) v += red[warp - 1];
    __syncthreads();  // red is reused right after
    return v;
}

// ---- radix descent over a large bucket (ties), from global memory -------------------
// Warp 0: the first digit where the cumulative weight reaches target; extends the
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

// The smallest key at which the cumulative weight of the candidates (1 each, or their
// mass) reaches target (1 <= target <= their total). Every thread gets it. The descent
// starts at the highest digit where the keys differ: a bucket this large is ties, whose
// keys differ only in the id's low bits.
__device__ u64 radix_find(sample_sh &sh, const cand_src &s, bool by_mass, u64 target) {
    int tid = threadIdx.x;
    u64 first = s.keys[0], diff = 0;
    if (tid == 0) sh.prefix = 0, sh.below = 0, sh.single = 0;
    __syncthreads();
    for (int i = tid; i < s.m; i += blockDim.x) diff |= s.keys[i] ^ first;
    if (diff) atomicOr(&sh.prefix, diff);
    __syncthreads();
    diff = sh.prefix;
    if (diff == 0) return first;  // one candidate (every thread returns before sh changes)
    int d = (63 - __clzll((long long)diff)) / 8 * 8;
    __syncthreads();
    if (tid == 0) sh.prefix = d == 56 ? 0 : first >> (d + 8) << (d + 8);
    for (;; d -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) sh.hw[b] = 0, sh.hc[b] = 0;
        __syncthreads();
        u64 prefix = sh.prefix;
        for (int base = 0; base < s.m; base += blockDim.x) {
            int i = base + tid;
            u64 key = i < s.m ? s.keys[i] : 0;
            bool on = i < s.m && (d == 56 || (key >> (d + 8)) == (prefix >> (d + 8)));
            hist_add(sh, on, (unsigned)(key >> d) & 255u, on && by_mass ? s.qs[i] : 1);
        }
        __syncthreads();
        if (tid < 32) pick_bucket(sh, d, target);
        __syncthreads();
        if (sh.single || d == 0) break;
    }
    u64 prefix = sh.prefix;
    if (d > 0) {  // one candidate left in the digit: fetch its full key
        for (int i = tid; i < s.m; i += blockDim.x)
            if ((s.keys[i] >> d) == (prefix >> d)) sh.key = s.keys[i];
        __syncthreads();
        prefix = sh.key;
    }
    __syncthreads();  // sh is reused by the caller's next step
    return prefix;
}

// ---- launch 1: argmax and minimum partials ----------------------------------------
// (v, i) pairs: the largest value, the first index on ties, NaN never wins; every
// thread gets the winner's index (0 when every value is NaN, as block_argmax).
__device__ int block_amax_pairs(const float *pv, const int *pi, int np, float *sv, int *si) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < np; i += blockDim.x) amax_merge(bv, bi, pv[i], pi[i]);
    return block_amax_finish(bv, bi, sv, si);
}

// Block (b < nb, r): the argmax and the smallest finite value of row r's tokens
// [b * 1024, ...) as partials (row r: x + r * ld, its partials at r * nb). The blocks of
// row 0 clear a share of the histograms each (n_words 32-bit words).
__global__ void __launch_bounds__(SAMPLE_PREP_THREADS)
    sample_argmax_kernel(const float *__restrict__ x, size_t ld, int n, int nb, float *part_v, int *part_i,
                         float *part_lo, unsigned *hist_words, size_t n_words) {
    __shared__ float sv[33];
    __shared__ float sm[32];
    __shared__ int si[33];
    x += blockIdx.y * ld;
    part_v += blockIdx.y * nb, part_i += blockIdx.y * nb, part_lo += blockIdx.y * nb;
    int base = blockIdx.x * SAMPLE_MAX_CHUNK;
    if ((int)blockIdx.x < nb) {  // uniform over the block
        float v[SAMPLE_MAX_CHUNK / SAMPLE_PREP_THREADS], bv = -INFINITY, lo = INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int k = 0; k < SAMPLE_MAX_CHUNK / SAMPLE_PREP_THREADS; k++) {  // all loads in flight first
            int i = base + k * SAMPLE_PREP_THREADS + (int)threadIdx.x;
            v[k] = i < n ? x[i] : NAN;
        }
#pragma unroll
        for (int k = 0; k < SAMPLE_MAX_CHUNK / SAMPLE_PREP_THREADS; k++) {
            amax_merge(bv, bi, v[k], k * SAMPLE_PREP_THREADS + (int)threadIdx.x);
            if (isfinite(v[k])) lo = fminf(lo, v[k]);
        }
        int am = base + block_amax_finish(bv, bi, sv, si);
        lo = -block_max(-lo, sm);
        if (threadIdx.x == 0) part_v[blockIdx.x] = x[am], part_i[blockIdx.x] = am, part_lo[blockIdx.x] = lo;
    }
    if (blockIdx.y != 0) return;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < n_words; w += stride) hist_words[w] = 0;
}

// Configuration c's row: c's own (x + c * ld, partials at c * nb) when the
// configurations draw from one row each (ld > 0), else the one row.
struct sample_row {
    const float *x, *part_v, *part_lo;
    const int *part_i;
};

__device__ sample_row row_of(const float *x, size_t ld, const float *pv, const int *pi, const float *pl, int nb,
                             int c) {
    size_t r = ld ? (size_t)c : 0;
    return sample_row{ x + r * ld, pv + r * nb, pl + r * nb, pi + r * nb };
}

// ---- launch 2: masses, buckets and histograms --------------------------------------
// The row's maximum (and its index) and smallest finite value from the partials; every
// block of launches 2 and 3 reduces them the same way.
__device__ float row_min(const float *part_lo, int nb, float *sm) {
    float lo = INFINITY;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) lo = fminf(lo, part_lo[i]);
    return -block_max(-lo, sm);
}

// Block (b, c): configuration c's tokens [b * 2048, ...): each token's mass computed once,
// its bucket stored (SAMPLE_NONE when not a candidate), the candidates' counts, masses
// and entropy terms summed per bucket in shared memory, then added to c's histogram
// (integer atomics: exact in any order). Greedy configurations and rows with no finite
// maximum have none (sample_kernel takes the argmax).
__global__ void __launch_bounds__(SAMPLE_PREP_THREADS)
    sample_mass_kernel(const float *__restrict__ x0, size_t ld, int n, const float *part_v0, const int *part_i0,
                       const float *part_lo0, int nb, const sample_cfg *cfgs, sample_hist *hists,
                       unsigned short *buckets, size_t stride) {
    enum { PER = SAMPLE_MASS_CHUNK / SAMPLE_PREP_THREADS };
    __shared__ unsigned hc[SAMPLE_BUCKETS];
    __shared__ u64 hq[SAMPLE_BUCKETS];
    __shared__ u64 he[SAMPLE_BUCKETS];
    __shared__ float sv[33];
    __shared__ int si[33];
    const sample_cfg cfg = cfgs[blockIdx.y];
    const sample_row r = row_of(x0, ld, part_v0, part_i0, part_lo0, nb, (int)blockIdx.y);
    const float *x = r.x, *part_v = r.part_v, *part_lo = r.part_lo;
    const int *part_i = r.part_i;
    float mx = x[block_amax_pairs(part_v, part_i, nb, sv, si)];
    if (!(cfg.temperature > 0) || !isfinite(mx)) return;
    double inv_t = 1.0 / (double)cfg.temperature, s = sample_scale(mx, row_min(part_lo, nb, sv), inv_t);
    for (int b = threadIdx.x; b < SAMPLE_BUCKETS; b += blockDim.x) hc[b] = 0, hq[b] = 0, he[b] = 0;
    int base = blockIdx.x * SAMPLE_MASS_CHUNK;
    float v[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {  // all loads in flight first
        int i = base + k * SAMPLE_PREP_THREADS + (int)threadIdx.x;
        v[k] = i < n ? x[i] : NAN;
    }
    __syncthreads();
    unsigned short *bk = buckets + blockIdx.y * stride;
#pragma unroll
    for (int k = 0; k < PER; k++) {  // every lane of a warp takes part in hist_add
        int i = base + k * SAMPLE_PREP_THREADS + (int)threadIdx.x;
        double d = sample_logp(v[k], mx, inv_t), p = exp(d);
        u64 q = sample_q(p);
        bool on = q != 0 && !(cfg.min_p > 0 && !(p >= (double)cfg.min_p) && d != 0);
        unsigned b = on ? sample_bucket(d, s) : SAMPLE_NONE;
        if (i < n) bk[i] = (unsigned short)b;
        unsigned grp = bucket_group(on, b);
        if (on) {
            u64 sq = group_sum(grp, q), se = group_sum(grp, sample_e(p, d));
            if (group_leader(grp)) {
                atomicAdd(&hc[b], (unsigned)__popc(grp));
                atomicAdd(&hq[b], sq);
                atomicAdd(&he[b], se);
            }
        }
    }
    __syncthreads();
    sample_hist *H = hists + blockIdx.y;
    for (int b = threadIdx.x; b < SAMPLE_BUCKETS; b += blockDim.x)
        if (hc[b]) {
            atomicAdd(&H->cnt[b], hc[b]);
            atomicAdd(&H->q[b], hq[b]);
            atomicAdd(&H->e[b], he[b]);
        }
}

// ---- launch 3: the searches, one block per configuration ---------------------------
// What sample_kernel's searches share: the row, the configuration's arithmetic and its
// arrays, and the key every kept candidate is at most (~0: no cut yet).
struct search_ctx {
    const float *x;
    int n;
    float mx;
    double inv_t;
    const unsigned short *bk;  // [n] buckets
    u64 *keys, *qs, *es;       // [n] a large bucket's members (global scratch)
    u64 cut;
};

// Thread t's two buckets of the histogram, 2t and 2t + 1: the kept candidates' counts,
// masses and entropy terms (the cut's bucket holds only those up to the cut).
struct hist2 {
    unsigned c[2];
    u64 q[2], e[2];
};

// The bucket where the cumulative weight (counts, or masses) reaches target: into sh.bucket,
// with the weight of the buckets before it (sh.before) and its candidates (sh.bcnt).
__device__ void find_bucket(sample_sh &sh, const hist2 &h, bool by_mass, u64 target) {
    u64 w0 = by_mass ? h.q[0] : h.c[0], w1 = by_mass ? h.q[1] : h.c[1];
    u64 incl = block_scan(w0 + w1, sh.red), excl = incl - w0 - w1;
    if (excl < target && incl >= target) {  // exactly one thread: 1 <= target <= total
        int second = excl + w0 < target;
        sh.bucket = 2 * threadIdx.x + second;
        sh.before = second ? excl + w0 : excl;
        sh.bcnt = (unsigned)(second ? h.c[1] : h.c[0]);
    }
    __syncthreads();
}

// Member i of the bucket: its key, mass and entropy term (the mass pass's arithmetic).
__device__ __forceinline__ void member_put(const search_ctx &c, int i, u64 key, u64 *k, u64 *q, u64 *e, int slot) {
    double d = sample_logp(c.x[i], c.mx, c.inv_t), p = exp(d);
    k[slot] = key;
    q[slot] = sample_q(p);
    e[slot] = sample_e(p, d);
}

// Gathers the candidates of bucket b with keys <= c.cut into m (shared) when to_shared,
// else into c.keys/qs/es; their number into sh.nm. One pass over the 2-byte buckets,
// 8 per 16-byte load, 4 loads in flight per thread.
__device__ void gather(sample_sh &sh, sample_members &m, const search_ctx &c, unsigned b, bool to_shared) {
    if (threadIdx.x == 0) sh.nm = 0;
    __syncthreads();
    const uint4 *v = (const uint4 *)c.bk;
    int nv = (c.n + 7) / 8;
    for (int j0 = 0; j0 < nv; j0 += 4 * SAMPLE_THREADS) {
        uint4 w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int j = j0 + k * SAMPLE_THREADS + (int)threadIdx.x;
            w[k] = j < nv ? v[j] : make_uint4(~0u, ~0u, ~0u, ~0u);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            unsigned words[4] = { w[k].x, w[k].y, w[k].z, w[k].w };
            int i0 = 8 * (j0 + k * SAMPLE_THREADS + (int)threadIdx.x);
#pragma unroll
            for (int h = 0; h < 8; h++) {
                int i = i0 + h;
                if ((words[h >> 1] >> (16 * (h & 1)) & 0xffffu) != b || i >= c.n) continue;
                u64 key = sample_key(c.x[i], i);
                if (key > c.cut) continue;
                int slot = atomicAdd(&sh.nm, 1);
                if (!to_shared) member_put(c, i, key, c.keys, c.qs, c.es, slot);
                else if (slot < SAMPLE_SORT_MAX) member_put(c, i, key, m.key, m.q, m.e, slot);
            }
        }
    }
    __syncthreads();
}

// Within a gathered bucket of at most SAMPLE_SORT_MAX members (in shared memory): the
// smallest key whose cumulative weight reaches target, counting from `before`. Ranks
// by counting (keys are distinct), a prefix sum in key order, then the crossing.
// *kc, *kq, *ke (when kc is not NULL): count, mass and entropy of the members up to it.
__device__ u64 rank_find(sample_sh &sh, sample_members &m, int nm, bool by_mass, u64 before, u64 target, u64 *kc,
                         u64 *kq, u64 *ke) {
    int t = threadIdx.x;
    if (t < nm) {
        u64 key = m.key[t];
        int r = 0;
        for (int j = 0; j < nm; j++) r += m.key[j] < key;
        m.perm[r] = (short)t;
    }
    __syncthreads();
    int me = t < nm ? m.perm[t] : 0;
    u64 w = t < nm ? (by_mass ? m.q[me] : 1) : 0;
    u64 incl = before + block_scan(w, sh.red);
    if (t < nm && incl >= target && incl - w < target) sh.rank = t, sh.found = m.key[me];
    __syncthreads();
    int rank = sh.rank;
    u64 found = sh.found;
    if (kc) {
        bool in = t < nm && t <= rank;
        *kc = (u64)rank + 1;
        *kq = block_sum(in ? m.q[me] : 0ull, sh.red);
        *ke = block_sum(in ? m.e[me] : 0ull, sh.red);
    }
    return found;
}

// Count, mass and entropy term of a large bucket's members with key <= cut.
__device__ void cand_sums(sample_sh &sh, const cand_src &s, u64 cut, u64 *cnt, u64 *Q, u64 *E) {
    u64 n = 0, qs = 0, es = 0;
    for (int i = threadIdx.x; i < s.m; i += blockDim.x)
        if (s.keys[i] <= cut) n++, qs += s.qs[i], es += s.es[i];
    *cnt = block_sum(n, sh.red);
    *Q = block_sum(qs, sh.red);
    *E = block_sum(es, sh.red);
}

// The smallest kept key where the cumulative weight reaches target (1 <= target <= the
// kept total). With cut set, it becomes the new cut: the histogram keeps only what
// lies up to it (the bucket it falls in is replaced by its members up to it).
__device__ u64 hist_find(sample_sh &sh, sample_members &m, search_ctx &c, hist2 &h, bool by_mass, u64 target,
                         bool cut) {
    find_bucket(sh, h, by_mass, target);
    unsigned b = sh.bucket, bcnt = sh.bcnt;
    u64 before = sh.before, key, kc = 0, kq = 0, ke = 0;
    bool small = bcnt <= SAMPLE_SORT_MAX;
    gather(sh, m, c, b, small);
    if (small) {
        key = rank_find(sh, m, sh.nm, by_mass, before, target, cut ? &kc : NULL, &kq, &ke);
    } else {
        cand_src s = { c.keys, c.qs, c.es, sh.nm };
        key = radix_find(sh, s, by_mass, target - before);
        if (cut) cand_sums(sh, s, key, &kc, &kq, &ke);
    }
    if (cut) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            unsigned bj = 2 * threadIdx.x + j;
            if (bj == b) h.c[j] = (unsigned)kc, h.q[j] = kq, h.e[j] = ke;
            if (bj > b) h.c[j] = 0, h.q[j] = 0, h.e[j] = 0;
        }
        c.cut = key;
    }
    return key;
}

// One block per configuration: the truncations and the draw over its histogram.
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(sample_out *out, const float *__restrict__ x0, size_t ld, int n, const sample_cfg *cfgs,
                  const float *part_v0, const int *part_i0, int nb, const sample_hist *hists,
                  const unsigned short *buckets, size_t stride, u64 *keys, u64 *qs, u64 *es) {
    __shared__ sample_sh sh;
    __shared__ sample_members m;
    const sample_cfg cfg = cfgs[blockIdx.x];
    const sample_row r = row_of(x0, ld, part_v0, part_i0, part_v0, nb, (int)blockIdx.x);  // (no minimum needed)
    const float *x = r.x, *part_v = r.part_v;
    const int *part_i = r.part_i;
    sample_out *o = out + blockIdx.x;
    int am = block_amax_pairs(part_v, part_i, nb, sh.redf, sh.redi);
    if (!(cfg.temperature > 0) || !isfinite(x[am])) {  // greedy, or no finite logit
        if (threadIdx.x == 0) *o = sample_out{ am, 1, x[am], 0.f, 0.0 };
        return;
    }
    const sample_hist *H = hists + blockIdx.x;
    hist2 h;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int b = 2 * threadIdx.x + j;
        h.c[j] = H->cnt[b], h.q[j] = H->q[b], h.e[j] = H->e[b];
    }
    size_t off = (size_t)blockIdx.x * n;
    search_ctx c = { x, n, x[am], 1.0 / (double)cfg.temperature, buckets + blockIdx.x * stride,
                     keys + off, qs + off, es + off, ~0ull };
    u64 cnt = block_sum((u64)h.c[0] + h.c[1], sh.red);
    if (cnt == 0) {  // no candidate (cannot happen for a finite maximum: it has q = 2^44)
        if (threadIdx.x == 0) *o = sample_out{ am, 1, x[am], 0.f, 0.0 };
        return;
    }
    if (cfg.top_k > 0 && (u64)cfg.top_k < cnt) hist_find(sh, m, c, h, false, (u64)cfg.top_k, true);
    if (cfg.top_p < 1) {
        u64 Q = block_sum(h.q[0] + h.q[1], sh.red);
        hist_find(sh, m, c, h, true, sample_top_p_target(cfg.top_p, Q), true);
    }
    cnt = block_sum((u64)h.c[0] + h.c[1], sh.red);
    u64 Q = block_sum(h.q[0] + h.q[1], sh.red), E = block_sum(h.e[0] + h.e[1], sh.red);
    u64 key = hist_find(sh, m, c, h, true, sample_draw_target(cfg.u, Q), false);
    if (threadIdx.x == 0) {
        int id = sample_key_id(key);
        *o = sample_out{ id, (int)cnt, x[id], 0.f, sample_entropy_bits(Q, E) };
    }
}

// ---- host side ---------------------------------------------------------------------
// ctx->sample_buf, for n tokens and n_cfg configurations: the partials, then (256-byte
// aligned) the histograms, each configuration's buckets (n rounded up to 8: 16-byte
// rows) and each configuration's n keys, masses and entropy terms of a large bucket.
struct sample_layout {
    int nb;  // argmax partials
    size_t stride;
    float *part_v, *part_lo;
    int *part_i;
    sample_hist *hist;
    unsigned short *bk;
    u64 *keys, *qs, *es;
    size_t bytes;
};

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

// (rows: the logits rows, 1 or n_cfg, each with its own partials.)
static sample_layout sample_plan(char *base, int n, int n_cfg, int rows) {
    sample_layout L;
    L.nb = (n + SAMPLE_MAX_CHUNK - 1) / SAMPLE_MAX_CHUNK;
    L.stride = ((size_t)n + 7) & ~(size_t)7;
    size_t off_hist = align256((size_t)L.nb * rows * 12), off_bk = off_hist + (size_t)n_cfg * sizeof(sample_hist);
    size_t off_keys = align256(off_bk + (size_t)n_cfg * L.stride * 2), per = (size_t)n_cfg * n;
    L.part_v = (float *)base;
    L.part_lo = L.part_v + (size_t)L.nb * rows;
    L.part_i = (int *)(L.part_lo + (size_t)L.nb * rows);
    L.hist = (sample_hist *)(base + off_hist);
    L.bk = (unsigned short *)(base + off_bk);
    L.keys = (u64 *)(base + off_keys);
    L.qs = L.keys + per;
    L.es = L.qs + per;
    L.bytes = off_keys + 3 * per * sizeof(u64);
    return L;
}

// The sampler's device arrays for n tokens and n_cfg configurations, grown (never
// shrunk) on the first call that needs more.
static int sample_reserve(cuda_ctx *ctx, int n, int n_cfg) {
    size_t need = sample_plan(NULL, n, n_cfg, n_cfg).bytes;  // room for a draw per row too
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
    return sample_reserve(ctx, n, n_cfg);
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

// ld == 0: every configuration from the row at logits; ld > 0: configuration c from
// row c (logits + c * ld).
static int sample_launch(cuda_ctx *ctx, sample_out *out, const float *logits, size_t ld, int n, const sample_cfg *cfg,
                         int n_cfg) {
    CUDA_REQUIRE(ctx, n > 0 && n <= SAMPLE_MAX_VOCAB && n_cfg >= 0 && n_cfg <= 65535,
                 "cuda_sample: bad shape n=%d n_cfg=%d", n, n_cfg);
    CUDA_REQUIRE(ctx, ld == 0 || ld >= (size_t)n, "cuda_sample_rows: row stride %zu under the row's %d logits", ld, n);
    if (n_cfg == 0) return 0;
    if (sample_reserve(ctx, n, n_cfg)) return -1;
    int rows = ld ? n_cfg : 1;
    sample_layout L = sample_plan((char *)ctx->sample_buf, n, n_cfg, rows);
    int nb2 = (n + SAMPLE_MASS_CHUNK - 1) / SAMPLE_MASS_CHUNK, grid1 = L.nb > n_cfg ? L.nb : n_cfg;
    size_t words = (size_t)n_cfg * sizeof(sample_hist) / 4;
    sample_argmax_kernel<<<dim3(grid1, rows), SAMPLE_PREP_THREADS, 0, ctx->stream>>>(
        logits, ld, n, L.nb, L.part_v, L.part_i, L.part_lo, (unsigned *)L.hist, words);
    CUDA_CHECK_LAUNCH(ctx, "sample_argmax_kernel");
    sample_mass_kernel<<<dim3(nb2, n_cfg), SAMPLE_PREP_THREADS, 0, ctx->stream>>>(
        logits, ld, n, L.part_v, L.part_i, L.part_lo, L.nb, cfg, L.hist, L.bk, L.stride);
    CUDA_CHECK_LAUNCH(ctx, "sample_mass_kernel");
    sample_kernel<<<n_cfg, SAMPLE_THREADS, 0, ctx->stream>>>(out, logits, ld, n, cfg, L.part_v, L.part_i, L.nb,
                                                             L.hist, L.bk, L.stride, L.keys, L.qs, L.es);
    CUDA_CHECK_LAUNCH(ctx, "sample_kernel");
    return 0;
}

extern "C" int cuda_sample(cuda_ctx *ctx, sample_out *out, const float *logits, int n, const sample_cfg *cfg,
                           int n_cfg) {
    return sample_launch(ctx, out, logits, 0, n, cfg, n_cfg);
}

extern "C" int cuda_sample_rows(cuda_ctx *ctx, sample_out *out, const float *logits, size_t ld, int n,
                                const sample_cfg *cfg, int rows) {
    CUDA_REQUIRE(ctx, ld > 0, "cuda_sample_rows: row stride 0 (cuda_sample draws from one row)");
    return sample_launch(ctx, out, logits, ld, n, cfg, rows);
}
