// hugemem.c: see hugemem.h. Below 2 MiB a huge page would mostly be waste: malloc's heap.
#include "host/util/hugemem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

static size_t huge_round(size_t n) { return (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

void *huge_alloc(size_t n) {
    if (n < HUGE_PAGE) return aligned_alloc(64, n ? (n + 63) / 64 * 64 : 64);
    size_t len = huge_round(n);
    // One page more than needed, so a 2 MiB-aligned start lies inside: THP maps aligned
    // 2 MiB ranges only. The ends outside it go back at once.
    char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + HUGE_PAGE > p) munmap(p + len, (size_t)(raw + HUGE_PAGE - p));
    madvise(p, len, MADV_HUGEPAGE);  // advice only: refused, the pages are ordinary ones
    return p;
}

void huge_free(void *p, size_t n) {
    if (!p) return;
    if (n < HUGE_PAGE) free(p);
    else munmap(p, huge_round(n));
}

long long huge_resident(const void *p, size_t n) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    int inside = 0;
    long long total = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b, kb;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2) inside = a < hi && b > lo;  // a mapping's first line
        else if (inside && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) total += (long long)kb * 1024;
    }
    fclose(f);
    return total;
}
