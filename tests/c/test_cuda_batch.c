// test_cuda_batch.c: the batched-decode CUDA ops (B sequences of one token each) against
// their CPU twins, and each row against the B == 1 op on that row alone, bit for bit:
// cuda_matvec_rows (planar-by-segment output; B up to 19, passes of 8 in one launch; the
// deep one-row kernel against the 4-deep one), cuda_matvec_glu_rows, cuda_kv_store_rows and
// cuda_attention_decode_rows. Same conventions as test_cuda_kernels.c: fixed-seed
// random inputs, outputs poisoned with NaN first, |gpu - ref| <= tol + |ref| * eps.
// Usage: test_cuda_batch    (SKIP without a device)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "check.h"
#include "kernels/ops.h"

#ifndef VARENT_CUDA
int main(void) {
    (void)check_failures;
    SKIP("cuda_batch", "built without CUDA");
    return 0;
}
#else
#include <cuda_runtime_api.h>
#include "kernels/ops_cuda.h"

#include "cuda_harness.h"

// ---- cuda_matvec_rows --------------------------------------------------------------------
enum { MV_MAX_B = 19 };  // > 16: three passes of 8 rows in one launch, the last one partial

// Index of row r, column o in the planar layout: [B, s1] | [B, s2 - s1] | [B, n_out - s2].
static size_t planar_at(int B, int n_out, int s1, int s2, int r, int o) {
    if (o < s1) return (size_t)r * s1 + o;
    if (o < s2) return (size_t)B * s1 + (size_t)r * (s2 - s1) + (o - s1);
    return (size_t)B * s2 + (size_t)r * (n_out - s2) + (o - s2);
}

// One weight: rows of every B against cpu_matmul and against cuda_matvec on the row alone.
static void matvec_rows_case(wtype t, int n_in, int n_out, int s1, int s2) {
    static const int Bs[] = {1, 2, 3, 5, 8, 11, MV_MAX_B};
    size_t nw = (size_t)n_out * n_in, nx = (size_t)MV_MAX_B * n_in, ny = (size_t)MV_MAX_B * n_out;
    void *raw = wmake(t, nw, 1.f / sqrtf((float)n_in));
    float *x = fvec(nx, 1.f), *ref = malloc(ny * 4), *single = malloc(ny * 4), *plain = malloc(ny * 4);
    void *dw = dup_up(raw, nw * wtype_size(t));
    float *dx = dup_up(x, nx * 4), *dout = dalloc(ny * 4);
    wref w = {dw, t};
    cpu_matmul(ref, x, (wref){raw, t}, MV_MAX_B, n_in, n_out);
    for (int r = 0; r < MV_MAX_B; r++) {  // the B == 1 op on each row alone
        OK(cuda_memset(&C, dout, 0xFF, (size_t)n_out * 4));
        OK(cuda_matvec(&C, dout, dx + (size_t)r * n_in, w, n_in, n_out));
        OK(cuda_download(&C, single + (size_t)r * n_out, dout, (size_t)n_out * 4));
    }
    for (int bi = 0; bi < 7; bi++) {
        int B = Bs[bi];
        OK(cuda_memset(&C, dout, 0xFF, ny * 4));
        OK(cuda_matvec_rows(&C, dout, dx, w, n_in, n_out, B, s1, s2));
        float *got = fdown(dout, (size_t)B * n_out);
        for (int r = 0; r < B; r++)  // back to [B, n_out]; an unwritten slot stays NaN
            for (int o = 0; o < n_out; o++) plain[(size_t)r * n_out + o] = got[planar_at(B, n_out, s1, s2, r, o)];
        char tag[128];
        snprintf(tag, sizeof tag, "%s B=%d n_in=%d n_out=%d split=%d/%d", wtype_name(t), B, n_in, n_out, s1, s2);
        cmp(NAME("cuda_matvec_rows vs cpu %s", tag), plain, ref, (long)B * n_out, 1e-4f, 1e-3f);
        int bad_row = -1;
        for (int r = 0; r < B && bad_row < 0; r++)
            if (memcmp(plain + (size_t)r * n_out, single + (size_t)r * n_out, (size_t)n_out * 4)) bad_row = r;
        CHECK(bad_row < 0, NAME("cuda_matvec_rows bit-identical to B=1 %s", tag), "row %d differs", bad_row);
        free(got);
    }
    free(raw); free(x); free(ref); free(single); free(plain);
    cuda_free(dw); cuda_free(dx); cuda_free(dout);
}

static void test_matvec_rows(void) {
    // tall: enough rows for the four-rows-per-warp kernel (4 rows x 4 warps x 2 blocks per SM)
    int tall = 4 * 4 * 2 * (C.n_sm > 0 ? C.n_sm : 1) + 13, hid = tall / 2 + 1;
    int shapes[][4] = {  // n_in, n_out, s1, s2
        {256, 67, 67, 67},                    // plain, one row per warp
        {37, 67, 67, 67},                     // n_in % 8 != 0: scalar path
        {128, 160, 96, 128},                  // q|k|v = 96|32|32
        {100, 160, 96, 128},                  // q|k|v, scalar
        {256, 67, 0, 30},                     // empty first segment
        {512, tall, tall, tall},              // tall plain: four rows per warp
        {512, 2 * hid, hid, 2 * hid},         // tall gate|up
        {64, tall, tall - 128, tall - 64},    // tall q|k|v
        {100, tall, hid, tall}};              // tall, scalar
    for (int k = 0; k < 3; k++)
        for (int si = 0; si < 9; si++)
            matvec_rows_case(TYPES[k], shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
    float *d = dalloc(64 * 4);
    wref w = {d, WT_F32};
    CHECK(cuda_matvec_rows(&C, d, d, w, 4, 4, 0, 4, 4) != 0 && strstr(C.err.msg, "cuda_matvec_rows"),
          "cuda_matvec_rows refuses B=0", "%s", C.err.msg);
    CHECK(cuda_matvec_rows(&C, d, d, w, 4, 4, 1, 3, 2) != 0 && strstr(C.err.msg, "cuda_matvec_rows"),
          "cuda_matvec_rows refuses s1 > s2", "%s", C.err.msg);
    CHECK(cuda_matvec_rows(&C, d, d, w, 4, 4, 1, 2, 5) != 0 && strstr(C.err.msg, "cuda_matvec_rows"),
          "cuda_matvec_rows refuses s2 > n_out", "%s", C.err.msg);
    cuda_free(d);
}

// ---- cuda_rope_kv_store_rows ----------------------------------------------------------------
// The RoPE table of head_dim hd (inv_freq 10000^(-2i/hd)) for positions [0, ROPE_POS):
// built once per head_dim by cuda_rope_table (test_cuda_kernels checks it), as the
// forward builds its own.
#define ROPE_POS 1200
static float *rope_tab(int hd) {
    static float *tabs[257];
    if (!tabs[hd]) {
        float inv[128], *dinv;
        for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.f, -2.f * i / hd);
        dinv = dup_up(inv, (size_t)hd / 2 * 4);
        tabs[hd] = dalloc((size_t)ROPE_POS * hd * 4);
        OK(cuda_rope_table(&C, tabs[hd], dinv, hd / 2, ROPE_POS));
        cuda_free(dinv);
    }
    return tabs[hd];
}

