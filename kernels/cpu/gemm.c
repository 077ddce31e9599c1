// gemm.c: the prefill GEMM, out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T with fp32
// accumulation, for many tokens at once (cpu_matmul keeps its matrix-vector paths for
// decode). Cache blocking: a job packs a panel of GEMM_NR weight rows once (widened to
// fp32, or as bf16 pairs for vdpbf16ps) into a thread-local buffer that stays in L1/L2,
// then runs the micro-kernel over every tile of MR tokens of its token range, so each
// weight is read from memory once per job instead of once per token tile.
// Layout of the panels and the micro-kernel contract: gemm.h.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

// -1: not read yet; VARENT_CPU_GEMM=bf16 turns bf16 inputs on for the whole process.
static int gemm_bf16_inputs = -1;

void cpu_set_gemm_bf16_inputs(int on) { gemm_bf16_inputs = on != 0; }
int cpu_gemm_bf16_inputs(void) {
    if (gemm_bf16_inputs < 0) {
        const char *e = getenv("VARENT_CPU_GEMM");
        gemm_bf16_inputs = e && !strcmp(e, "bf16");
    }
    return gemm_bf16_inputs;
}

// The portable micro-kernel: plain loops over a 4 x 32 tile the compiler vectorises.
#define GENERIC_MR 4
static void gemm_f32_generic(float *tile, const float *x, size_t ldx, int mr, const float *panel, int K) {
    float c[GENERIC_MR][GEMM_NR] = { { 0 } };
    const float *r[GENERIC_MR];
    for (int t = 0; t < GENERIC_MR; t++) r[t] = x + (size_t)(t < mr ? t : mr - 1) * ldx;
    for (int k = 0; k < K; k++) {
        const float *p = panel + (size_t)k * GEMM_NR;
        for (int t = 0; t < GENERIC_MR; t++) {
            float b = r[t][k];
            for (int j = 0; j < GEMM_NR; j++) c[t][j] += p[j] * b;
        }
    }
    for (int t = 0; t < mr; t++) memcpy(tile + t * GEMM_NR, c[t], sizeof c[t]);
}

// Rows r0..r0+nr of w, widened, into panel[n_in][GEMM_NR] (zero columns past nr). The
// panel is written in order and the rows read as GEMM_NR sequential streams, one cache
// line of each serving many k: packing costs a small fraction of the multiply-adds.
#define PACK_LOOP(CONV)                                                                        \
    for (int k = k_start; k < n_in; k++) {                                                     \
        float *dst = panel + (size_t)k * GEMM_NR;                                              \
        for (int j = 0; j < nr; j++) dst[j] = CONV(src[(size_t)j * n_in + k]);                 \
        for (int j = nr; j < GEMM_NR; j++) dst[j] = 0;                                         \
    }
#define PACK_ID(v) (v)
// vec: the AVX-512 packer takes the whole 16-column groups of a full panel first.
static void pack_f32(float *panel, wref w, int r0, int nr, int n_in, int vec) {
    size_t base = (size_t)r0 * n_in;
    int k_start = 0;
#if defined(__x86_64__)
    if (vec) k_start = gemm_pack_f32_avx512(panel, (const char *)w.data + base * wtype_size(w.type), w.type, nr, n_in);
#endif
    if (w.type == WT_F32) {
        const float *src = (const float *)w.data + base;
        PACK_LOOP(PACK_ID)
    } else if (w.type == WT_BF16) {
        const uint16_t *src = (const uint16_t *)w.data + base;
        PACK_LOOP(bf16_to_f32)
    } else {
        const uint16_t *src = (const uint16_t *)w.data + base;
        PACK_LOOP(f16_to_f32)
    }
}

// Rows r0..r0+nr of bf16 w as 32-bit pairs into panel[(n_in+1)/2][GEMM_NR].
static void pack_bf16(uint32_t *panel, const uint16_t *w, int r0, int nr, int n_in, int vec) {
    int k2 = (n_in + 1) / 2, k_start = 0;
    const uint16_t *src = w + (size_t)r0 * n_in;
#if defined(__x86_64__)
    if (vec) k_start = gemm_pack_bf16_avx512(panel, src, nr, n_in);
#endif
    for (int k = k_start; k < k2; k++) {
        uint32_t *dst = panel + (size_t)k * GEMM_NR;
        for (int j = 0; j < nr; j++) {
            const uint16_t *p = src + (size_t)j * n_in + 2 * k;
            dst[j] = p[0] | (2 * k + 1 < n_in ? (uint32_t)p[1] << 16 : 0);
        }
        for (int j = nr; j < GEMM_NR; j++) dst[j] = 0;
    }
}

