// test_cpu_attention.c: the blocked attention (kernels/cpu/attention.c) on every
// instruction-set path this CPU can run (cpu_isa_set forces each), against a naive
// double-precision reference written here: odd head sizes, GQA groups of 1, 3 and 7,
// prefill tiles that end mid-tile, a trunk + tail split, and decode at depths long
// enough that the keys are split across threads and merged; a paged trunk read through
// its block table gives the contiguous trunk's bits.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/ops.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float frand(void) {  // uniform in [-1, 1)
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * 0x1.0p-53 * 2 - 1);
}

// out[T, n_heads * hd] for queries at the last T of n_keys positions; sc: last query's
// scaled scores [n_heads, n_keys].
static void attention_ref(float *out, float *sc, const float *q, const float *k, const float *v, int n_keys, int T,
                          attn_shape s) {
    int kvd = s.n_kv_heads * s.head_dim, G = s.n_heads / s.n_kv_heads;
    double *p = malloc(sizeof(double) * (size_t)n_keys);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < s.n_heads; h++) {
            int nk = n_keys - T + t + 1, kh = h / G;
            const float *qr = q + ((size_t)t * s.n_heads + h) * s.head_dim;
            double mx = -1e300, sum = 0;
            for (int j = 0; j < nk; j++) {
                double d = 0;
                for (int i = 0; i < s.head_dim; i++) d += (double)qr[i] * k[(size_t)j * kvd + kh * s.head_dim + i];
                p[j] = d * s.scale;
                if (t == T - 1) sc[(size_t)h * n_keys + j] = (float)p[j];
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int j = 0; j < nk; j++) sum += p[j] = exp(p[j] - mx);
            for (int i = 0; i < s.head_dim; i++) {
                double o = 0;
                for (int j = 0; j < nk; j++) o += p[j] / sum * v[(size_t)j * kvd + kh * s.head_dim + i];
                out[((size_t)t * s.n_heads + h) * s.head_dim + i] = (float)o;
            }
        }
    free(p);
}

static uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// A bf16 cache (--kv-type bf16) gives the same bits as an fp32 cache holding the same
// bf16-rounded values: the kernel widens each row exactly. k and v are rounded in place.
static void test_bf16_cache(cpu_isa isa, const float *q, float *k, float *v, kv_span span, int T, attn_shape s,
                            int n_keys, const char *base) {
    size_t nq = (size_t)T * s.n_heads * s.head_dim, nkv = (size_t)n_keys * s.n_kv_heads * s.head_dim;
    size_t ns = (size_t)s.n_heads * n_keys, kvd = (size_t)s.n_kv_heads * s.head_dim;
    uint16_t *k16 = malloc(nkv * 2), *v16 = malloc(nkv * 2);
    float *o32 = malloc(nq * 4), *o16 = malloc(nq * 4), *s32 = malloc(ns * 4), *s16 = malloc(ns * 4);
    for (size_t i = 0; i < nkv; i++) {
        k16[i] = to_bf16(k[i]), v16[i] = to_bf16(v[i]);
        k[i] = from_bf16(k16[i]), v[i] = from_bf16(v16[i]);
    }
    for (size_t i = 0; i < nq; i++) o16[i] = NAN;
    for (size_t i = 0; i < ns; i++) s16[i] = NAN;
    cpu_attention(o32, q, span, T, s, s32);
    kv_span h = span;
    h.bf16 = 1;
    h.k_trunk = k16, h.v_trunk = v16;
    if (span.k_tail) h.k_tail = k16 + (size_t)span.n_trunk * kvd, h.v_tail = v16 + (size_t)span.n_trunk * kvd;
    cpu_attention(o16, q, h, T, s, s16);
    char name[160];
    snprintf(name, sizeof name, "%.120s_bf16_cache_same_bits", base);
    CHECK(!memcmp(o32, o16, nq * 4) && !memcmp(s32, s16, ns * 4), name, "the bf16 cache differs from fp32 (%s)",
          cpu_isa_name(isa));
    free(k16), free(v16), free(o32), free(o16), free(s32), free(s16);
}