// Against cuda_rope (q, k) + cuda_kv_store_rows on the same inputs, whole caches compared
// (untouched rows stay 0xFFFF), bit for bit; with Qwen3's q/k norms against cuda_rmsnorm
// over heads first (within rounding: the sums of squares run in another order). And
// against the CPU twin (cpu_rmsnorm, cpu_rope, then bf16 rounding for the caches).
static void rope_kv_case(int B, int nh, int nkv, int hd, int norm) {
    enum { N_POS = 9, MAX_B = 8 };
    int kv_dim = nkv * hd, pos[MAX_B], rows[MAX_B];
    size_t nq = (size_t)B * nh * hd, nk = (size_t)B * kv_dim, nc = (size_t)N_POS * kv_dim;
    for (int b = 0; b < B; b++) {
        pos[b] = irand(ROPE_POS);
        rows[b] = irand(N_POS);
    }
    float inv[256];
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.f, -2.f * i / hd);
    float *q = fvec(nq, 2.f), *k = fvec(nk, 2.f), *v = fvec(nk, 2.f);
    float *dq1 = dup_up(q, nq * 4), *dq2 = dup_up(q, nq * 4), *dk = dup_up(k, nk * 4), *dk2 = dup_up(k, nk * 4);
    float *dv = dup_up(v, nk * 4), *dinv = dup_up(inv, (size_t)hd / 2 * 4);
    float *qw = fvec((size_t)hd, 1.f), *kw = fvec((size_t)hd, 1.f);
    float *dqw = dup_up(qw, (size_t)hd * 4), *dkw = dup_up(kw, (size_t)hd * 4);
    int *dpos = dup_up(pos, B * sizeof(int)), *drows = dup_up(rows, B * sizeof(int));
    cuda_kv_layer L1[MAX_B], L2[MAX_B];
    for (int b = 0; b < B; b++) {
        L1[b] = (cuda_kv_layer){NULL, NULL, NULL, NULL, dalloc(nc * 2), dalloc(nc * 2)};
        L2[b] = (cuda_kv_layer){NULL, NULL, NULL, NULL, dalloc(nc * 2), dalloc(nc * 2)};
        OK(cuda_memset(&C, L1[b].k_dst, 0xFF, nc * 2)); OK(cuda_memset(&C, L1[b].v_dst, 0xFF, nc * 2));
        OK(cuda_memset(&C, L2[b].k_dst, 0xFF, nc * 2)); OK(cuda_memset(&C, L2[b].v_dst, 0xFF, nc * 2));
    }
    cuda_kv_layer *dL1 = dup_up(L1, B * sizeof *L1), *dL2 = dup_up(L2, B * sizeof *L2);
    OK(cuda_rope_kv_store_rows(&C, dq1, dk, dv, dpos, drows, dL1, B, nh, nkv, hd, rope_tab(hd), norm ? dqw : NULL,
                               norm ? dkw : NULL, 1e-6f));
    if (norm) {
        OK(cuda_rmsnorm(&C, dq2, dq2, (wref){dqw, WT_F32}, B * nh, hd, 1e-6f));
        OK(cuda_rmsnorm(&C, dk2, dk2, (wref){dkw, WT_F32}, B * nkv, hd, 1e-6f));
    }
    OK(cuda_rope(&C, dq2, dpos, B, nh, hd, dinv, 0));
    OK(cuda_rope(&C, dk2, dpos, B, nkv, hd, dinv, 0));
    OK(cuda_kv_store_rows(&C, dL2, dk2, dv, drows, B, kv_dim));
    char tag[96];
    snprintf(tag, sizeof tag, "B=%d heads=%d/%d hd=%d%s", B, nh, nkv, hd, norm ? " q/k norm" : "");
    float *g1 = fdown(dq1, nq), *g2 = fdown(dq2, nq);
    if (norm) cmp(NAME("cuda_rope_kv_store_rows q vs rmsnorm + rope %s", tag), g1, g2, (long)nq, 1e-5f, 1e-5f);
    else CHECK(!memcmp(g1, g2, nq * 4), NAME("cuda_rope_kv_store_rows q == cuda_rope %s", tag), "q differs");
    if (norm) {
        cpu_rmsnorm(q, q, (wref){qw, WT_F32}, B * nh, hd, 1e-6f);
        cpu_rmsnorm(k, k, (wref){kw, WT_F32}, B * nkv, hd, 1e-6f);
    }
    cpu_rope(q, pos, B, nh, hd, inv, 0);
    cpu_rope(k, pos, B, nkv, hd, inv, 0);
    cmp(NAME("cuda_rope_kv_store_rows q vs cpu %s", tag), g1, q, (long)nq, 1e-5f, 1e-5f);
    uint16_t *c1 = malloc(nc * 2), *c2 = malloc(nc * 2);
    int same = 1, near = 1;
    for (int b = 0; b < B; b++)
        for (int kv = 0; kv < 2; kv++) {
            OK(cuda_download(&C, c1, kv ? L1[b].v_dst : L1[b].k_dst, nc * 2));
            OK(cuda_download(&C, c2, kv ? L2[b].v_dst : L2[b].k_dst, nc * 2));
            same &= !memcmp(c1, c2, nc * 2);
            const float *want = (kv ? v : k) + (size_t)b * kv_dim;  // row rows[b] holds this row's values
            for (int e = 0; e < kv_dim; e++) {
                float got = bf16_to_f32(c1[(size_t)rows[b] * kv_dim + e]), w = bf16_to_f32(f32_to_bf16(want[e]));
                near &= fabsf(got - w) <= 1e-2f * fabsf(w) + 1e-6f;  // sincosf may move the last bit
            }
        }
    if (!norm)
        CHECK(same, NAME("cuda_rope_kv_store_rows caches == cuda_rope + cuda_kv_store_rows %s", tag), "a cache differs");
    CHECK(near, NAME("cuda_rope_kv_store_rows caches vs cpu %s", tag), "a stored k or v is off by more than a bf16 step");
    for (int b = 0; b < B; b++) {
        cuda_free(L1[b].k_dst); cuda_free(L1[b].v_dst); cuda_free(L2[b].k_dst); cuda_free(L2[b].v_dst);
    }
    free(q); free(k); free(v); free(g1); free(g2); free(c1); free(c2); free(qw); free(kw);
    cuda_free(dqw); cuda_free(dkw);
    cuda_free(dq1); cuda_free(dq2); cuda_free(dk); cuda_free(dk2); cuda_free(dv); cuda_free(dinv);
    cuda_free(dpos); cuda_free(drows); cuda_free(dL1); cuda_free(dL2);
}

