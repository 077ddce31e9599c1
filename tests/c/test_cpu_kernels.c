// test_cpu_kernels.c: each CPU kernel against a naive double-precision reference
// written here, on random inputs with odd sizes, outputs poisoned with NaN first.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "kernels/ops.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {  // uniform in [-1, 1)
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * 0x1.0p-53 * 2 - 1);
}
static void fill(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = frand(); }
static void poison(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = NAN; }

// Weights in the given type; ref receives the exact values the kernel sees.
static void make_weights(void *w, float *ref, wtype t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        if (t == WT_F32) ((float *)w)[i] = ref[i] = v;
        else if (t == WT_BF16) ref[i] = bf16_to_f32(((uint16_t *)w)[i] = f32_to_bf16(v));
        else ref[i] = f16_to_f32(((uint16_t *)w)[i] = f32_to_f16(v));
    }
}

static void test_matmul(wtype t, int T, int n_in, int n_out) {
    static float x[7 * 1000], out[7 * 700], wref_[700 * 1000];
    static uint32_t wbuf[700 * 1000];
    fill(x, (size_t)T * n_in);
    make_weights(wbuf, wref_, t, (size_t)n_out * n_in);
    poison(out, (size_t)T * n_out);
    cpu_matmul(out, x, (wref){ wbuf, t }, T, n_in, n_out);
    float ref[7 * 700];
    for (int b = 0; b < T; b++)
        for (int r = 0; r < n_out; r++) {
            double s = 0;
            for (int i = 0; i < n_in; i++) s += (double)x[b * n_in + i] * wref_[(size_t)r * n_in + i];
            ref[b * n_out + r] = (float)s;
        }
    char name[96];
    snprintf(name, sizeof name, "matmul_%s_T%d_%dx%d", wtype_name(t), T, n_out, n_in);
    long bad = check_close(out, ref, (long)T * n_out, 1e-4f, 1e-4f);
    CHECK(bad < 0, name, "index %ld: got %g want %g", bad, bad < 0 ? 0 : out[bad], bad < 0 ? 0 : ref[bad]);
}

static void test_rmsnorm(void) {
    enum { T = 3, D = 77 };
    float x[T * D], w[D], out[T * D], ref[T * D];
    fill(x, T * D), fill(w, D), poison(out, T * D);
    cpu_rmsnorm(out, x, (wref){ w, WT_F32 }, T, D, 1e-5f);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
        for (int i = 0; i < D; i++) ref[t * D + i] = (float)(x[t * D + i] / sqrt(ss / D + 1e-5) * w[i]);
    }
    CHECK(check_close(out, ref, T * D, 1e-6f, 1e-5f) < 0, "rmsnorm", "mismatch");
}

// RoPE as a complex rotation of pair (a, b) by pos * inv_freq[i].
static void test_rope(int interleaved) {
    enum { T = 3, H = 5, HD = 12 };
    float x[T * H * HD], ref[T * H * HD], inv[HD / 2];
    int pos[T] = { 0, 7, 1023 };
    fill(x, T * H * HD);
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / HD);
    memcpy(ref, x, sizeof x);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD / 2; i++) {
                int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + HD / 2;
                float *v = ref + (t * H + h) * HD;
                double ang = (double)((float)pos[t] * inv[i]), re = v[a], im = v[b];
                v[a] = (float)(re * cos(ang) - im * sin(ang));
                v[b] = (float)(re * sin(ang) + im * cos(ang));
            }
    cpu_rope(x, pos, T, H, HD, inv, interleaved);
    CHECK(check_close(x, ref, T * H * HD, 1e-5f, 1e-5f) < 0, interleaved ? "rope_interleaved" : "rope_rotate_half", "mismatch");
}

