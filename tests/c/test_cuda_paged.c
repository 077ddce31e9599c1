// test_cuda_paged.c: the paged KV pool on the device (kernels/cuda/attention_paged.cu)
// against its CPU twin, cpu_attention_paged, on every row bucket up to the scheduler's
// 64 rows (8, 16, 32, 48, 64: live rows 1, 8, 9, 16, 17, 33, 64), blocks of 16, 8 and 1
// positions, shuffled tables, two rows sharing a prefix block, the pool's other rows
// NaN, head_dim 64 (16-byte loads) and 30 (one at a time), grouped heads:
//   - cuda_attention_decode_paged's outputs and scores equal the CPU's within the decode
//     tolerance; padding rows give zeros;
//   - the same launch after the tables and lengths change on the device (as a captured
//     graph replays) gives the new rows' results;
//   - cuda_kv_store_paged writes each row's bf16 key and value at its mapped row and no
//     other pool row;
//   - cuda_row_bucket's buckets; bad geometry and too little scratch are errors.
// Needs a GPU (the emulated one in make test): prints "SKIP ..." without one.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_paged", "built without CUDA");
    CHECK_DONE();
}
#else
#include "kernels/ops_cuda.h"
#include "cuda_harness.h"

enum { MAX_ROWS = 64 };

typedef struct {
    int hd, nkv, G, shift, max_keys, n_blocks, stride;
    uint16_t *kb, *vb;        // host pool, bf16 [n_blocks << shift, kv_dim]
    int tables[MAX_ROWS][64];  // [row][logical block]
    int lens[MAX_ROWS];
} pool_case;

