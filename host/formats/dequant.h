// dequant.h: ggml tensor types and their decoding to float32. Block formats:
//   Q8_0 (32): f16 d, i8 q[32]                    x = q*d
//   Q4_0 (32): f16 d, u8 qs[16]                   x = (nib - 8)*d
//   Q4_1 (32): f16 d, f16 m, u8 qs[16]            x = nib*d + m
//   Q5_0 (32): f16 d, u32 qh, u8 qs[16]           x = ((nib | bit<<4) - 16)*d
//   Q5_1 (32): f16 d, f16 m, u32 qh, u8 qs[16]    x = (nib | bit<<4)*d + m
//   Q6_K (256): u8 ql[128], u8 qh[64], i8 sc[16], f16 d   x = (d*sc)*(q6 - 32)
// In the 32-blocks byte j holds element j (low nibble) and j+16 (high nibble); bit j
// of qh is the fifth bit of element j.
#ifndef VARENT_DEQUANT_H
#define VARENT_DEQUANT_H

#include <stddef.h>
#include <stdint.h>
#include "host/util/err.h"

enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7,
    GGML_Q8_0 = 8, GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12,
    GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_Q8_K = 15, GGML_I8 = 24, GGML_I16 = 25,
    GGML_I32 = 26, GGML_I64 = 27, GGML_F64 = 28, GGML_BF16 = 30
};

// Block geometry of a ggml type: elements and bytes per block. 0 if unknown.
int dq_block(uint32_t type, uint32_t *elems, uint32_t *bytes);
// "Q4_1", "F32", ... or "unknown".
const char *dq_type_name(uint32_t type);
// 1 if dq_to_f32 can decode the type.
int dq_supported(uint32_t type);
// Decode n elements (a multiple of the block size) from src into dst.
int dq_to_f32(uint32_t type, const void *src, float *dst, size_t n, verr *err);

#endif