// Naive causal GQA attention over contiguous keys, in double.
static void attention_ref(float *out, const float *q, const float *k, const float *v, int n_keys, int T, attn_shape s) {
    int kvd = s.n_kv_heads * s.head_dim;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < s.n_heads; h++) {
            int nk = n_keys - T + t + 1, kh = h / (s.n_heads / s.n_kv_heads);
            double sc[512], mx = -1e300, sum = 0;
            for (int j = 0; j < nk; j++) {
                double d = 0;
                for (int i = 0; i < s.head_dim; i++) d += (double)q[(t * s.n_heads + h) * s.head_dim + i] * k[j * kvd + kh * s.head_dim + i];
                sc[j] = d * s.scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = 0; j < nk; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int i = 0; i < s.head_dim; i++) {
                double o = 0;
                for (int j = 0; j < nk; j++) o += sc[j] / sum * v[j * kvd + kh * s.head_dim + i];
                out[(t * s.n_heads + h) * s.head_dim + i] = (float)o;
            }
        }
}

static void test_attention(int n_heads, int n_kv, int hd, int n_keys, int T, int split) {
    attn_shape s = { n_heads, n_kv, hd, 1.0f / sqrtf((float)hd) };
    int kvd = n_kv * hd;
    static float q[8 * 16 * 128], k[300 * 8 * 128], v[300 * 8 * 128], out[8 * 16 * 128], ref[8 * 16 * 128], sc[16 * 300];
    fill(q, (size_t)T * n_heads * hd), fill(k, (size_t)n_keys * kvd), fill(v, (size_t)n_keys * kvd);
    poison(out, (size_t)T * n_heads * hd), poison(sc, (size_t)n_heads * n_keys);
    // split > 0: the first `split` keys are the trunk, the rest a separate tail buffer.
    kv_span span = split ? (kv_span){ k, v, split, k + (size_t)split * kvd, v + (size_t)split * kvd, n_keys - split, 0 }
                         : (kv_span){ k, v, n_keys, NULL, NULL, 0, 0 };
    cpu_attention(out, q, span, T, s, sc);
    attention_ref(ref, q, k, v, n_keys, T, s);
    char name[96];
    snprintf(name, sizeof name, "attention_h%d_kv%d_hd%d_keys%d_T%d_split%d", n_heads, n_kv, hd, n_keys, T, split);
    long bad = check_close(out, ref, (long)T * n_heads * hd, 1e-5f, 1e-4f);
    CHECK(bad < 0, name, "index %ld", bad);
    // The captured scores of the last query are q.k * scale for every key.
    int t = T - 1, ok = 1;
    for (int h = 0; h < n_heads && ok; h++)
        for (int j = 0; j < n_keys && ok; j++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[(t * n_heads + h) * hd + i] * k[j * kvd + (h / (n_heads / n_kv)) * hd + i];
            ok = fabs(d * s.scale - sc[h * n_keys + j]) < 1e-4;
        }
    snprintf(name, sizeof name, "attention_scores_h%d_kv%d_split%d", n_heads, n_kv, split);
    CHECK(ok, name, "captured scores differ");
}

