// exec.cpp (emulated device): runs a kernel launch. Every CUDA thread of a block is a
// fiber; a scheduler runs each runnable fiber until it blocks (at a barrier, a warp
// intrinsic or a counter wait), yields (at an acquire load or __nanosleep) or ends, in
// the configured order (forward, reverse or seeded random, reshuffled after every
// barrier). Blocks of an ordinary launch run one at a time per worker thread, in
// parallel on the workers. The blocks of a cooperative launch are co-resident: all of
// them on one OS thread, taking turns, so a block that waits for a counter another
// block advances gets there; when no fiber of any block can go on, the deadlock is
// reported with each block's position. The checks: a barrier that only part of the
// block reaches, a thread that ends while others wait at one, a warp intrinsic whose
// mask names a lane that does not arrive (or arrives at another intrinsic), a lane that
// reads a lane outside the mask, shared memory beyond the launch's limit, a counter wait
// in a launch whose blocks are not co-resident, and a deadlock of co-resident blocks;
// each ends the process with a message naming the kernel, the block and the threads.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fiber.h"
#include "internal.h"

namespace emu {

thread_local thread_ctx *cur;
thread_local unsigned long progress;

namespace {

#ifdef __SANITIZE_ADDRESS__
constexpr size_t STACK_BYTES = 256 << 10;
#else
constexpr size_t STACK_BYTES = 64 << 10;
#endif
constexpr size_t SHARED_ARENA = 228 << 10;  // 227 KiB opt-in + 1 KiB reserved, as sm_90
constexpr size_t STATIC_SMEM_MAX = 48 << 10;
constexpr unsigned char POISON = 0xff;  // NaN as float and double, -1 as integers
constexpr int IDLE_PASSES = 3;           // rounds without progress before a deadlock is declared
constexpr int GREEDY_PASSES = 1 << 16;   // passes one co-resident block may run before the next
constexpr long EARLY_THREADS = 2048;     // threads of a PDL launch that start before the kernel ahead
// (16 blocks of 128: each thread is a fiber with a guarded stack, two memory mappings;
// at 16384 a busy test ran out of the process's 65530 mappings, vm.max_map_count)
constexpr long SPIN_PASSES = 1L << 22;   // an ordinary launch's block spinning this long never ends

// T_YIELD: yielded at an acquire load or __nanosleep (runs again at the next pass);
// T_WAIT: waits for *wait_ptr >= wait_target; T_GRIDDEP: at cudaGridDependencySynchronize.
enum tstate_kind { T_RUN, T_BARRIER, T_WARP, T_DONE, T_YIELD, T_WAIT, T_GRIDDEP };

struct warp_pending {
    warp_kind kind;
    unsigned mask;
    uint64_t value;
    int arg, width;
    const char *what;
};

// Where a fiber yielded or waits: the site, and what it read there.
struct site {
    const char *file = nullptr;
    int line = 0;
    const void *ptr = nullptr;
    uint64_t value = 0;
};

struct tstate {
    fiber f;
    thread_ctx ctx;
    tstate_kind state;
    warp_pending wp;
    uint64_t result;
    site at;                   // T_YIELD / T_WAIT / T_GRIDDEP: where; otherwise the last such place
    unsigned wait_target;      // T_WAIT: *(const unsigned *)at.ptr >= wait_target
    site seen[4];              // the last values its acquire loads read, by address
    int n_seen;
};

// One running block: its fibers and shared memory.
struct block {
    fiber *sched = nullptr;    // the scheduler its fibers switch back to
    tstate *th = nullptr;      // [n]
    std::vector<int> order;
    char *shared = nullptr;
    size_t dyn = 0, static_used = 0;
    std::vector<std::pair<const void *, size_t>> statics;  // key -> offset
    const launch_rec *L = nullptr;
    uint3 bid;
    int n = 0, n_done = 0, n_barrier = 0, n_warp = 0, n_wait = 0, current = -1;
    const char *barrier_file = nullptr;
    int barrier_line = 0;
    uint64_t rng = 0;
    bool coresident = false;   // its launch's blocks all run together (waits are allowed)
    const bool *dep_done = nullptr;  // cudaGridDependencySynchronize returns once *dep_done
};

thread_local block *self;      // the block whose fiber runs now (kernel-side calls)

char *new_stack() {
    void *m = mmap(nullptr, STACK_BYTES + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) fatal("out of memory for fiber stacks");
    mprotect(m, 4096, PROT_NONE);  // a stack overflow faults instead of corrupting
    return (char *)m + 4096;
}

// Stacks and shared arenas of co-resident blocks, kept for the next such launch.
struct resource_pool {
    std::mutex m;
    std::vector<char *> stacks, arenas;
    char *stack() {
        std::lock_guard<std::mutex> lk(m);
        if (stacks.empty()) return new_stack();
        char *s = stacks.back();
        stacks.pop_back();
        return s;
    }
    char *arena() {
        std::lock_guard<std::mutex> lk(m);
        if (arenas.empty()) {
            char *a = (char *)aligned_alloc(256, SHARED_ARENA);
            if (!a) fatal("out of memory for shared memory");
            return a;
        }
        char *a = arenas.back();
        arenas.pop_back();
        return a;
    }
    void give(char *s, char *a) {
        std::lock_guard<std::mutex> lk(m);
        if (s) stacks.push_back(s);
        if (a) arenas.push_back(a);
    }
};
resource_pool &pool_res() {
    static resource_pool *p = new resource_pool();  // never destroyed, as the worker pool
    return *p;
}

// One per worker OS thread: the fibers and shared memory of the ordinary block it runs.
struct runner {
    fiber sched;
    std::vector<tstate> th;
    block blk;

