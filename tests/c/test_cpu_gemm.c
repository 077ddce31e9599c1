// test_cpu_gemm.c: the prefill GEMM (kernels/cpu/gemm.c) on every instruction-set path
// this CPU can run (cpu_isa_set forces each; levels the CPU lacks are skipped), against
// a double-precision reference written here, at odd sizes: edge panels, short token
// tiles, odd n_in (a half bf16 pair), and few panels split across threads.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/ops.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {  // uniform in [-1, 1)
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * 0x1.0p-53 * 2 - 1);
}

// w in type t; wf receives the values the kernel sees.
static void make_weights(void *w, float *wf, wtype t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        if (t == WT_F32) ((float *)w)[i] = wf[i] = v;
        else if (t == WT_BF16) wf[i] = bf16_to_f32(((uint16_t *)w)[i] = f32_to_bf16(v));
        else wf[i] = f16_to_f32(((uint16_t *)w)[i] = f32_to_f16(v));
    }
}

// bf16_x: the reference rounds x to bf16 first (the vdpbf16ps path's documented inputs).
static void test_gemm(cpu_isa isa, wtype t, int bf16_x, int T, int n_in, int n_out) {
    size_t nx = (size_t)T * n_in, nw = (size_t)n_out * n_in, no = (size_t)T * n_out;
    float *x = malloc(nx * 4), *wf = malloc(nw * 4), *out = malloc(no * 4), *ref = malloc(no * 4);
    void *w = malloc(nw * 4);
    for (size_t i = 0; i < nx; i++) x[i] = frand();
    make_weights(w, wf, t, nw);
    for (size_t i = 0; i < no; i++) out[i] = NAN;
    cpu_set_gemm_bf16_inputs(bf16_x);
    int rc = cpu_gemm(out, x, (wref){ w, t }, T, n_in, n_out);
    cpu_set_gemm_bf16_inputs(0);
    int rounds = bf16_x && t == WT_BF16 && isa == CPU_ISA_AVX512BF16;
    for (int b = 0; b < T; b++)
        for (int r = 0; r < n_out; r++) {
            double s = 0;
            for (int i = 0; i < n_in; i++) {
                float xv = x[(size_t)b * n_in + i];
                s += (double)(rounds ? bf16_to_f32(f32_to_bf16(xv)) : xv) * wf[(size_t)r * n_in + i];
            }
            ref[(size_t)b * n_out + r] = (float)s;
        }
    char name[128];
    snprintf(name, sizeof name, "gemm_%s_%s%s_T%d_%dx%d", cpu_isa_name(isa), wtype_name(t), bf16_x ? "_bf16x" : "", T,
             n_out, n_in);
    // Sums of up to 1000 products of magnitude <= 1, accumulated in fp32.
    long bad = rc ? 0 : check_close(out, ref, (long)no, 2e-4f, 1e-4f);
    CHECK(rc == 0 && bad < 0, name, "rc %d, index %ld: got %g want %g", rc, bad, bad < 0 ? 0 : out[bad],
          bad < 0 ? 0 : ref[bad]);
    free(x), free(wf), free(out), free(ref), free(w);
}

static const int sizes[][3] = {  // T, n_in, n_out
    { 9, 1, 1 }, { 9, 2, 33 }, { 13, 31, 70 }, { 17, 577, 33 }, { 37, 64, 257 }, { 64, 1000, 95 }, { 130, 129, 64 },
};

int main(void) {
    cpu_isa best = cpu_isa_best();
    for (int isa = CPU_ISA_GENERIC; isa <= CPU_ISA_AVX512BF16; isa++) {
        char name[64];
        snprintf(name, sizeof name, "gemm_%s", cpu_isa_name((cpu_isa)isa));
        if (isa > (int)best) {
            SKIP(name, "this CPU lacks the instruction set");
            continue;
        }
        CHECK(cpu_isa_set((cpu_isa)isa) == 0 && cpu_isa_active() == (cpu_isa)isa, name, "cannot select the path");
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int t = 0; t < 3; t++) test_gemm((cpu_isa)isa, (wtype)t, 0, sizes[s][0], sizes[s][1], sizes[s][2]);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            test_gemm((cpu_isa)isa, WT_BF16, 1, sizes[s][0], sizes[s][1], sizes[s][2]);
    }
    CHECK(cpu_isa_set((cpu_isa)(best + 1)) != 0, "isa_refuses_above_cpu", "accepted a level the CPU lacks");
    CHECK(cpu_isa_parse("avx2") == CPU_ISA_AVX2 && cpu_isa_parse("avx512bf16") == CPU_ISA_AVX512BF16 &&
          cpu_isa_parse("sse") == -1 && cpu_isa_parse(NULL) == -1, "isa_parse", "wrong");
    CHECK_DONE();
}