// cpu_attention_rows against one cpu_attention_paged call per row, bit for bit: rows of 1
// to 1100 keys (the long ones split their keys into jobs and merge them), a row with a
// tail, a paged row (blocks of 16 positions, in reverse), captures on some rows.
static void test_attention_rows(int n_heads, int n_kv, int hd) {
    enum { B = 5, MAXK = 1104 };
    attn_shape s = { n_heads, n_kv, hd, 1.0f / sqrtf((float)hd) };
    int kvd = n_kv * hd, keys[B] = { 1, 37, 300, 1100, 77 }, qd = n_heads * hd;
    float *k = malloc(sizeof(float) * (size_t)B * MAXK * kvd), *v = malloc(sizeof(float) * (size_t)B * MAXK * kvd);
    float *q = malloc(sizeof(float) * (size_t)B * qd), *out = malloc(sizeof(float) * (size_t)B * qd);
    float *ref = malloc(sizeof(float) * (size_t)B * qd), *sc = malloc(sizeof(float) * (size_t)B * n_heads * MAXK);
    float *sc_ref = malloc(sizeof(float) * (size_t)B * n_heads * MAXK);
    fill(k, (size_t)B * MAXK * kvd), fill(v, (size_t)B * MAXK * kvd), fill(q, (size_t)B * qd);
    poison(out, (size_t)B * qd), poison(ref, (size_t)B * qd);
    poison(sc, (size_t)B * n_heads * MAXK), poison(sc_ref, (size_t)B * n_heads * MAXK);
    static int blocks[MAXK / 16];
    kv_span sp[B];
    kv_pages pg[B];
    float *caps[B], *caps_ref[B];
    for (int b = 0; b < B; b++) {
        float *kb = k + (size_t)b * MAXK * kvd, *vb = v + (size_t)b * MAXK * kvd;
        int tail = b == 2 ? 9 : 0;  // row 2: the last 9 keys in a tail buffer
        sp[b] = (kv_span){ kb, vb, keys[b] - tail, tail ? kb + (size_t)(keys[b] - tail) * kvd : NULL,
                           tail ? vb + (size_t)(keys[b] - tail) * kvd : NULL, tail, 0 };
        pg[b] = (kv_pages){ NULL, 0 };
        caps[b] = b % 2 ? NULL : sc + (size_t)b * n_heads * MAXK;
        caps_ref[b] = b % 2 ? NULL : sc_ref + (size_t)b * n_heads * MAXK;
    }
    int nblk = (keys[4] + 15) / 16;  // row 4 paged: logical block i is physical block nblk - 1 - i
    for (int i = 0; i < nblk; i++) blocks[i] = nblk - 1 - i;
    pg[4] = (kv_pages){ blocks, 4 };
    cpu_attention_rows(out, q, sp, pg, B, s, caps);
    for (int b = 0; b < B; b++)
        cpu_attention_paged(ref + (size_t)b * qd, q + (size_t)b * qd, sp[b], pg[b], 1, s, caps_ref[b]);
    char name[96];
    snprintf(name, sizeof name, "attention_rows_h%d_kv%d_hd%d == one call per row", n_heads, n_kv, hd);
    CHECK(!memcmp(out, ref, sizeof(float) * (size_t)B * qd), name, "an output differs");
    int same = 1;
    for (int b = 0; b < B; b += 2)
        same &= !memcmp(caps[b], caps_ref[b], sizeof(float) * (size_t)n_heads * keys[b]);
    snprintf(name, sizeof name, "attention_rows_h%d_kv%d_hd%d captures", n_heads, n_kv, hd);
    CHECK(same, name, "a captured score differs");
    free(k), free(v), free(q), free(out), free(ref), free(sc), free(sc_ref);
}

static void test_conversions(void) {
    CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f && f16_to_f32(0x0001) == 5.9604644775390625e-8f &&
          f16_to_f32(0x7bff) == 65504.0f, "f16_decode_known_values", "wrong");
    CHECK(f32_to_f16(1.0f) == 0x3c00 && f32_to_f16(65504.0f) == 0x7bff && f32_to_f16(1e6f) == 0x7c00 &&
          f32_to_f16(5.9604644775390625e-8f) == 0x0001, "f16_encode_known_values", "wrong");
    CHECK(f32_to_bf16(1.0f) == 0x3f80 && f32_to_bf16(1.00390625f) == 0x3f80 && f32_to_bf16(1.01171875f) == 0x3f82,
          "bf16_round_to_nearest_even", "wrong");
}

static void test_swiglu(void) {
    enum { N = 1001 };
    float g[N], u[N], out[N], ref[N];
    fill(g, N), fill(u, N), poison(out, N);
    for (int i = 0; i < N; i++) ref[i] = (float)(g[i] / (1 + exp(-(double)g[i])) * u[i]);
    cpu_swiglu(out, g, u, N);
    CHECK(check_close(out, ref, N, 1e-6f, 1e-5f) < 0, "swiglu", "mismatch");
}

// Gates from -100 to 100 (e^100 overflows fp32: the sigmoid must not), over enough
// elements for the threaded path, and a length that leaves a scalar tail.
static void test_swiglu_wide(void) {
    enum { N = 70001 };
    float *g = malloc(N * sizeof *g), *u = malloc(N * sizeof *u), *out = malloc(N * sizeof *out), *ref = malloc(N * sizeof *ref);
    fill(u, N), poison(out, N);
    for (int i = 0; i < N; i++) g[i] = (float)((i % 2001) - 1000) * 0.1f;
    for (int i = 0; i < N; i++) ref[i] = (float)(g[i] / (1 + exp(-(double)g[i])) * u[i]);
    cpu_swiglu(out, g, u, N);
    CHECK(check_close(out, ref, N, 1e-6f, 1e-5f) < 0, "swiglu_wide_range_threaded", "mismatch");
    free(g), free(u), free(out), free(ref);
}