    runner() {
        th.resize(1024);
        for (tstate &t : th) {
            t.f.stack = new_stack();
            t.f.stack_size = STACK_BYTES;
        }
        blk.sched = &sched;
        blk.th = th.data();
        blk.shared = (char *)aligned_alloc(256, SHARED_ARENA);
        if (!blk.shared) fatal("out of memory for shared memory");
    }
    ~runner() {
        for (tstate &t : th) munmap(t.f.stack - 4096, STACK_BYTES + 4096);
        free(blk.shared);
    }
};

thread_local runner *mine;

// Frees a thread's runner when the thread ends (a host thread that ran blocks itself,
// e.g. a device thread of `agents --devices 0,1`); the pool's workers never end.
struct runner_owner {
    ~runner_owner() {
        delete mine;
        mine = nullptr;
    }
};
thread_local runner_owner mine_owner;

runner *get_runner() {
    if (!mine) {
        mine = new runner();
        (void)&mine_owner;  // odr-use: constructs the owner, whose destructor runs at thread exit
    }
    return mine;
}

uint64_t next_rand(uint64_t &s) {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void make_order(std::vector<int> &order, int n, uint64_t &rng) {
    order.resize(n);
    for (int i = 0; i < n; i++) order[i] = cfg().schedule == SCHED_REVERSE ? n - 1 - i : i;
    if (cfg().schedule != SCHED_RANDOM) return;
    for (int i = n - 1; i > 0; i--) std::swap(order[i], order[next_rand(rng) % (uint64_t)(i + 1)]);
}

std::string block_name(const block &b) {
    char s[160];
    snprintf(s, sizeof s, "kernel %s, block (%u,%u,%u) of (%u,%u,%u), %u threads", b.L->name.c_str(), b.bid.x,
             b.bid.y, b.bid.z, b.L->grid.x, b.L->grid.y, b.L->grid.z, b.L->block.x * b.L->block.y * b.L->block.z);
    return s;
}

[[noreturn]] void block_fatal(const block &b, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void block_fatal(const block &b, const char *check, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fatal("%s: %s: %s", check, block_name(b).c_str(), msg);
}

void thread_main(void *arg) {
    tstate *t = (tstate *)arg;
    block &b = *self;
    fiber_entered(b.sched);
    b.L->ops->run(b.L->closure.get());
    async_thread_end(t->ctx);
    t->state = T_DONE;
    b.n_done++;
    progress++;
    fiber_exit(&t->f, b.sched);
}

const char *state_name(tstate_kind k) {
    switch (k) {
    case T_RUN: return "running";
    case T_BARRIER: return "at __syncthreads";
    case T_WARP: return "at a warp intrinsic";
    case T_DONE: return "exited";
    case T_YIELD: return "spinning";
    case T_WAIT: return "waiting for a counter";
    case T_GRIDDEP: return "at cudaGridDependencySynchronize";
    }
    return "?";
}

// The result of lane `lane` for a complete group (all of mask arrived at one kind).
uint64_t warp_result(block &b, int base, int lane, const warp_pending &p) {
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
            if ((mask >> l & 1) && b.th[base + l].wp.value) bits |= 1u << l;
        if (p.kind == WARP_BALLOT) return bits;
        return p.kind == WARP_ANY ? bits != 0 : bits == mask;
    }
    case WARP_REDUCE_ADD: {
        unsigned sum = 0;
        for (int l = 0; l < 32; l++)
            if (mask >> l & 1) sum += (unsigned)b.th[base + l].wp.value;
        return sum;
    }
    case WARP_MATCH_ANY: {
        unsigned same = 0;
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1) && b.th[base + l].wp.value == b.th[base + lane].wp.value) same |= 1u << l;
        return same;
    }
    case WARP_SYNC: return 0;
    }
    // shuffles: a source outside the lane's segment gives the lane's own value
    if (src < seg || src >= seg + p.width) return b.th[base + lane].wp.value;
    if (!(mask >> src & 1))
        block_fatal(b, "warp", "%s: lane %d reads lane %d, which is not in the mask 0x%08x (thread %d)", p.what, lane,
                    src, mask, base + lane);
    return b.th[base + src].wp.value;
}

