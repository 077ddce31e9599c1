// runtime.cpp (emulated device): the CUDA runtime API on the CPU. Devices (an H100's
// properties and limits, VARENT_EMU_DEVICES of them, the current one per host thread),
// device memory (each allocation its own mapping, end flush against a guard page, NaN
// poisoned, inaccessible to the host except while the device works on it), streams that
// run their work lazily at the next synchronisation point, events, and graphs captured
// from a stream and replayed against memory as it is at replay time.
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "internal.h"

struct emu_stream {
    int device;
    uint32_t id = 0;  // the trace's stream id
    bool nonblocking;
    std::deque<emu::op> queue;
    bool capturing = false, invalidated = false;
    std::thread::id capture_thread;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    emu_graph *graph = nullptr;
    // cudaFree and friends flush every stream of the device, from any thread: one flusher
    // at a time per stream, and a stream destroyed meanwhile lives until the flush ends.
    std::recursive_mutex flush_m;
    std::atomic<int> refs{ 1 };
};
struct emu_event {
    emu_stream *stream = nullptr;
    bool done = false;
    double ms = 0;
};
struct emu_graph {
    std::vector<emu::op> nodes;
};
struct emu_graph_exec {
    std::vector<emu::op> nodes;
    int device;
    uint32_t id;  // the trace's graph id
};

namespace emu {

namespace {

constexpr size_t PAGE = 4096;
constexpr size_t DEVICE_BYTES = (size_t)80 << 30;

struct alloc_rec {
    char *map;       // mapping start (page aligned)
    size_t map_len;  // data pages + the guard page
    char *ptr;       // what cudaMalloc returned: ends at the guard page (16-byte aligned)
    size_t bytes;
    int device;
};

struct state {
    std::mutex m;
    std::map<uintptr_t, alloc_rec> allocs;  // by ptr
    std::vector<int> active;                // per device: work running (memory readable)
    std::vector<size_t> used;
    std::vector<emu_stream *> legacy;        // per device: the NULL stream
    std::vector<std::vector<emu_stream *>> streams;
    std::vector<std::pair<uintptr_t, size_t>> pinned;
    std::map<const void *, int> func_smem;
    config c;
};

std::atomic<uint32_t> next_id{ 1 };  // stream and graph ids for the trace

uint64_t env_u64(const char *name, uint64_t def) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, nullptr, 0) : def;
}