static void test_rope_kv_rows(void) {
    int shapes[][3] = {{4, 2, 32}, {6, 6, 16}, {8, 1, 28}, {32, 8, 64}};  // heads, kv heads, head_dim
    int Bs[] = {1, 3, 8};
    for (int si = 0; si < 4; si++)
        for (int bi = 0; bi < 3; bi++)
            for (int norm = 0; norm < 2; norm++) rope_kv_case(Bs[bi], shapes[si][0], shapes[si][1], shapes[si][2], norm);
    CHECK(cuda_rope_kv_store_rows(&C, NULL, NULL, NULL, NULL, NULL, NULL, 1, 4, 2, 7, NULL, NULL, NULL, 0.f) != 0 &&
              strstr(C.err.msg, "cuda_rope_kv_store_rows"),
          "cuda_rope_kv_store_rows refuses an odd head_dim", "%s", C.err.msg);
}

// ---- cuda_matvec_rows_fused ----------------------------------------------------------------
// A folded RMSNorm (against cpu_rmsnorm then cpu_matmul) and a residual add (out starts
// as a random base and must end as base + W x), on the vector, four-rows and scalar
// kernels, each row against B == 1.
static void fused_rows_case(wtype t, int n_in, int n_out, int norm, int add, int bias) {
    static const int Bs[] = {1, 3, 8, MV_MAX_B};
    size_t nw = (size_t)n_out * n_in, nx = (size_t)MV_MAX_B * n_in, ny = (size_t)MV_MAX_B * n_out;
    void *raw = wmake(t, nw, 1.f / sqrtf((float)n_in));
    float *x = fvec(nx, 1.f), *g = fvec((size_t)n_in, 1.f), *base = fvec(ny, 1.f), *xn = malloc(nx * 4);
    float *bv = fvec((size_t)n_out, 1.f), *dbv = dup_up(bv, (size_t)n_out * 4);
    float *ref = malloc(ny * 4), *single = malloc(ny * 4);
    void *dw = dup_up(raw, nw * wtype_size(t));
    float *dx = dup_up(x, nx * 4), *dg = dup_up(g, (size_t)n_in * 4), *dout = dalloc(ny * 4);
    wref w = {dw, t};
    cuda_mv_fuse fz = {norm ? dg : NULL, 1e-5f, add, bias ? dbv : NULL, NULL};
    if (norm) cpu_rmsnorm(xn, x, (wref){g, WT_F32}, MV_MAX_B, n_in, 1e-5f);
    else memcpy(xn, x, nx * 4);
    cpu_matmul(ref, xn, (wref){raw, t}, MV_MAX_B, n_in, n_out);
    for (size_t i = 0; bias && i < ny; i++) ref[i] += bv[i % (size_t)n_out];
    for (size_t i = 0; add && i < ny; i++) ref[i] += base[i];
    for (int r = 0; r < MV_MAX_B; r++) {
        OK(cuda_upload(&C, dout, base + (size_t)r * n_out, (size_t)n_out * 4));
        OK(cuda_matvec_rows_fused(&C, dout, dx + (size_t)r * n_in, w, n_in, n_out, 1, n_out, n_out, &fz));
        OK(cuda_download(&C, single + (size_t)r * n_out, dout, (size_t)n_out * 4));
    }
    for (int bi = 0; bi < 4; bi++) {
        int B = Bs[bi];
        char tag[128];
        snprintf(tag, sizeof tag, "%s B=%d n_in=%d n_out=%d%s%s%s", wtype_name(t), B, n_in, n_out,
                 norm ? " norm" : "", add ? " add" : "", bias ? " bias" : "");
        OK(cuda_upload(&C, dout, base, (size_t)B * n_out * 4));
        OK(cuda_matvec_rows_fused(&C, dout, dx, w, n_in, n_out, B, n_out, n_out, &fz));
        float *got = fdown(dout, (size_t)B * n_out);
        cmp(NAME("cuda_matvec_rows_fused vs cpu %s", tag), got, ref, (long)B * n_out, 1e-4f, 1e-3f);
        CHECK(!memcmp(got, single, (size_t)B * n_out * 4), NAME("cuda_matvec_rows_fused bit-identical to B=1 %s", tag),
              "a row differs");
        free(got);
    }
    free(raw); free(x); free(g); free(base); free(xn); free(ref); free(single); free(bv);
    cuda_free(dw); cuda_free(dx); cuda_free(dg); cuda_free(dout); cuda_free(dbv);
}