// Completes the group of lane `lane` if every lane of its mask waits at the same
// intrinsic with the same mask; true when it did.
bool warp_try_complete(block &b, int base, int lane) {
    const warp_pending &p = b.th[base + lane].wp;
    for (int l = 0; l < 32; l++) {
        if (!(p.mask >> l & 1)) continue;
        const tstate &o = b.th[base + l];
        if (o.state == T_DONE)
            block_fatal(b, "warp", "%s with mask 0x%08x at thread %d: lane %d named in the mask has exited", p.what,
                        p.mask, base + lane, l);
        if (o.state != T_WARP || o.wp.kind != p.kind || o.wp.mask != p.mask) return false;
    }
    std::vector<uint64_t> res(32);
    for (int l = 0; l < 32; l++)
        if (p.mask >> l & 1) res[l] = warp_result(b, base, l, p);
    unsigned mask = p.mask;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        b.th[base + l].result = res[l];
        b.th[base + l].state = T_RUN;
        b.n_warp--;
    }
    progress++;
    return true;
}

// Nothing of the block can run and a warp intrinsic waits: name the lane that never comes.
void report_warp_deadlock(block &b) {
    for (int i = 0; i < b.n; i++) {
        const tstate &t = b.th[i];
        if (t.state != T_WARP) continue;
        int base = i & ~31;
        for (int l = 0; l < 32; l++) {
            if (!(t.wp.mask >> l & 1)) continue;
            const tstate &o = b.th[base + l];
            if (o.state == T_WARP && o.wp.kind == t.wp.kind && o.wp.mask == t.wp.mask) continue;
            block_fatal(b, "warp", "%s with mask 0x%08x at thread %d: lane %d named in the mask never arrives (%s%s%s)",
                        t.wp.what, t.wp.mask, i, l, state_name(o.state), o.state == T_WARP ? ": " : "",
                        o.state == T_WARP ? o.wp.what : "");
        }
    }
}

