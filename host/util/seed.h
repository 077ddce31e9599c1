// seed.h: a fresh random seed for a sampler, from the operating system.
#ifndef VARENT_SEED_H
#define VARENT_SEED_H

#include <stdint.h>

// 53 random bits from getrandom (the time and pid only where it fails): 53 so that the
// seed survives a round trip through JSON numbers (jq, JavaScript) unchanged.
uint64_t seed_from_os(void);

#endif
