// check.h: the tiny assertion kit of the C tests. Prints the PASS/FAIL/SKIP lines
// tests/run.sh counts; a test binary exits non-zero when anything failed.
#ifndef VARENT_CHECK_H
#define VARENT_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <math.h>

static int check_failures;

#define CHECK(cond, name, ...)                                              \
    do {                                                                    \
        if (cond) printf("PASS %s\n", name);                                \
        else {                                                              \
            printf("FAIL %s: ", name); printf(__VA_ARGS__);                 \
            printf(" (%s:%d)\n", __FILE__, __LINE__); check_failures++;     \
        }                                                                   \
    } while (0)

#define SKIP(name, why) printf("SKIP %s: %s\n", name, why)
#define CHECK_DONE() return check_failures ? 1 : 0

// llm.c-style closeness: |got - ref| <= tol + |ref| * eps, element-wise.
// Returns the index of the first violation, or -1.
static inline long check_close(const float *got, const float *ref, long n, float tol, float eps) {
    for (long i = 0; i < n; i++) {
        if (!(fabsf(got[i] - ref[i]) <= tol + fabsf(ref[i]) * eps)) return i;
    }
    return -1;
}
#endif
