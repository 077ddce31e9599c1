// test_cuda_kernels.c: every CUDA kernel against its cpu_* twin (or a double-precision
// reference for the statistics), in the spirit of llm.c dev/cuda and ggml's
// test-backend-ops: fixed-seed random inputs, outputs poisoned with NaN first, odd
// sizes, |gpu - ref| <= tol + |ref| * eps.
// The batched-decode ops (cuda_*_rows) are checked in test_cuda_batch.c.
// Usage: test_cuda_kernels            run the checks (SKIP without a device)
//        test_cuda_kernels --bench    time the bf16 matvec at Llama-3.2-1B shapes etc., then
//                                     the decode graph's ops (cuda_decode_bench.h)
//        test_cuda_kernels --bench-quick   the decode graph bench at a tiny shape (runs on
//                                     the emulated device: the code, not the timings)
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
    SKIP("cuda_kernels", "built without CUDA");
    return 0;
}
#else
#include <cuda_runtime_api.h>
#include "kernels/ops_cuda.h"

#include "cuda_harness.h"
#include "cuda_decode_bench.h"


// ---- elementwise ----------------------------------------------------------------------
static void test_embed(void) {
    int vocab = 1001, dim = 777, T = 5, ids[5];
    for (int t = 0; t < T; t++) ids[t] = irand(vocab);
    ids[T - 1] = vocab - 1;
    for (int k = 0; k < 3; k++) {
        void *raw = wmake(TYPES[k], (size_t)vocab * dim, 1.f);
        void *dw = dup_up(raw, (size_t)vocab * dim * wtype_size(TYPES[k]));
        int *dids = dup_up(ids, sizeof ids);
        float *dout = dalloc((size_t)T * dim * 4), *ref = malloc((size_t)T * dim * 4);
        cpu_embed(ref, (wref){raw, TYPES[k]}, ids, T, dim);
        OK(cuda_embed(&C, dout, (wref){dw, TYPES[k]}, dids, T, dim));
        float *got = fdown(dout, (size_t)T * dim);
        cmp(NAME("cuda_embed %s dim=%d", wtype_name(TYPES[k]), dim), got, ref, (long)T * dim, 0, 0);
        free(raw); free(ref); free(got); cuda_free(dw); cuda_free(dids); cuda_free(dout);
    }
}

static void test_rmsnorm(void) {
    int dims[] = {8, 64, 128, 2049, 4096};
    for (int k = 0; k < 3; k++)
        for (int di = 0; di < 5; di++) {
            int dim = dims[di], T = 3;
            size_t n = (size_t)T * dim;
            void *raw = wmake(TYPES[k], dim, 1.f);
            float *x = fvec(n, 2.f), *y = fvec(n, 1.f), *ref = malloc(n * 4), *xr = malloc(n * 4);
            void *dw = dup_up(raw, dim * wtype_size(TYPES[k]));
            float *dx = dup_up(x, n * 4), *dy = dup_up(y, n * 4), *dout = dalloc(n * 4);
            wref w = {raw, TYPES[k]}, wd = {dw, TYPES[k]};
            cpu_rmsnorm(ref, x, w, T, dim, 1e-5f);
            OK(cuda_rmsnorm(&C, dout, dx, wd, T, dim, 1e-5f));
            float *got = fdown(dout, n);
            cmp(NAME("cuda_rmsnorm %s dim=%d", wtype_name(TYPES[k]), dim), got, ref, n, 1e-5f, 1e-5f);
            free(got);
            OK(cuda_rmsnorm(&C, dx, dx, wd, T, dim, 1e-5f));  // in place
            got = fdown(dx, n);
            cmp(NAME("cuda_rmsnorm in-place %s dim=%d", wtype_name(TYPES[k]), dim), got, ref, n,
                1e-5f, 1e-5f);
            free(got);
            // fused residual: x += y; out = rmsnorm(x)
            OK(cuda_upload(&C, dx, x, n * 4));
            OK(cuda_memset(&C, dout, 0xFF, n * 4));
            memcpy(xr, x, n * 4);
            cpu_add(xr, y, n);
            cpu_rmsnorm(ref, xr, w, T, dim, 1e-5f);
            OK(cuda_rmsnorm_residual(&C, dout, dx, dy, wd, T, dim, 1e-5f));
            got = fdown(dout, n);
            float *gx = fdown(dx, n);
            cmp(NAME("cuda_rmsnorm_residual out %s dim=%d", wtype_name(TYPES[k]), dim), got, ref, n,
                1e-5f, 1e-5f);
            cmp(NAME("cuda_rmsnorm_residual x %s dim=%d", wtype_name(TYPES[k]), dim), gx, xr, n, 0, 0);
            free(got); free(gx); free(raw); free(x); free(y); free(ref); free(xr);
            cuda_free(dw); cuda_free(dx); cuda_free(dy); cuda_free(dout);
        }
}

static void test_pointwise(void) {
    size_t n = 100003;
    float *g = fvec(n, 6.f), *u = fvec(n, 2.f), *ref = malloc(n * 4);
    float *dg = dup_up(g, n * 4), *du = dup_up(u, n * 4), *dout = dalloc(n * 4);
    cpu_swiglu(ref, g, u, n);
    OK(cuda_swiglu(&C, dout, dg, du, n));
    float *got = fdown(dout, n);
    cmp("cuda_swiglu n=100003", got, ref, n, 1e-6f, 1e-5f);
    free(got);
    OK(cuda_swiglu(&C, dg, dg, du, n));  // in place
    got = fdown(dg, n);
    cmp("cuda_swiglu in-place", got, ref, n, 1e-6f, 1e-5f);
    free(got);
    OK(cuda_upload(&C, dg, g, n * 4));
    memcpy(ref, g, n * 4);
    cpu_add(ref, u, n);
    OK(cuda_add(&C, dg, du, n));
    got = fdown(dg, n);
    cmp("cuda_add n=100003", got, ref, n, 0, 0);
    free(got);
    // add_scaled (LoRA deltas): odd sizes, a negative and a tiny scale, 0 leaves x as it was
    const float scales[] = { 0.75f, -1.5f, 3e-3f, 0.f };
    const size_t sizes[] = { 1, 7, 257, 100003 };
    for (int i = 0; i < 4; i++) {
        OK(cuda_upload(&C, dg, g, n * 4));
        memcpy(ref, g, n * 4);
        cpu_add_scaled(ref, u, scales[i], sizes[i]);
        OK(cuda_add_scaled(&C, dg, du, scales[i], sizes[i]));
        got = fdown(dg, n);  // the elements past sizes[i] must be untouched
        cmp(NAME("cuda_add_scaled s=%g n=%zu", scales[i], sizes[i]), got, ref, n, 1e-7f, 1e-6f);
        free(got);
    }
    for (int k = 0; k < 3; k++) {  // add_bias
        int T = 3, nb = 1001;
        void *raw = wmake(TYPES[k], nb, 1.f);
        void *db = dup_up(raw, nb * wtype_size(TYPES[k]));
        memcpy(ref, g, (size_t)T * nb * 4);
        OK(cuda_upload(&C, dg, g, (size_t)T * nb * 4));
        cpu_add_bias(ref, (wref){raw, TYPES[k]}, T, nb);
        OK(cuda_add_bias(&C, dg, (wref){db, TYPES[k]}, T, nb));
        got = fdown(dg, (size_t)T * nb);
        cmp(NAME("cuda_add_bias %s n=%d", wtype_name(TYPES[k]), nb), got, ref, (long)T * nb, 0, 0);
        free(got); free(raw); cuda_free(db);
    }
    free(g); free(u); free(ref); cuda_free(dg); cuda_free(du); cuda_free(dout);
}

