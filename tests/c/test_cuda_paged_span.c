// test_cuda_paged_span.c: the fast attention kernels reading a paged trunk through its
// block table (cuda_attention_paged; the decode step's records carry the same table in
// cuda_kv_lens), the path the scheduler's device pool takes:
//   - against the CPU twin, cpu_attention_paged, within the existing tolerances;
//   - bit for bit against cuda_attention on the same rows stored contiguously (what
//     generate() reads), so a sequence of the pool gets generate()'s logits;
// decode (T == 1: the flash kernel at head_dim 64, the generic split kernel at 30, one
// split and several) and
// prefill (T == 7), blocks of 16, 4 and 1 positions, shuffled tables, the pool's
// unmapped rows NaN, odd key counts, outputs poisoned; a tail with a table is an error.
// Needs a GPU (the emulated one in make test): prints "SKIP ..." without one.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#ifndef VARENT_CUDA
int main(void) {
    SKIP("cuda_paged_span", "built without CUDA");
    CHECK_DONE();
}
#else
#include "kernels/ops_cuda.h"
#include "cuda_harness.h"

// One case: n_keys keys of a sequence in a pool of blocks of 2^shift positions, T queries.
static void span_case(int hd, int nkv, int G, int shift, int n_keys, int T) {
    int nh = nkv * G, kv_dim = nkv * hd, block = 1 << shift;
    int nb = (n_keys + block - 1) >> shift, n_blocks = 2 * nb + 3;
    size_t prow = (size_t)n_blocks << shift, pel = prow * kv_dim;
    uint16_t *kb = malloc(pel * 2), *vb = malloc(pel * 2);
    for (size_t i = 0; i < pel; i++) kb[i] = vb[i] = 0xFFFF;  // NaN in every row the table does not map
    int *perm = malloc(sizeof(int) * (size_t)n_blocks), *table = malloc(sizeof(int) * (size_t)nb);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < nb; i++) table[i] = perm[i];
    // the contiguous copy of the sequence's rows, and the same rows in the pool
    size_t cel = (size_t)n_keys * kv_dim;
    uint16_t *kc = malloc(cel * 2), *vc = malloc(cel * 2);
    for (int j = 0; j < n_keys; j++) {
        size_t r = ((size_t)table[j >> shift] << shift) + (size_t)(j & (block - 1));
        for (int i = 0; i < kv_dim; i++) {
            kc[(size_t)j * kv_dim + i] = kb[r * kv_dim + i] = f32_to_bf16(frand());
            vc[(size_t)j * kv_dim + i] = vb[r * kv_dim + i] = f32_to_bf16(frand());
        }
    }
    attn_shape s = {nh, nkv, hd, 1.f / sqrtf((float)hd)};
    size_t nq = (size_t)T * nh * hd, nsc = (size_t)nh * n_keys;
    float *q = fvec(nq, 2.f), *ref = calloc(nq, 4), *rsc = calloc(nsc, 4);
    kv_span hspan = {kb, vb, n_keys, NULL, NULL, 0, 1};
    kv_pages hpg = {table, shift};
    cpu_attention_paged(ref, q, hspan, hpg, T, s, rsc);

    void *dk = dup_up(kb, pel * 2), *dv = dup_up(vb, pel * 2), *dkc = dup_up(kc, cel * 2), *dvc = dup_up(vc, cel * 2);
    int *dt = dup_up(table, sizeof(int) * (size_t)nb);
    float *dq = dup_up(q, nq * 4), *dout = dalloc(nq * 4), *dsc = dalloc(nsc * 4);
    float *cout = dalloc(nq * 4), *csc = dalloc(nsc * 4);
    OK(cuda_reserve_scratch(&C, cuda_attention_scratch_bytes(&C, n_keys, s)));
    kv_span pspan = {dk, dv, n_keys, NULL, NULL, 0, 1}, cspan = {dkc, dvc, n_keys, NULL, NULL, 0, 1};
    kv_pages pg = {dt, shift};
    OK(cuda_attention_paged(&C, dout, dq, pspan, pg, T, s, dsc));
    OK(cuda_attention(&C, cout, dq, cspan, T, s, csc));
    float *got = fdown(dout, nq), *gsc = fdown(dsc, nsc), *con = fdown(cout, nq), *csh = fdown(csc, nsc);
    char tag[128];
    snprintf(tag, sizeof tag, "hd=%d kv=%d G=%d block=%d keys=%d T=%d", hd, nkv, G, block, n_keys, T);
    if (T == 1) printf("note: %s: %d decode splits\n", tag, cuda_attention_live_splits(&C, n_keys, n_keys, s));
    cmp(NAME("paged span out vs cpu_attention_paged %s", tag), got, ref, (long)nq, 2e-5f, 1e-3f);
    cmp(NAME("paged span scores vs cpu_attention_paged %s", tag), gsc, rsc, (long)nsc, 1e-5f, 1e-4f);
    CHECK(!memcmp(got, con, nq * 4) && !memcmp(gsc, csh, nsc * 4),
          NAME("paged span equals the contiguous rows bit for bit %s", tag), "the outputs or scores differ");
    free(got), free(gsc), free(con), free(csh);
    free(q), free(ref), free(rsc), free(kb), free(vb), free(kc), free(vc), free(perm), free(table);
    cuda_free(dk), cuda_free(dv), cuda_free(dkc), cuda_free(dvc), cuda_free(dt);
    cuda_free(dq), cuda_free(dout), cuda_free(dsc), cuda_free(cout), cuda_free(csc);
}

static void test_errors(void) {
    attn_shape s = {4, 2, 16, 0.25f};
    float *d = dalloc(4096);
    int *dt = dalloc(64);
    kv_span tail = {d, d, 4, d, d, 2, 1};
    kv_pages pg = {dt, 2};
    CHECK(cuda_attention_paged(&C, d, d, tail, pg, 1, s, NULL) != 0 && strstr(C.err.msg, "no tail"),
          "paged span: a paged trunk with a tail is an error", "%s", C.err.msg);
    cuda_free(d);
    cuda_free(dt);
}

int main(void) {
    int rc = harness_open("cuda_paged_span");
    if (rc) return rc < 0;
    test_errors();
    span_case(64, 2, 2, 4, 37, 1);   // the flash decode kernel, blocks of 16
    span_case(64, 1, 4, 2, 53, 1);   // a group of 4, blocks of 4
    span_case(30, 2, 3, 0, 21, 1);   // the generic split kernel, blocks of 1, element loads
    span_case(64, 2, 2, 4, 301, 1);  // several splits (and their combine)
    span_case(30, 2, 3, 1, 100, 1);
    span_case(64, 2, 2, 4, 37, 7);   // prefill
    span_case(30, 2, 3, 2, 19, 5);   // prefill, head_dim 30, blocks of 4
    cuda_destroy(&C);
    CHECK_DONE();
}
#endif