state &st() {
    static state *s = [] {
        state *n = new state();
        const char *sch = getenv("VARENT_EMU_SCHEDULE");
        n->c.schedule = SCHED_FORWARD;
        n->c.seed = 1;
        if (sch && !strncmp(sch, "reverse", 7)) n->c.schedule = SCHED_REVERSE;
        if (sch && !strncmp(sch, "random", 6)) {
            n->c.schedule = SCHED_RANDOM;
            if (sch[6] == ':') n->c.seed = strtoull(sch + 7, nullptr, 0);
        }
        n->c.devices = (int)env_u64("VARENT_EMU_DEVICES", 2);
        unsigned hw = std::thread::hardware_concurrency();
        n->c.threads = (int)env_u64("VARENT_EMU_THREADS", hw ? (hw < 4 ? hw : 4) : 1);
        if (n->c.devices < 0) n->c.devices = 0;
        if (n->c.threads < 1) n->c.threads = 1;
        n->active.assign(n->c.devices, 0);
        n->used.assign(n->c.devices, 0);
        n->streams.resize(n->c.devices);
        for (int d = 0; d < n->c.devices; d++) {
            emu_stream *s0 = new emu_stream();
            s0->device = d;
            s0->id = next_id++;
            s0->nonblocking = false;
            n->legacy.push_back(s0);
        }
        trace_inject();  // CUDA_INJECTION64_PATH, as the driver does when it starts
        return n;
    }();
    return *s;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local int capturing_here = 0;  // captures begun by this thread (global/thread-local mode)
thread_local emu_stream *capture_stream_here = nullptr;

cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void protect(state &s, int device, int prot) {
    for (auto &kv : s.allocs)
        if (kv.second.device == device) mprotect(kv.second.map, kv.second.map_len - PAGE, prot);
}

// The device's memory is readable while its work runs (kernels, copies, GEMMs).
void device_enter(int d) {
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    if (s.active[d]++ == 0) protect(s, d, PROT_READ | PROT_WRITE);
}
void device_leave(int d) {
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    if (--s.active[d] == 0) protect(s, d, PROT_NONE);
}

static void stream_unref(emu_stream *s) {
    if (--s->refs == 0) delete s;
}

// Runs a stream's queued ops in order: a kernel launched with programmatic dependent
// launch right after another kernel starts early (exec_start_early) and finishes after it.
void run_ops(std::deque<op> &queue) {
    early_start *early = nullptr;  // blocks of the kernel at the front, started before the one ahead
    while (!queue.empty()) {
        op o = std::move(queue.front());
        queue.pop_front();
        uint64_t t0 = trace_on() ? trace_now() : 0;  // the trace's records (cupti.cpp)
        if (!o.kernel) {
            o.run();
        } else {
            early_start *mine = early;
            early = nullptr;
            const op *next = queue.empty() ? nullptr : &queue.front();
            if (next && next->kernel && next->kernel->pdl && !next->kernel->cooperative && !o.kernel->cooperative)
                early = exec_start_early(*next->kernel);
            if (mine) exec_finish(*o.kernel, mine);
            else o.run();
        }
        if (trace_on()) trace_op(o, t0, trace_now());
    }
}

void flush(emu_stream *s) {
    std::lock_guard<std::recursive_mutex> g(s->flush_m);
    if (s->queue.empty()) return;
    device_enter(s->device);
    run_ops(s->queue);
    device_leave(s->device);
}

void flush_device(int d) {
    state &s = st();
    std::vector<emu_stream *> all;
    {
        std::lock_guard<std::mutex> lk(s.m);
        all = s.streams[d];
        for (emu_stream *x : all) x->refs++;
    }
    flush(s.legacy[d]);
    for (emu_stream *x : all) {
        flush(x);
        stream_unref(x);
    }
}

emu_stream *resolve(cudaStream_t s) { return s ? s : st().legacy[current_device]; }

// A call that would synchronise while this thread captures: CUDA refuses it and the
// capture is invalidated.
bool refuse_in_capture() {
    if (!capturing_here) return false;
    if (capture_stream_here) capture_stream_here->invalidated = true;
    return true;
}

bool is_pinned(const void *p, size_t n) {
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    for (auto &r : s.pinned)
        if ((uintptr_t)p >= r.first && (uintptr_t)p + n <= r.first + r.second) return true;
    return false;
}

bool valid_device(int d) { return d >= 0 && d < st().c.devices; }

// The allocation that holds [p, p + n): an error when it is not device memory or the
// range runs past its end.
cudaError_t check_device_range(const void *p, size_t n) {
    const char *start;
    size_t bytes;
    int dev;
    if (!device_range(p, &start, &bytes, &dev)) return cudaErrorInvalidValue;
    if ((const char *)p + n > start + bytes) return cudaErrorInvalidValue;
    return cudaSuccess;
}

void segv_handler(int sig, siginfo_t *si, void *) {
    char msg[512];
    const char *start;
    size_t bytes;
    int dev;
    state &s = st();
    bool active = false;
    if (s.m.try_lock()) {
        bool found = false;
        for (auto &kv : s.allocs) {
            const alloc_rec &a = kv.second;
            if ((char *)si->si_addr >= a.map && (char *)si->si_addr < a.map + a.map_len) {
                found = true;
                start = a.ptr;
                bytes = a.bytes;
                dev = a.device;
                active = s.active[a.device] > 0;
                break;
            }
        }
        s.m.unlock();
        if (found) {
            long off = (long)((char *)si->si_addr - start);
            if (active)
                snprintf(msg, sizeof msg,
                         "cudaemu: memcheck: kernel %s on device %d: out-of-bounds access at %p, offset %ld of a "
                         "%zu-byte allocation at %p\n",
                         exec_running_kernel(), dev, si->si_addr, off, bytes, (const void *)start);
            else
                snprintf(msg, sizeof msg,
                         "cudaemu: memcheck: host code dereferenced device memory at %p (offset %ld of a %zu-byte "
                         "allocation at %p on device %d)\n",
                         si->si_addr, off, bytes, (const void *)start, dev);
            if (write(2, msg, strlen(msg)) < 0) {
            }
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_segv() {
#if !defined(__SANITIZE_ADDRESS__)
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = segv_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigaction(SIGSEGV, &sa, nullptr);
        sigaction(SIGBUS, &sa, nullptr);
    });
#endif
}

}  // namespace

const config &cfg(void) { return st().c; }

void fatal(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudaemu: %s\n", msg);
    fflush(stderr);
    abort();
}

void set_last_error(cudaError_t e) { ret(e); }

bool device_range(const void *p, const char **start, size_t *bytes, int *device) {
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    auto it = s.allocs.upper_bound((uintptr_t)p);
    if (it == s.allocs.begin()) return false;
    --it;
    const alloc_rec &a = it->second;
    if ((const char *)p < a.ptr || (const char *)p >= a.ptr + a.bytes) return false;
    *start = a.ptr;
    *bytes = a.bytes;
    *device = a.device;
    return true;
}

int func_max_dynamic_smem(const void *func) {
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    auto it = s.func_smem.find(func);
    return it == s.func_smem.end() ? 0 : it->second;
}

cudaError_t stream_enqueue(cudaStream_t h, op o) {
    emu_stream *s = resolve(h);
    if (s->capturing) {
        if (!s->invalidated) s->graph->nodes.push_back(std::move(o));
        return cudaSuccess;
    }
    o.corr = trace_corr();
    o.stream = s->id;
    o.device = s->device;
    s->queue.push_back(std::move(o));
    return cudaSuccess;
}

int stream_device(cudaStream_t h) { return resolve(h)->device; }

// ---- kernel launches ---------------------------------------------------------------------
cudaError_t launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   void *closure, const closure_ops *ops) {
    api_scope api(API_LAUNCH_KERNEL);
    std::shared_ptr<void> holder(closure, ops->destroy);
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || !threads || threads > 1024 || block.x > 1024 || block.y > 1024 ||
        block.z > 64 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        return ret(cudaErrorInvalidConfiguration);
    int limit = func_max_dynamic_smem(func);
    if (smem > (size_t)(limit > 49152 ? limit : 49152)) return ret(cudaErrorInvalidValue);
    install_segv();
    auto L = std::make_shared<const launch_rec>(launch_rec{name, func, grid, block, smem, holder, ops, resolve(s)->device});
    op o{std::string("kernel ") + name, 1, [L] { exec_launch(*L); }};
    o.kernel = L;  // PDL pairs consecutive kernels (run_ops)
    return stream_enqueue(s, std::move(o));
}