// Where thread t is, in words (for the deadlock report).
std::string position(const block &b, const tstate &t) {
    char s[320];
    switch (t.state) {
    case T_WAIT:
        snprintf(s, sizeof s, "waits at %s:%d for the counter at %p to reach %u (it is %u)", t.at.file, t.at.line,
                 t.at.ptr, t.wait_target, __atomic_load_n((const unsigned *)t.at.ptr, __ATOMIC_RELAXED));
        break;
    case T_YIELD:
        snprintf(s, sizeof s, "spins at %s:%d", t.at.file, t.at.line);
        break;
    case T_GRIDDEP:
        snprintf(s, sizeof s, "waits at cudaGridDependencySynchronize (%s:%d) for the grid before it", t.at.file,
                 t.at.line);
        break;
    case T_BARRIER: snprintf(s, sizeof s, "at __syncthreads (%s:%d)", b.barrier_file, b.barrier_line); break;
    case T_WARP: snprintf(s, sizeof s, "at %s", t.wp.what); break;
    default: snprintf(s, sizeof s, "%s", state_name(t.state)); break;
    }
    return s;
}

// One line per block: its threads grouped by position ("thread 0 waits ...; threads 1-127 at ...").
std::string block_position(const block &b) {
    std::string out, prev;
    int first = -1;
    auto flush = [&](int last) {
        if (first < 0) return;
        char r[48];
        if (first == last) snprintf(r, sizeof r, "thread %d ", first);
        else snprintf(r, sizeof r, "threads %d-%d ", first, last);
        out += (out.empty() ? "" : "; ") + std::string(r) + prev;
    };
    for (int i = 0; i < b.n; i++) {
        std::string p = position(b, b.th[i]);
        if (first >= 0 && p == prev) continue;
        flush(i - 1);
        first = i, prev = p;
    }
    flush(b.n - 1);
    return out;
}

// ---- the fibers' side ----------------------------------------------------------------------
// Progress, for the deadlock detector, is what can let another fiber go on: a fiber
// that ends, a barrier or warp group that completes, a counter wait that is met, an
// atomic, release store or fence, and an acquire load that reads a value its fiber has
// not seen there before. A spin loop that keeps reading the same value makes none.
void note_acquire(tstate &t, const void *p, uint64_t value) {
    for (int i = 0; i < t.n_seen; i++)
        if (t.seen[i].ptr == p) {
            if (t.seen[i].value != value) progress++;
            t.seen[i].value = value;
            return;
        }
    progress++;
    site s;
    s.ptr = p, s.value = value;
    int slot = t.n_seen < 4 ? t.n_seen++ : (int)(value % 4);
    t.seen[slot] = s;
}

// Parks the running fiber in state k at site `at` and returns once the scheduler resumes it.
void park(tstate_kind k, const site &at) {
    block &b = *self;
    tstate &t = b.th[b.current];
    t.at = at;
    t.state = k;
    if (k == T_WAIT) b.n_wait++;
    fiber_switch(&t.f, b.sched);
    cur = &t.ctx;
}

// ---- running blocks ------------------------------------------------------------------------
void block_init(block &b, const launch_rec &L, uint3 bid) {
    b.L = &L;
    b.bid = bid;
    b.n = (int)(L.block.x * L.block.y * L.block.z);
    b.n_done = b.n_barrier = b.n_warp = b.n_wait = 0;
    b.current = -1;
    b.barrier_file = nullptr;
    b.dyn = L.smem;
    b.static_used = 0;
    b.statics.clear();
    b.rng = cfg().seed ^ (0x100000001b3ull * (bid.x + 1315423911ull * (bid.y + 2654435761ull * bid.z)));
    memset(b.shared, POISON, SHARED_ARENA);
    for (int i = 0; i < b.n; i++) {
        tstate &t = b.th[i];
        unsigned x = (unsigned)i % L.block.x, y = ((unsigned)i / L.block.x) % L.block.y;
        unsigned z = (unsigned)i / (L.block.x * L.block.y);
        t.ctx = thread_ctx{{x, y, z}, bid, {L.block.x, L.block.y, L.block.z}, {L.grid.x, L.grid.y, L.grid.z}, i};
        t.state = T_RUN;
        t.at = site();
        t.n_seen = 0;
        fiber_init(&t.f, thread_main, &t);
    }
    make_order(b.order, b.n, b.rng);
}

