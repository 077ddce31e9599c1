// cupti.cpp (emulated device): CUPTI's activity API on the emulated device, so that the
// tracer of a GPU window (tools/trace/cupti_trace.c) runs in `make test` as it runs on
// hardware. As with CUDA, CUDA_INJECTION64_PATH names a library whose
// InitializeInjection() is called when the runtime starts; it enables activity kinds and
// hands out buffers, and receives them filled with records: one per kernel, copy and
// memset the device ran (start and end, stream, the correlation id of the API call that
// asked for it, and the graph and node when a graph launch did) and one per runtime API
// call of the host. Times are the emulator's: what the CPU took to run each piece.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>

#include "include/cupti.h"
#include "internal.h"

namespace emu {

namespace {

// The names cuptiGetCallbackName gives: the emulated API ids (internal.h's api_id).
const char *const api_names[API_COUNT] = {
    "cudaLaunchKernel",  "cudaGraphLaunch",     "cudaMemcpy",           "cudaMemcpyAsync",     "cudaMemcpy2DAsync",
    "cudaMemset",        "cudaMemsetAsync",     "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventRecord",
    "cudaEventSynchronize", "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "cudaMalloc",
    "cudaFree",          "cudaHostAlloc",       "cublasGemmEx",         "ncclCollective",
};

struct tracer {
    std::mutex m;
    std::atomic<bool> on{ false };
    bool kinds[16] = { false };
    CUpti_BuffersCallbackRequestFunc requested = nullptr;
    CUpti_BuffersCallbackCompleteFunc completed = nullptr;
    uint8_t *buf = nullptr;  // the buffer being filled, [size] bytes, [used] of them valid
    size_t size = 0, used = 0;
    size_t dropped = 0;
    std::atomic<uint32_t> next_corr{ 1 };
    std::set<std::string> names;  // kernel names the records point into, kept for the process
};

tracer &tr() {
    static tracer *t = new tracer();  // never destroyed: records may be flushed at exit
    return *t;
}

thread_local uint32_t corr_here = 0;  // the API call this thread is in (0: none)

uint64_t now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t record_size(CUpti_ActivityKind k) {
    switch (k) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(CUpti_ActivityMemset4);
    case CUPTI_ACTIVITY_KIND_RUNTIME: return sizeof(CUpti_ActivityAPI);
    default: return 0;
    }
}
size_t aligned(size_t n) { return (n + 7) & ~(size_t)7; }

// Hands the filled buffer to the tracer; called without the lock held (the tracer's
// callback may call back into the API).
void complete(uint8_t *b, size_t size, size_t used) {
    tracer &t = tr();
    if (b && t.completed) t.completed(nullptr, 0, b, size, used);
}

// Appends one record, asking for a new buffer when the current one is full.
void emit(const void *rec, CUpti_ActivityKind kind) {
    tracer &t = tr();
    size_t n = aligned(record_size(kind));
    uint8_t *full = nullptr;
    size_t full_size = 0, full_used = 0;
    {
        std::lock_guard<std::mutex> lk(t.m);
        if (!t.kinds[kind]) return;
        if (t.buf && t.used + n > t.size) {
            full = t.buf, full_size = t.size, full_used = t.used;
            t.buf = nullptr;
        }
        if (!t.buf && t.requested) {
            size_t max_records = 0;
            t.requested(&t.buf, &t.size, &max_records);
            t.used = 0;
            if (t.buf && t.size < n) t.buf = nullptr;
        }
        if (!t.buf) {
            t.dropped++;
        } else {
            memcpy(t.buf + t.used, rec, record_size(kind));
            t.used += n;
        }
    }
    complete(full, full_size, full_used);
}

const char *intern(const std::string &s) {
    tracer &t = tr();
    std::lock_guard<std::mutex> lk(t.m);
    return t.names.insert(s).first->c_str();
}

}  // namespace

bool trace_on(void) { return tr().on.load(std::memory_order_relaxed); }
uint64_t trace_now(void) { return now_ns(); }

// The correlation id of work enqueued now: the API call's, or a fresh one outside any.
uint32_t trace_corr(void) {
    if (!trace_on()) return 0;
    return corr_here ? corr_here : tr().next_corr++;
}

api_scope::api_scope(api_id id) : id_(id), corr_(0), start_(0), outer_(corr_here) {
    if (!trace_on() || corr_here) return;  // nested calls belong to the outer one
    corr_ = tr().next_corr++;
    corr_here = corr_;
    start_ = now_ns();
}