cudaError_t launch_ex(const char *name, const void *func, const launch_attrs &a, void *closure,
                      const closure_ops *ops) {
    std::shared_ptr<void> holder(closure, ops->destroy);
    unsigned long long threads = (unsigned long long)a.block.x * a.block.y * a.block.z;
    if (!a.grid.x || !a.grid.y || !a.grid.z || !threads || threads > 1024 || a.block.x > 1024 || a.block.y > 1024 ||
        a.block.z > 64 || a.grid.x > 2147483647u || a.grid.y > 65535 || a.grid.z > 65535)
        return ret(cudaErrorInvalidConfiguration);
    int limit = func_max_dynamic_smem(func);
    if (a.smem > (size_t)(limit > 49152 ? limit : 49152)) return ret(cudaErrorInvalidValue);
    install_segv();
    launch_rec rec{name, func, a.grid, a.block, a.smem, holder, ops, resolve(a.stream)->device};
    rec.cooperative = a.cooperative, rec.pdl = a.pdl;
    if (rec.cooperative) {  // every block must fit on the device at once
        long n = (long)a.grid.x * a.grid.y * a.grid.z;
        int per_sm = exec_max_blocks_per_sm(rec);
        if (per_sm < 1 || n > (long)per_sm * SM_COUNT) return ret(cudaErrorCooperativeLaunchTooLarge);
    }
    auto L = std::make_shared<const launch_rec>(rec);
    op o{std::string("kernel ") + name, 1, [L] { exec_launch(*L); }};
    o.kernel = L;  // PDL pairs consecutive kernels (run_ops)
    return stream_enqueue(a.stream, std::move(o));
}

unsigned long long globaltimer_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

}  // namespace emu