static void test_fused_rows(void) {
    int tall = 4 * 4 * 2 * (C.n_sm > 0 ? C.n_sm : 1) + 13;
    int shapes[][2] = {{256, 67}, {512, tall}, {37, 67}};  // vector, four rows per warp, scalar
    static const int modes[][3] = {{1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {1, 0, 1}};  // norm, add, bias
    for (int k = 0; k < 3; k++)
        for (int si = 0; si < 3; si++)
            for (int m = 0; m < 4; m++)  // the tall shape (slow on the emulator): bf16, a norm
                if (si != 1 || (k == 2 && modes[m][0]))
                    fused_rows_case(TYPES[k], shapes[si][0], shapes[si][1], modes[m][0], modes[m][1], modes[m][2]);
    float *d = dalloc(64 * 4);
    wref w = {d, WT_F32};
    cuda_mv_fuse add = {NULL, 0.f, 1, NULL, NULL};
    CHECK(cuda_matvec_rows_fused(&C, d, d, w, 8, 4, 1, 2, 4, &add) != 0 && strstr(C.err.msg, "plain layout"),
          "cuda_matvec_rows_fused refuses a residual add into a split layout", "%s", C.err.msg);
    cuda_free(d);
}

// ---- the deep one-row matvec (C.mv_deep) -----------------------------------------------------
// 8 chunks a lane in flight instead of 4: the same bits (the sums' order does not depend
// on it, matvec.cuh), within tolerance of the CPU, on rows whose lanes end in a whole
// group of 8, in 8 plus a group of 4 and a rest, and in counts that differ by lane.
static void deep_case(wtype t, int n_in, int n_out, int norm, int add, int want_deep) {
    size_t nw = (size_t)n_out * n_in;
    void *raw = wmake(t, nw, 1.f / sqrtf((float)n_in));
    float *x = fvec((size_t)n_in, 1.f), *g = fvec((size_t)n_in, 1.f), *base = fvec((size_t)n_out, 1.f);
    float *xn = malloc((size_t)n_in * 4), *ref = malloc((size_t)n_out * 4);
    void *dw = dup_up(raw, nw * wtype_size(t));
    float *dx = dup_up(x, (size_t)n_in * 4), *dg = dup_up(g, (size_t)n_in * 4), *dout = dalloc((size_t)n_out * 4);
    wref w = {dw, t};
    cuda_mv_fuse fz = {norm ? dg : NULL, 1e-5f, add, NULL, NULL};
    if (norm) cpu_rmsnorm(xn, x, (wref){g, WT_F32}, 1, n_in, 1e-5f);
    else memcpy(xn, x, (size_t)n_in * 4);
    cpu_matmul(ref, xn, (wref){raw, t}, 1, n_in, n_out);
    for (int i = 0; add && i < n_out; i++) ref[i] += base[i];
    float *got[2];
    long deep0 = C.n_mv_deep;
    for (int d = 0; d < 2; d++) {
        C.mv_deep = d;
        OK(cuda_upload(&C, dout, base, (size_t)n_out * 4));
        OK(cuda_matvec_rows_fused(&C, dout, dx, w, n_in, n_out, 1, n_out, n_out, &fz));
        got[d] = fdown(dout, (size_t)n_out);
    }
    C.mv_deep = 0;
    char tag[128];
    snprintf(tag, sizeof tag, "%s n_in=%d n_out=%d%s%s", wtype_name(t), n_in, n_out, norm ? " norm" : "",
             add ? " add" : "");
    CHECK(C.n_mv_deep == deep0 + want_deep,
          NAME("cuda matvec deep kernel %s %s", want_deep ? "taken" : "not taken (under 2048 inputs)", tag),
          "%ld deep launches", C.n_mv_deep - deep0);
    cmp(NAME("cuda matvec deep vs cpu %s", tag), got[1], ref, n_out, 1e-4f, 1e-3f);
    CHECK(!memcmp(got[0], got[1], (size_t)n_out * 4), NAME("cuda matvec deep bit-identical to 4 in flight %s", tag),
          "a row differs");
    free(got[0]); free(got[1]);
    free(raw); free(x); free(g); free(base); free(xn); free(ref);
    cuda_free(dw); cuda_free(dx); cuda_free(dg); cuda_free(dout);
}

// The four-row (tall) and gate|up kernels with the next chunks in flight: the same bits
// as without, within tolerance of the CPU, counted as deep launches; rows of 2 to 5
// chunks a lane, some lanes one more than others.
static void deep4_case(wtype t, int n_in, int glu) {
    int n_out = glu ? 2 * 37 : 4 * 4 * 2 * (C.n_sm > 0 ? C.n_sm : 1) + 13, hid = n_out / 2;
    int n_y = glu ? hid : n_out;
    size_t nw = (size_t)n_out * n_in;
    void *raw = wmake(t, nw, 1.f / sqrtf((float)n_in));
    float *x = fvec((size_t)n_in, 1.f), *g = fvec((size_t)n_in, 1.f), *xn = malloc((size_t)n_in * 4);
    float *mm = malloc((size_t)n_out * 4), *ref = malloc((size_t)n_y * 4);
    void *dw = dup_up(raw, nw * wtype_size(t));
    float *dx = dup_up(x, (size_t)n_in * 4), *dg = dup_up(g, (size_t)n_in * 4), *dout = dalloc((size_t)n_out * 4);
    float *dtmp = dalloc((size_t)n_out * 4);
    wref w = {dw, t};
    cuda_mv_fuse fz = {dg, 1e-5f, 0, NULL, NULL};  // a folded norm, as gate|up and the lm_head have
    cpu_rmsnorm(xn, x, (wref){g, WT_F32}, 1, n_in, 1e-5f);
    cpu_matmul(mm, xn, (wref){raw, t}, 1, n_in, n_out);
    if (glu) cpu_swiglu(ref, mm, mm + hid, (size_t)hid);
    else memcpy(ref, mm, (size_t)n_out * 4);
    float *got[2];
    long deep0 = C.n_mv_deep;
    for (int d = 0; d < 2; d++) {
        C.mv_deep = d;
        OK(cuda_memset(&C, dout, 0xFF, (size_t)n_out * 4));
        if (glu) OK(cuda_matvec_glu_rows(&C, dout, dtmp, dx, w, n_in, hid, 1, &fz));
        else OK(cuda_matvec_rows_fused(&C, dout, dx, w, n_in, n_out, 1, n_out, n_out, &fz));
        got[d] = fdown(dout, (size_t)n_y);
    }
    C.mv_deep = 0;
    char tag[128];
    snprintf(tag, sizeof tag, "%s %s n_in=%d n_out=%d", glu ? "gate|up" : "four-row", wtype_name(t), n_in, n_out);
    CHECK(C.n_mv_deep == deep0 + 1, NAME("cuda matvec deep kernel taken %s", tag), "%ld deep launches",
          C.n_mv_deep - deep0);
    cmp(NAME("cuda matvec deep vs cpu %s", tag), got[1], ref, n_y, 1e-4f, 1e-3f);
    CHECK(!memcmp(got[0], got[1], (size_t)n_y * 4), NAME("cuda matvec deep bit-identical to 4 in flight %s", tag),
          "a row differs");
    free(got[0]); free(got[1]);
    free(raw); free(x); free(g); free(xn); free(mm); free(ref);
    cuda_free(dw); cuda_free(dx); cuda_free(dg); cuda_free(dout); cuda_free(dtmp);
}

static void test_deep_rows(void) {
    // chunks a lane: 8 (one group); 13 (8, then 4 alternating and 1); 8 or 9 by lane;
    // 31 or 32 by lane (three groups, then 7 or 8)
    int n_ins[] = {2048, 3328, 2104, 8192 - 8};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++) deep_case(TYPES[k], n_ins[i], 37, i & 1, i >= 2, 1);
    deep_case(WT_BF16, 2040, 37, 0, 0, 0);  // short of 8 chunks a lane: the 4-deep kernel
    for (int k = 0; k < 3; k++) {  // gate|up: 2 or 3 chunks a lane, then 4 or 5
        deep4_case(TYPES[k], 520, 1);
        deep4_case(TYPES[k], 1032, 1);
    }
    deep4_case(WT_BF16, 1288, 0);  // four rows a warp: 5 or 6 chunks a lane (the tall shape: slow emulated)
}

