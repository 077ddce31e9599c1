// hugemem.h: large buffers the CPU streams through (weights, KV caches) in 2 MiB
// transparent huge pages, so reading them takes a TLB miss per 2 MiB rather than per
// 4 KiB. With THP off ("never") the memory is ordinary pages and works the same.
#ifndef VARENT_HUGEMEM_H
#define VARENT_HUGEMEM_H

#include <stddef.h>

// n bytes (contents undefined), 64-byte aligned, in huge pages from 2 MiB up; NULL when
// out of memory.
void *huge_alloc(size_t n);
// Releases huge_alloc(n)'s p; n must be the size it was given (NULL p: nothing).
void huge_free(void *p, size_t n);

// Bytes the kernel backs with huge pages now in the mappings that overlap [p, p + n)
// (/proc/self/smaps' AnonHugePages; a mapping merged with a neighbour counts whole, so
// it can exceed n), or -1 when that cannot be read: what a benchmark reports, since THP
// is advice the kernel may decline.
long long huge_resident(const void *p, size_t n);

#endif