using namespace emu;

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorCooperativeLaunchTooLarge: return "cudaErrorCooperativeLaunchTooLarge";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch";
    default: return "unknown error";
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetDeviceCount(int *n) {
    *n = st().c.devices;
    return *n ? cudaSuccess : ret(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
    if (!valid_device(d)) return ret(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (!valid_device(d)) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (emulated, cudaemu)");
    p->totalGlobalMem = DEVICE_BYTES;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->multiProcessorCount = SM_COUNT;
    p->major = 9;
    p->minor = 0;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) return ret(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    case cudaDevAttrGlobalMemoryBusWidth: *v = p.memoryBusWidth; break;
    case cudaDevAttrClockRate: *v = 1980000; break;        // an H100 SXM's boost clock, kHz
    case cudaDevAttrMemoryClockRate: *v = 2619000; break;  // and its HBM3 clock
    case cudaDevAttrEccEnabled: *v = 1; break;
    default: return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
// 13.0, as the toolkit the nvcc build uses; the emulated device has no driver of its own.
cudaError_t cudaDriverGetVersion(int *version) {
    *version = 13000;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *version) {
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *func, int block_size, size_t smem) {
    if (!n || block_size < 1 || block_size > 1024) return ret(cudaErrorInvalidValue);
    launch_rec L{"", func, dim3(1), dim3((unsigned)block_size), smem, nullptr, nullptr, current_device};
    *n = exec_max_blocks_per_sm(L);
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > (227 << 10))
        return ret(cudaErrorInvalidValue);
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    s.func_smem[func] = value;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    api_scope api(API_DEVICE_SYNCHRONIZE);
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    flush_device(current_device);
    return cudaSuccess;
}

// ---- memory --------------------------------------------------------------------------------
cudaError_t cudaMalloc(void **p, size_t bytes) {
    api_scope api(API_MALLOC);
    *p = nullptr;
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    state &s = st();
    int d = current_device;
    size_t data = (bytes + 15) & ~(size_t)15, pages = (data + PAGE - 1) / PAGE * PAGE;
    {
        std::lock_guard<std::mutex> lk(s.m);
        if (bytes == 0 || s.used[d] + pages > DEVICE_BYTES) return ret(cudaErrorMemoryAllocation);
    }
    char *map = (char *)mmap(nullptr, pages + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                             -1, 0);
    if (map == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
    char *ptr = map + pages - data;
    memset(ptr, 0xff, data);  // NaN: a read before any write shows up in results
    std::lock_guard<std::mutex> lk(s.m);
    mprotect(map + pages, PAGE, PROT_NONE);
    if (!s.active[d]) mprotect(map, pages, PROT_NONE);
    s.allocs[(uintptr_t)ptr] = alloc_rec{map, pages + PAGE, ptr, bytes, d};
    s.used[d] += pages;
    install_segv();
    *p = ptr;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    api_scope api(API_FREE);
    if (!p) return cudaSuccess;
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    state &s = st();
    int d;
    {
        std::lock_guard<std::mutex> lk(s.m);
        auto it = s.allocs.find((uintptr_t)p);
        if (it == s.allocs.end()) return ret(cudaErrorInvalidValue);
        d = it->second.device;
    }
    flush_device(d);  // cudaFree waits for the device, as CUDA's does
    std::lock_guard<std::mutex> lk(s.m);
    auto it = s.allocs.find((uintptr_t)p);
    if (it == s.allocs.end()) return ret(cudaErrorInvalidValue);
    munmap(it->second.map, it->second.map_len);
    s.used[d] -= it->second.map_len - PAGE;
    s.allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    *total_b = DEVICE_BYTES;
    *free_b = DEVICE_BYTES - s.used[current_device];
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    api_scope api(API_HOST_ALLOC);
    (void)flags;
    *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!*p) return ret(cudaErrorMemoryAllocation);
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    s.pinned.emplace_back((uintptr_t)*p, bytes);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

static cudaError_t unpin(void *p) {
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    for (size_t i = 0; i < s.pinned.size(); i++)
        if (s.pinned[i].first == (uintptr_t)p) {
            s.pinned.erase(s.pinned.begin() + (long)i);
            return cudaSuccess;
        }
    return ret(cudaErrorInvalidValue);
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    flush_device(current_device);
    if (unpin(p) != cudaSuccess) return cudaErrorInvalidValue;
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags) {
    (void)flags;
    state &s = st();
    std::lock_guard<std::mutex> lk(s.m);
    s.pinned.emplace_back((uintptr_t)p, bytes);
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) { return unpin(p); }

// Direction checks as CUDA makes them: a device side must be device memory.
static cudaError_t check_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    if (kind > cudaMemcpyDeviceToDevice) return cudaErrorInvalidMemcpyDirection;
    if (src_dev && check_device_range(src, n) != cudaSuccess) return cudaErrorInvalidValue;
    if (dst_dev && check_device_range(dst, n) != cudaSuccess) return cudaErrorInvalidValue;
    const char *st0;
    size_t b;
    int d;
    if (!src_dev && device_range(src, &st0, &b, &d)) return cudaErrorInvalidValue;
    if (!dst_dev && device_range(dst, &st0, &b, &d)) return cudaErrorInvalidValue;
    return cudaSuccess;
}

// The op of a copy of n bytes, named by its direction for the trace.
static op copy_op(const char *what, size_t n, std::function<void()> run) {
    op o{what, 0, std::move(run)};
    o.bytes = n;
    return o;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t h) {
    api_scope api(API_MEMCPY_ASYNC);
    if (n == 0) return cudaSuccess;
    cudaError_t e = check_copy(dst, src, n, kind);
    if (e != cudaSuccess) return ret(e);
    emu_stream *s = resolve(h);
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src, n)) {
        // pageable source: CUDA stages it before returning, so it is read now
        if (s->capturing) return ret(cudaErrorStreamCaptureUnsupported);
        auto copy = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        return stream_enqueue(h, copy_op("memcpy HtoD", n, [dst, copy] { memcpy(dst, copy->data(), copy->size()); }));
    }
    if (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, n)) {
        // pageable destination: CUDA returns when the copy is done
        if (s->capturing) return ret(cudaErrorStreamCaptureUnsupported);
        stream_enqueue(h, copy_op("memcpy DtoH", n, [dst, src, n] { memcpy(dst, src, n); }));
        flush(s);
        return cudaSuccess;
    }
    const char *what = kind == cudaMemcpyHostToDevice   ? "memcpy HtoD"
                       : kind == cudaMemcpyDeviceToHost ? "memcpy DtoH"
                                                        : "memcpy DtoD";
    return stream_enqueue(h, copy_op(what, n, [dst, src, n] { memmove(dst, src, n); }));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    api_scope api(API_MEMCPY);
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    cudaError_t e = check_copy(dst, src, n, kind);
    if (e != cudaSuccess) return ret(e);
    emu_stream *s = st().legacy[current_device];
    flush(s);
    stream_enqueue(nullptr, copy_op("memcpy", n, [dst, src, n] { memmove(dst, src, n); }));
    flush(s);
    return cudaSuccess;
}

