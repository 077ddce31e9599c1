// sample_core.h: the per-token arithmetic of the exact sampler, shared word for word by
// the CPU twin (kernels/cpu/sample.c) and the device kernel (kernels/cuda/sample.cu) so
// both make the same draw from the same logits and uniform.
//
// Why integers: the device sums probability mass in parallel, in no fixed order. Floating
// sums would differ in their last bits from run to run and from the CPU, and a draw near
// a boundary would flip. Each token's mass is instead a 44-bit fixed-point integer
// q = floor(p * 2^44) of p = exp((x - max) / T) (p = 1 for the top token); integer sums
// are exact in any order. Tokens with q = 0 (p < 2^-44, more than 30.5 T below the max)
// are dropped before the truncations: together they hold less than vocab * 2^-44 of the
// mass (1.5e-8 for a 262144-token vocabulary).
#ifndef VARENT_SAMPLE_CORE_H
#define VARENT_SAMPLE_CORE_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SAMPLE_HD __host__ __device__ __forceinline__
#else
#define SAMPLE_HD static inline
#endif

#define SAMPLE_Q_BITS 44
#define SAMPLE_Q_ONE 17592186044416.0  // 2^44
#define SAMPLE_MAX_VOCAB (1 << 19)       // sums of q stay below 2^63

// Sort key: ascending key = descending logit, then ascending id (the CPU sampler's
// order: most probable first, ties to the lower id).
SAMPLE_HD uint64_t sample_key(float x, int id) {
    union {
        float f;
        uint32_t u;
    } b;
    b.f = x;
    uint32_t asc = (b.u & 0x80000000u) ? ~b.u : (b.u | 0x80000000u);  // monotone in x
    return ((uint64_t)~asc << 32) | (uint32_t)id;
}

SAMPLE_HD int sample_key_id(uint64_t key) { return (int)(key & 0xffffffffu); }

// ln p of a logit at temperature 1/inv_t, relative to the max: (x - max) / T, in double.
// The device must not contract this into an fma: it is one subtraction, one product.
SAMPLE_HD double sample_logp(float x, float mx, double inv_t) { return ((double)x - (double)mx) * inv_t; }

// 2^44-scaled mass of p = e^d (d <= 0); NaN and -inf give 0.
SAMPLE_HD uint64_t sample_q(double p) { return p >= 0 && p <= 1 ? (uint64_t)(p * SAMPLE_Q_ONE) : 0; }

// 2^44-scaled -p ln p = -p d: the entropy accumulates exactly like the mass.
SAMPLE_HD uint64_t sample_e(double p, double d) {
    double v = -p * d * SAMPLE_Q_ONE;
    return v > 0 && v < 1e19 ? (uint64_t)v : 0;
}

// Entropy in bits of the kept tokens renormalised, from Q = sum q and E = sum e:
// H = ln S - (sum p ln p) / S with S = Q / 2^44.
SAMPLE_HD double sample_entropy_bits(uint64_t Q, uint64_t E) {
    if (Q == 0) return 0;
    double h = log((double)Q) - SAMPLE_Q_BITS * 0.69314718055994530942 + (double)E / (double)Q;
    h /= 0.69314718055994530942;
    return h > 0 ? h : 0;
}

// Nucleus target: the smallest prefix whose mass reaches top_p of Q, as an integer
// (at least 1, so top_p <= 0 keeps the top token).
SAMPLE_HD uint64_t sample_top_p_target(float top_p, uint64_t Q) {
    double t = ceil((double)top_p * (double)Q);
    if (t < 1) return 1;
    if (t >= (double)Q) return Q;
    return (uint64_t)t;
}

// The draw: the first token (in key order) whose inclusive cumulative mass exceeds
// r = floor(u Q); returned as the target r + 1 for "cumulative >= target".
SAMPLE_HD uint64_t sample_draw_target(double u, uint64_t Q) {
    double r = floor(u * (double)Q);
    if (!(r >= 0)) r = 0;
    uint64_t ri = r >= (double)Q ? Q - 1 : (uint64_t)r;
    return ri + 1;
}

#endif
