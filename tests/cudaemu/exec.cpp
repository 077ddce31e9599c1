// exec.cpp (emulated device): runs a kernel launch. Every CUDA thread of a block is a
// fiber on one OS thread; a scheduler runs each runnable fiber until it blocks (at a
// barrier or a warp intrinsic) or ends, in the configured order (forward, reverse or
// seeded random, reshuffled after every barrier). Blocks of a launch run in parallel on
// worker threads. The checks: a barrier that only part of the block reaches, a thread
// that ends while others wait at one, a warp intrinsic whose mask names a lane that
// does not arrive (or arrives at another intrinsic), a lane that reads a lane outside
// the mask, and shared memory beyond the launch's limit; each ends the process with a
// message naming the kernel, the block and the threads.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "fiber.h"
#include "internal.h"

namespace emu {

thread_local thread_ctx *cur;

namespace {

#ifdef __SANITIZE_ADDRESS__
constexpr size_t STACK_BYTES = 256 << 10;
#else
constexpr size_t STACK_BYTES = 64 << 10;
#endif
constexpr size_t SHARED_ARENA = 228 << 10;  // 227 KiB opt-in + 1 KiB reserved, as sm_90
constexpr size_t STATIC_SMEM_MAX = 48 << 10;
constexpr unsigned char POISON = 0xff;  // NaN as float and double, -1 as integers

enum tstate_kind { T_RUN, T_BARRIER, T_WARP, T_DONE };

struct warp_pending {
    warp_kind kind;
    unsigned mask;
    uint64_t value;
    int arg, width;
    const char *what;
};

struct tstate {
    fiber f;
    thread_ctx ctx;
    tstate_kind state;
    warp_pending wp;
    uint64_t result;
};

// One per worker OS thread: the fibers and shared memory of the block it runs.
struct runner {
    fiber sched;
    std::vector<tstate> th;
    std::vector<int> order;
    char *shared = nullptr;
    size_t dyn = 0, static_used = 0;
    std::vector<std::pair<const void *, size_t>> statics;  // key -> offset
    const launch_rec *L = nullptr;
    uint3 bid;
    int n = 0, n_done = 0, n_barrier = 0, n_warp = 0, current = -1;
    const char *barrier_file = nullptr;
    int barrier_line = 0;
    uint64_t rng = 0;

    runner() {
        th.resize(1024);
        for (tstate &t : th) {
            void *m = mmap(nullptr, STACK_BYTES + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) fatal("out of memory for fiber stacks");
            mprotect(m, 4096, PROT_NONE);  // a stack overflow faults instead of corrupting
            t.f.stack = (char *)m + 4096;
            t.f.stack_size = STACK_BYTES;
        }
        shared = (char *)aligned_alloc(256, SHARED_ARENA);
        if (!shared) fatal("out of memory for shared memory");
    }
    ~runner() {
        for (tstate &t : th) munmap(t.f.stack - 4096, STACK_BYTES + 4096);
        free(shared);
    }
};

thread_local runner *self;

// Frees a thread's runner when the thread ends (a host thread that ran blocks itself,
// e.g. a device thread of `agents --devices 0,1`); the pool's workers never end.
struct runner_owner {
    ~runner_owner() {
        delete self;
        self = nullptr;
    }
};
thread_local runner_owner self_owner;

runner *get_runner() {
    if (!self) {
        self = new runner();
        (void)&self_owner;  // odr-use: constructs the owner, whose destructor runs at thread exit
    }
    return self;
}

uint64_t next_rand(uint64_t &s) {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void make_order(runner &r) {
    r.order.resize(r.n);
    for (int i = 0; i < r.n; i++) r.order[i] = cfg().schedule == SCHED_REVERSE ? r.n - 1 - i : i;
    if (cfg().schedule != SCHED_RANDOM) return;
    for (int i = r.n - 1; i > 0; i--) std::swap(r.order[i], r.order[next_rand(r.rng) % (uint64_t)(i + 1)]);
}

[[noreturn]] void block_fatal(const runner &r, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void block_fatal(const runner &r, const char *check, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fatal("%s: kernel %s, block (%u,%u,%u) of (%u,%u,%u), %u threads: %s", check, r.L->name.c_str(), r.bid.x,
          r.bid.y, r.bid.z, r.L->grid.x, r.L->grid.y, r.L->grid.z, r.L->block.x * r.L->block.y * r.L->block.z, msg);
}

void thread_main(void *arg) {
    tstate *t = (tstate *)arg;
    runner &r = *self;
    fiber_entered(&r.sched);
    r.L->ops->run(r.L->closure.get());
    t->state = T_DONE;
    r.n_done++;
    fiber_exit(&t->f, &r.sched);
}

const char *state_name(tstate_kind k) {
    return k == T_RUN ? "running" : k == T_BARRIER ? "at __syncthreads" : k == T_WARP ? "at a warp intrinsic" : "exited";
}

// The result of lane `lane` for a complete group (all of mask arrived at one kind).
uint64_t warp_result(runner &r, int base, int lane, const warp_pending &p) {
    unsigned mask = p.mask;
    int seg = lane & ~(p.width - 1), src = lane;
    switch (p.kind) {
    case WARP_SHFL: src = seg + (p.arg & (p.width - 1)); break;
    case WARP_SHFL_XOR: src = lane ^ p.arg; break;
    case WARP_SHFL_UP: src = lane - p.arg; break;
    case WARP_SHFL_DOWN: src = lane + p.arg; break;
    case WARP_BALLOT:
    case WARP_ANY:
    case WARP_ALL: {
        unsigned bits = 0;
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1) && r.th[base + l].wp.value) bits |= 1u << l;
        if (p.kind == WARP_BALLOT) return bits;
        return p.kind == WARP_ANY ? bits != 0 : bits == mask;
    }
    case WARP_REDUCE_ADD: {
        unsigned sum = 0;
        for (int l = 0; l < 32; l++)
            if (mask >> l & 1) sum += (unsigned)r.th[base + l].wp.value;
        return sum;
    }
    case WARP_MATCH_ANY: {
        unsigned same = 0;
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1) && r.th[base + l].wp.value == r.th[base + lane].wp.value) same |= 1u << l;
        return same;
    }
    case WARP_SYNC: return 0;
    }
    // shuffles: a source outside the lane's segment gives the lane's own value
    if (src < seg || src >= seg + p.width) return r.th[base + lane].wp.value;
    if (!(mask >> src & 1))
        block_fatal(r, "warp", "%s: lane %d reads lane %d, which is not in the mask 0x%08x (thread %d)", p.what, lane,
                    src, mask, base + lane);
    return r.th[base + src].wp.value;
}