// Device to device, or device to pinned host memory (the forward hooks' attention
// captures come back this way); a pageable destination is refused: CUDA would make the
// call synchronous, which nothing here relies on.
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t h) {
    api_scope api(API_MEMCPY2D_ASYNC);
    if (width > dpitch || width > spitch) return ret(cudaErrorInvalidValue);
    if (width == 0 || height == 0) return cudaSuccess;
    if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDeviceToHost)
        return ret(cudaErrorInvalidMemcpyDirection);
    size_t dst_n = dpitch * (height - 1) + width;
    if (check_device_range(src, spitch * (height - 1) + width) != cudaSuccess ||
        (kind == cudaMemcpyDeviceToDevice ? check_device_range(dst, dst_n) != cudaSuccess : !is_pinned(dst, dst_n)))
        return ret(cudaErrorInvalidValue);
    return stream_enqueue(h, copy_op(kind == cudaMemcpyDeviceToHost ? "memcpy2D DtoH" : "memcpy2D DtoD", width * height,
                                     [=] {
                                         for (size_t r = 0; r < height; r++)
                                             memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
                                     }));
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t h) {
    api_scope api(API_MEMSET_ASYNC);
    if (n == 0) return cudaSuccess;
    if (check_device_range(p, n) != cudaSuccess) return ret(cudaErrorInvalidValue);
    return stream_enqueue(h, copy_op("memset", n, [p, v, n] { memset(p, v, n); }));
}
// height rows of width bytes, pitch bytes apart (the forward hooks zero an ablated
// head's columns this way).
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int v, size_t width, size_t height, cudaStream_t h) {
    if (width > pitch) return ret(cudaErrorInvalidValue);
    if (width == 0 || height == 0) return cudaSuccess;
    if (check_device_range(p, pitch * (height - 1) + width) != cudaSuccess) return ret(cudaErrorInvalidValue);
    return stream_enqueue(h, copy_op("memset2D", width * height, [=] {
                                         for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, v, width);
                                     }));
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    api_scope api(API_MEMSET);
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    cudaError_t e = cudaMemsetAsync(p, v, n, nullptr);
    flush(st().legacy[current_device]);
    return e;
}