// ---- cuda_matvec_glu_rows -------------------------------------------------------------------
// silu(gate) * up of every B against the CPU twin (cpu_matmul, cpu_swiglu), each row
// against B == 1, and bit for bit against the two launches it replaces where those take
// the four-rows-per-warp kernel (tall), or the fallback (n_in % 8 != 0).
static void glu_rows_case(wtype t, int n_in, int hid, int exact, int norm) {
    static const int Bs[] = {1, 2, 3, 5, 8, 11, MV_MAX_B};
    size_t nw = (size_t)2 * hid * n_in, nx = (size_t)MV_MAX_B * n_in, ny = (size_t)MV_MAX_B * hid;
    void *raw = wmake(t, nw, 1.f / sqrtf((float)n_in));
    float *x = fvec(nx, 1.f), *gu = malloc(2 * ny * 4), *ref = malloc(ny * 4), *single = malloc(ny * 4);
    void *dw = dup_up(raw, nw * wtype_size(t));
    float *dx = dup_up(x, nx * 4), *dout = dalloc(ny * 4), *dtmp = dalloc(2 * ny * 4);
    wref w = {dw, t};
    float *gn = fvec((size_t)n_in, 1.f), *xn = malloc(nx * 4), *dnw = dup_up(gn, (size_t)n_in * 4);
    cuda_mv_fuse fz = {dnw, 1e-5f, 0, NULL, NULL}, *pf = norm ? &fz : NULL;  // the folded RMSNorm, or none
    if (norm) cpu_rmsnorm(xn, x, (wref){gn, WT_F32}, MV_MAX_B, n_in, 1e-5f);
    else memcpy(xn, x, nx * 4);
    cpu_matmul(gu, xn, (wref){raw, t}, MV_MAX_B, n_in, 2 * hid);
    for (int r = 0; r < MV_MAX_B; r++)
        cpu_swiglu(ref + (size_t)r * hid, gu + (size_t)r * 2 * hid, gu + (size_t)r * 2 * hid + hid, (size_t)hid);
    for (int r = 0; r < MV_MAX_B; r++) {
        OK(cuda_memset(&C, dout, 0xFF, (size_t)hid * 4));
        OK(cuda_matvec_glu_rows(&C, dout, dtmp, dx + (size_t)r * n_in, w, n_in, hid, 1, pf));
        OK(cuda_download(&C, single + (size_t)r * hid, dout, (size_t)hid * 4));
    }
    for (int bi = 0; bi < 7; bi++) {
        int B = Bs[bi];
        char tag[128];
        snprintf(tag, sizeof tag, "%s B=%d n_in=%d hid=%d%s", wtype_name(t), B, n_in, hid, norm ? " norm" : "");
        OK(cuda_memset(&C, dout, 0xFF, ny * 4));
        OK(cuda_matvec_glu_rows(&C, dout, dtmp, dx, w, n_in, hid, B, pf));
        float *got = fdown(dout, (size_t)B * hid);
        cmp(NAME("cuda_matvec_glu_rows vs cpu %s", tag), got, ref, (long)B * hid, 1e-4f, 1e-3f);
        CHECK(!memcmp(got, single, (size_t)B * hid * 4), NAME("cuda_matvec_glu_rows bit-identical to B=1 %s", tag),
              "a row differs");
        if (exact) {  // the two launches it replaces
            OK(cuda_memset(&C, dtmp, 0xFF, 2 * ny * 4));
            OK(cuda_matvec_rows_fused(&C, dtmp, dx, w, n_in, 2 * hid, B, hid, 2 * hid, pf));
            OK(cuda_swiglu(&C, dtmp, dtmp, dtmp + (size_t)B * hid, (size_t)B * hid));
            float *two = fdown(dtmp, (size_t)B * hid);
            CHECK(!memcmp(got, two, (size_t)B * hid * 4), NAME("cuda_matvec_glu_rows == matvec_rows + swiglu %s", tag),
                  "the fused result differs from the two launches");
            free(two);
        }
        free(got);
    }
    free(raw); free(x); free(gu); free(ref); free(single); free(gn); free(xn);
    cuda_free(dw); cuda_free(dx); cuda_free(dout); cuda_free(dtmp); cuda_free(dnw);
}

static void test_glu_rows(void) {
    int tall = 4 * 4 * 2 * (C.n_sm > 0 ? C.n_sm : 1) + 13, hid = tall / 2 + 1;  // 2*hid rows take vec4
    for (int k = 0; k < 3; k++)
        for (int norm = 0; norm < 2; norm++) {
            glu_rows_case(TYPES[k], 256, 67, 0, norm);   // odd hid: the last warp has one output
            if (!norm || k == 2) glu_rows_case(TYPES[k], 512, hid, 1, norm);  // tall: == vec4 + swiglu
            glu_rows_case(TYPES[k], 37, 5, 1, norm);     // n_in % 8 != 0: the fallback is those two ops
        }
    float *d = dalloc(64 * 4);
    wref w = {d, WT_F32};
    cuda_mv_fuse add = {NULL, 0.f, 1, NULL, NULL};
    CHECK(cuda_matvec_glu_rows(&C, d, d, d, w, 8, 0, 1, NULL) != 0 && strstr(C.err.msg, "cuda_matvec_glu_rows"),
          "cuda_matvec_glu_rows refuses hid=0", "%s", C.err.msg);
    CHECK(cuda_matvec_glu_rows(&C, d, d, d, w, 8, 4, 0, NULL) != 0 && strstr(C.err.msg, "cuda_matvec_glu_rows"),
          "cuda_matvec_glu_rows refuses B=0", "%s", C.err.msg);
    CHECK(cuda_matvec_glu_rows(&C, d, d, d, w, 8, 4, 1, &add) != 0 && strstr(C.err.msg, "residual"),
          "cuda_matvec_glu_rows refuses a residual add", "%s", C.err.msg);
    cuda_free(d);
}

// ---- cuda_kv_store_rows ---------------------------------------------------------------------
// Row b goes to its own cache (record b) at rows[b]; every other cache row stays 0xFFFF.
static void kv_store_rows_case(int B, int kv_dim) {
    enum { N_POS = 11, MAX_B = 8 };
    size_t n = (size_t)B * kv_dim, nc = (size_t)N_POS * kv_dim;
    int rows[MAX_B];
    for (int b = 0; b < B; b++) rows[b] = irand(N_POS);
    rows[B - 1] = N_POS - 1;
    float *k = fvec(n, 3.f), *v = fvec(n, 3.f);
    float *dk = dup_up(k, n * 4), *dv = dup_up(v, n * 4);
    int *drows = dup_up(rows, B * sizeof(int));
    cuda_kv_layer L[MAX_B];
    for (int b = 0; b < B; b++) L[b] = (cuda_kv_layer){NULL, NULL, NULL, NULL, dalloc(nc * 2), dalloc(nc * 2)};
    cuda_kv_layer *dL = dup_up(L, B * sizeof *L);
    OK(cuda_kv_store_rows(&C, dL, dk, dv, drows, B, kv_dim));
    uint16_t *hk = malloc(nc * 2), *hv = malloc(nc * 2);
    long bad = -1;
    int bad_b = -1;
    for (int b = 0; b < B && bad < 0; b++) {
        OK(cuda_download(&C, hk, L[b].k_dst, nc * 2));
        OK(cuda_download(&C, hv, L[b].v_dst, nc * 2));
        for (size_t i = 0; i < nc && bad < 0; i++) {
            int p = (int)(i / kv_dim), c = (int)(i % kv_dim);
            uint16_t ek = p != rows[b] ? 0xFFFF : f32_to_bf16(k[(size_t)b * kv_dim + c]);
            uint16_t ev = p != rows[b] ? 0xFFFF : f32_to_bf16(v[(size_t)b * kv_dim + c]);
            if (hk[i] != ek || hv[i] != ev) { bad = (long)i; bad_b = b; }
        }
    }
    CHECK(bad < 0, NAME("cuda_kv_store_rows bf16 B=%d kv_dim=%d", B, kv_dim),
          "cache %d: mismatch at element %ld (row %ld, stored row %d)", bad_b, bad, bad / kv_dim,
          bad_b < 0 ? -1 : rows[bad_b]);
    for (int b = 0; b < B; b++) { cuda_free(L[b].k_dst); cuda_free(L[b].v_dst); }
    free(k); free(v); free(hk); free(hv);
    cuda_free(dk); cuda_free(dv); cuda_free(drows); cuda_free(dL);
}