static void test_rope(void) {
    int hds[] = {8, 64, 128};
    for (int hi = 0; hi < 3; hi++)
        for (int il = 0; il < 2; il++) {
            int hd = hds[hi], T = 5, nh = 3, pos[5];
            for (int t = 0; t < T; t++) pos[t] = irand(4000);
            pos[0] = 0;
            float inv[64];
            for (int i = 0; i < hd / 2; i++) inv[i] = powf(500000.f, -2.f * i / hd);
            size_t n = (size_t)T * nh * hd;
            float *x = fvec(n, 1.f);
            float *dx = dup_up(x, n * 4), *dinv = dup_up(inv, hd / 2 * 4);
            int *dpos = dup_up(pos, sizeof pos);
            cpu_rope(x, pos, T, nh, hd, inv, il);
            OK(cuda_rope(&C, dx, dpos, T, nh, hd, dinv, il));
            float *got = fdown(dx, n);
            cmp(NAME("cuda_rope hd=%d %s", hd, il ? "interleaved" : "rotate-half"), got, x, n, 1e-5f, 1e-5f);
            free(got); free(x); cuda_free(dx); cuda_free(dinv); cuda_free(dpos);
        }
}

// cuda_rope_table against cpu_rope_table (poisoned table, odd halves and lengths, up to
// position 4099: large angles), and against cuda_rope itself: rotating the pair (1, 0)
// gives (cos, sin), so at every checked position the table's entries must be the bits
// cuda_rope rotates with (the decode kernels read the table instead of sincosf).
static void test_rope_table(void) {
    int halves[] = {1, 4, 32, 45}, lens[] = {1, 7, 4100, 300};
    for (int c = 0; c < 4; c++) {
        int half = halves[c], n_pos = lens[c], hd = 2 * half;
        float inv[64];
        for (int i = 0; i < half; i++) inv[i] = powf(500000.f, -(float)i / half);
        size_t n = (size_t)n_pos * half * 2;
        float *want = malloc(n * 4), *dinv = dup_up(inv, (size_t)half * 4), *dtab = dalloc(n * 4 + 8);
        OK(cuda_memset(&C, dtab, 0xFF, n * 4 + 8));  // NaN: a missed entry shows, and so does a write past the end
        OK(cuda_rope_table(&C, dtab, dinv, half, n_pos));
        cpu_rope_table(want, inv, half, n_pos);
        float *got = fdown(dtab, n + 2);
        cmp(NAME("cuda_rope_table half=%d positions=%d", half, n_pos), got, want, (long)n, 2e-6f, 2e-6f);
        CHECK(isnan(got[n]) && isnan(got[n + 1]), NAME("cuda_rope_table half=%d writes no further", half), "it did");
        enum { NP = 6 };  // the first, the last and a few between
        int pos[NP] = {0, n_pos - 1, n_pos / 2, n_pos / 3, n_pos / 5, n_pos - 2 > 0 ? n_pos - 2 : 0};
        float *x = calloc((size_t)NP * hd, 4);
        for (int t = 0; t < NP; t++)
            for (int i = 0; i < half; i++) x[(size_t)t * hd + i] = 1.f;
        float *dx = dup_up(x, (size_t)NP * hd * 4);
        int *dpos = dup_up(pos, sizeof pos);
        OK(cuda_rope(&C, dx, dpos, NP, 1, hd, dinv, 0));
        float *r = fdown(dx, (size_t)NP * hd);
        int same = 1;
        for (int t = 0; t < NP; t++)
            for (int i = 0; i < half; i++) {
                const float *e = got + ((size_t)pos[t] * half + i) * 2;
                same &= !memcmp(&r[(size_t)t * hd + i], &e[0], 4) && !memcmp(&r[(size_t)t * hd + half + i], &e[1], 4);
            }
        CHECK(same, NAME("cuda_rope_table half=%d == cuda_rope's cos and sin", half), "an entry differs");
        free(want); free(got); free(x); free(r);
        cuda_free(dinv); cuda_free(dtab); cuda_free(dx); cuda_free(dpos);
    }
    CHECK(cuda_rope_table(&C, NULL, NULL, 4, 2) != 0 && strstr(C.err.msg, "cuda_rope_table"),
          "cuda_rope_table refuses a missing table", "%s", C.err.msg);
}

static void test_kv_store(void) {
    int T = 4, kv_dim = 520, n_pos = 11, pos[4] = {0, 7, 3, 10};
    size_t n = (size_t)T * kv_dim, nc = (size_t)n_pos * kv_dim;
    float *k = fvec(n, 3.f), *v = fvec(n, 3.f);
    float *dk = dup_up(k, n * 4), *dv = dup_up(v, n * 4);
    int *dpos = dup_up(pos, sizeof pos);
    uint16_t *kc = dalloc(nc * 2), *vc = dalloc(nc * 2);  // poisoned 0xFFFF
    OK(cuda_kv_store(&C, kc, vc, dk, dv, dpos, T, kv_dim));
    uint16_t *hk = malloc(nc * 2), *hv = malloc(nc * 2);
    OK(cuda_download(&C, hk, kc, nc * 2));
    OK(cuda_download(&C, hv, vc, nc * 2));
    long bad = -1;
    for (int p = 0; p < n_pos && bad < 0; p++) {
        int t = -1;
        for (int i = 0; i < T; i++) if (pos[i] == p) t = i;
        for (int i = 0; i < kv_dim; i++) {
            uint16_t ek = t < 0 ? 0xFFFF : f32_to_bf16(k[(size_t)t * kv_dim + i]);
            uint16_t ev = t < 0 ? 0xFFFF : f32_to_bf16(v[(size_t)t * kv_dim + i]);
            if (hk[(size_t)p * kv_dim + i] != ek || hv[(size_t)p * kv_dim + i] != ev) { bad = (long)p * kv_dim + i; break; }
        }
    }
    CHECK(bad < 0, "cuda_kv_store bf16 rows", "mismatch at element %ld", bad);
    // The graph form: destination buffers from a device record.
    uint16_t *kc2 = dalloc(nc * 2), *vc2 = dalloc(nc * 2), *hk2 = malloc(nc * 2), *hv2 = malloc(nc * 2);
    cuda_kv_layer L = {NULL, NULL, NULL, NULL, kc2, vc2};
    cuda_kv_layer *dL = dup_up(&L, sizeof L);
    OK(cuda_kv_store_dev(&C, dL, dk, dv, dpos, T, kv_dim));
    OK(cuda_download(&C, hk2, kc2, nc * 2));
    OK(cuda_download(&C, hv2, vc2, nc * 2));
    CHECK(!memcmp(hk, hk2, nc * 2) && !memcmp(hv, hv2, nc * 2), "cuda_kv_store_dev bf16 rows",
          "differs from cuda_kv_store");
    free(hk2); free(hv2); cuda_free(kc2); cuda_free(vc2); cuda_free(dL);
    free(k); free(v); free(hk); free(hv);
    cuda_free(dk); cuda_free(dv); cuda_free(dpos); cuda_free(kc); cuda_free(vc);
}

