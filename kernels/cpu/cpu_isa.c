// cpu_isa.c: which instruction set the CPU kernels use, chosen at run time so that one
// binary runs on any x86-64 (and on other architectures with the portable C path).
// The best level the CPU supports is the default; VARENT_CPU_ISA (generic, avx2,
// avx512, avx512bf16) or cpu_isa_set() lowers it, so the tests cover every path on one
// machine. A level above what the CPU has is never used: it would fault.
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

static const char *const isa_names[] = { "generic", "avx2", "avx512", "avx512bf16" };
static int isa_active = -1;  // -1: not chosen yet

const char *cpu_isa_name(cpu_isa isa) {
    return isa >= CPU_ISA_GENERIC && isa <= CPU_ISA_AVX512BF16 ? isa_names[isa] : "unknown";
}

// The highest level this CPU (and this compiler) can run.
cpu_isa cpu_isa_best(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    // GCC 12's __builtin_cpu_supports does not know avx512bf16: read CPUID leaf 7,
    // subleaf 1, EAX bit 5 directly.
    int bf16 = 0;
    if (avx512) {
        unsigned a, b, c, d;
        __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        bf16 = (a >> 5) & 1;
    }
    return bf16 ? CPU_ISA_AVX512BF16 : avx512 ? CPU_ISA_AVX512 : avx2 ? CPU_ISA_AVX2 : CPU_ISA_GENERIC;
#else
    return CPU_ISA_GENERIC;
#endif
}

int cpu_isa_parse(const char *name) {
    for (int i = 0; i <= CPU_ISA_AVX512BF16; i++)
        if (name && !strcmp(name, isa_names[i])) return i;
    return -1;
}

int cpu_isa_set(cpu_isa isa) {
    if (isa < CPU_ISA_GENERIC || isa > cpu_isa_best()) return -1;
    isa_active = isa;
    return 0;
}

cpu_isa cpu_isa_active(void) {
    if (isa_active < 0) {  // first use: the environment, else the best level
        int want = cpu_isa_parse(getenv("VARENT_CPU_ISA")), best = cpu_isa_best();
        isa_active = want >= 0 && want < best ? want : best;
    }
    return (cpu_isa)isa_active;
}