// The micro-kernels this run uses (cpu_isa_active), with their token tile height.
typedef struct {
    gemm_f32_fn *f32;
    gemm_bf16_fn *bf16;  // NULL: bf16 inputs unavailable
    int mr;
    int pack_avx512;  // the packers' AVX-512 transposes
} gemm_impl;

static gemm_impl gemm_pick(void) {
    switch (cpu_isa_active()) {
#if defined(__x86_64__)
    case CPU_ISA_AVX512BF16: return (gemm_impl){ gemm_f32_avx512, gemm_bf16_avx512bf16, 8, 1 };
    case CPU_ISA_AVX512: return (gemm_impl){ gemm_f32_avx512, NULL, 8, 1 };
    case CPU_ISA_AVX2: return (gemm_impl){ gemm_f32_avx2, NULL, 6, 0 };
#endif
    default: return (gemm_impl){ gemm_f32_generic, NULL, GENERIC_MR, 0 };
    }
}

// out[t][r0..r0+nr) = tile rows (a tile holds all GEMM_NR columns; the edge keeps nr).
static void store_tile(float *out, size_t ldo, const float *tile, int mr, int nr) {
    for (int t = 0; t < mr; t++) memcpy(out + (size_t)t * ldo, tile + t * GEMM_NR, sizeof(float) * (size_t)nr);
}

typedef struct {
    float *out;
    const float *x;
    const uint32_t *xb;  // x as bf16 pairs, [T][k2], when the bf16 kernel runs
    wref w;
    int T, n_in, n_out, k2;
    gemm_impl impl;
} gemm_job;

// One job: panel p (rows p*NR..) against tokens t0..t1, packed into buf.
static void gemm_run_job(const gemm_job *g, int p, int t0, int t1, void *buf) {
    int r0 = p * GEMM_NR, nr = g->n_out - r0 < GEMM_NR ? g->n_out - r0 : GEMM_NR, mr = g->impl.mr;
    float tile[GEMM_MR_MAX * GEMM_NR];
    if (g->xb) pack_bf16(buf, g->w.data, r0, nr, g->n_in, g->impl.pack_avx512);
    else pack_f32(buf, g->w, r0, nr, g->n_in, g->impl.pack_avx512);
    for (int t = t0; t < t1; t += mr) {
        int m = t1 - t < mr ? t1 - t : mr;
        if (g->xb) g->impl.bf16(tile, g->xb + (size_t)t * g->k2, (size_t)g->k2, m, buf, g->k2);
        else g->impl.f32(tile, g->x + (size_t)t * g->n_in, (size_t)g->n_in, m, buf, g->n_in);
        store_tile(g->out + (size_t)t * g->n_out + r0, (size_t)g->n_out, tile, m, nr);
    }
}

// x as bf16 pairs for the vdpbf16ps kernel; NULL when it does not apply (or no memory:
// the fp32 kernel then runs, slower but the same sums to fp32 rounding).
static uint32_t *gemm_inputs_bf16(const gemm_job *g) {
    if (!cpu_gemm_bf16_inputs() || !g->impl.bf16 || g->w.type != WT_BF16) return NULL;
    uint32_t *xb = malloc(sizeof(uint32_t) * (size_t)g->T * g->k2);
#if defined(__x86_64__)
    if (xb)
#pragma omp parallel for schedule(static) if (g->T >= 16)
        for (int t = 0; t < g->T; t++) gemm_to_bf16_avx512bf16(xb + (size_t)t * g->k2, g->x + (size_t)t * g->n_in, g->n_in);
#endif
    return xb;
}

int cpu_gemm(float *out, const float *x, wref w, int T, int n_in, int n_out) {
    gemm_job g = { out, x, NULL, w, T, n_in, n_out, (n_in + 1) / 2, gemm_pick() };
    g.xb = gemm_inputs_bf16(&g);
    int panels = (n_out + GEMM_NR - 1) / GEMM_NR, threads = omp_get_max_threads();
    // Few panels for many threads: split the tokens too (each split repacks its panel).
    int splits = (2 * threads + panels - 1) / panels, tiles = (T + g.impl.mr - 1) / g.impl.mr;
    if (splits > tiles) splits = tiles;
    if (splits < 1) splits = 1;
    int per = (tiles + splits - 1) / splits * g.impl.mr, jobs = panels * splits, failed = 0;
    size_t bytes = sizeof(float) * (size_t)GEMM_NR * (n_in + 1);
#pragma omp parallel reduction(|: failed) if (jobs > 1)
    {
        void *buf = malloc(bytes);
        failed |= !buf;
#pragma omp for schedule(static)
        for (int j = 0; j < jobs; j++) {
            int t0 = (j % splits) * per, t1 = t0 + per < T ? t0 + per : T;
            if (buf && t0 < t1) gemm_run_job(&g, j / splits, t0, t1, buf);
        }
        free(buf);
    }
    free((void *)g.xb);
    return failed ? -1 : 0;
}
