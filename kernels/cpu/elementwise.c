// elementwise.c: the cheap ops of the forward pass (embedding, norms, bias, SwiGLU,
// residual add) and the f16 conversions. Loops are plain so the compiler vectorises.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/ops.h"

int cpu_set_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
    return omp_get_max_threads();
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {  // zero or subnormal: man * 2^-24
        v.f = (float)man * 5.9604644775390625e-8f;
        v.u |= sign;
    } else if (exp == 31) {
        v.u = sign | 0x7f800000u | (man << 13);
    } else {
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    }
    return v.f;
}

uint16_t f32_to_f16(float f) {
    union { float f; uint32_t u; } v = { f };
    uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to inf
    if (a < 0x38800000u) {  // subnormal half: round(|f| / 2^-24)
        union { uint32_t u; float f; } m = { a };
        return (uint16_t)(sign | (uint16_t)lrintf(m.f * 16777216.0f));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);  // round to nearest even
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

// Widen n weights starting at element i0 to fp32.
static void widen(float *dst, wref w, size_t i0, size_t n) {
    if (w.type == WT_F32) {
        memcpy(dst, (const float *)w.data + i0, n * sizeof(float));
    } else if (w.type == WT_BF16) {
        const uint16_t *s = (const uint16_t *)w.data + i0;
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)w.data + i0;
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
    }
}

void cpu_embed(float *out, wref table, const int *ids, int T, int dim) {
    for (int t = 0; t < T; t++) widen(out + (size_t)t * dim, table, (size_t)ids[t] * dim, (size_t)dim);
}

void cpu_rmsnorm(float *out, const float *x, wref w, int T, int dim, float eps) {
    float wf[dim];
    widen(wf, w, 0, (size_t)dim);
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * dim;
        float *ot = out + (size_t)t * dim;
        double ss = 0;  // double: the sum of squares of a wide row loses bits in fp32
        for (int i = 0; i < dim; i++) ss += (double)xt[i] * xt[i];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) ot[i] = xt[i] * r * wf[i];
    }
}

void cpu_add_bias(float *x, wref b, int T, int n) {
    float bf[n];
    widen(bf, b, 0, (size_t)n);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) x[(size_t)t * n + i] += bf[i];
}

// SwiGLU 16 lanes at a time (prefill runs it on T x intermediate values): silu(g) =
// g * sigmoid(g), the sigmoid from e = e^-|g|, which cannot overflow: 1 / (1 + e) for
// g >= 0, e / (1 + e) below.
typedef float ew_vf __attribute__((vector_size(64)));
typedef int ew_vi __attribute__((vector_size(64)));
#define ATT_V ew_vf
#define ATT_VI ew_vi
#define ATT_FN(name) ew_##name
#include "kernels/cpu/vexp.h"
#undef ATT_V
#undef ATT_VI
#undef ATT_FN

static void swiglu16(float *out, const float *gate, const float *up) {
    ew_vf g, u, one = (ew_vf){ 0 } + 1.0f;
    memcpy(&g, gate, sizeof g);
    memcpy(&u, up, sizeof u);
    ew_vi neg = g < 0;
    ew_vf e = ew_vexp((ew_vf)((ew_vi)g | (int)0x80000000));  // e^-|g|
    ew_vf num = (ew_vf)(((ew_vi)e & neg) | ((ew_vi)one & ~neg));
    ew_vf r = g * (num / (one + e)) * u;
    memcpy(out, &r, sizeof r);
}

// Every element takes the same vector formula, the tail too (padded), so a value does
// not depend on where it sits: batched decode rows equal their one-row steps bit for bit.
void cpu_swiglu(float *out, const float *gate, const float *up, size_t n) {
    long blocks = (long)(n / 16);
#pragma omp parallel for schedule(static) if (blocks > 4096)
    for (long b = 0; b < blocks; b++) swiglu16(out + b * 16, gate + b * 16, up + b * 16);
    size_t done = (size_t)blocks * 16, rest = n - done;
    if (rest) {
        float g[16] = { 0 }, u[16] = { 0 }, o[16];
        memcpy(g, gate + done, rest * sizeof *g);
        memcpy(u, up + done, rest * sizeof *u);
        swiglu16(o, g, u);
        memcpy(out + done, o, rest * sizeof *o);
    }
}

void cpu_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void cpu_add_scaled(float *x, const float *y, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += s * y[i];
}