// cuda_copy_2d: rows of a narrow pitched buffer into a wider one (a KV tail commit).
static void test_copy_2d(void) {
    int rows = 5;
    size_t sp = 40, dp = 72, w = 24;
    unsigned char src[5 * 40], dst[5 * 72], ref[5 * 72];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 7 + 3);
    memset(ref, 0xFF, sizeof ref);
    for (int r = 0; r < rows; r++) memcpy(ref + r * dp + 8, src + r * sp, w);
    void *ds = dup_up(src, sizeof src), *dd = dalloc(sizeof dst);
    OK(cuda_copy_2d(&C, (char *)dd + 8, dp, ds, sp, w, rows));
    OK(cuda_download(&C, dst, dd, sizeof dst));
    CHECK(!memcmp(dst, ref, sizeof dst), "cuda_copy_2d pitched rows", "bytes differ");
    cuda_free(ds); cuda_free(dd);
}

// ---- matmul -------------------------------------------------------------------------------
static void test_matmul(void) {
    int shapes[][3] = {  // T, n_in, n_out
        {1, 2048, 515}, {1, 1001, 257}, {1, 8, 3}, {1, 4096, 1027}, {1, 64, 32003},
        {7, 2048, 515}, {33, 1000, 129}, {2, 8, 5}};
    OK(cuda_reserve_scratch(&C, cuda_matmul_scratch_bytes(33, 2048)));
    for (int k = 0; k < 3; k++)
        for (int si = 0; si < 8; si++) {
            int T = shapes[si][0], n_in = shapes[si][1], n_out = shapes[si][2];
            wtype t = TYPES[k];
            void *raw = wmake(t, (size_t)n_out * n_in, 1.f / sqrtf((float)n_in));
            float *x = fvec((size_t)T * n_in + 1, 1.f), *ref = malloc((size_t)T * n_out * 4);
            void *dw = dup_up(raw, (size_t)n_out * n_in * wtype_size(t));
            float *dx = dup_up(x, ((size_t)T * n_in + 1) * 4), *dout = dalloc((size_t)T * n_out * 4);
            // T > 1 rounds x to the weight's 16-bit type: the reference does the same.
            float *xr = malloc(((size_t)T * n_in + 1) * 4);
            for (size_t i = 0; i < (size_t)T * n_in + 1; i++)
                xr[i] = T == 1 || t == WT_F32 ? x[i]
                        : t == WT_BF16 ? bf16_to_f32(f32_to_bf16(x[i])) : f16_to_f32(f32_to_f16(x[i]));
            cpu_matmul(ref, xr, (wref){raw, t}, T, n_in, n_out);
            OK(cuda_matmul(&C, dout, dx, (wref){dw, t}, T, n_in, n_out));
            float *got = fdown(dout, (size_t)T * n_out);
            cmp(NAME("cuda_matmul %s T=%d n_in=%d n_out=%d", wtype_name(t), T, n_in, n_out), got, ref,
                (long)T * n_out, 1e-4f, 1e-3f);
            free(got);
            if (T == 1) {  // unaligned x: the scalar fallback
                cpu_matmul(ref, x + 1, (wref){raw, t}, 1, n_in, n_out);
                OK(cuda_memset(&C, dout, 0xFF, (size_t)n_out * 4));
                OK(cuda_matvec(&C, dout, dx + 1, (wref){dw, t}, n_in, n_out));
                got = fdown(dout, n_out);
                cmp(NAME("cuda_matvec unaligned-x %s n_in=%d n_out=%d", wtype_name(t), n_in, n_out),
                    got, ref, n_out, 1e-4f, 1e-3f);
                free(got);
            }
            free(raw); free(x); free(xr); free(ref); cuda_free(dw); cuda_free(dx); cuda_free(dout);
        }
}

// ---- attention ------------------------------------------------------------------------------
static void close1(const char *name, double got, double ref, double tol, double eps) {
    CHECK(fabs(got - ref) <= tol + fabs(ref) * eps, name, "gpu %.9g ref %.9g", got, ref);
}

