// async.cpp (emulated device): asynchronous copies from global into shared memory
// (cp.async, kernels/cuda/sync.cuh) carried out as late as a GPU may. At the issue the
// source is read (a copy issued before its data was ready gets the old bytes) and the
// destination is poisoned; the bytes land at the issuing thread's cp_async_wait_all, or
// at the cp_async_wait_group that covers the copy's commit group (a read before it sees
// NaN, as a read of a copy still in flight may on a GPU). The
// checks: 16-byte aligned operands, the source in device memory, the destination in the
// block's shared memory, and no copy left unwaited when its thread ends.
#include <stdio.h>
#include <string.h>

#include <vector>

#include "internal.h"

namespace emu {

struct pending_copy {
    void *dst;
    unsigned char data[16];
    size_t bytes;
    const char *file;
    int line;
    long group;  // its commit group, 1, 2, ... in commit order; 0: not committed yet
};
struct async_copies {
    std::vector<pending_copy> q;
    long groups = 0;  // groups committed so far
};

namespace {

constexpr unsigned char POISON = 0xff;  // as exec.cpp's: NaN as float, -1 as integers

[[noreturn]] void async_fatal(const thread_ctx &t, const char *file, int line, const char *what) {
    fatal("cp.async: kernel %s, block (%u,%u,%u), thread %d at %s:%d: %s", exec_running_kernel(), t.bid.x, t.bid.y,
          t.bid.z, t.linear, file, line, what);
}

}  // namespace

void cp_async(void *dst, const void *src, size_t bytes, const char *file, int line) {
    thread_ctx &t = *cur;
    const char *start;
    size_t size;
    int dev;
    if (bytes != 16 && bytes != 8 && bytes != 4) async_fatal(t, file, line, "a copy of other than 4, 8 or 16 bytes");
    if ((uintptr_t)dst % bytes || (uintptr_t)src % bytes) async_fatal(t, file, line, "an operand not aligned to its size");
    if (!device_range(src, &start, &size, &dev) || (const char *)src + bytes > start + size)
        async_fatal(t, file, line, "the source is not device memory");
    if (!shared_range(dst, bytes)) async_fatal(t, file, line, "the destination is not the block's shared memory");
    if (!t.copies) t.copies = new async_copies();
    pending_copy c;
    c.dst = dst;
    memcpy(c.data, src, bytes);
    c.bytes = bytes;
    c.file = file;
    c.line = line;
    c.group = 0;
    t.copies->q.push_back(c);
    memset(dst, POISON, bytes);
}

void cp_async_wait_all(const char *file, int line) {
    (void)file, (void)line;
    thread_ctx &t = *cur;
    if (!t.copies) return;
    for (const pending_copy &c : t.copies->q) memcpy(c.dst, c.data, c.bytes);
    t.copies->q.clear();
    progress++;
}

void cp_async_commit() {
    thread_ctx &t = *cur;
    if (!t.copies) t.copies = new async_copies();
    t.copies->groups++;
    for (pending_copy &c : t.copies->q)
        if (!c.group) c.group = t.copies->groups;
}

// Lands the copies of groups 1 .. groups - n, in issue order; the newest n groups and
// the uncommitted copies stay in flight (poisoned).
void cp_async_wait_group(int n, const char *file, int line) {
    thread_ctx &t = *cur;
    if (n < 0) async_fatal(t, file, line, "a negative group count");
    if (!t.copies) return;
    long last = t.copies->groups - n;
    std::vector<pending_copy> left;
    for (const pending_copy &c : t.copies->q) {
        if (c.group && c.group <= last) memcpy(c.dst, c.data, c.bytes);
        else left.push_back(c);
    }
    t.copies->q.swap(left);
    progress++;
}

void async_thread_end(thread_ctx &t) {
    if (!t.copies) return;
    if (!t.copies->q.empty()) {
        const pending_copy &c = t.copies->q.front();
        char what[160];
        snprintf(what, sizeof what, "the thread ended with %zu asynchronous copies never waited for (cp_async_wait_all)",
                 t.copies->q.size());
        async_fatal(t, c.file, c.line, what);
    }
    delete t.copies;
    t.copies = nullptr;
}

}  // namespace emu
