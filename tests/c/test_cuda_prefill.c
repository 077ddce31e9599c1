// test_cuda_prefill.c: the prefill's device ops. The tiled prefill attention
// (kernels/cuda/attention_prefill.cu), cuda_attention with T > 1 queries:
//   - against attn_prefill_kernel, the kernel of one block per (query, head) it stands in
//     for (C.prefill_tiled = 0, VARENT_CUDA_PREFILL_TILED=0): the outputs and the last
//     query's scores bit for bit;
//   - against the CPU twin (cpu_attention, cpu_attention_paged) within the tolerance of
//     test_cuda_kernels' attention cases;
// on head_dim 64 and 128, groups of 1, 2, 3, 4, 5, 8 and 16 heads (blocks of 16 rows, of
// 15 and of 10, the last block part-filled), 2 to 300 queries over up to 700 keys
// (partial key tiles, queries past the first tile), a tail segment, and a paged trunk of
// shuffled 16-position blocks whose unmapped rows are NaN. The outputs are NaN-poisoned
// first and a guard past them must stay untouched. Shapes the tiled kernel does not take
// (head_dim 80, a group of 20 heads) still match the CPU (the other kernel runs).
// Also cuda_matmul_parts (the prefill's q|k|v and gate|up from one rounding of x): each
// part bit for bit cuda_matmul on its rows, for bf16, f16 and f32 weights, T = 1 and T > 1,
// nothing written past a part, and a part of no rows an error.
// --bench: both kernels at the prefill shapes of the goal tables' models (a 512-token
// prompt, its second 256-token chunk, a last chunk after 3840 keys), each call timed over
// 20 (median of 3 rounds), `BENCH prefill attention ...` lines (the GPU window's kbench
// stage); --bench-quick: one tiny shape once, to run the code on the emulated device.
// Needs a GPU (the emulated one in make test): prints "SKIP ..." without one.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_prefill", "built without CUDA");
    CHECK_DONE();
}
#else
#include "kernels/ops_cuda.h"
#include "cuda_harness.h"

enum { GUARD = 64 };  // floats past each output that no kernel may write

typedef struct {
    int hd, nkv, G, nk, n_tail, T, shift;  // shift >= 0: a paged trunk of 2^shift positions a block
} pf_case;

// The greatest |got - ref| beyond tol + |ref| * eps, as test_cuda_kernels' cmp: 0 when within.
static double worst(const float *got, const float *ref, size_t n, double tol, double eps) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]) - (tol + fabs(ref[i]) * eps);
        if (!(d <= 0)) w = isnan(d) ? INFINITY : d > w ? d : w;
    }
    return w;
}

static int guard_kept(const float *h, size_t n) {
    const unsigned char *b = (const unsigned char *)(h + n);
    for (size_t i = 0; i < GUARD * sizeof(float); i++)
        if (b[i] != 0xFF) return 0;
    return 1;
}

// The device's outputs and scores with the tiled kernel on (tiled 1) or off.
static void run(const pf_case *c, kv_span ds, kv_pages dp, const float *dq, float *dout, float *dsc, int tiled,
                float *out, float *sc) {
    int nh = c->nkv * c->G;
    attn_shape s = {nh, c->nkv, c->hd, 1.f / sqrtf((float)c->hd)};
    size_t nq = (size_t)c->T * nh * c->hd, ns = (size_t)nh * c->nk;
    OK(cuda_memset(&C, dout, 0xFF, (nq + GUARD) * 4));
    OK(cuda_memset(&C, dsc, 0xFF, (ns + GUARD) * 4));
    C.prefill_tiled = tiled;
    OK(cuda_attention_paged(&C, dout, dq, ds, dp, c->T, s, dsc));
    OK(cuda_download(&C, out, dout, (nq + GUARD) * 4));
    OK(cuda_download(&C, sc, dsc, (ns + GUARD) * 4));
    C.prefill_tiled = 1;
}

// A shuffled block table over n_blocks blocks: the first `used` entries map the keys.
static int *shuffled(int n_blocks) {
    int *t = malloc(sizeof(int) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) t[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = irand(i + 1), x = t[i];
        t[i] = t[j];
        t[j] = x;
    }
    return t;
}

