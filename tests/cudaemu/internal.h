// internal.h (emulated device): what the runtime (runtime.cpp), the executor
// (exec.cpp) and the cuBLAS stand-in (cublas.cpp) share. Not seen by kernel code.
#ifndef VARENT_EMU_INTERNAL_H
#define VARENT_EMU_INTERNAL_H

#include <stdint.h>

#include <functional>
#include <memory>
#include <string>

#include "include/cuda_runtime.h"

namespace emu {

enum schedule_kind { SCHED_FORWARD, SCHED_REVERSE, SCHED_RANDOM };

constexpr int SM_COUNT = 132;  // an H100 SXM's

// VARENT_EMU_SCHEDULE=forward|reverse|random[:SEED], VARENT_EMU_DEVICES=N (default 2),
// VARENT_EMU_THREADS=N (OS threads running blocks; default: the cores, at most 4).
struct config {
    schedule_kind schedule;
    uint64_t seed;
    int devices;
    int threads;
};
const config &cfg(void);

// One kernel launch: the closure the launch site built and its configuration.
struct launch_rec {
    std::string name;
    const void *func;
    dim3 grid, block;
    size_t smem;
    std::shared_ptr<void> closure;
    const closure_ops *ops;
    int device;
    bool cooperative = false;  // cudaLaunchAttributeCooperative: its blocks run co-resident
    bool pdl = false;          // cudaLaunchAttributeProgrammaticStreamSerialization
    long first = 0;            // the blocks before it ran already (started early)
};

// Runs every block of L now, on the worker threads (a cooperative launch: all of its
// blocks co-resident on this thread); returns when all are done. A synchronisation,
// warp or deadlock error ends the process with a message naming the kernel.
void exec_launch(const launch_rec &L);
// Programmatic dependent launch (L launched with the attribute right after another
// kernel): the first blocks of L run now, before the kernel ahead of it, each up to its
// cudaGridDependencySynchronize (a read of that kernel's output before it sees the old
// values; one that never synchronises runs to its end). exec_finish runs the rest once
// that kernel is done. At most EARLY_THREADS threads start early (fibers cost memory).
struct early_start;
early_start *exec_start_early(const launch_rec &L);
void exec_finish(const launch_rec &L, early_start *e);
// Blocks of L that may be resident at once on one SM (threads, shared memory), as an
// H100 counts them: a cooperative launch may have at most this times the SM count.
int exec_max_blocks_per_sm(const launch_rec &L);
// The kernel this OS thread is running ("" when none): for the memcheck report.
const char *exec_running_kernel(void);
// Whether [p, p + n) lies in the running block's shared memory (dynamic and static).
bool shared_range(const void *p, size_t n);
// The running thread ends: its asynchronous copies must all have been waited for
// (async.cpp; reported otherwise).
void async_thread_end(thread_ctx &t);
// The dynamic shared memory limit set with cudaFuncSetAttribute (0: default 48 KiB).
int func_max_dynamic_smem(const void *func);

// A queued piece of device work (a kernel, a copy, a GEMM, an event).
struct op {
    std::string what;  // "kernel NAME", "memcpy HtoD", "cublasGemmEx", ...
    int is_kernel;
    std::function<void()> run;
    size_t bytes = 0;  // a copy's or memset's size (the trace's records)
    // Set when enqueued, for the trace (cupti.cpp): the API call's correlation id, the
    // stream and device, and for a graph launch's nodes the graph and node ids.
    uint32_t corr = 0, stream = 0, graph = 0;
    uint64_t node = 0;
    int device = 0;
    std::shared_ptr<const launch_rec> kernel;  // a kernel launch's record (PDL pairs consecutive ones)
};

// Enqueues o on s (the current device's legacy stream when s is NULL), or records it
// when s is capturing. Error: bad stream.
cudaError_t stream_enqueue(cudaStream_t s, op o);
// The device of stream s (NULL: the calling thread's current device).
int stream_device(cudaStream_t s);
void set_last_error(cudaError_t e);

// ---- the activity trace (cupti.cpp; CUPTI's API on the emulated device) ----
// The runtime API calls an api_scope records, as cuptiGetCallbackName names them.
enum api_id {
    API_LAUNCH_KERNEL, API_GRAPH_LAUNCH, API_MEMCPY, API_MEMCPY_ASYNC, API_MEMCPY2D_ASYNC, API_MEMSET,
    API_MEMSET_ASYNC, API_STREAM_SYNCHRONIZE, API_DEVICE_SYNCHRONIZE, API_EVENT_RECORD, API_EVENT_SYNCHRONIZE,
    API_STREAM_BEGIN_CAPTURE, API_STREAM_END_CAPTURE, API_GRAPH_INSTANTIATE, API_MALLOC, API_FREE, API_HOST_ALLOC,
    API_CUBLAS_GEMM, API_NCCL, API_COUNT
};
// Records one API call from construction to destruction while tracing is on; the work
// it enqueues carries its correlation id. A call made inside another is not recorded.
class api_scope {
  public:
    explicit api_scope(api_id id);
    ~api_scope();
    api_scope(const api_scope &) = delete;
    api_scope &operator=(const api_scope &) = delete;

  private:
    api_id id_;
    uint32_t corr_;
    uint64_t start_;
    uint32_t outer_;
};
bool trace_on(void);
uint64_t trace_now(void);
uint32_t trace_corr(void);
// A piece of device work ran from start to end (ns): its record, if its kind is enabled.
void trace_op(const op &o, uint64_t start, uint64_t end);
// Loads CUDA_INJECTION64_PATH's library, if set, and calls its InitializeInjection.
void trace_inject(void);

// Prints "cudaemu: " + the message on stderr and aborts (the emulator's checks).
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Which allocation holds p: its start and size; false when p is not device memory.
bool device_range(const void *p, const char **start, size_t *bytes, int *device);

}  // namespace emu

#endif
