// dequant.c: decoding of the ggml block formats described in dequant.h.
// Products are rounded before the add (no FMA contraction) so the result is
// bit-identical to a straightforward float32 reference.
#pragma GCC optimize("fp-contract=off")
#include "host/formats/dequant.h"

#include <string.h>

typedef struct {
    uint32_t type, elems, bytes;
    const char *name;
} dq_info;

static const dq_info dq_table[] = {
    {GGML_F32, 1, 4, "F32"},       {GGML_F16, 1, 2, "F16"},       {GGML_Q4_0, 32, 18, "Q4_0"},
    {GGML_Q4_1, 32, 20, "Q4_1"},   {GGML_Q5_0, 32, 22, "Q5_0"},   {GGML_Q5_1, 32, 24, "Q5_1"},
    {GGML_Q8_0, 32, 34, "Q8_0"},   {GGML_Q8_1, 32, 36, "Q8_1"},   {GGML_Q2_K, 256, 84, "Q2_K"},
    {GGML_Q3_K, 256, 110, "Q3_K"}, {GGML_Q4_K, 256, 144, "Q4_K"}, {GGML_Q5_K, 256, 176, "Q5_K"},
    {GGML_Q6_K, 256, 210, "Q6_K"}, {GGML_Q8_K, 256, 292, "Q8_K"}, {GGML_I8, 1, 1, "I8"},
    {GGML_I16, 1, 2, "I16"},       {GGML_I32, 1, 4, "I32"},       {GGML_I64, 1, 8, "I64"},
    {GGML_F64, 1, 8, "F64"},       {GGML_BF16, 1, 2, "BF16"},
};

static const dq_info *dq_lookup(uint32_t type) {
    for (size_t i = 0; i < sizeof dq_table / sizeof dq_table[0]; i++) {
        if (dq_table[i].type == type) return &dq_table[i];
    }
    return NULL;
}

int dq_block(uint32_t type, uint32_t *elems, uint32_t *bytes) {
    const dq_info *d = dq_lookup(type);
    if (!d) return 0;
    *elems = d->elems;
    *bytes = d->bytes;
    return 1;
}

const char *dq_type_name(uint32_t type) {
    const dq_info *d = dq_lookup(type);
    return d ? d->name : "unknown";
}

int dq_supported(uint32_t type) {
    switch (type) {
    case GGML_F32: case GGML_F16: case GGML_BF16: case GGML_Q8_0: case GGML_Q4_0:
    case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q6_K: return 1;
    default: return 0;
    }
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// IEEE half -> float, exact for every value (subnormals, inf, NaN).
static float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 0x3ff, u;
    if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {  // subnormal: normalise the mantissa
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            u = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else {
        u = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Q4_0, Q4_1, Q5_0, Q5_1: 32-element blocks sharing one layout family.
static void dq_q45(const uint8_t *b, float *y, size_t nb, int five, int has_min) {
    size_t bytes = 18 + 2 * has_min + 4 * five;
    for (size_t i = 0; i < nb; i++, b += bytes, y += 32) {
        float d = half_to_f32(rd16(b));
        float m = has_min ? half_to_f32(rd16(b + 2)) : 0.0f;
        const uint8_t *p = b + 2 + 2 * has_min;
        uint32_t qh = five ? rd32(p) : 0;
        const uint8_t *qs = p + 4 * five;
        int bias = has_min ? 0 : (five ? 16 : 8);
        for (int j = 0; j < 16; j++) {
            int lo = qs[j] & 15, hi = qs[j] >> 4;
            if (five) {
                lo |= (int)((qh >> j) & 1) << 4;
                hi |= (int)((qh >> (j + 16)) & 1) << 4;
            }
            float a = (float)(lo - bias) * d, c = (float)(hi - bias) * d;
            y[j] = has_min ? a + m : a;
            y[j + 16] = has_min ? c + m : c;
        }
    }
}

static void dq_q8_0(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = half_to_f32(rd16(b));
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

// Q6_K: each 128-element half uses 64 bytes of ql, 32 of qh and 8 scales. For
// l < 32, ql[l] and ql[l+32] hold the low nibbles of elements l, l+32 (low) and
// l+64, l+96 (high); qh[l] holds their top two bits at shifts 0, 2, 4, 6.
static void dq_q6_k(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 210) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = half_to_f32(rd16(b + 208));
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int s = l / 16;
                int q[4] = {
                    (ql[l] & 15) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                };
                for (int k = 0; k < 4; k++) {
                    float ds = d * (float)sc[s + 2 * k];
                    y[l + 32 * k] = ds * (float)(q[k] - 32);
                }
            }
        }
    }
}

int dq_to_f32(uint32_t type, const void *src, float *dst, size_t n, verr *err) {
    const uint8_t *b = src;
    uint32_t be, bb;
    if (!dq_supported(type) || !dq_block(type, &be, &bb)) {
        return verr_set(err, "unsupported tensor type %s (%u)", dq_type_name(type), type);
    }
    if (n % be) return verr_set(err, "%zu elements is not a multiple of the %s block size %u",
                                n, dq_type_name(type), be);
    switch (type) {
    case GGML_F32: memcpy(dst, src, n * 4); break;
    case GGML_F16: for (size_t i = 0; i < n; i++) dst[i] = half_to_f32(rd16(b + 2 * i)); break;
    case GGML_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)rd16(b + 2 * i) << 16;
            memcpy(&dst[i], &u, 4);
        }
        break;
    case GGML_Q8_0: dq_q8_0(b, dst, n / 32); break;
    case GGML_Q4_0: dq_q45(b, dst, n / 32, 0, 0); break;
    case GGML_Q4_1: dq_q45(b, dst, n / 32, 0, 1); break;
    case GGML_Q5_0: dq_q45(b, dst, n / 32, 1, 0); break;
    case GGML_Q5_1: dq_q45(b, dst, n / 32, 1, 1); break;
    case GGML_Q6_K: dq_q6_k(b, dst, n / 256); break;
    }
    return 0;
}