static void prefill_case(pf_case c) {
    int nh = c.nkv * c.G, kv_dim = c.nkv * c.hd, paged = c.shift >= 0;
    attn_shape s = {nh, c.nkv, c.hd, 1.f / sqrtf((float)c.hd)};
    int n_trunk = c.nk - c.n_tail, per = paged ? 1 << c.shift : 1;
    int n_blocks = paged ? (n_trunk + per - 1) / per + 2 : 0;  // two blocks no key maps
    size_t trunk_rows = paged ? (size_t)n_blocks * per : (size_t)n_trunk;
    size_t rows = trunk_rows + c.n_tail, el = rows * kv_dim;
    uint16_t *kb = malloc(el * 2), *vb = malloc(el * 2);
    for (size_t i = 0; i < el; i++) {
        kb[i] = f32_to_bf16(frand());
        vb[i] = f32_to_bf16(frand());
    }
    int *table = paged ? shuffled(n_blocks) : NULL;
    if (paged) {  // NaN in the rows of the blocks no key maps
        int used = (n_trunk + per - 1) / per;
        for (int b = used; b < n_blocks; b++)
            for (size_t i = (size_t)table[b] * per * kv_dim; i < (size_t)(table[b] + 1) * per * kv_dim; i++)
                kb[i] = vb[i] = 0x7FC0;
    }
    size_t tr = trunk_rows * kv_dim, nq = (size_t)c.T * nh * c.hd, ns = (size_t)nh * c.nk;
    float *q = fvec(nq, 3.f), *ref = malloc(nq * 4), *rsc = malloc(ns * 4);
    kv_span hs = {kb, vb, n_trunk, c.n_tail ? kb + tr : NULL, c.n_tail ? vb + tr : NULL, c.n_tail, 1};
    kv_pages hp = {table, c.shift > 0 ? c.shift : 0};
    if (paged) cpu_attention_paged(ref, q, hs, hp, c.T, s, rsc);
    else cpu_attention(ref, q, hs, c.T, s, rsc);
    // separate device buffers for trunk and tail, as a forked branch has
    uint16_t *dkt = dup_up(kb, tr * 2 + 16), *dvt = dup_up(vb, tr * 2 + 16);
    uint16_t *dkl = c.n_tail ? dup_up(kb + tr, (el - tr) * 2) : NULL, *dvl = c.n_tail ? dup_up(vb + tr, (el - tr) * 2) : NULL;
    int *dtab = paged ? dup_up(table, sizeof(int) * (size_t)n_blocks) : NULL;
    kv_span ds = {dkt, dvt, n_trunk, dkl, dvl, c.n_tail, 1};
    kv_pages dp = {dtab, c.shift > 0 ? c.shift : 0};
    float *dq = dup_up(q, nq * 4), *dout = dalloc((nq + GUARD) * 4), *dsc = dalloc((ns + GUARD) * 4);
    float *o0 = malloc((nq + GUARD) * 4), *s0 = malloc((ns + GUARD) * 4);
    float *o1 = malloc((nq + GUARD) * 4), *s1 = malloc((ns + GUARD) * 4);
    run(&c, ds, dp, dq, dout, dsc, 0, o0, s0);
    run(&c, ds, dp, dq, dout, dsc, 1, o1, s1);
    char tag[160];
    snprintf(tag, sizeof tag, "hd=%d kv=%d G=%d keys=%d tail=%d T=%d%s", c.hd, c.nkv, c.G, c.nk, c.n_tail, c.T,
             paged ? " paged" : "");
    long diff = 0;
    for (size_t i = 0; i < nq; i++) diff += memcmp(o0 + i, o1 + i, 4) != 0;
    for (size_t i = 0; i < ns; i++) diff += memcmp(s0 + i, s1 + i, 4) != 0;
    CHECK(diff == 0, NAME("prefill tiled equals the per-query kernel bit for bit %s", tag),
          "%ld of %zu outputs and scores differ", diff, nq + ns);
    double wo = worst(o1, ref, nq, 2e-5, 1e-3), ws = worst(s1, rsc, ns, 1e-5, 1e-4);
    CHECK(wo == 0 && ws == 0, NAME("prefill tiled against the CPU %s", tag), "outputs %.3g, scores %.3g past the tolerance",
          wo, ws);
    CHECK(guard_kept(o1, nq) && guard_kept(s1, ns), NAME("prefill tiled writes nothing past its outputs %s", tag),
          "a guard float changed");
    free(o0), free(s0), free(o1), free(s1), free(q), free(ref), free(rsc), free(kb), free(vb), free(table);
    cuda_free(dkt), cuda_free(dvt), cuda_free(dkl), cuda_free(dvl), cuda_free(dtab);
    cuda_free(dq), cuda_free(dout), cuda_free(dsc);
}