// One attention case: nk keys (n_tail of them in the tail segment), T queries.
static void attn_case(int hd, int nkv, int G, int nk, int n_tail, int T, float qscale) {
    int nh = nkv * G, kv_dim = nkv * hd, n_trunk = nk - n_tail;
    attn_shape s = {nh, nkv, hd, 1.f / sqrtf((float)hd)};
    size_t nkv_el = (size_t)nk * kv_dim, nq = (size_t)T * nh * hd;
    float *kf = fvec(nkv_el, 1.f), *vf = fvec(nkv_el, 1.f), *q = fvec(nq, qscale);
    uint16_t *kb = malloc(nkv_el * 2), *vb = malloc(nkv_el * 2);
    for (size_t i = 0; i < nkv_el; i++) {  // the CPU twin reads the bf16-rounded cache
        kb[i] = f32_to_bf16(kf[i]); kf[i] = bf16_to_f32(kb[i]);
        vb[i] = f32_to_bf16(vf[i]); vf[i] = bf16_to_f32(vb[i]);
    }
    size_t tr = (size_t)n_trunk * kv_dim;
    kv_span hs = {kf, vf, n_trunk, n_tail ? kf + tr : NULL, n_tail ? vf + tr : NULL, n_tail, 0};
    // Separate device buffers for trunk and tail, as a forked branch would have.
    uint16_t *dkt = dalloc(tr * 2 + 16), *dvt = dalloc(tr * 2 + 16);
    OK(cuda_upload(&C, dkt, kb, tr * 2));
    OK(cuda_upload(&C, dvt, vb, tr * 2));
    uint16_t *dkl = n_tail ? dup_up(kb + tr, (nkv_el - tr) * 2) : NULL;
    uint16_t *dvl = n_tail ? dup_up(vb + tr, (nkv_el - tr) * 2) : NULL;
    kv_span ds = {dkt, dvt, n_trunk, dkl, dvl, n_tail, 1};
    float *ref = malloc(nq * 4), *rsc = malloc((size_t)nh * nk * 4);
    cpu_attention(ref, q, hs, T, s, rsc);
    float *dq = dup_up(q, nq * 4), *dout = dalloc(nq * 4), *dsc = dalloc((size_t)nh * nk * 4), *d4 = dalloc(16);
    OK(cuda_reserve_scratch(&C, cuda_attention_scratch_bytes(&C, nk, s)));
    OK(cuda_attention(&C, dout, dq, ds, T, s, dsc));
    OK(cuda_attn_stats(&C, d4, dsc, nh, nk, NULL));  // the scratch is sized for it too
    float *got = fdown(dout, nq), *gsc = fdown(dsc, (size_t)nh * nk);
    float g4[4];
    OK(cuda_download(&C, g4, d4, 16));
    char tag[128];
    snprintf(tag, sizeof tag, "%s hd=%d kv=%d G=%d keys=%d tail=%d T=%d", T == 1 ? "decode" : "prefill",
             hd, nkv, G, nk, n_tail, T);
    cmp(NAME("cuda_attention out %s", tag), got, ref, (long)nq, 2e-5f, 1e-3f);
    cmp(NAME("cuda_attention scores %s", tag), gsc, rsc, (long)nh * nk, 1e-5f, 1e-4f);
    // The capture turned into metrics on the device vs the CPU twin on the CPU's scores.
    double r4[4], *ws = malloc(((size_t)nk + 2 * nh) * sizeof(double));
    cpu_attn_stats(r4, rsc, nh, nk, ws);
    close1(NAME("cuda_attn_stats entropy vs cpu attention %s", tag), g4[0], r4[0], 1e-3, 1e-3);
    close1(NAME("cuda_attn_stats interaction vs cpu attention %s", tag), g4[3], r4[3], 1e-4, 1e-3);
    if (T == 1) {  // the graph form: segments and lengths from device records, fixed grid
        cuda_kv_layer L = {dkt, dvt, dkl, dvl, NULL, NULL};
        cuda_kv_lens N = {n_trunk, nk, NULL, 0};
        cuda_kv_layer *dL = dup_up(&L, sizeof L);
        cuda_kv_lens *dN = dup_up(&N, sizeof N);
        int max_keys = 3 * nk + 100;  // most splits see few or no keys
        OK(cuda_reserve_scratch(&C, cuda_attention_scratch_bytes(&C, max_keys, s)));
        // Keys per live split: one tile (the default), the capacity's splits (0), one key
        // a split (1), and one split over every key (its tiles in one block).
        int kpss[] = {-1, 0, 1, 1 << 20}, saved = C.att_split_keys;
        for (int ki = 0; ki < (nk <= 5000 ? 4 : 1); ki++) {
            C.att_split_keys = kpss[ki];
            int ns = cuda_attention_live_splits(&C, nk, max_keys, s);
            OK(cuda_memset(&C, dout, 0xFF, nq * 4));
            OK(cuda_memset(&C, dsc, 0xFF, (size_t)nh * nk * 4));
            OK(cuda_memset(&C, d4, 0xFF, 16));
            OK(cuda_memset(&C, C.scratch, 0xFF, C.scratch_bytes));
            OK(cuda_attention_decode_dev(&C, dout, dq, dL, dN, max_keys, s, dsc));
            // the partials are laid out by the live count: nothing past them is written,
            // and nothing at all with one split
            size_t used = ns > 1 ? (size_t)nh * ns * (hd + 2) * 4 : 0, untouched = 1;
            unsigned char *scr = malloc(C.scratch_bytes);
            OK(cuda_download(&C, scr, C.scratch, C.scratch_bytes));
            for (size_t i = used; i < C.scratch_bytes && untouched; i++) untouched = scr[i] == 0xFF;
            free(scr);
            char ktag[160];
            snprintf(ktag, sizeof ktag, "%s split-keys=%d splits=%d", tag, kpss[ki], ns);
            CHECK(untouched, NAME("cuda_attention_decode_dev writes only its live partials %s", ktag),
                  "scratch past %zu bytes written", used);
            OK(cuda_attn_stats(&C, d4, dsc, nh, max_keys, dN));
            float *got2 = fdown(dout, nq), *gsc2 = fdown(dsc, (size_t)nh * nk);
            OK(cuda_download(&C, g4, d4, 16));
            cmp(NAME("cuda_attention_decode_dev out %s", ktag), got2, ref, (long)nq, 2e-5f, 1e-3f);
            cmp(NAME("cuda_attention_decode_dev scores %s", ktag), gsc2, rsc, (long)nh * nk, 1e-5f, 1e-4f);
            close1(NAME("cuda_attention_decode_dev entropy %s", ktag), g4[0], r4[0], 1e-3, 1e-3);
            free(got2); free(gsc2);
        }
        C.att_split_keys = saved;
        cuda_free(dL); cuda_free(dN);
    }
    free(ws); free(got); free(gsc);
    free(kf); free(vf); free(q); free(kb); free(vb); free(ref); free(rsc);
    cuda_free(dkt); cuda_free(dvt); cuda_free(dkl); cuda_free(dvl); cuda_free(dq);
    cuda_free(dout); cuda_free(dsc); cuda_free(d4);
}