static void test_kv_store_rows(void) {
    int Bs[] = {1, 3, 8}, dims[] = {520, 64, 36};
    for (int bi = 0; bi < 3; bi++)
        for (int di = 0; di < 3; di++) kv_store_rows_case(Bs[bi], dims[di]);
    CHECK(cuda_kv_store_rows(&C, NULL, NULL, NULL, NULL, 1, 8) != 0 && strstr(C.err.msg, "cuda_kv_store_rows"),
          "cuda_kv_store_rows refuses missing records", "%s", C.err.msg);
}

// ---- cuda_attention_decode_rows ------------------------------------------------------------
enum { AR_MAX_B = 8 };

// B rows over one shared trunk (row b reads its first trunk[b] keys) and a tail of its own
// (tail[b] keys; 0: no tail segment). Each row vs cpu_attention on its own kv_span and vs
// cuda_attention_decode_dev (B == 1) on its own records, bit for bit.
static void attn_rows_case(int hd, int nkv, int G, int B, const int *trunk, const int *tail, float qscale) {
    int nh = nkv * G, kv_dim = nkv * hd, max_trunk = 0, max_nk = 0;
    for (int b = 0; b < B; b++) {
        if (trunk[b] > max_trunk) max_trunk = trunk[b];
        if (trunk[b] + tail[b] > max_nk) max_nk = trunk[b] + tail[b];
    }
    attn_shape s = {nh, nkv, hd, 1.f / sqrtf((float)hd)};
    int max_keys = 3 * max_nk + 100;  // most splits see few or no keys
    size_t nq1 = (size_t)nh * hd, nsc = (size_t)nh * max_keys;
    // Host copies are the bf16-rounded values the CPU twin reads; the device gets the bf16.
    float *kf[AR_MAX_B + 1], *vf[AR_MAX_B + 1];
    void *dk[AR_MAX_B + 1], *dv[AR_MAX_B + 1];
    for (int i = 0; i <= B; i++) {  // i == B: the shared trunk
        size_t nel = (size_t)(i == B ? max_trunk : tail[i]) * kv_dim;
        kf[i] = fvec(nel, 1.f); vf[i] = fvec(nel, 1.f);
        uint16_t *kb = malloc(nel * 2 + 2), *vb = malloc(nel * 2 + 2);
        for (size_t j = 0; j < nel; j++) {
            kb[j] = f32_to_bf16(kf[i][j]); kf[i][j] = bf16_to_f32(kb[j]);
            vb[j] = f32_to_bf16(vf[i][j]); vf[i][j] = bf16_to_f32(vb[j]);
        }
        dk[i] = dv[i] = NULL;
        if (nel || i == B) {  // a trunk buffer even when empty: records point somewhere valid
            dk[i] = dalloc(nel * 2 + 16); dv[i] = dalloc(nel * 2 + 16);
            OK(cuda_upload(&C, dk[i], kb, nel * 2));
            OK(cuda_upload(&C, dv[i], vb, nel * 2));
        }
        free(kb); free(vb);
    }
    cuda_kv_layer L[AR_MAX_B];
    cuda_kv_lens N[AR_MAX_B];
    for (int b = 0; b < B; b++) {
        L[b] = (cuda_kv_layer){dk[B], dv[B], dk[b], dv[b], NULL, NULL};
        N[b] = (cuda_kv_lens){trunk[b], trunk[b] + tail[b], NULL, 0};
    }
    cuda_kv_layer *dL = dup_up(L, B * sizeof *L);
    cuda_kv_lens *dN = dup_up(N, B * sizeof *N);
    float *q = fvec((size_t)B * nq1, qscale), *dq = dup_up(q, (size_t)B * nq1 * 4);
    float *dout = dalloc((size_t)B * nq1 * 4), *dsc = dalloc((size_t)B * nsc * 4);
    float *dout1 = dalloc(nq1 * 4), *dsc1 = dalloc(nsc * 4);
    size_t sb = cuda_attention_rows_scratch_bytes(&C, max_keys, s, B), s1b = cuda_attention_scratch_bytes(&C, max_keys, s);
    OK(cuda_reserve_scratch(&C, sb > s1b ? sb : s1b));
    OK(cuda_attention_decode_rows(&C, dout, dq, dL, dN, B, max_keys, s, dsc));
    float *got = fdown(dout, (size_t)B * nq1), *gsc = fdown(dsc, (size_t)B * nsc);
    OK(cuda_memset(&C, dout, 0xFF, (size_t)B * nq1 * 4));
    OK(cuda_attention_decode_rows(&C, dout, dq, dL, dN, B, max_keys, s, NULL));
    float *got_ns = fdown(dout, (size_t)B * nq1);
    // The same without the counters: split and combine as two launches, the same bits.
    int counters = C.att_count_n;
    C.att_count_n = 0;
    OK(cuda_memset(&C, dout, 0xFF, (size_t)B * nq1 * 4));
    OK(cuda_attention_decode_rows(&C, dout, dq, dL, dN, B, max_keys, s, NULL));
    C.att_count_n = counters;
    float *got_two = fdown(dout, (size_t)B * nq1);
    CHECK(!memcmp(got_ns, got_two, (size_t)B * nq1 * 4),
          NAME("cuda_attention_decode_rows self-combined == split + combine hd=%d kv=%d G=%d B=%d", hd, nkv, G, B),
          "the outputs differ");
    free(got_two);
    float *ref = malloc(nq1 * 4), *rsc = malloc(nsc * 4);
    for (int b = 0; b < B; b++) {
        int nk = trunk[b] + tail[b];
        kv_span hs = {kf[B], vf[B], trunk[b], tail[b] ? kf[b] : NULL, tail[b] ? vf[b] : NULL, tail[b], 0};
        cpu_attention(ref, q + (size_t)b * nq1, hs, 1, s, rsc);
        char tag[160];
        snprintf(tag, sizeof tag, "hd=%d kv=%d G=%d B=%d row=%d trunk=%d tail=%d", hd, nkv, G, B, b, trunk[b],
                 tail[b]);
        const float *gb = got + (size_t)b * nq1, *sb_ = gsc + (size_t)b * nsc;
        cmp(NAME("cuda_attention_decode_rows out %s", tag), gb, ref, (long)nq1, 2e-5f, 1e-3f);
        cmp(NAME("cuda_attention_decode_rows scores %s", tag), sb_, rsc, (long)nh * nk, 1e-5f, 1e-4f);
        CHECK(!memcmp(gb, got_ns + (size_t)b * nq1, nq1 * 4),
              NAME("cuda_attention_decode_rows out without last_scores %s", tag), "differs");
        OK(cuda_memset(&C, dout1, 0xFF, nq1 * 4));
        OK(cuda_memset(&C, dsc1, 0xFF, nsc * 4));
        OK(cuda_attention_decode_dev(&C, dout1, dq + (size_t)b * nq1, dL + b, dN + b, max_keys, s, dsc1));
        float *g1 = fdown(dout1, nq1), *s1 = fdown(dsc1, (size_t)nh * nk);
        CHECK(!memcmp(gb, g1, nq1 * 4) && !memcmp(sb_, s1, (size_t)nh * nk * 4),
              NAME("cuda_attention_decode_rows bit-identical to decode_dev %s", tag), "out %s, scores %s",
              memcmp(gb, g1, nq1 * 4) ? "differ" : "equal", memcmp(sb_, s1, (size_t)nh * nk * 4) ? "differ" : "equal");
        free(g1); free(s1);
    }
    for (int i = 0; i <= B; i++) { free(kf[i]); free(vf[i]); cuda_free(dk[i]); cuda_free(dv[i]); }
    free(q); free(got); free(gsc); free(got_ns); free(ref); free(rsc);
    cuda_free(dL); cuda_free(dN); cuda_free(dq); cuda_free(dout); cuda_free(dsc); cuda_free(dout1); cuda_free(dsc1);
}