static void matmul_parts_case(wtype t, int T) {
    enum { N_IN = 72, P = 3 };
    int rows[P] = {40, 8, 24}, n_out = 72;
    void *raw = wmake(t, (size_t)n_out * N_IN, 0.1f), *dw = dup_up(raw, (size_t)n_out * N_IN * wtype_size(t));
    float *x = fvec((size_t)T * N_IN, 1.f), *dx = dup_up(x, (size_t)T * N_IN * 4);
    OK(cuda_reserve_scratch(&C, cuda_matmul_scratch_bytes(T, N_IN)));
    float *parts[P], *want[P];
    size_t row0 = 0;
    long diff = 0, guard = 0;
    for (int i = 0; i < P; i++) {
        size_t n = (size_t)T * rows[i];
        parts[i] = dalloc((n + GUARD) * 4);
        want[i] = dalloc(n * 4);
        wref wi = {(const char *)dw + row0 * N_IN * wtype_size(t), t};
        OK(cuda_matmul(&C, want[i], dx, wi, T, N_IN, rows[i]));
        row0 += rows[i];
    }
    wref w = {dw, t};
    OK(cuda_matmul_parts(&C, parts, dx, w, T, N_IN, rows, P));
    for (int i = 0; i < P; i++) {
        size_t n = (size_t)T * rows[i];
        float *g = fdown(parts[i], n + GUARD), *r = fdown(want[i], n);
        diff += memcmp(g, r, n * 4) != 0;
        guard += !guard_kept(g, n);
        free(g), free(r);
        cuda_free(parts[i]), cuda_free(want[i]);
    }
    CHECK(diff == 0 && guard == 0, NAME("cuda_matmul_parts equals cuda_matmul on each part, %s T=%d", wtype_name(t), T),
          "%ld parts differ, %ld wrote past their end", diff, guard);
    int bad[P] = {40, 0, 24};
    CHECK(cuda_matmul_parts(&C, parts, dx, w, T, N_IN, bad, P) != 0 && strstr(C.err.msg, "part 1 has 0 rows"),
          NAME("cuda_matmul_parts: a part of no rows is an error, %s T=%d", wtype_name(t), T), "%s", C.err.msg);
    free(raw), free(x);
    cuda_free(dw), cuda_free(dx);
}

// Microseconds a call of cuda_attention (T > 1) takes, tiled or not: the median of 3
// rounds of `iters` calls each.
static double time_one(cudaEvent_t e0, cudaEvent_t e1, kv_span ds, const float *dq, float *dout, int T,
                       attn_shape s, int tiled, int iters) {
    kv_pages none = {NULL, 0};
    C.prefill_tiled = tiled;
    double r[3];
    for (int k = 0; k < 3; k++) {
        OK(cuda_attention_paged(&C, dout, dq, ds, none, T, s, NULL));  // warm
        CK(cudaEventRecord(e0, C.stream));
        for (int it = 0; it < iters; it++) OK(cuda_attention_paged(&C, dout, dq, ds, none, T, s, NULL));
        CK(cudaEventRecord(e1, C.stream));
        OK(cuda_sync(&C));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        r[k] = ms * 1000.0 / iters;
    }
    C.prefill_tiled = 1;
    double lo = r[0] < r[1] ? r[0] : r[1], hi = r[0] < r[1] ? r[1] : r[0];
    return r[2] < lo ? lo : r[2] > hi ? hi : r[2];
}

