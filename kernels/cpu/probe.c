// probe.c: the CPU twin of the read-bandwidth probe kernel (kernels/cuda/probe.cu).
#include <string.h>

#include "kernels/ops.h"

uint32_t cpu_read_checksum(const void *p, size_t bytes) {
    const uint8_t *b = p;
    uint32_t sum = 0;
    for (size_t i = 0; i < bytes; i++) sum += (uint32_t)b[i] << (8 * (i % 4));  // little-endian words
    return sum;
}