// Row tables: distinct random blocks (a shuffled pool), rows 0 and 1 sharing their
// first block (a reused prefix); the pool rows no table maps stay NaN.
static void make_tables(pool_case *c, int B, int live) {
    int *perm = malloc(sizeof(int) * (size_t)c->n_blocks);
    for (int i = 0; i < c->n_blocks; i++) perm[i] = i;
    for (int i = c->n_blocks - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int nb = (c->max_keys + (1 << c->shift) - 1) >> c->shift, next = 0;
    for (int b = 0; b < B; b++) {
        c->lens[b] = b < live ? 1 + irand(c->max_keys) : 0;
        for (int i = 0; i < nb; i++) c->tables[b][i] = perm[next++];
        if (b == 1) c->tables[1][0] = c->tables[0][0];
    }
    free(perm);
}

// The CPU twin on row b: out [n_heads * hd], scores [n_heads, lens[b]].
static void cpu_row(const pool_case *c, int b, const float *q, float *out, float *scores) {
    attn_shape s = {c->nkv * c->G, c->nkv, c->hd, 1.f / sqrtf((float)c->hd)};
    kv_span kv = {c->kb, c->vb, c->lens[b], NULL, NULL, 0, 1};
    kv_pages pg = {c->tables[b], c->shift};
    cpu_attention_paged(out, q, kv, pg, 1, s, scores);
}

// One bucket: `live` rows with keys, the bucket's other rows padding.
static void paged_case(int hd, int nkv, int G, int shift, int live) {
    pool_case c = {.hd = hd, .nkv = nkv, .G = G, .shift = shift, .max_keys = 37};
    int B = cuda_row_bucket(live), nh = nkv * G, kv_dim = nkv * hd;
    c.stride = 64;
    c.n_blocks = B * ((c.max_keys + (1 << shift) - 1) >> shift) + 3;
    size_t prow = (size_t)c.n_blocks << shift, pel = prow * kv_dim;
    c.kb = malloc(pel * 2);
    c.vb = malloc(pel * 2);
    for (size_t i = 0; i < pel; i++) {
        c.kb[i] = f32_to_bf16(frand());
        c.vb[i] = f32_to_bf16(frand());
    }
    make_tables(&c, B, live);
    // NaN in every pool row no live row reads
    char *mapped = calloc(prow, 1);
    for (int b = 0; b < live; b++)
        for (int j = 0; j < c.lens[b]; j++)
            mapped[((size_t)c.tables[b][j >> shift] << shift) + (j & ((1 << shift) - 1))] = 1;
    for (size_t r = 0; r < prow; r++)
        if (!mapped[r])
            for (int i = 0; i < kv_dim; i++) c.kb[r * kv_dim + i] = c.vb[r * kv_dim + i] = 0xFFFF;
    attn_shape s = {nh, nkv, hd, 1.f / sqrtf((float)hd)};
    size_t nq = (size_t)B * nh * hd, nsc = (size_t)B * nh * c.max_keys;
    float *q = fvec(nq, 2.f), *ref = calloc(nq, 4), *rsc = calloc(nsc, 4);
    char tag[128];
    snprintf(tag, sizeof tag, "hd=%d kv=%d G=%d block=%d rows=%d of %d", hd, nkv, G, 1 << shift, live, B);
    void *dk = dup_up(c.kb, pel * 2), *dv = dup_up(c.vb, pel * 2);
    int *dt = dup_up(c.tables, sizeof c.tables), *dl = dup_up(c.lens, sizeof c.lens);
    float *dq = dup_up(q, nq * 4), *dout = dalloc(nq * 4), *dsc = dalloc(nsc * 4);
    cuda_paged_kv pk = {dk, dv, dt, dl, c.stride, shift, c.max_keys};
    OK(cuda_reserve_scratch(&C, cuda_attention_paged_scratch_bytes(c.max_keys, s, B)));
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {  // new tables and lengths on the device, the same launch
            make_tables(&c, B, live);
            for (size_t i = 0; i < pel; i++)
                if (c.kb[i] == 0xFFFF) c.kb[i] = f32_to_bf16(frand()), c.vb[i] = f32_to_bf16(frand());
            OK(cuda_upload(&C, dk, c.kb, pel * 2));
            OK(cuda_upload(&C, dv, c.vb, pel * 2));
            OK(cuda_upload(&C, dt, c.tables, sizeof c.tables));
            OK(cuda_upload(&C, dl, c.lens, sizeof c.lens));
            OK(cuda_memset(&C, dout, 0xFF, nq * 4));
        }
        for (int b = 0; b < live; b++)
            cpu_row(&c, b, q + (size_t)b * nh * hd, ref + (size_t)b * nh * hd, rsc + (size_t)b * nh * c.max_keys);
        OK(cuda_attention_decode_paged(&C, dout, dq, &pk, B, s, dsc));
        float *got = fdown(dout, nq), *gsc = fdown(dsc, nsc);
        const char *ph = pass ? " (tables changed)" : "";
        cmp(NAME("paged decode out %s%s", tag, ph), got, ref, (long)live * nh * hd, 2e-5f, 1e-3f);
        long bad = -1;
        for (int b = 0; b < live && bad < 0; b++) {
            long n = (long)nh * c.lens[b], o = (long)b * nh * c.max_keys;
            if (check_close(gsc + o, rsc + o, n, 1e-5f, 1e-4f) >= 0) bad = b;
        }
        CHECK(bad < 0, NAME("paged decode scores %s%s", tag, ph), "row %ld differs", bad);
        long nz = 0;
        for (size_t i = (size_t)live * nh * hd; i < nq; i++) nz += got[i] != 0.f;
        CHECK(nz == 0, NAME("paged decode padding rows are zeros %s%s", tag, ph), "%ld nonzero", nz);
        free(got);
        free(gsc);
    }
    // The store: each live row's new key/value at position lens[b] - 1.
    float *k = fvec((size_t)B * kv_dim, 1.f), *v = fvec((size_t)B * kv_dim, 1.f);
    int pos[MAX_ROWS];
    for (int b = 0; b < B; b++) pos[b] = c.lens[b] > 0 ? c.lens[b] - 1 : 0;
    float *dkn = dup_up(k, (size_t)B * kv_dim * 4), *dvn = dup_up(v, (size_t)B * kv_dim * 4);
    int *dp = dup_up(pos, sizeof pos);
    // rows 0 and 1 share block 0: keep row 1's store off it
    if (live > 1 && pos[1] < (1 << shift)) c.lens[1] = 0;
    OK(cuda_upload(&C, dl, c.lens, sizeof c.lens));
    OK(cuda_kv_store_paged(&C, &pk, dkn, dvn, dp, B, kv_dim));
    uint16_t *gk = malloc(pel * 2), *gv = malloc(pel * 2);
    OK(cuda_download(&C, gk, dk, pel * 2));
    OK(cuda_download(&C, gv, dv, pel * 2));
    for (int b = 0; b < B; b++) {
        if (c.lens[b] <= 0) continue;
        size_t r = ((size_t)c.tables[b][pos[b] >> shift] << shift) + (pos[b] & ((1 << shift) - 1));
        for (int i = 0; i < kv_dim; i++) {
            c.kb[r * kv_dim + i] = f32_to_bf16(k[(size_t)b * kv_dim + i]);
            c.vb[r * kv_dim + i] = f32_to_bf16(v[(size_t)b * kv_dim + i]);
        }
    }
    CHECK(!memcmp(gk, c.kb, pel * 2) && !memcmp(gv, c.vb, pel * 2), NAME("paged kv store %s", tag),
          "the pool differs from the expected rows");
    free(gk); free(gv); free(k); free(v); free(mapped);
    free(q); free(ref); free(rsc); free(c.kb); free(c.vb);
    cuda_free(dk); cuda_free(dv); cuda_free(dt); cuda_free(dl); cuda_free(dq); cuda_free(dout); cuda_free(dsc);
    cuda_free(dkn); cuda_free(dvn); cuda_free(dp);
}