// ---- streams and events -------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags) {
    emu_stream *s = new emu_stream();
    s->device = current_device;
    s->id = next_id++;
    s->nonblocking = flags & cudaStreamNonBlocking;
    state &S = st();
    std::lock_guard<std::mutex> lk(S.m);
    S.streams[s->device].push_back(s);
    *out = s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    flush(s);
    state &S = st();
    std::lock_guard<std::mutex> lk(S.m);
    auto &v = S.streams[s->device];
    for (size_t i = 0; i < v.size(); i++)
        if (v[i] == s) v.erase(v.begin() + (long)i);
    stream_unref(s);  // deleted now, or by a flush_device still holding it
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    api_scope api(API_STREAM_SYNCHRONIZE);
    emu_stream *s = resolve(h);
    if (s->capturing) {
        s->invalidated = true;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    flush(s);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t h) { return cudaStreamSynchronize(h); }

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new emu_event();
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    return cudaEventCreate(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h) {
    api_scope api(API_EVENT_RECORD);
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    emu_stream *s = resolve(h);
    e->stream = s;
    e->done = false;
    return stream_enqueue(h, op{"event record", 0, [e] {
                                    e->ms = now_ms();
                                    e->done = true;
                                }});
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    api_scope api(API_EVENT_SYNCHRONIZE);
    if (!e || !e->stream) return ret(cudaErrorInvalidResourceHandle);
    if (refuse_in_capture()) return ret(cudaErrorStreamCaptureUnsupported);
    flush(e->stream);
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b) return ret(cudaErrorInvalidResourceHandle);
    if (!a->done || !b->done) return ret(cudaErrorNotReady);
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}

// ---- graphs ------------------------------------------------------------------------------------
cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode) {
    api_scope api(API_STREAM_BEGIN_CAPTURE);
    if (!h) return ret(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
    emu_stream *s = h;
    if (s->capturing) return ret(cudaErrorInvalidValue);
    flush(s);
    s->capturing = true;
    s->invalidated = false;
    s->mode = mode;
    s->capture_thread = std::this_thread::get_id();
    s->graph = new emu_graph();
    if (mode != cudaStreamCaptureModeRelaxed) {
        capturing_here++;
        capture_stream_here = s;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *g) {
    api_scope api(API_STREAM_END_CAPTURE);
    *g = nullptr;
    if (!h || !h->capturing) return ret(cudaErrorInvalidValue);
    emu_stream *s = h;
    s->capturing = false;
    if (s->mode != cudaStreamCaptureModeRelaxed) {
        capturing_here--;
        capture_stream_here = nullptr;
    }
    if (s->invalidated) {
        delete s->graph;
        s->graph = nullptr;
        return ret(cudaErrorStreamCaptureInvalidated);
    }
    *g = s->graph;
    s->graph = nullptr;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    api_scope api(API_GRAPH_INSTANTIATE);
    if (!g) return ret(cudaErrorInvalidValue);
    *exec = new emu_graph_exec{g->nodes, current_device, next_id++};
    return cudaSuccess;
}

// Counting only (nodes NULL), which is all varent asks: its decode-step report.
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *num_nodes) {
    if (!g || !num_nodes || nodes) return ret(cudaErrorInvalidValue);
    *num_nodes = g->nodes.size();
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t h) {
    api_scope api(API_GRAPH_LAUNCH);
    if (!exec) return ret(cudaErrorInvalidResourceHandle);
    for (size_t i = 0; i < exec->nodes.size(); i++) {  // replayed against memory as it is then
        op o = exec->nodes[i];
        o.graph = exec->id;
        o.node = (uint64_t)exec->id << 32 | i;
        stream_enqueue(h, std::move(o));
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

}  // extern "C"
