// sync.cuh: counters between the blocks of one grid, with release/acquire semantics at
// GPU scope (the persistent decode kernel's dataflow, docs/cuda.md), and programmatic
// dependent launch, and asynchronous copies into shared memory (cp.async: the
// persistent kernel's weight ring, matvec.cuh). On a GPU these are PTX; on the emulated device (VARENT_EMU_DEVICE,
// tests/cudaemu/) each acquire is a point where the running block yields to the other
// co-resident blocks, and a wait parks it until the counter arrives, so a missing
// release or a wrong target shows as a reported deadlock (docs/cuda.md "The emulated
// device"). Counters only grow (by epochs), and comparisons are wrap-safe. On a GPU a
// wait that outlasts CTR_WAIT_TIMEOUT_NS traps (a deadlock becomes a launch error).
#ifndef VARENT_CUDA_SYNC_CUH
#define VARENT_CUDA_SYNC_CUH

// On a GPU, a counter wait longer than this traps: the launch fails (a sticky error the
// host's next wait reports) instead of hanging the process. No phase of a decode step
// waits this long unless the kernel is deadlocked (a missing release, blocks not all
// resident): 10 s leaves room for compute-sanitizer's slowdown (the window's racecheck
// and synccheck of the persistent kernel). (The emulated device reports a deadlock
// itself, with every block's place.)
#define CTR_WAIT_TIMEOUT_NS 10000000000ull

// a reached b on a counter that grows: wrap-safe.
__device__ __forceinline__ bool ctr_reached(unsigned a, unsigned b) { return (int)(a - b) >= 0; }

#ifdef VARENT_EMU_DEVICE

static inline unsigned emu_ld_acquire(const unsigned *p, const char *file, int line) {
    unsigned v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    emu::spin_yield(p, v, file, line);
    return v;
}
// *p, read with acquire semantics (the writes released before it are visible after).
#define ld_acquire_gpu(p) emu_ld_acquire((p), __FILE__, __LINE__)
// Waits until *p reaches target (acquire): parked, and resumed once it has (a GPU's
// pause between polls, the optional third argument, changes nothing here).
#define wait_counter_gpu(p, target, ...) emu::wait_geq((p), (target), __FILE__, __LINE__)
// *p += v, releasing this thread's earlier writes (pair it with __syncthreads so the
// block's writes are the thread's).
static inline void red_release_gpu(unsigned *p, unsigned v) {
    emu::progress++;
    __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
}
// 16 bytes from global src to shared dst, asynchronously: dst holds them only after this
// thread's cp_async_wait_all (tests/cudaemu/async.cpp poisons it until then).
#define cp_async16(dst, src) emu::cp_async((dst), (src), 16, __FILE__, __LINE__)
#define cp_async_wait_all() emu::cp_async_wait_all(__FILE__, __LINE__)
// The copies issued since the last commit form a group; wait_group(n) lands every group
// but the newest n (n a literal).
#define cp_async_commit() emu::cp_async_commit()
#define cp_async_wait_group(n) emu::cp_async_wait_group((n), __FILE__, __LINE__)
// The device's nanosecond clock (%globaltimer): the host's monotonic clock here.
#define globaltimer_ns() emu::globaltimer_ns()

#else

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_gpu(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// cp.async.cg: through L2 only (weights streamed once, as the matvec's loads).
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
#define cp_async_wait_group(n) asm volatile("cp.async.wait_group " #n ";" ::: "memory")
// The device's nanosecond clock, one for every SM (the persistent kernel's phase trace).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Polls *p until it reaches target; sleep_ns > 0 pauses that long between polls (fewer
// loads on the counter's L2 line while its producers add to it). The clock is read once
// every 256 polls, past the first, so a wait that is met at once costs one load.
__device__ __forceinline__ void wait_counter_gpu(const unsigned *p, unsigned target, unsigned sleep_ns = 0,
                                                 unsigned long long timeout_ns = CTR_WAIT_TIMEOUT_NS) {
    if (ctr_reached(ld_acquire_gpu(p), target)) return;
    unsigned long long t0 = globaltimer_ns();
    for (unsigned n = 1; !ctr_reached(ld_acquire_gpu(p), target); n++) {
        if (sleep_ns) __nanosleep(sleep_ns);
        if ((n & 255u) == 0 && globaltimer_ns() - t0 > timeout_ns) __trap();
    }
}

#endif

#endif