// Completes the group of lane `lane` if every lane of its mask waits at the same
// intrinsic with the same mask; true when it did.
bool warp_try_complete(runner &r, int base, int lane) {
    const warp_pending &p = r.th[base + lane].wp;
    for (int l = 0; l < 32; l++) {
        if (!(p.mask >> l & 1)) continue;
        const tstate &o = r.th[base + l];
        if (o.state == T_DONE)
            block_fatal(r, "warp", "%s with mask 0x%08x at thread %d: lane %d named in the mask has exited", p.what,
                        p.mask, base + lane, l);
        if (o.state != T_WARP || o.wp.kind != p.kind || o.wp.mask != p.mask) return false;
    }
    std::vector<uint64_t> res(32);
    for (int l = 0; l < 32; l++)
        if (p.mask >> l & 1) res[l] = warp_result(r, base, l, p);
    unsigned mask = p.mask;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        r.th[base + l].result = res[l];
        r.th[base + l].state = T_RUN;
        r.n_warp--;
    }
    return true;
}

// Nothing can run, and not every thread is at the barrier or done: name what waits.
[[noreturn]] void report_deadlock(runner &r) {
    for (int i = 0; i < r.n; i++) {
        const tstate &t = r.th[i];
        if (t.state != T_WARP) continue;
        int base = i & ~31;
        for (int l = 0; l < 32; l++) {
            if (!(t.wp.mask >> l & 1)) continue;
            const tstate &o = r.th[base + l];
            if (o.state == T_WARP && o.wp.kind == t.wp.kind && o.wp.mask == t.wp.mask) continue;
            block_fatal(r, "warp", "%s with mask 0x%08x at thread %d: lane %d named in the mask never arrives (%s%s%s)",
                        t.wp.what, t.wp.mask, i, l, state_name(o.state), o.state == T_WARP ? ": " : "",
                        o.state == T_WARP ? o.wp.what : "");
        }
    }
    block_fatal(r, "deadlock", "no thread can run");
}

void run_block(runner &r, const launch_rec &L, uint3 bid) {
    r.L = &L;
    r.bid = bid;
    r.n = (int)(L.block.x * L.block.y * L.block.z);
    r.n_done = r.n_barrier = r.n_warp = 0;
    r.dyn = L.smem;
    r.static_used = 0;
    r.statics.clear();
    r.rng = cfg().seed ^ (0x100000001b3ull * (bid.x + 1315423911ull * (bid.y + 2654435761ull * bid.z)));
    memset(r.shared, POISON, SHARED_ARENA);
    for (int i = 0; i < r.n; i++) {
        tstate &t = r.th[i];
        unsigned x = (unsigned)i % L.block.x, y = ((unsigned)i / L.block.x) % L.block.y;
        unsigned z = (unsigned)i / (L.block.x * L.block.y);
        t.ctx = thread_ctx{{x, y, z}, bid, {L.block.x, L.block.y, L.block.z}, {L.grid.x, L.grid.y, L.grid.z}, i};
        t.state = T_RUN;
        fiber_init(&t.f, thread_main, &t);
    }
    make_order(r);
    while (r.n_done < r.n) {
        bool ran = false;
        for (int idx : r.order) {
            tstate &t = r.th[idx];
            if (t.state != T_RUN) continue;
            r.current = idx;
            cur = &t.ctx;
            fiber_switch(&r.sched, &t.f);
            ran = true;
        }
        cur = nullptr;
        if (ran || r.n_done == r.n) continue;
        if (r.n_warp > 0) report_deadlock(r);
        // everyone not done waits at a barrier
        if (r.n_done > 0)
            block_fatal(r, "synccheck", "%d thread(s) wait at __syncthreads (%s:%d) while %d thread(s) have exited",
                        r.n_barrier, r.barrier_file, r.barrier_line, r.n_done);
        for (int i = 0; i < r.n; i++) r.th[i].state = T_RUN;
        r.n_barrier = 0;
        r.barrier_file = nullptr;
        if (cfg().schedule == SCHED_RANDOM) make_order(r);
    }
}