// The live split count (cuda_attention_live_splits), pinned: one key tile a split by
// default (64 keys at head_dim 64, 32 at 128, 32 for the generic kernel), 1 for a
// short context, at most the grid's splits; 0 keys a split: every split of the grid.
static void test_live_splits(void) {
    attn_shape l1b = {32, 8, 64, 0.125f}, h128 = {16, 8, 128, 0.09f}, gen = {22, 2, 64, 0.125f};
    int saved = C.att_split_keys;
    C.att_split_keys = -1;
    int grid = cuda_attention_live_splits(&C, 4096, 4096, l1b);  // as many as the grid holds
    struct { attn_shape s; int n, max, want; } cases[] = {
        {l1b, 1, 4096, 1}, {l1b, 64, 4096, 1}, {l1b, 65, 4096, 2}, {l1b, 512, 4096, 8},
        {l1b, 512, 512, 8}, {l1b, 4096, 4096, grid}, {h128, 33, 4096, 2}, {gen, 32, 4096, 1},
        {gen, 100, 4096, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = cuda_attention_live_splits(&C, cases[i].n, cases[i].max, cases[i].s);
        CHECK(got == cases[i].want, NAME("live splits hd=%d G=%d keys=%d of %d", cases[i].s.head_dim,
              cases[i].s.n_heads / cases[i].s.n_kv_heads, cases[i].n, cases[i].max), "%d, want %d", got,
              cases[i].want);
    }
    CHECK(grid > 8 && grid <= 4096 / 64, "live splits: the grid caps them", "%d", grid);
    C.att_split_keys = 0;
    int all = cuda_attention_live_splits(&C, 1, 4096, l1b);
    CHECK(all == grid, "live splits: VARENT_CUDA_ATT_SPLIT_KEYS=0 takes every split of the grid", "%d of %d", all,
          grid);
    C.att_split_keys = saved;
}

static void test_attention(void) {
    test_live_splits();
    attn_shape huge = {64, 1, 512, 0.04f}, odd = {4, 2, 30, 0.2f}, bad_g = {6, 4, 64, 0.125f};
    CHECK(cuda_attention_validate(&C, huge) != 0 && strstr(C.err.msg, "shared memory"),
          "cuda_attention_validate rejects a group too large for shared memory", "%s", C.err.msg);
    CHECK(cuda_attention_validate(&C, odd) == 0, "cuda_attention_validate accepts head_dim 30", "%s", C.err.msg);
    CHECK(cuda_attention_validate(&C, bad_g) != 0, "cuda_attention_validate rejects 6 heads over 4 kv heads",
          "accepted");
    int hds[] = {8, 64, 128}, Gs[] = {1, 2, 8};
    for (int hi = 0; hi < 3; hi++)
        for (int gi = 0; gi < 3; gi++) {
            int hd = hds[hi], G = Gs[gi], nkv = G == 8 ? 2 : 3;
            attn_case(hd, nkv, G, 1, 0, 1, 3.f);      // first token
            attn_case(hd, nkv, G, 37, 0, 1, 3.f);
            attn_case(hd, nkv, G, 1000, 13, 1, 3.f);  // trunk + tail
            attn_case(hd, nkv, G, 2, 0, 2, 3.f);      // prefill from scratch
            attn_case(hd, nkv, G, 301, 40, 130, 3.f); // prefill after a trunk, crosses tiles
        }
    attn_case(64, 8, 4, 5000, 0, 1, 4.f);   // Llama-3.2-1B geometry, many splits
    attn_case(128, 8, 2, 20000, 777, 1, 4.f);  // long context
    attn_case(64, 8, 1, 40000, 777, 1, 4.f);   // many key tiles per split
    attn_case(64, 1, 8, 70, 70, 1, 2.f);    // everything in the tail
    attn_case(28, 2, 2, 1, 0, 1, 3.f);      // head_dim 28 (not a multiple of 8): scalar K loads
    attn_case(28, 2, 2, 300, 20, 1, 3.f);
    attn_case(28, 2, 2, 60, 9, 7, 3.f);
    attn_case(128, 2, 16, 600, 0, 1, 3.f);  // large GQA group: smaller key tiles
    attn_case(128, 1, 10, 700, 33, 1, 3.f); // the largest group of the tiled decode kernel
    attn_case(64, 1, 11, 700, 33, 1, 3.f);  // one more head: the generic kernel
    attn_case(80, 2, 2, 500, 9, 1, 3.f);    // head_dim 80: 16-byte loads, generic kernel
    attn_case(128, 4, 2, 33, 1, 1, 3.f);    // tiled kernel: one key in the tail, a partial tile
}

// ---- attention statistics ----------------------------------------------------------------
// cuda_attn_stats against cpu_attn_stats on the same scores[nh, nk]. kind 0: random
// scores; 1: a wide spread (most probabilities below the 1e-10 clip); 2: every head the
// same (varentropy and agreement ~0: the absolute floors); 3: constant scores (uniform).
// Run plain (n_keys an argument) and from a device cuda_kv_lens with max_keys far above
// n_keys, as the forward's graph does; outputs and scratch are NaN-poisoned first.
static void stats_case(int nh, int nk, int kind) {
    size_t n = (size_t)nh * nk;
    float *sc = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        if (kind == 2) sc[i] = i < (size_t)nk ? 4.f * frand() : sc[i % (size_t)nk];
        else sc[i] = kind == 0 ? 3.f * frand() : kind == 1 ? 40.f * frand() : 1.25f;
    }
    double ref[4], *ws = malloc(((size_t)nk + 2 * nh) * sizeof(double));
    cpu_attn_stats(ref, sc, nh, nk, ws);
    float *dsc = dup_up(sc, n * sizeof(float)), *d4 = dalloc(16), g[4];
    cuda_kv_lens N = {0, nk, NULL, 0};
    cuda_kv_lens *dN = dup_up(&N, sizeof N);
    static const char *kinds[] = {"random", "wide", "same-heads", "constant"};
    for (int form = 0; form < 2; form++) {
        int max_keys = form ? 3 * nk + 100 : nk;
        OK(cuda_reserve_scratch(&C, cuda_attn_stats_scratch_bytes(&C, nh, max_keys)));
        OK(cuda_memset(&C, C.scratch, 0xFF, C.scratch_bytes));
        OK(cuda_memset(&C, d4, 0xFF, 16));
        OK(cuda_attn_stats(&C, d4, dsc, nh, max_keys, form ? dN : NULL));
        OK(cuda_download(&C, g, d4, 16));
        char tag[96];
        snprintf(tag, sizeof tag, "%s heads=%d keys=%d %s", kinds[kind], nh, nk, form ? "device lens" : "plain");
        close1(NAME("cuda_attn_stats attn_entropy %s", tag), g[0], ref[0], 1e-5, 1e-5);
        close1(NAME("cuda_attn_stats attn_varentropy %s", tag), g[1], ref[1], 1e-6, 1e-3);
        close1(NAME("cuda_attn_stats agreement %s", tag), g[2], ref[2], 4e-6 / nk, 1e-4);
        close1(NAME("cuda_attn_stats interaction %s", tag), g[3], ref[3], 1e-7, 1e-6);
    }
    free(sc); free(ws); cuda_free(dsc); cuda_free(d4); cuda_free(dN);
}

