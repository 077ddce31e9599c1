// cuda_fp16.h (emulated device): __half as its 16 bits, with exact conversions
// (round to nearest even, subnormals, inf and NaN), for kernels compiled as host C++.
#ifndef VARENT_EMU_CUDA_FP16_H
#define VARENT_EMU_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

struct __half {
    unsigned short x;
};
typedef __half half;

static inline float emu_f16_to_f32(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);  // inf, NaN (payload kept)
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline unsigned short emu_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    if (exp == 0xff) return (unsigned short)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return (unsigned short)(sign | 0x7c00u);  // overflow: inf
    if (e <= 0) {                                            // subnormal or zero
        if (e < -10) return (unsigned short)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t half_man = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half_man & 1))) half_man++;
        return (unsigned short)(sign | half_man);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;  // may carry into the exponent: correct
    return (unsigned short)h;
}

static inline float __half2float(__half h) { return emu_f16_to_f32(h.x); }
static inline __half __float2half_rn(float f) { return __half{emu_f32_to_f16(f)}; }
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }

#endif