// One pass over the block's fibers: each runnable one (a wait whose counter has
// arrived, a spinner, a released grid dependency) runs until it blocks, yields or ends;
// then a barrier every live thread waits at is released. True when anything ran.
bool block_pass(block &b) {
    bool ran = false;
    self = &b;
    for (int idx : b.order) {
        tstate &t = b.th[idx];
        if (t.state == T_WAIT) {
            unsigned now = __atomic_load_n((const unsigned *)t.at.ptr, __ATOMIC_ACQUIRE);
            if ((int)(now - t.wait_target) < 0) continue;  // counters grow: a wrap-safe >=
            b.n_wait--;
            progress++;
        } else if (t.state == T_GRIDDEP) {
            if (!b.dep_done || !*b.dep_done) continue;
            progress++;
        } else if (t.state != T_RUN && t.state != T_YIELD) {
            continue;
        }
        t.state = T_RUN;
        b.current = idx;
        cur = &t.ctx;
        fiber_switch(b.sched, &t.f);
        ran = true;
    }
    cur = nullptr;
    if (b.n_barrier > 0 && b.n_barrier + b.n_done == b.n) {
        if (b.n_done > 0)
            block_fatal(b, "synccheck", "%d thread(s) wait at __syncthreads (%s:%d) while %d thread(s) have exited",
                        b.n_barrier, b.barrier_file, b.barrier_line, b.n_done);
        for (int i = 0; i < b.n; i++) b.th[i].state = T_RUN;
        b.n_barrier = 0;
        b.barrier_file = nullptr;
        progress++;
        if (cfg().schedule == SCHED_RANDOM) make_order(b.order, b.n, b.rng);
        ran = true;
    }
    return ran;
}

// An ordinary launch's block, alone on this OS thread: a counter wait cannot be met by
// another block (they are not co-resident), and a block that only spins never ends.
void run_block(runner &r, const launch_rec &L, uint3 bid) {
    block &b = r.blk;
    block_init(b, L, bid);
    long idle = 0;
    while (b.n_done < b.n) {
        unsigned long p0 = progress;
        bool ran = block_pass(b);
        if (!ran) {
            report_warp_deadlock(b);
            block_fatal(b, "deadlock", "no thread can run: %s", block_position(b).c_str());
        }
        idle = progress == p0 ? idle + 1 : 0;
        if (idle > SPIN_PASSES)
            block_fatal(b, "deadlock", "the block spins and nothing changes (%s); the launch is not cooperative, "
                        "so no other block is guaranteed to run beside it", block_position(b).c_str());
    }
}

// ---- co-resident blocks ----------------------------------------------------------------------
// The blocks of a cooperative launch, all on this OS thread with their own fibers and
// shared memory, run pass by pass in the schedule's block order.
struct group {
    fiber sched;
    std::vector<block> blocks;
    std::vector<int> order;
    uint64_t rng = 0;
    bool dep_done = true;      // false while its blocks started early (PDL) and the grid ahead runs
};

// Blocks [0, n) of L, co-resident.
void group_setup(group &g, const launch_rec &L, long n) {
    int threads = (int)(L.block.x * L.block.y * L.block.z);
    g.blocks.resize(n);
    for (long i = 0; i < n; i++) {
        block &b = g.blocks[i];
        b.sched = &g.sched;
        b.th = new tstate[threads];
        for (int t = 0; t < threads; t++) {
            b.th[t].f.stack = pool_res().stack();
            b.th[t].f.stack_size = STACK_BYTES;
        }
        b.shared = pool_res().arena();
        b.coresident = L.cooperative;
        b.dep_done = &g.dep_done;
        uint3 bid = {(unsigned)(i % L.grid.x), (unsigned)(i / L.grid.x % L.grid.y),
                     (unsigned)(i / ((long)L.grid.x * L.grid.y))};
        block_init(b, L, bid);
    }
    g.rng = cfg().seed * 0x9e3779b97f4a7c15ull + 7;
    make_order(g.order, (int)n, g.rng);
}