static void bench(int quick) {
    struct { const char *name; int hd, nkv, G, nk, T; } sh[] = {
        {"smollm2-135m", 64, 3, 3, 512, 512},  {"llama-3.2-1b", 64, 8, 4, 512, 512},
        {"llama-3.2-1b", 64, 8, 4, 512, 256},  {"llama-3.2-1b", 64, 8, 4, 4096, 256},
        {"qwen3-0.6b", 128, 8, 2, 512, 512},   {"llama-3.1-8b", 128, 8, 4, 512, 512},
    }, tiny[] = {{"tiny", 64, 2, 2, 20, 8}};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int n = quick ? 1 : (int)(sizeof sh / sizeof *sh);
    for (int i = 0; i < n; i++) {
        int hd = quick ? tiny[0].hd : sh[i].hd, nkv = quick ? tiny[0].nkv : sh[i].nkv;
        int G = quick ? tiny[0].G : sh[i].G, nk = quick ? tiny[0].nk : sh[i].nk, T = quick ? tiny[0].T : sh[i].T;
        const char *name = quick ? tiny[0].name : sh[i].name;
        int nh = nkv * G, kv_dim = nkv * hd;
        attn_shape s = {nh, nkv, hd, 1.f / sqrtf((float)hd)};
        size_t el = (size_t)nk * kv_dim, nq = (size_t)T * nh * hd;
        uint16_t *kb = malloc(el * 2);
        for (size_t j = 0; j < el; j++) kb[j] = f32_to_bf16(frand());
        float *q = fvec(nq, 1.f);
        uint16_t *dk = dup_up(kb, el * 2), *dv = dup_up(kb, el * 2);
        float *dq = dup_up(q, nq * 4), *dout = dalloc(nq * 4);
        kv_span ds = {dk, dv, nk, NULL, NULL, 0, 1};
        int iters = quick ? 1 : 20;
        double simple = time_one(e0, e1, ds, dq, dout, T, s, 0, iters);
        double tiled = time_one(e0, e1, ds, dq, dout, T, s, 1, iters);
        printf("BENCH prefill attention %-13s hd=%d heads=%d/%d T=%d keys=%d: simple %9.1f us, tiled %9.1f us, "
               "%.2fx\n", name, hd, nh, nkv, T, nk, simple, tiled, tiled > 0 ? simple / tiled : 0);
        free(kb), free(q);
        cuda_free(dk), cuda_free(dv), cuda_free(dq), cuda_free(dout);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

int main(int argc, char **argv) {
    int h = harness_open("cuda_prefill");
    if (h) return h < 0;
    if (argc > 1 && (!strcmp(argv[1], "--bench") || !strcmp(argv[1], "--bench-quick"))) {
        bench(!strcmp(argv[1], "--bench-quick"));
        cuda_destroy(&C);
        return 0;
    }
    const wtype types[] = {WT_BF16, WT_F16, WT_F32};
    for (int i = 0; i < 3; i++) {
        matmul_parts_case(types[i], 1);
        matmul_parts_case(types[i], 37);
    }
    const int Gs[] = {1, 2, 3, 4, 5, 8, 16};
    for (int hi = 0; hi < 2; hi++)
        for (size_t gi = 0; gi < sizeof Gs / sizeof *Gs; gi++) {
            int hd = hi ? 128 : 64, G = Gs[gi], nkv = G >= 8 ? 1 : 2;
            prefill_case((pf_case){hd, nkv, G, 2, 0, 2, -1});       // two queries, nothing before
            prefill_case((pf_case){hd, nkv, G, 301, 40, 130, -1});  // after a trunk, a tail, tiles crossed
        }
    prefill_case((pf_case){64, 8, 4, 300, 0, 300, -1});    // Llama-3.2-1B's group, a whole prompt
    prefill_case((pf_case){128, 8, 2, 700, 0, 256, -1});   // Qwen3-0.6B's: a second chunk of 256
    prefill_case((pf_case){64, 3, 3, 257, 0, 129, 4});     // SmolLM2's group, a paged trunk
    prefill_case((pf_case){128, 2, 4, 520, 0, 200, 4});    // paged, queries past the first tile
    prefill_case((pf_case){64, 1, 16, 64, 0, 63, -1});     // one query a block, T one below the keys
    prefill_case((pf_case){80, 2, 2, 150, 9, 17, -1});     // head_dim 80: the other kernel
    prefill_case((pf_case){64, 1, 20, 90, 0, 11, -1});     // a group of 20: the other kernel
    cuda_destroy(&C);
    CHECK_DONE();
}
#endif