// ---- cuda_attention_decode_rows_rope ----------------------------------------------------------
// The fused step (RoPE + KV store inside the attention launch) against the two launches it
// replaces, bit for bit: outputs, captured scores and both caches. Each row has a trunk
// and a tail of its own (tail 0: the newest key is the trunk's last row); the newest row
// starts as NaN in both caches, so a missed store or a stale read shows.
static void upload_poisoned(void **d, const uint16_t *h, int rows, int kv_dim, int newest) {
    size_t n = (size_t)rows * kv_dim;
    *d = dalloc(n * 2 + 16);
    OK(cuda_upload(&C, *d, h, n * 2));
    if (newest >= 0) OK(cuda_memset(&C, (uint16_t *)*d + (size_t)newest * kv_dim, 0xFF, (size_t)kv_dim * 2));
}

static void fused_rope_case(int hd, int nkv, int G, int B, const int *trunk, const int *tail, int norm) {
    int nh = nkv * G, kv_dim = nkv * hd, max_nk = 0, pos[AR_MAX_B], rows[AR_MAX_B];
    for (int b = 0; b < B; b++) max_nk = trunk[b] + tail[b] > max_nk ? trunk[b] + tail[b] : max_nk;
    attn_shape s = {nh, nkv, hd, 1.f / sqrtf((float)hd)};
    int max_keys = 2 * max_nk + 50;
    size_t nq = (size_t)B * nh * hd, nk = (size_t)B * kv_dim, nsc = (size_t)nh * max_keys;
    float *q = fvec(nq, 2.f), *k = fvec(nk, 2.f), *v = fvec(nk, 2.f), *qw = fvec((size_t)hd, 1.f), *kw = fvec((size_t)hd, 1.f);
    float *dqa = dup_up(q, nq * 4), *dqb = dup_up(q, nq * 4), *dk = dup_up(k, nk * 4), *dv = dup_up(v, nk * 4);
    float *dqw = dup_up(qw, (size_t)hd * 4), *dkw = dup_up(kw, (size_t)hd * 4);
    void *buf[2][AR_MAX_B][4];  // [path][row][k trunk, v trunk, k tail, v tail]
    cuda_kv_layer L[2][AR_MAX_B];
    cuda_kv_lens N[AR_MAX_B];
    for (int b = 0; b < B; b++) {
        pos[b] = irand(ROPE_POS);
        int newest_in_tail = tail[b] > 0;
        rows[b] = newest_in_tail ? tail[b] - 1 : trunk[b] - 1;
        N[b] = (cuda_kv_lens){trunk[b], trunk[b] + tail[b], NULL, 0};
        for (int seg = 0; seg < 4; seg++) {
            int n = seg < 2 ? trunk[b] : tail[b], newest = (seg < 2) != newest_in_tail ? rows[b] : -1;
            uint16_t *h = malloc((size_t)n * kv_dim * 2 + 2);
            float *f = fvec((size_t)n * kv_dim, 1.f);
            for (size_t j = 0; j < (size_t)n * kv_dim; j++) h[j] = f32_to_bf16(f[j]);
            for (int path = 0; path < 2; path++) upload_poisoned(&buf[path][b][seg], h, n, kv_dim, newest);
            free(h); free(f);
        }
        for (int path = 0; path < 2; path++) {
            void **g = buf[path][b];
            L[path][b] = (cuda_kv_layer){g[0], g[1], tail[b] ? g[2] : NULL, tail[b] ? g[3] : NULL,
                                         tail[b] ? g[2] : g[0], tail[b] ? g[3] : g[1]};
        }
    }
    cuda_kv_layer *dLa = dup_up(L[0], B * sizeof **L), *dLb = dup_up(L[1], B * sizeof **L);
    cuda_kv_lens *dN = dup_up(N, B * sizeof *N);
    int *dpos = dup_up(pos, B * sizeof(int)), *drows = dup_up(rows, B * sizeof(int));
    float *outa = dalloc(nq * 4), *outb = dalloc(nq * 4), *sca = dalloc((size_t)B * nsc * 4), *scb = dalloc((size_t)B * nsc * 4);
    OK(cuda_reserve_scratch(&C, cuda_attention_rows_scratch_bytes(&C, max_keys, s, B)));
    const float *qn = norm ? dqw : NULL, *kn = norm ? dkw : NULL;
    OK(cuda_rope_kv_store_rows(&C, dqa, dk, dv, dpos, drows, dLa, B, nh, nkv, hd, rope_tab(hd), qn, kn, 1e-6f));
    OK(cuda_attention_decode_rows(&C, outa, dqa, dLa, dN, B, max_keys, s, sca));
    cuda_rope_kv rk = {dk, dv, dpos, drows, rope_tab(hd), qn, kn, 1e-6f};
    OK(cuda_attention_decode_rows_rope(&C, outb, dqb, &rk, dLb, dN, B, max_keys, s, scb));
    char tag[160];
    snprintf(tag, sizeof tag, "hd=%d kv=%d G=%d B=%d%s", hd, nkv, G, B, norm ? " q/k norm" : "");
    float *ga = fdown(outa, nq), *gb = fdown(outb, nq), *qb = fdown(dqb, nq);
    CHECK(!memcmp(ga, gb, nq * 4), NAME("attention_decode_rows_rope out == rope_kv_store + attention %s", tag), "differs");
    CHECK(!memcmp(qb, q, nq * 4), NAME("attention_decode_rows_rope leaves q as given %s", tag), "q was written");
    int same_sc = 1, same_kv = 1;
    for (int b = 0; b < B; b++) {
        size_t n = (size_t)nh * (trunk[b] + tail[b]) * 4;
        float *sa = fdown(sca + (size_t)b * nsc, n / 4), *sb = fdown(scb + (size_t)b * nsc, n / 4);
        same_sc &= !memcmp(sa, sb, n);
        free(sa); free(sb);
        for (int seg = 0; seg < 4; seg++) {
            size_t nb = (size_t)(seg < 2 ? trunk[b] : tail[b]) * kv_dim * 2;
            if (!nb) continue;
            uint16_t *ca = malloc(nb), *cb = malloc(nb);
            OK(cuda_download(&C, ca, buf[0][b][seg], nb));
            OK(cuda_download(&C, cb, buf[1][b][seg], nb));
            same_kv &= !memcmp(ca, cb, nb);
            free(ca); free(cb);
        }
    }
    CHECK(same_sc, NAME("attention_decode_rows_rope scores == two launches %s", tag), "a captured score differs");
    CHECK(same_kv, NAME("attention_decode_rows_rope caches == rope_kv_store %s", tag), "a cache row differs");
    int counters = C.att_count_n;  // and with the combine as a launch of its own
    C.att_count_n = 0;
    OK(cuda_attention_decode_rows_rope(&C, outb, dqb, &rk, dLb, dN, B, max_keys, s, NULL));
    C.att_count_n = counters;
    float *g2 = fdown(outb, nq);
    CHECK(!memcmp(ga, g2, nq * 4), NAME("attention_decode_rows_rope split + combine launches %s", tag), "differs");
    for (int path = 0; path < 2; path++)
        for (int b = 0; b < B; b++)
            for (int seg = 0; seg < 4; seg++) cuda_free(buf[path][b][seg]);
    free(q); free(k); free(v); free(qw); free(kw); free(ga); free(gb); free(qb); free(g2);
    cuda_free(dqa); cuda_free(dqb); cuda_free(dk); cuda_free(dv); cuda_free(dqw); cuda_free(dkw);
    cuda_free(dLa); cuda_free(dLb); cuda_free(dN); cuda_free(dpos); cuda_free(drows);
    cuda_free(outa); cuda_free(outb); cuda_free(sca); cuda_free(scb);
}

