// seed.c: seeds from the OS. Two runs started in the same second must not share a
// seed (a time-based default made quick successive runs print the same text).
#include "host/util/seed.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t seed_from_os(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() << 32;
    }
    return seed & ((1ull << 53) - 1);
}