static void test_attn_stats(void) {
    int heads[] = {1, 8, 32}, keys[] = {1, 2, 7, 33, 257, 1001, 4099, 20011};
    for (int hi = 0; hi < 3; hi++)
        for (int ki = 0; ki < 8; ki++)
            for (int kind = 0; kind < 4; kind++) stats_case(heads[hi], keys[ki], kind);
    // No keys (d_lens->n_keys == 0): zeros, as cpu_attn_stats. Bad shapes are refused.
    cuda_kv_lens N = {0, 0, NULL, 0};
    cuda_kv_lens *dN = dup_up(&N, sizeof N);
    float *dsc = dalloc(64 * sizeof(float)), *d4 = dalloc(16), g[4];
    OK(cuda_reserve_scratch(&C, cuda_attn_stats_scratch_bytes(&C, 4, 16)));
    OK(cuda_attn_stats(&C, d4, dsc, 4, 16, dN));
    OK(cuda_download(&C, g, d4, 16));
    CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == 0, "cuda_attn_stats no keys: zeros",
          "%g %g %g %g", g[0], g[1], g[2], g[3]);
    CHECK(cuda_attn_stats(&C, d4, dsc, 0, 16, NULL) != 0 && strstr(C.err.msg, "n_heads"),
          "cuda_attn_stats refuses n_heads 0", "%s", C.err.msg);
    cuda_ctx small = C;  // a context whose scratch is too small
    small.scratch_bytes = 8;
    CHECK(cuda_attn_stats(&small, d4, dsc, 4, 16, NULL) != 0 && strstr(small.err.msg, "scratch"),
          "cuda_attn_stats refuses a scratch too small", "%s", small.err.msg);
    cuda_free(dN); cuda_free(dsc); cuda_free(d4);
}

// ---- vocab -----------------------------------------------------------------------------------
static void test_vocab(void) {
    int ns[] = {1000, 32003, 151669}, rows = 3;
    for (int ni = 0; ni < 3; ni++) {
        int n = ns[ni];
        size_t tot = (size_t)rows * n;
        float *x = fvec(tot, 8.f);
        x[5] = -INFINITY;                       // row 0: a masked logit
        for (int i = 0; i < n; i++) x[n + i] *= 0.01f;  // row 1: nearly uniform
        x[2 * (size_t)n + n / 3] = 60.f;        // row 2: one dominant logit
        float *dx = dup_up(x, tot * 4), *dout = dalloc((size_t)rows * 16);
        OK(cuda_vocab_stats(&C, dout, dx, rows, n));
        float *got = fdown(dout, (size_t)rows * 4);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * n;
            double m = -INFINITY, s0 = 0, h = 0, v = 0;
            for (int i = 0; i < n; i++) m = fmax(m, xr[i]);
            for (int i = 0; i < n; i++) s0 += exp((double)xr[i] - m);
            double lse = m + log(s0);
            for (int i = 0; i < n; i++) {
                if (xr[i] == -INFINITY) continue;
                double lp = (xr[i] - lse) / M_LN2, p = exp((double)xr[i] - lse);
                h -= p * lp;
            }
            for (int i = 0; i < n; i++) {
                if (xr[i] == -INFINITY) continue;
                double lp = (xr[i] - lse) / M_LN2, p = exp((double)xr[i] - lse);
                v += p * (lp + h) * (lp + h);
            }
            char tag[64];
            snprintf(tag, sizeof tag, "n=%d row=%d", n, r);
            close1(NAME("cuda_vocab_stats max %s", tag), got[r * 4 + 0], m, 0, 0);
            close1(NAME("cuda_vocab_stats lse %s", tag), got[r * 4 + 1], lse, 1e-5, 1e-5);
            close1(NAME("cuda_vocab_stats entropy %s", tag), got[r * 4 + 2], h, 1e-4, 1e-4);
            close1(NAME("cuda_vocab_stats varentropy %s", tag), got[r * 4 + 3], v, 1e-4, 1e-3);
        }
        // argmax: ties resolve to the first index, NaN never wins
        x[7] = 100.f; x[9] = 100.f; x[3] = NAN;
        x[(size_t)n + n - 1] = 50.f;
        OK(cuda_upload(&C, dx, x, tot * 4));
        int *di = dalloc(rows * sizeof(int)), gi[3], ri[3];
        OK(cuda_argmax(&C, di, dx, rows, n));
        OK(cuda_download(&C, gi, di, sizeof gi));
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * n;
            ri[r] = 0;
            for (int i = 1; i < n; i++) if (xr[i] > xr[ri[r]] || xr[ri[r]] != xr[ri[r]]) ri[r] = i;
            CHECK(gi[r] == ri[r], NAME("cuda_argmax n=%d row=%d", n, r), "gpu %d ref %d", gi[r], ri[r]);
        }
        free(x); free(got); cuda_free(dx); cuda_free(dout); cuda_free(di);
    }
}

// ---- the read-bandwidth probe (bench --probe): its sum against cpu_read_checksum ---------------
static void test_probe(void) {
    size_t sizes[] = {16, 999, 4096 + 3, ((size_t)1 << 20) + 7};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        uint8_t *h = malloc(n);
        for (size_t i = 0; i < n; i++) h[i] = (uint8_t)irand(256);
        void *d = dup_up(h, n);
        uint32_t got = 0;
        float ms = 0;
        OK(cuda_read_probe(&C, d, n, &got, &ms));
        uint32_t want = cpu_read_checksum(h, n);
        CHECK(got == want, NAME("cuda_read_probe bytes=%zu", n), "gpu 0x%08x cpu 0x%08x", got, want);
        free(h);
        cuda_free(d);
    }
    double gbs = 0;
    int checked = 0;
    OK(cuda_read_gbs(&C, ((size_t)1 << 20) + 5, 2, &gbs, &checked));
    CHECK(checked && gbs > 0, "cuda_read_gbs", "checked %d, %.1f GB/s", checked, gbs);
    cuda_facts f;
    OK(cuda_device_facts(&C, &f));
    CHECK(f.n_sm > 0 && f.l2_bytes > 0 && f.mem_bytes > 0 && f.driver > 0, "cuda_device_facts",
          "%d SMs, L2 %d, memory %zu, driver %d", f.n_sm, f.l2_bytes, f.mem_bytes, f.driver);
}