void group_release(group &g) {
    for (block &b : g.blocks) {
        for (int t = 0; t < b.n; t++) pool_res().give(b.th[t].f.stack, nullptr);
        pool_res().give(nullptr, b.shared);
        delete[] b.th;
    }
    g.blocks.clear();
}

[[noreturn]] void report_group_deadlock(const group &g) {
    const launch_rec &L = *g.blocks[0].L;
    std::string msg = std::string("deadlock: ") + (L.cooperative ? "cooperative launch" : "early-started blocks") +
                      " of kernel " + L.name + " (" + std::to_string(g.blocks.size()) + " co-resident blocks of " + std::to_string(L.block.x * L.block.y * L.block.z) +
                      " threads): no thread of any block can go on:";
    for (const block &b : g.blocks) {
        if (b.n_done == b.n) continue;
        char head[64];
        snprintf(head, sizeof head, "\n  block (%u,%u,%u): ", b.bid.x, b.bid.y, b.bid.z);
        msg += head + block_position(b);
    }
    fprintf(stderr, "cudaemu: %s\n", msg.c_str());
    fflush(stderr);
    abort();
}

// Round after round, each block in the schedule's block order runs greedily: pass after
// pass while it makes progress (up to GREEDY_PASSES), so a block that does not wait
// where it should runs ahead of the blocks it reads from and reads what they have not
// written yet. A round in which nothing progresses, three times over, is a deadlock.
// until_parked: started early (PDL): stop, with no deadlock, once no fiber can go on.
void run_group(group &g, bool until_parked) {
    size_t live = 0;
    for (const block &b : g.blocks) live += b.n_done < b.n;
    int idle = 0;
    while (live > 0) {
        unsigned long p0 = progress;
        for (int i : g.order) {
            block &b = g.blocks[i];
            for (int k = 0; k < GREEDY_PASSES && b.n_done < b.n; k++) {
                unsigned long before = progress;
                block_pass(b);
                if (b.n_done == b.n) live--;
                if (progress == before) break;
            }
        }
        idle = progress == p0 ? idle + 1 : 0;
        if (idle >= IDLE_PASSES && until_parked) break;
        if (idle >= IDLE_PASSES) {
            for (block &b : g.blocks)  // a warp that waits for a lane that never comes says so
                if (b.n_done < b.n && b.n_warp > 0) report_warp_deadlock(b);
            report_group_deadlock(g);
        }
    }
    self = nullptr;
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
        self = nullptr;
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
        if (n - job.first <= 1 || helpers <= 0) {
            next = job.first;
            drain(job, n);
            return;
        }
        std::unique_lock<std::mutex> lk(m);
        while ((int)threads.size() < helpers) threads.emplace_back([this] { worker(); });
        L = &job;
        n_blocks = n;
        next = job.first;
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

void exec_launch(const launch_rec &L) {
    if (!L.cooperative) {
        the_pool().run(L);
        return;
    }
    group g;
    group_setup(g, L, (long)L.grid.x * L.grid.y * L.grid.z);
    run_group(g, false);
    group_release(g);
}

struct early_start {
    group g;
};

early_start *exec_start_early(const launch_rec &L) {
    long n = (long)L.grid.x * L.grid.y * L.grid.z, threads = (long)L.block.x * L.block.y * L.block.z;
    long k = EARLY_THREADS / threads;
    if (k < 1) k = 1;
    if (k > n) k = n;
    early_start *e = new early_start();
    e->g.dep_done = false;
    group_setup(e->g, L, k);
    run_group(e->g, true);
    return e;
}

void exec_finish(const launch_rec &L, early_start *e) {
    e->g.dep_done = true;
    run_group(e->g, false);
    long started = (long)e->g.blocks.size();
    group_release(e->g);
    delete e;
    if (started < (long)L.grid.x * L.grid.y * L.grid.z) {
        launch_rec rest = L;
        rest.first = started;
        the_pool().run(rest);
    }
}

int exec_max_blocks_per_sm(const launch_rec &L) {
    long threads = (long)L.block.x * L.block.y * L.block.z, by_smem = (long)SHARED_ARENA / (long)(L.smem + 1024);
    long n = 32;
    if (2048 / threads < n) n = 2048 / threads;
    if (by_smem < n) n = by_smem;
    return (int)n;
}

const char *exec_running_kernel(void) { return self && cur && self->L ? self->L->name.c_str() : ""; }

// ---- what kernel code calls -------------------------------------------------------------
void syncthreads(const char *file, int line) {
    block &b = *self;
    tstate &t = b.th[b.current];
    if (!b.barrier_file) {
        b.barrier_file = file;
        b.barrier_line = line;
    }
    t.state = T_BARRIER;
    b.n_barrier++;
    fiber_switch(&t.f, b.sched);
    cur = &t.ctx;
}

uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int arg, int width, const char *what) {
    block &b = *self;
    int i = b.current, lane = i & 31, base = i & ~31;
    if (!(mask >> lane & 1))
        block_fatal(b, "warp", "%s: the mask 0x%08x does not name the calling lane %d (thread %d)", what, mask, lane, i);
    if (width < 1 || width > 32 || (width & (width - 1)))
        block_fatal(b, "warp", "%s: width %d is not a power of two in 1..32", what, width);
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && base + l >= b.n)
            block_fatal(b, "warp", "%s: the mask 0x%08x names lane %d, beyond the block's %d threads", what, mask, l,
                        b.n);
    tstate &t = b.th[i];
    t.wp = warp_pending{kind, mask, value, arg, width, what};
    t.state = T_WARP;
    b.n_warp++;
    if (!warp_try_complete(b, base, lane)) {
        fiber_switch(&t.f, b.sched);
        cur = &t.ctx;
    }
    return t.result;
}