// A paged trunk (model/kv_pool.h): the same rows scattered over shuffled blocks of
// 2^shift positions, the pool's other rows NaN (a wrong row would show), read through
// the block table, give the contiguous trunk's bits; fp32 and bf16 rows.
static void test_paged(cpu_isa isa, const float *q, const float *k, const float *v, kv_span span, int T, attn_shape s,
                       int shift, int bf16, const char *base) {
    int B = 1 << shift, nb = (span.n_trunk + B - 1) / B, P = 2 * nb + 1;
    size_t kvd = (size_t)s.n_kv_heads * s.head_dim, es = bf16 ? 2 : 4, rows = (size_t)P * B;
    size_t nq = (size_t)T * s.n_heads * s.head_dim, ns = (size_t)s.n_heads * (span.n_trunk + span.n_tail);
    int *perm = malloc(sizeof(int) * (size_t)P);
    char *pk = malloc(rows * kvd * es), *pv = malloc(rows * kvd * es), *ck = malloc(rows * kvd * es),
         *cv = malloc(rows * kvd * es), *tk = malloc((size_t)span.n_tail * kvd * es + 1),
         *tv = malloc((size_t)span.n_tail * kvd * es + 1);
    float *o1 = malloc(nq * 4), *o2 = malloc(nq * 4), *s1 = malloc(ns * 4), *s2 = malloc(ns * 4);
    for (int i = 0; i < P; i++) perm[i] = i;
    for (int i = P - 1; i > 0; i--) {
        int j = (int)((frand() + 1) * 0.5 * (i + 1)) % (i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    float nan = NAN;
    uint16_t nan16 = 0x7fc0;
    for (size_t r = 0; r < rows * kvd; r++) {
        memcpy(pk + r * es, bf16 ? (void *)&nan16 : (void *)&nan, es);
        memcpy(pv + r * es, bf16 ? (void *)&nan16 : (void *)&nan, es);
    }
    for (int j = 0; j < span.n_trunk + span.n_tail; j++) {  // rows in the kernel's element type
        char *dk = j < span.n_trunk ? ck + (size_t)j * kvd * es : tk + (size_t)(j - span.n_trunk) * kvd * es;
        char *dv = j < span.n_trunk ? cv + (size_t)j * kvd * es : tv + (size_t)(j - span.n_trunk) * kvd * es;
        for (size_t i = 0; i < kvd; i++) {
            float kf = k[(size_t)j * kvd + i], vf = v[(size_t)j * kvd + i];
            uint16_t kh = to_bf16(kf), vh = to_bf16(vf);
            memcpy(dk + i * es, bf16 ? (void *)&kh : (void *)&kf, es);
            memcpy(dv + i * es, bf16 ? (void *)&vh : (void *)&vf, es);
        }
    }
    for (int j = 0; j < span.n_trunk; j++) {
        size_t row = (size_t)perm[j >> shift] * B + (size_t)(j & (B - 1));
        memcpy(pk + row * kvd * es, ck + (size_t)j * kvd * es, kvd * es);
        memcpy(pv + row * kvd * es, cv + (size_t)j * kvd * es, kvd * es);
    }
    kv_span flat = { ck, cv, span.n_trunk, span.n_tail ? tk : NULL, span.n_tail ? tv : NULL, span.n_tail, bf16 };
    kv_span paged = flat;
    paged.k_trunk = pk, paged.v_trunk = pv;
    for (size_t i = 0; i < nq; i++) o2[i] = NAN;
    for (size_t i = 0; i < ns; i++) s2[i] = NAN;
    cpu_attention(o1, q, flat, T, s, s1);
    cpu_attention_paged(o2, q, paged, (kv_pages){ perm, shift }, T, s, s2);
    char name[200];
    snprintf(name, sizeof name, "%.120s_paged%d%s_same_bits", base, B, bf16 ? "_bf16" : "");
    CHECK(!memcmp(o1, o2, nq * 4) && !memcmp(s1, s2, ns * 4), name, "paged attention differs from contiguous (%s)",
          cpu_isa_name(isa));
    free(perm), free(pk), free(pv), free(ck), free(cv), free(tk), free(tv), free(o1), free(o2), free(s1), free(s2);
}

static void test_attention(cpu_isa isa, int n_heads, int n_kv, int hd, int n_keys, int T, int split) {
    attn_shape s = { n_heads, n_kv, hd, 1.0f / sqrtf((float)hd) };
    size_t nq = (size_t)T * n_heads * hd, nkv = (size_t)n_keys * n_kv * hd, ns = (size_t)n_heads * n_keys;
    float *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4), *out = malloc(nq * 4);
    float *ref = malloc(nq * 4), *sc = malloc(ns * 4), *sref = malloc(ns * 4);
    for (size_t i = 0; i < nq; i++) q[i] = 3 * frand();  // peaked softmaxes as well as flat ones
    for (size_t i = 0; i < nkv; i++) k[i] = frand(), v[i] = frand();
    for (size_t i = 0; i < nq; i++) out[i] = NAN;
    for (size_t i = 0; i < ns; i++) sc[i] = NAN;
    size_t kvd = (size_t)n_kv * hd;
    kv_span span = split ? (kv_span){ k, v, split, k + split * kvd, v + split * kvd, n_keys - split, 0 }
                         : (kv_span){ k, v, n_keys, NULL, NULL, 0, 0 };
    cpu_attention(out, q, span, T, s, sc);
    attention_ref(ref, sref, q, k, v, n_keys, T, s);
    char name[128];
    snprintf(name, sizeof name, "attention_%s_h%d_kv%d_hd%d_keys%d_T%d_split%d", cpu_isa_name(isa), n_heads, n_kv, hd,
             n_keys, T, split);
    long bad = check_close(out, ref, (long)nq, 1e-5f, 1e-4f);
    CHECK(bad < 0, name, "index %ld: got %g want %g", bad, bad < 0 ? 0 : out[bad], bad < 0 ? 0 : ref[bad]);
    bad = check_close(sc, sref, (long)ns, 1e-4f, 1e-5f);
    strncat(name, "_scores", sizeof name - strlen(name) - 1);
    CHECK(bad < 0, name, "index %ld: got %g want %g", bad, bad < 0 ? 0 : sc[bad], bad < 0 ? 0 : sref[bad]);
    test_paged(isa, q, k, v, span, T, s, 4, 0, name);
    test_paged(isa, q, k, v, span, T, s, 0, 1, name);
    test_paged(isa, q, k, v, span, T, s, 3, 1, name);
    test_bf16_cache(isa, q, k, v, span, T, s, n_keys, name);
    free(q), free(k), free(v), free(out), free(ref), free(sc), free(sref);
}

static const int cases[][6] = {  // n_heads, n_kv, hd, n_keys, T, split
    { 9, 3, 64, 1, 1, 0 },      { 9, 3, 64, 37, 37, 0 },     { 9, 3, 64, 200, 37, 150 }, { 7, 1, 12, 71, 13, 0 },
    { 4, 4, 80, 130, 130, 0 },  { 14, 2, 64, 1000, 1, 999 }, { 9, 3, 64, 2049, 1, 0 },   { 9, 3, 64, 1500, 3, 1000 },
    { 16, 2, 128, 777, 1, 0 },  { 8, 8, 8, 600, 2, 0 },
    // prefill tiles with the rows across the lanes: head_dim tails, GQA 6 and 16, split caches
    { 12, 2, 40, 300, 150, 100 }, { 32, 2, 64, 70, 70, 0 },   { 6, 1, 20, 97, 97, 0 },   { 9, 3, 64, 517, 512, 0 },
    // decode over every kv head at once (attn_tile_sweep): MHA, 32 heads over a split cache,
    // an odd head_dim, and 40 heads (more than a tile: the per-kv-head tiles)
    { 6, 6, 24, 300, 1, 0 },      { 32, 8, 64, 900, 1, 400 }, { 12, 4, 20, 333, 1, 0 },  { 40, 8, 64, 500, 1, 0 },
};

int main(void) {
    cpu_isa best = cpu_isa_best();
    for (int isa = CPU_ISA_GENERIC; isa <= CPU_ISA_AVX512BF16; isa++) {
        char name[64];
        snprintf(name, sizeof name, "attention_%s", cpu_isa_name((cpu_isa)isa));
        if (isa > (int)best) {
            SKIP(name, "this CPU lacks the instruction set");
            continue;
        }
        CHECK(cpu_isa_set((cpu_isa)isa) == 0, name, "cannot select the path");
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            test_attention((cpu_isa)isa, cases[c][0], cases[c][1], cases[c][2], cases[c][3], cases[c][4], cases[c][5]);
    }
    CHECK_DONE();
}