// ---- the lm_head's argmax epilogue (cuda_mv_fuse.amax, cuda_argmax_finish) ----------------------
// The greedy draw made while the logits are stored, against the argmax of the stored
// logits on the host (first index on ties, NaN never wins, token 0 when all are NaN):
// rows 7 and 9 tie at the maximum, row 3 is NaN, -0 and +0 tie in a second case; the
// logits are the bits of the same matvec without the epilogue; the finish leaves the
// argmax zero for the next step (a second step with other logits draws right).
static void argmax_case(int n_in, int n_out, int all_nan, int zeros) {
    size_t nw = (size_t)n_out * n_in;
    float *x = fvec(n_in, 1.f);
    uint16_t *w = malloc(nw * 2);
    for (size_t i = 0; i < nw; i++) w[i] = f32_to_bf16(0.05f * (float)((i * 2654435761u) % 2001) / 1000.f - 0.05f);
    for (int j = 0; j < n_in; j++) x[j] = all_nan && j == 1 ? NAN : 1.f;
    for (int j = 0; j < n_in; j++) {
        w[(size_t)7 * n_in + j] = w[(size_t)9 * n_in + j] = f32_to_bf16(1.f);  // the tied maximum
        w[(size_t)3 * n_in + j] = j == 0 ? 0x7FC0 : f32_to_bf16(1.f);          // NaN (else a third tie)
    }
    if (zeros) {  // every row 0 (rows 2 and 4 -0: w * 1 = -0 sums to -0), so rows 0.. tie
        for (size_t i = 0; i < nw; i++) w[i] = (i / n_in == 2 || i / n_in == 4) ? 0x8000 : 0;
        for (int j = 0; j < n_in; j++) w[(size_t)3 * n_in + j] = j == 0 ? 0x7FC0 : 0;
    }
    float *dx = dup_up(x, (size_t)n_in * 4), *dl = dalloc((size_t)n_out * 4), *dl2 = dalloc((size_t)n_out * 4);
    void *dw = dup_up(w, nw * 2);
    unsigned long long *da = dalloc(8), zero = 0, left = 1;
    OK(cuda_upload(&C, da, &zero, 8));
    sample_out *dout = dalloc(sizeof(sample_out)), got;
    cuda_mv_fuse fz = {NULL, 0.f, 0, NULL, da};
    OK(cuda_memset(&C, dl, 0xFF, (size_t)n_out * 4));
    OK(cuda_matvec_rows_fused(&C, dl, dx, (wref){dw, WT_BF16}, n_in, n_out, 1, n_out, n_out, &fz));
    OK(cuda_memset(&C, dout, 0xFF, sizeof got));
    OK(cuda_argmax_finish(&C, dout, dl, da));
    OK(cuda_matvec_rows_fused(&C, dl2, dx, (wref){dw, WT_BF16}, n_in, n_out, 1, n_out, n_out, NULL));
    float *lg = fdown(dl, n_out), *lg2 = fdown(dl2, n_out);
    OK(cuda_download(&C, &got, dout, sizeof got));
    OK(cuda_download(&C, &left, da, 8));
    int want = 0;
    for (int i = 1; i < n_out; i++)
        if (lg[i] == lg[i] && (lg[want] != lg[want] || lg[i] > lg[want])) want = i;
    char tag[96];
    snprintf(tag, sizeof tag, "n_in=%d n_out=%d%s%s", n_in, n_out, all_nan ? " all NaN" : "", zeros ? " +-0" : "");
    CHECK(got.token == want && got.n_kept == 1 && !memcmp(&got.logit, &lg[want], 4) && got.entropy == 0,
          NAME("argmax epilogue draw %s", tag), "token %d (logit %g, kept %d), want %d (%g)", got.token, got.logit,
          got.n_kept, want, lg[want]);
    CHECK(!memcmp(lg, lg2, (size_t)n_out * 4), NAME("argmax epilogue leaves the logits' bits %s", tag), "differ");
    CHECK(left == 0, NAME("argmax finish zeroes the argmax %s", tag), "%llu", left);
    if (!all_nan && !zeros) {  // a second step: row 9 alone on top now
        w[(size_t)7 * n_in] = f32_to_bf16(0.5f);
        OK(cuda_upload(&C, dw, w, nw * 2));
        OK(cuda_matvec_rows_fused(&C, dl, dx, (wref){dw, WT_BF16}, n_in, n_out, 1, n_out, n_out, &fz));
        OK(cuda_argmax_finish(&C, dout, dl, da));
        OK(cuda_download(&C, &got, dout, sizeof got));
        CHECK(got.token == 9, NAME("argmax epilogue second step %s", tag), "token %d", got.token);
    }
    free(x); free(w); free(lg); free(lg2);
    cuda_free(dx); cuda_free(dl); cuda_free(dl2); cuda_free(dw); cuda_free(da); cuda_free(dout);
}

static void test_argmax_epilogue(void) {
    argmax_case(64, 1000, 0, 0);    // the vector kernels
    argmax_case(64, 32003, 0, 0);   // many rows a warp (four-row kernel where it applies)
    argmax_case(36, 517, 0, 0);     // n_in % 8: the scalar kernel
    argmax_case(64, 1000, 1, 0);    // every logit NaN: token 0
    argmax_case(64, 300, 0, 1);     // -0 and +0 tie: the first index
}