static void test_errors(void) {
    int want[][2] = {{1, 8}, {8, 8}, {9, 16}, {16, 16}, {17, 32}, {33, 48}, {64, 64}};
    int ok = 1;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) ok &= cuda_row_bucket(want[i][0]) == want[i][1];
    CHECK(ok, "cuda_row_bucket: 8, then multiples of 16", "bucket(9) = %d", cuda_row_bucket(9));
    attn_shape s = {4, 2, 16, 0.25f};
    int *dl = dalloc(64);
    cuda_paged_kv pk = {NULL, NULL, dl, dl, 2, 4, 64};  // 2 blocks of 16 < 64 keys
    float *d = dalloc(4096);
    CHECK(cuda_attention_decode_paged(&C, d, d, &pk, 1, s, NULL) != 0 && strstr(C.err.msg, "fewer than"),
          "paged decode: tables too short are an error", "%s", C.err.msg);
    pk.table_stride = 4;
    attn_shape bad = {6, 4, 16, 0.25f};
    CHECK(cuda_attention_decode_paged(&C, d, d, &pk, 1, bad, NULL) != 0 && strstr(C.err.msg, "whole group"),
          "paged decode: 6 heads over 4 KV heads are an error", "%s", C.err.msg);
    cuda_paged_kv big = pk;
    big.max_keys = 1 << 20;
    big.table_stride = 1 << 16;
    CHECK(cuda_attention_decode_paged(&C, d, d, &big, 64, s, NULL) != 0 && strstr(C.err.msg, "scratch"),
          "paged decode: too little scratch is an error", "%s", C.err.msg);
    cuda_free(dl);
    cuda_free(d);
}

int main(void) {
    if (cuda_device_count() == 0) {
        SKIP("cuda_paged", "no CUDA device");
        return 0;
    }
    verr e;
    if (cuda_init(&C, 0, &e)) {
        printf("FAIL cuda_init: %s\n", e.msg);
        return 1;
    }
    test_errors();
    const int lives[] = {1, 8, 9, 16, 17, 33, 64};
    for (size_t i = 0; i < sizeof lives / sizeof *lives; i++) paged_case(64, 2, 2, 4, lives[i]);
    paged_case(64, 1, 4, 3, 5);   // blocks of 8, a group of 4
    paged_case(30, 2, 3, 0, 9);   // blocks of 1, head_dim 30: element loads
    cuda_destroy(&C);
    CHECK_DONE();
}
#endif