void *shared_static(const void *key, size_t bytes, size_t align) {
    block &b = *self;
    for (auto &kv : b.statics)
        if (kv.first == key) return b.shared + kv.second;
    size_t off = (b.dyn + b.static_used + align - 1) / align * align;
    b.static_used = off + bytes - b.dyn;
    if (b.static_used > STATIC_SMEM_MAX)
        block_fatal(b, "shared", "static shared memory of %zu bytes is above the 48 KiB a kernel may declare",
                    b.static_used);
    if (off + bytes > SHARED_ARENA)
        block_fatal(b, "shared", "%zu bytes of dynamic + %zu of static shared memory are above the 227 KiB of sm_90",
                    b.dyn, b.static_used);
    b.statics.emplace_back(key, off);
    return b.shared + off;
}

void *shared_dynamic(void) { return self->shared; }

bool shared_range(const void *p, size_t n) {
    const char *c = (const char *)p, *s = self->shared;
    return c >= s && c + n <= s + self->dyn + self->static_used;
}

void spin_yield(const void *p, uint64_t value, const char *file, int line) {
    block &b = *self;
    if (p) note_acquire(b.th[b.current], p, value);
    site at;
    at.file = file, at.line = line, at.ptr = p, at.value = value;
    park(T_YIELD, at);
}

void wait_geq(const unsigned *p, unsigned target, const char *file, int line) {
    block &b = *self;
    if (!b.coresident) {  // no other block is guaranteed to run while this one waits
        unsigned now = __atomic_load_n(p, __ATOMIC_ACQUIRE);
        if ((int)(now - target) >= 0) return;
        block_fatal(b, "coresidency", "thread %d waits at %s:%d for the counter at %p to reach %u (it is %u), which "
                    "another block must advance, but the launch is not cooperative: its blocks are not co-resident "
                    "(launch it with cudaLaunchAttributeCooperative)", b.current, file, line, (const void *)p, target,
                    now);
    }
    site at;
    at.file = file, at.line = line, at.ptr = p, at.value = target;
    b.th[b.current].wait_target = target;
    park(T_WAIT, at);  // the scheduler resumes it once *p >= target (an acquire load)
}

void grid_dep_sync(const char *file, int line) {
    block &b = *self;
    if (!b.dep_done || *b.dep_done) return;  // no grid before it still running
    site at;
    at.file = file, at.line = line;
    park(T_GRIDDEP, at);
}

}  // namespace emu