api_scope::~api_scope() {
    if (!corr_) return;
    corr_here = outer_;
    CUpti_ActivityAPI r;
    memset(&r, 0, sizeof r);
    r.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    r.cbid = (CUpti_CallbackId)id_;
    r.start = start_;
    r.end = now_ns();
    r.processId = (uint32_t)getpid();
    r.threadId = (uint32_t)syscall(SYS_gettid);
    r.correlationId = corr_;
    emit(&r, CUPTI_ACTIVITY_KIND_RUNTIME);
}

// The fields every device record has, from the op and its times.
template <class R>
void device_record(R &r, CUpti_ActivityKind kind, const op &o, uint64_t start, uint64_t end) {
    memset(&r, 0, sizeof r);
    r.kind = kind;
    r.start = start;
    r.end = end;
    r.deviceId = (uint32_t)o.device;
    r.streamId = o.stream;
    r.correlationId = o.corr;
    r.graphNodeId = o.node;
    r.graphId = o.graph;
}

// One finished piece of device work: a kernel (and the cuBLAS and NCCL stand-ins, which
// are kernels on hardware), a copy or a memset; events and the like leave no record.
void trace_op(const op &o, uint64_t start, uint64_t end) {
    const std::string &w = o.what;
    if (w.compare(0, 7, "kernel ") == 0 || w.compare(0, 6, "cublas") == 0 || w.compare(0, 4, "nccl") == 0) {
        CUpti_ActivityKernel10 r;
        device_record(r, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, o, start, end);
        r.name = intern(w.compare(0, 7, "kernel ") == 0 ? w.substr(7) : w);
        emit(&r, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    } else if (w.compare(0, 6, "memcpy") == 0) {
        CUpti_ActivityMemcpy6 r;
        device_record(r, CUPTI_ACTIVITY_KIND_MEMCPY, o, start, end);
        r.copyKind = w.find("HtoD") != std::string::npos   ? CUPTI_ACTIVITY_MEMCPY_KIND_HTOD
                     : w.find("DtoH") != std::string::npos ? CUPTI_ACTIVITY_MEMCPY_KIND_DTOH
                                                           : CUPTI_ACTIVITY_MEMCPY_KIND_DTOD;
        r.bytes = o.bytes;
        emit(&r, CUPTI_ACTIVITY_KIND_MEMCPY);
    } else if (w.compare(0, 6, "memset") == 0) {
        CUpti_ActivityMemset4 r;
        device_record(r, CUPTI_ACTIVITY_KIND_MEMSET, o, start, end);
        r.bytes = o.bytes;
        emit(&r, CUPTI_ACTIVITY_KIND_MEMSET);
    }
}

// CUDA_INJECTION64_PATH: load the library and call its InitializeInjection, as the
// CUDA driver does at initialisation. A library that cannot be loaded is an error.
void trace_inject(void) {
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (!path || !*path) return;
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) fatal("CUDA_INJECTION64_PATH=%s: %s", path, dlerror());
    int (*init)(void) = (int (*)(void))dlsym(h, "InitializeInjection");
    if (!init) fatal("CUDA_INJECTION64_PATH=%s: no InitializeInjection in the library", path);
    init();
}

}  // namespace emu

using namespace emu;

extern "C" {

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
                                           CUpti_BuffersCallbackCompleteFunc completed) {
    if (!requested || !completed) return CUPTI_ERROR_INVALID_PARAMETER;
    tracer &t = tr();
    std::lock_guard<std::mutex> lk(t.m);
    t.requested = requested;
    t.completed = completed;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
    if (!record_size(kind)) return CUPTI_ERROR_INVALID_PARAMETER;
    tracer &t = tr();
    std::lock_guard<std::mutex> lk(t.m);
    t.kinds[kind] = true;
    t.on = true;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    tracer &t = tr();
    uint8_t *b;
    size_t size, used;
    {
        std::lock_guard<std::mutex> lk(t.m);
        b = t.buf, size = t.size, used = t.used;
        t.buf = nullptr;
    }
    complete(b, size, used);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
    if (!buffer || !record) return CUPTI_ERROR_INVALID_PARAMETER;
    uint8_t *at = *record ? (uint8_t *)*record + aligned(record_size((*record)->kind)) : buffer;
    if (at >= buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)at;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped) {
    (void)context, (void)streamId;
    tracer &t = tr();
    std::lock_guard<std::mutex> lk(t.m);
    *dropped = t.dropped;
    t.dropped = 0;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name) {
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API || cbid >= API_COUNT || !name) return CUPTI_ERROR_INVALID_PARAMETER;
    *name = api_names[cbid];
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult result, const char **str) {
    *str = result == CUPTI_SUCCESS ? "CUPTI_SUCCESS" : "CUPTI_ERROR (emulated)";
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetTimestamp(uint64_t *timestamp) {
    *timestamp = now_ns();
    return CUPTI_SUCCESS;
}

}  // extern "C"