// ---- bench -------------------------------------------------------------------------------------
static void bench(void) {
    struct { const char *name; int n_in, n_out, deep; } sh[] = {  // deep: C.mv_deep (not in the sums)
        {"wq/wo 2048x2048", 2048, 2048, 0}, {"wk/wv 512x2048", 2048, 512, 0}, {"gate/up 8192x2048", 2048, 8192, 0},
        {"down 2048x8192", 8192, 2048, 0}, {"lm_head 128256x2048", 2048, 128256, 0},
        {"wq/wo 2048x2048 deep", 2048, 2048, 1}, {"down 2048x8192 deep", 8192, 2048, 1},
        {"gate/up 8192x2048 deep", 2048, 8192, 1}};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, C.device) == cudaSuccess) printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    double layer_us = 0, head_us = 0;
    for (int i = 0; i < 8; i++) {
        size_t nw = (size_t)sh[i].n_in * sh[i].n_out;
        C.mv_deep = sh[i].deep;
        void *raw = wmake(WT_BF16, nw, 0.02f);
        void *dw = dup_up(raw, nw * 2);
        float *x = fvec(sh[i].n_in, 1.f), *dx = dup_up(x, sh[i].n_in * 4), *dout = dalloc(sh[i].n_out * 4);
        wref w = {dw, WT_BF16};
        for (int it = 0; it < 10; it++) OK(cuda_matvec(&C, dout, dx, w, sh[i].n_in, sh[i].n_out));
        int iters = 200;
        CK(cudaEventRecord(e0, C.stream));
        for (int it = 0; it < iters; it++) OK(cuda_matvec(&C, dout, dx, w, sh[i].n_in, sh[i].n_out));
        CK(cudaEventRecord(e1, C.stream));
        OK(cuda_sync(&C));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double us = ms * 1000.0 / iters, bytes = nw * 2.0 + sh[i].n_in * 4.0 + sh[i].n_out * 4.0;
        printf("BENCH matvec bf16 %-22s %8.2f us  %7.1f GB/s\n", sh[i].name, us, bytes / us / 1e3);
        if (i == 0) layer_us += 2 * us;
        else if (i == 1) layer_us += 2 * us;
        else if (i == 2) layer_us += 2 * us;
        else if (i == 3) layer_us += us;
        else if (i == 4) head_us = us;
        free(raw); free(x); cuda_free(dw); cuda_free(dx); cuda_free(dout);
    }
    C.mv_deep = 0;
    printf("BENCH llama-3.2-1b matvecs per token: 16 layers x %.1f us + lm_head %.1f us = %.1f us\n",
           layer_us, head_us, 16 * layer_us + head_us);
    {  // batched decode: B rows per weight pass (gate/up shape); weight bytes once per 8 rows
        int n_in = 2048, n_out = 8192, Bs[] = {1, 2, 4, 8};
        size_t nw = (size_t)n_in * n_out;
        void *raw = wmake(WT_BF16, nw, 0.02f), *dw = dup_up(raw, nw * 2);
        float *x = fvec((size_t)8 * n_in, 1.f), *dx = dup_up(x, (size_t)8 * n_in * 4);
        float *dout = dalloc((size_t)8 * n_out * 4);
        wref w = {dw, WT_BF16};
        for (int bi = 0; bi < 4; bi++) {
            int B = Bs[bi], iters = 200;
            for (int it = 0; it < 10; it++) OK(cuda_matvec_rows(&C, dout, dx, w, n_in, n_out, B, n_out, n_out));
            CK(cudaEventRecord(e0, C.stream));
            for (int it = 0; it < iters; it++) OK(cuda_matvec_rows(&C, dout, dx, w, n_in, n_out, B, n_out, n_out));
            CK(cudaEventRecord(e1, C.stream));
            OK(cuda_sync(&C));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double us = ms * 1000.0 / iters, passes = (B + 7) / 8;
            printf("BENCH matvec_rows bf16 8192x2048 B=%d %8.2f us  %7.1f GB/s weights  %6.2f us/row\n", B, us,
                   passes * nw * 2.0 / us / 1e3, us / B);
        }
        free(raw); free(x); cuda_free(dw); cuda_free(dx); cuda_free(dout);
    }
    // Decode attention at Llama-3.2-1B (32 heads over 8 KV heads, head_dim 64) and
    // Llama-3.1-8B (head_dim 128) geometry, 1K / 8K / 32K keys: first as split + combine
    // launches, then self-combined (cuda_reserve_attention counters, as the device forward
    // runs it). GB/s counts the K and V bytes once.
    int lens[] = {1024, 8192, 32768};
    for (int fused = 0; fused < 2; fused++) {
        if (fused) OK(cuda_reserve_attention(&C, 8));
        for (int hi = 0; hi < 2; hi++)
            for (int li = 0; li < 3; li++) {
                int nk = lens[li], hd = hi ? 128 : 64, nq = 32 * hd;
                attn_shape s = {32, 8, hd, 1.f / sqrtf((float)hd)};
                size_t nel = (size_t)nk * 8 * hd;
                uint16_t *kv = dalloc(nel * 2);
                OK(cuda_memset(&C, kv, 0, nel * 2));
                float *q = fvec(nq, 1.f), *dq = dup_up(q, nq * 4), *dout = dalloc(nq * 4);
                kv_span ds = {kv, kv, nk, NULL, NULL, 0, 1};
                OK(cuda_reserve_scratch(&C, cuda_attention_scratch_bytes(&C, nk, s)));
                for (int it = 0; it < 5; it++) OK(cuda_attention(&C, dout, dq, ds, 1, s, NULL));
                CK(cudaEventRecord(e0, C.stream));
                for (int it = 0; it < 100; it++) OK(cuda_attention(&C, dout, dq, ds, 1, s, NULL));
                CK(cudaEventRecord(e1, C.stream));
                OK(cuda_sync(&C));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                double us = ms * 10.0;
                printf("BENCH attention decode 32h/8kv/hd%-3d keys=%-6d %-13s %8.2f us  %7.1f GB/s (K+V)\n", hd, nk,
                       fused ? "self-combined" : "+ combine", us, 2.0 * nel * 2 / us / 1e3);
                free(q); cuda_free(kv); cuda_free(dq); cuda_free(dout);
            }
    }
    for (int li = 0; li < 3; li++) {  // the attention metrics of the capture, 32 heads
        int nk = lens[li];
        float *sc = fvec((size_t)32 * nk, 3.f), *dsc = dup_up(sc, (size_t)32 * nk * 4), *d4 = dalloc(16);
        OK(cuda_reserve_scratch(&C, cuda_attn_stats_scratch_bytes(&C, 32, nk)));
        for (int it = 0; it < 5; it++) OK(cuda_attn_stats(&C, d4, dsc, 32, nk, NULL));
        CK(cudaEventRecord(e0, C.stream));
        for (int it = 0; it < 100; it++) OK(cuda_attn_stats(&C, d4, dsc, 32, nk, NULL));
        CK(cudaEventRecord(e1, C.stream));
        OK(cuda_sync(&C));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("BENCH attn_stats 32 heads keys=%-6d %8.2f us\n", nk, ms * 10.0);
        free(sc); cuda_free(dsc); cuda_free(d4);
    }
    int nv = 128256;
    float *lg = fvec(nv, 10.f), *dl = dup_up(lg, nv * 4), *d4 = dalloc(16);
    for (int it = 0; it < 5; it++) OK(cuda_vocab_stats(&C, d4, dl, 1, nv));
    CK(cudaEventRecord(e0, C.stream));
    for (int it = 0; it < 100; it++) OK(cuda_vocab_stats(&C, d4, dl, 1, nv));
    CK(cudaEventRecord(e1, C.stream));
    OK(cuda_sync(&C));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("BENCH vocab_stats n=%d %8.2f us\n", nv, ms * 10.0);
    free(lg); cuda_free(dl); cuda_free(d4);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

int main(int argc, char **argv) {
    int do_bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    int quick = argc > 1 && strcmp(argv[1], "--bench-quick") == 0;
    verr e;
    // cuBLAS is loaded at run time (kernels/cuda/blas.cuh), not linked: a missing library
    // or entry point shows here, on a machine without a GPU too.
    int blas = cuda_blas_probe(&e);
    CHECK(blas == 0, "cuda_blas_loads", "%s", e.msg);
    if (cuda_device_count() == 0) {
        SKIP("cuda_kernels", "no CUDA device");
        return blas ? 1 : 0;
    }
    if (cuda_init(&C, 0, &e)) {
        printf("FAIL cuda_init: %s\n", e.msg);
        return 1;
    }
    if (do_bench || quick) {
        if (do_bench) bench();
        db_bench_all(quick);
        cuda_destroy(&C);
        return 0;
    }
    test_embed();
    test_rmsnorm();
    test_pointwise();
    test_rope();
    test_rope_table();
    test_kv_store();
    test_copy_2d();
    test_matmul();
    test_attention();
    test_attn_stats();
    test_vocab();
    test_probe();
    test_argmax_epilogue();
    cuda_destroy(&C);
    CHECK_DONE();
}
#endif