static void test_fused_rope_attention(void) {
    static const int t1[] = {1}, l1[] = {0};                                     // the first token
    static const int t3[] = {300, 41, 7}, l3[] = {0, 13, 1};                      // newest in trunk and tails
    static const int t8[] = {2, 65, 0, 129, 1000, 3, 64, 9}, l8[] = {0, 3, 1, 0, 5, 200, 0, 1};
    int hds[] = {64, 128, 28, 80}, Gs[] = {1, 4};
    for (int hi = 0; hi < 4; hi++)
        for (int gi = 0; gi < 2; gi++)
            for (int norm = 0; norm < 2; norm++) {
                fused_rope_case(hds[hi], 2, Gs[gi], 1, t1, l1, norm);
                fused_rope_case(hds[hi], 2, Gs[gi], 3, t3, l3, norm);
                fused_rope_case(hds[hi], 2, Gs[gi], 8, t8, l8, norm);
            }
    cuda_rope_kv bad = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.f};
    attn_shape s = {4, 2, 64, 0.125f};
    CHECK(cuda_attention_decode_rows_rope(&C, NULL, NULL, &bad, (const cuda_kv_layer *)&C, (const cuda_kv_lens *)&C, 1,
                                          8, s, NULL) != 0 && strstr(C.err.msg, "cuda_attention_decode_rows_rope"),
          "cuda_attention_decode_rows_rope refuses missing k/v/pos/rows", "%s", C.err.msg);
}

static void test_attention_rows(void) {
    // Counters for every (row, KV head) below: the split blocks combine themselves (each
    // case also runs without them and compares).
    OK(cuda_reserve_attention(&C, AR_MAX_B * 8));
    static const int t1[] = {37}, l1[] = {0};                               // one row
    static const int t3[] = {300, 300, 300}, l3[] = {13, 0, 1};             // one trunk, tails differ
    static const int t5[] = {1000, 1000, 250, 0, 1}, l5[] = {40, 0, 7, 70, 0};  // all-tail, one-key rows
    static const int t8[] = {0, 1, 2, 3, 64, 65, 0, 129}, l8[] = {1, 0, 5, 0, 0, 3, 64, 2};
    int hds[] = {8, 64, 128}, Gs[] = {1, 2, 8};
    for (int hi = 0; hi < 3; hi++)
        for (int gi = 0; gi < 3; gi++) {
            int hd = hds[hi], G = Gs[gi], nkv = G == 8 ? 2 : 3;
            attn_rows_case(hd, nkv, G, 1, t1, l1, 3.f);
            attn_rows_case(hd, nkv, G, 3, t3, l3, 3.f);
            attn_rows_case(hd, nkv, G, 5, t5, l5, 3.f);
            attn_rows_case(hd, nkv, G, 8, t8, l8, 3.f);
        }
    static const int tl[] = {5000, 5000, 5000, 4000}, ll[] = {777, 0, 1, 20};
    attn_rows_case(64, 8, 4, 4, tl, ll, 4.f);    // Llama-3.2-1B geometry, many splits
    static const int tg[] = {600, 600, 0}, lg[] = {0, 9, 5};
    attn_rows_case(128, 1, 32, 3, tg, lg, 3.f);  // GQA group of 32: 96-key tiles
    static const int th[] = {300, 300, 1}, lh[] = {20, 0, 0};
    attn_rows_case(28, 2, 2, 3, th, lh, 3.f);    // head_dim 28: scalar K loads
    attn_rows_case(80, 2, 2, 3, th, lh, 3.f);    // head_dim 80: the generic kernel
    attn_rows_case(128, 1, 10, 3, th, lh, 3.f);  // the tiled kernel's largest group
}

int main(void) {
    rng = 0x2545f4914f6cdd1dull;  // this harness's own inputs
    if (cuda_device_count() == 0) {
        SKIP("cuda_batch", "no CUDA device");
        return 0;
    }
    verr e;
    if (cuda_init(&C, 0, &e)) {
        printf("FAIL cuda_init: %s\n", e.msg);
        return 1;
    }
    test_matvec_rows();
    test_fused_rows();
    test_deep_rows();
    test_rope_kv_rows();
    test_glu_rows();
    test_kv_store_rows();
    test_attention_rows();
    test_fused_rope_attention();
    cuda_destroy(&C);
    CHECK_DONE();
}
#endif