// cpu_matmul_rows: every row of a batch of T bit-equal to the same row alone (the batch
// kernels of 2, 4 and 8 tokens must sum as the one-token kernel does), and within the
// tolerance of the double reference. n_in with a tail past the 32-element steps, n_out
// with rows past the blocks of 4; T up to 19 takes every kernel mix.
static void test_matmul_rows_alone(wtype t, int n_in, int n_out) {
    enum { TMAX = 19 };
    static float x[TMAX * 1100], out[TMAX * 300], one[300], wref_[300 * 1100];
    static uint32_t wbuf[300 * 1100];
    fill(x, (size_t)TMAX * n_in);
    make_weights(wbuf, wref_, t, (size_t)n_out * n_in);
    for (int T = 1; T <= TMAX; T++) {
        poison(out, (size_t)T * n_out);
        cpu_matmul_rows(out, x, (wref){ wbuf, t }, T, n_in, n_out);
        long bad = -1;
        int row = -1;
        for (int b = 0; b < T && bad < 0; b++) {
            poison(one, (size_t)n_out);
            cpu_matmul_rows(one, x + (size_t)b * n_in, (wref){ wbuf, t }, 1, n_in, n_out);
            for (int r = 0; r < n_out && bad < 0; r++)
                if (memcmp(&one[r], &out[(size_t)b * n_out + r], sizeof(float))) bad = r, row = b;
        }
        char name[96];
        snprintf(name, sizeof name, "matmul_rows_%s_T%d_%dx%d_each_row_as_alone", wtype_name(t), T, n_out, n_in);
        CHECK(bad < 0, name, "token %d, output %ld: %a in the batch, %a alone", row, bad,
              bad < 0 ? 0.0 : (double)out[(size_t)row * n_out + bad], bad < 0 ? 0.0 : (double)one[bad]);
    }
    double worst = 0;
    for (int r = 0; r < n_out; r++) {  // the last batch (T = TMAX) against the reference
        for (int b = 0; b < TMAX; b++) {
            double s = 0;
            for (int i = 0; i < n_in; i++) s += (double)x[(size_t)b * n_in + i] * wref_[(size_t)r * n_in + i];
            double d = fabs(out[(size_t)b * n_out + r] - s) / (1e-4 + 1e-4 * fabs(s));
            if (!(d <= worst)) worst = d;
        }
    }
    char name[96];
    snprintf(name, sizeof name, "matmul_rows_%s_T%d_%dx%d_reference", wtype_name(t), TMAX, n_out, n_in);
    CHECK(worst <= 1, name, "off by %.2f of the tolerance", worst);
}

int main(void) {
    test_conversions();
    for (int t = 0; t < 3; t++) {
        test_matmul_rows_alone((wtype)t, 1077, 259);
        test_matmul_rows_alone((wtype)t, 576, 64);
    }
    for (int t = 0; t < 3; t++) {
        test_matmul((wtype)t, 1, 1000, 257);
        test_matmul((wtype)t, 7, 333, 700);
        test_matmul((wtype)t, 3, 7, 5);
    }
    test_rmsnorm();
    test_rope(0), test_rope(1);
    test_swiglu();
    test_swiglu_wide();
    test_attention(8, 4, 8, 37, 1, 0);
    test_attention(8, 4, 8, 37, 5, 0);
    test_attention(8, 8, 64, 129, 3, 100);
    test_attention(16, 2, 128, 300, 8, 290);
    test_attention(4, 1, 64, 50, 1, 49);
    test_attention_rows(9, 3, 64);   // SmolLM2's heads: the sweep plan
    test_attention_rows(4, 1, 64);   // one KV head: the tile plan
    test_attention_rows(8, 8, 16);
    CHECK_DONE();
}