// ---- the worker pool -------------------------------------------------------------------
struct pool {
    std::mutex m;
    std::condition_variable work, done;
    std::vector<std::thread> threads;
    const launch_rec *L = nullptr;
    std::atomic<long> next{0};
    long n_blocks = 0;
    int busy = 0;
    uint64_t gen = 0;
    std::mutex launch_m;  // one launch at a time (several host threads may launch)

    void drain(const launch_rec &L, long n) {
        runner &r = *get_runner();
        for (long b; (b = next.fetch_add(1)) < n;) {
            uint3 bid = {(unsigned)(b % L.grid.x), (unsigned)(b / L.grid.x % L.grid.y),
                         (unsigned)(b / ((long)L.grid.x * L.grid.y))};
            run_block(r, L, bid);
        }
    }
    void worker() {
        uint64_t seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> lk(m);
            work.wait(lk, [&] { return gen != seen; });
            seen = gen;
            const launch_rec *job = L;
            long n = n_blocks;
            lk.unlock();
            drain(*job, n);
            lk.lock();
            if (--busy == 0) done.notify_all();
        }
    }
    void run(const launch_rec &job) {
        std::lock_guard<std::mutex> one(launch_m);
        long n = (long)job.grid.x * job.grid.y * job.grid.z;
        int helpers = cfg().threads - 1;
        if (n == 1 || helpers <= 0) {
            next = 0;
            drain(job, n);
            return;
        }
        std::unique_lock<std::mutex> lk(m);
        while ((int)threads.size() < helpers) threads.emplace_back([this] { worker(); });
        L = &job;
        n_blocks = n;
        next = 0;
        busy = (int)threads.size();
        gen++;
        work.notify_all();
        lk.unlock();
        drain(job, n);  // the calling thread runs blocks too
        lk.lock();
        done.wait(lk, [&] { return busy == 0; });
    }
};

pool &the_pool() {
    static pool *p = new pool();  // never destroyed: its threads block forever at exit
    return *p;
}

}  // namespace

void exec_launch(const launch_rec &L) { the_pool().run(L); }

const char *exec_running_kernel(void) { return self && cur && self->L ? self->L->name.c_str() : ""; }

// ---- what kernel code calls -------------------------------------------------------------
void syncthreads(const char *file, int line) {
    runner &r = *self;
    tstate &t = r.th[r.current];
    if (!r.barrier_file) {
        r.barrier_file = file;
        r.barrier_line = line;
    }
    t.state = T_BARRIER;
    r.n_barrier++;
    fiber_switch(&t.f, &r.sched);
    cur = &t.ctx;
}

uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int arg, int width, const char *what) {
    runner &r = *self;
    int i = r.current, lane = i & 31, base = i & ~31;
    if (!(mask >> lane & 1))
        block_fatal(r, "warp", "%s: the mask 0x%08x does not name the calling lane %d (thread %d)", what, mask, lane, i);
    if (width < 1 || width > 32 || (width & (width - 1)))
        block_fatal(r, "warp", "%s: width %d is not a power of two in 1..32", what, width);
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && base + l >= r.n)
            block_fatal(r, "warp", "%s: the mask 0x%08x names lane %d, beyond the block's %d threads", what, mask, l,
                        r.n);
    tstate &t = r.th[i];
    t.wp = warp_pending{kind, mask, value, arg, width, what};
    t.state = T_WARP;
    r.n_warp++;
    if (!warp_try_complete(r, base, lane)) {
        fiber_switch(&t.f, &r.sched);
        cur = &t.ctx;
    }
    return t.result;
}

void *shared_static(const void *key, size_t bytes, size_t align) {
    runner &r = *self;
    for (auto &kv : r.statics)
        if (kv.first == key) return r.shared + kv.second;
    size_t off = (r.dyn + r.static_used + align - 1) / align * align;
    r.static_used = off + bytes - r.dyn;
    if (r.static_used > STATIC_SMEM_MAX)
        block_fatal(r, "shared", "static shared memory of %zu bytes is above the 48 KiB a kernel may declare",
                    r.static_used);
    if (off + bytes > SHARED_ARENA)
        block_fatal(r, "shared", "%zu bytes of dynamic + %zu of static shared memory are above the 227 KiB of sm_90",
                    r.dyn, r.static_used);
    r.statics.emplace_back(key, off);
    return r.shared + off;
}

void *shared_dynamic(void) { return self->shared; }

}  // namespace emu
