// test_cudaemu_checks.cu: the emulated device must be able to fail. Each scenario
// plants one bug in a test-only kernel or host sequence, runs in a child process
// (this program re-executed with the scenario's name, under a chosen schedule) and must
// be caught: a wrong result, a CUDA error code, or the emulator's report naming it.
// Built only against the emulator (Makefile: build/emu/tests/test_cudaemu_checks).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/sync.cuh"

static int failures;

static void check(bool ok, const char *name, const char *why) {
    if (ok) printf("PASS %s\n", name);
    else printf("FAIL %s: %s\n", name, why), failures++;
    fflush(stdout);
}

// ---- planted kernels -------------------------------------------------------------------
// Sum of x[0..256) by thread 0 after every thread stored its value: without the
// barrier, thread 0 reads slots other threads have not written yet.
__global__ void reduce_no_sync(float *out, const float *x) {
    __shared__ float sh[256];
    sh[threadIdx.x] = x[threadIdx.x];
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int i = 0; i < 256; i++) s += sh[i];
        *out = s;
    }
}
__global__ void reduce_ok(float *out, const float *x) {
    __shared__ float sh[256];
    sh[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int i = 0; i < 256; i++) s += sh[i];
        *out = s;
    }
}
// Lane 31 never reaches the shuffle its mask names it in.
__global__ void shuffle_absent_lane(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 31) v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
// Reads one element past the end of x.
__global__ void read_past_end(float *out, const float *x, int n) { *out = x[n]; }
// Half of the block waits at a barrier the other half never reaches.
__global__ void divergent_barrier(float *out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1.f;
}
// Reads shared memory that nobody wrote.
__global__ void read_unwritten_shared(float *out) {
    __shared__ float sh[64];
    if (threadIdx.x == 0) sh[1] = 2.f;
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x];
}
__global__ void fill(float *out, float v) { out[threadIdx.x] = v; }
// Asynchronous copies into shared memory (cp_async16, as the persistent kernel's weight
// ring): each thread copies 4 floats of x into sh and stores them doubled. The planted
// bugs: 1 the copy read before its wait; 2 never waited for; 3 a destination in global
// memory; 4 a source not 16-byte aligned. In two commit groups (as the tiled attention's
// staged keys and values): x copied twice, one copy a group, and the two summed (2x)
// after cp_async_wait_group(1) lands the first and (0) the second; the planted bug 6
// reads the second after wait_group(1).
enum { AS_RIGHT, AS_READ_EARLY, AS_UNWAITED, AS_GLOBAL_DST, AS_MISALIGNED, AS_GROUPS, AS_GROUP_EARLY };
__device__ float4 async_two_groups(const float *x, int mode) {
    __shared__ float4 a[32];
    __shared__ float4 b[32];
    int t = threadIdx.x;
    cp_async16(&a[t], x + 4 * t);
    cp_async_commit();
    cp_async16(&b[t], x + 4 * t);
    cp_async_commit();
    cp_async_wait_group(1);
    float4 u = a[t], v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mode == AS_GROUP_EARLY) v = b[t];
    cp_async_wait_group(0);
    if (mode != AS_GROUP_EARLY) v = b[t];
    return make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
}
__global__ void async_copy(float *out, const float *x, int mode) {
    __shared__ float4 sh[32];
    int t = threadIdx.x;
    if (mode >= AS_GROUPS) {
        float4 v = async_two_groups(x, mode);
        out[4 * t] = v.x, out[4 * t + 1] = v.y, out[4 * t + 2] = v.z, out[4 * t + 3] = v.w;
        return;
    }
    void *dst = mode == AS_GLOBAL_DST ? (void *)(out + 4 * t) : (void *)&sh[t];
    cp_async16(dst, mode == AS_MISALIGNED ? x + 4 * t + 1 : x + 4 * t);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mode == AS_READ_EARLY) v = sh[t];
    if (mode != AS_UNWAITED) cp_async_wait_all();
    if (mode != AS_READ_EARLY) v = sh[t];
    out[4 * t] = 2.f * v.x, out[4 * t + 1] = 2.f * v.y, out[4 * t + 2] = 2.f * v.z, out[4 * t + 3] = 2.f * v.w;
}

// Co-resident blocks in two phases, as the persistent decode kernel's dataflow: block b
// works through barrier-separated steps, writes its slot and releases the counter;
// phase 2 waits until all G blocks have released, then sums every slot (G(G+1)/2).
// The planted bugs: 1 no wait; 2 a wrong target (G - 1); 3 the slots read before the
// wait; 4 a target no block reaches (G + 1): a deadlock.
enum { PH_RIGHT, PH_NO_WAIT, PH_WRONG_TARGET, PH_READ_EARLY, PH_DEADLOCK };
__global__ void phases(float *slot, float *out, unsigned *ctr, int mode) {
    __shared__ float part[64];
    int G = (int)gridDim.x, b = (int)blockIdx.x;
    float v = (float)(b + 1);
    for (int k = 0; k < 4; k++) {  // phase 1's work
        part[threadIdx.x] = v;
        __syncthreads();
        v = part[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    if (threadIdx.x == 0) slot[b] = v;
    __syncthreads();
    if (threadIdx.x == 0) red_release_gpu(ctr, 1);
    float early = 0.f;
    for (int i = 0; mode == PH_READ_EARLY && i < G; i++) early += slot[i];
    unsigned target = mode == PH_WRONG_TARGET ? G - 1 : mode == PH_DEADLOCK ? G + 1 : G;
    if (threadIdx.x == 0 && mode != PH_NO_WAIT) wait_counter_gpu(ctr, target);
    __syncthreads();
    float sum = early;
    for (int i = 0; mode != PH_READ_EARLY && i < G; i++) sum += slot[i];
    if (threadIdx.x == 0) out[b] = sum;
}

// ---- scenarios (run in the child) ----------------------------------------------------------
static float *dev_floats(int n, float base) {
    float *h = (float *)malloc(n * sizeof(float)), *d;
    for (int i = 0; i < n; i++) h[i] = base + (float)i;
    cudaMalloc((void **)&d, n * sizeof(float));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
    return d;
}

// Programmatic dependent launch: the consumer, launched with the attribute right after
// the producer, may start before the producer ends; only after
// cudaGridDependencySynchronize does it see the producer's writes. Planted: the read
// before the synchronisation (the emulator runs that part before the producer).
__global__ void pdl_produce(float *x, float v) { x[threadIdx.x] = v; }
__global__ void pdl_consume(float *out, const float *x, int early) {
    float a = 0.f;
    if (early) a = x[threadIdx.x];
    cudaGridDependencySynchronize();
    if (!early) a = x[threadIdx.x];
    out[threadIdx.x] = a;
}

// 0: the consumer saw the producer's values, 3: it did not; in a stream or a graph.
static int run_pdl(int early, int graph) {
    float *x = NULL, *out = NULL, h[32];
    cudaMalloc((void **)&x, sizeof h);
    cudaMalloc((void **)&out, sizeof h);
    cudaMemset(x, 0, sizeof h);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (graph) cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    pdl_produce<<<1, 32, 0, s>>>(x, 7.f);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {dim3(1), dim3(32), 0, s, attr, 1};
    cudaLaunchKernelEx(&lc, pdl_consume, out, (const float *)x, early);
    if (graph) {
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&ge, g, 0);
        cudaGraphLaunch(ge, s);
    }
    cudaStreamSynchronize(s);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 32; i++)
        if (h[i] != 7.f) return 3;
    return 0;
}

// phases() on G co-resident blocks (cooperative: 1, else an ordinary launch): 0 when
// every block's sum is right, 3 when one is not.
static int run_phases(int mode, int G, int cooperative) {
    float *slot, *out, h[64];
    unsigned *ctr;
    cudaMalloc((void **)&slot, G * sizeof(float));  // NaN-poisoned: a slot read before its write is NaN
    cudaMalloc((void **)&out, G * sizeof(float));
    cudaMalloc((void **)&ctr, sizeof(unsigned));
    cudaMemset(ctr, 0, sizeof(unsigned));
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = cooperative;
    cudaLaunchConfig_t lc = {dim3(G), dim3(64), 0, 0, attr, 1};
    cudaError_t e = cudaLaunchKernelEx(&lc, phases, slot, out, ctr, mode);
    if (e != cudaSuccess) return e == cudaErrorCooperativeLaunchTooLarge ? 4 : 5;
    cudaMemcpy(h, out, G * sizeof(float), cudaMemcpyDeviceToHost);
    for (int b = 0; b < G; b++)
        if (h[b] != (float)(G * (G + 1) / 2)) return 3;
    return 0;
}

// async_copy() on one warp: 0 when every output is twice its input (x[i] = i + 1), 3 when not.
static int run_async(const char *name, float *out) {
    int mode = !strcmp(name, "async_read_early") ? AS_READ_EARLY
               : !strcmp(name, "async_unwaited")  ? AS_UNWAITED
               : !strcmp(name, "async_global_dst") ? AS_GLOBAL_DST
               : !strcmp(name, "async_misaligned") ? AS_MISALIGNED
               : !strcmp(name, "async_groups")     ? AS_GROUPS
               : !strcmp(name, "async_group_early") ? AS_GROUP_EARLY
                                                   : AS_RIGHT;
    float *x = dev_floats(129, 1.f), h[128];
    async_copy<<<1, 32>>>(out, x, mode);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 128; i++)
        if (h[i] != 2.f * (float)(i + 1)) return 3;
    return 0;
}

// exit status: 0 = the bug went unnoticed, 3 = noticed by this scenario's own check
static int scenario(const char *name) {
    if (!strcmp(name, "pdl_right")) return run_pdl(0, 0) | run_pdl(0, 1);
    if (!strcmp(name, "pdl_read_early")) return run_pdl(1, 0);
    if (!strcmp(name, "pdl_read_early_graph")) return run_pdl(1, 1);
    if (!strcmp(name, "coop_right")) return run_phases(PH_RIGHT, 8, 1);
    if (!strcmp(name, "coop_no_wait")) return run_phases(PH_NO_WAIT, 8, 1);
    if (!strcmp(name, "coop_wrong_target")) return run_phases(PH_WRONG_TARGET, 8, 1);
    if (!strcmp(name, "coop_read_early")) return run_phases(PH_READ_EARLY, 8, 1);
    if (!strcmp(name, "coop_deadlock")) return run_phases(PH_DEADLOCK, 8, 1);
    if (!strcmp(name, "wait_not_coresident")) return run_phases(PH_RIGHT, 8, 0);
    if (!strcmp(name, "coop_too_large")) return run_phases(PH_RIGHT, 132 * 32 + 1, 1) == 4 ? 3 : 0;
    float *out;
    cudaMalloc((void **)&out, 256 * sizeof(float));
    if (!strncmp(name, "async_", 6)) return run_async(name, out);
    if (!strcmp(name, "reduce") || !strcmp(name, "reduce_ok")) {
        float *x = dev_floats(256, 1.f), got = 0;
        if (!strcmp(name, "reduce")) reduce_no_sync<<<1, 256>>>(out, x);
        else reduce_ok<<<1, 256>>>(out, x);
        cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost);
        return got == 256.f * 257.f / 2.f ? 0 : 3;  // 1 + 2 + ... + 256
    }
    if (!strcmp(name, "shuffle")) shuffle_absent_lane<<<1, 32>>>(out);
    if (!strcmp(name, "oob")) read_past_end<<<1, 1>>>(out, dev_floats(64, 0.f), 64);
    if (!strcmp(name, "barrier")) divergent_barrier<<<1, 32>>>(out);
    if (!strcmp(name, "host_deref")) {
        float *x = dev_floats(64, 0.f);
        volatile float v = x[3];  // host code reading device memory
        (void)v;
        return 0;
    }
    if (!strcmp(name, "unwritten_shared")) {
        read_unwritten_shared<<<1, 64>>>(out);
        float h[64];
        cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
        return isnan(h[0]) && h[1] == 2.f ? 3 : 0;
    }
    if (!strcmp(name, "pinned_early")) {
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        float *pinned;
        cudaHostAlloc((void **)&pinned, sizeof(float), cudaHostAllocDefault);
        *pinned = -1.f;
        fill<<<1, 1, 0, s>>>(out, 42.f);
        cudaMemcpyAsync(pinned, out, sizeof(float), cudaMemcpyDeviceToHost, s);
        float early = *pinned;  // before cudaStreamSynchronize: stale
        cudaStreamSynchronize(s);
        return early == -1.f && *pinned == 42.f ? 3 : 0;
    }
    if (!strcmp(name, "sync_in_capture")) {
        cudaStream_t s;
        cudaGraph_t g;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        fill<<<1, 32, 0, s>>>(out, 1.f);
        cudaError_t e1 = cudaStreamSynchronize(s);
        cudaError_t e2 = cudaStreamEndCapture(s, &g);
        return e1 == cudaErrorStreamCaptureUnsupported && e2 == cudaErrorStreamCaptureInvalidated && !g ? 3 : 0;
    }
    if (!strcmp(name, "graph_replay")) {  // not a bug: a graph reads memory as it is at replay
        cudaStream_t s;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        float *v = dev_floats(1, 5.f), h = 0;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        cudaMemcpyAsync(out, v, sizeof(float), cudaMemcpyDeviceToDevice, s);
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&ge, g, 0);
        float seven = 7.f;
        cudaMemcpy(v, &seven, sizeof seven, cudaMemcpyHostToDevice);
        cudaGraphLaunch(ge, s);
        cudaStreamSynchronize(s);
        cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost);
        cudaGraphExecDestroy(ge);  // (LeakSanitizer checks the children under make test-asan)
        cudaGraphDestroy(g);
        cudaStreamDestroy(s);
        return h == 7.f ? 3 : 0;
    }
    if (!strcmp(name, "gemm_lda")) {
        cublasHandle_t hb;
        cublasCreate(&hb);
        float *a = dev_floats(64, 0.f), al = 1.f, be = 0.f;
        // A is 8 x 8 (OP_N, m = k = 8): lda 4 is too small
        cublasStatus_t st = cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, a, CUDA_R_32F, 4, a, CUDA_R_32F, 8,
                                         &be, out, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cublasDestroy(hb);
        return st == CUBLAS_STATUS_INVALID_VALUE ? 3 : 0;
    }
    if (!strcmp(name, "launch_2048")) {
        fill<<<1, 2048>>>(out, 1.f);
        return cudaGetLastError() == cudaErrorInvalidConfiguration ? 3 : 0;
    }
    cudaDeviceSynchronize();
    return 0;
}

// ---- the parent --------------------------------------------------------------------------
// Runs scenario name under schedule; returns its exit status (128 + signal when
// killed) and its stderr in err.
static int run_child(const char *self, const char *name, const char *schedule, char *err, size_t cap) {
    char path[] = "/tmp/cudaemu-check-XXXXXX";
    int fd = mkstemp(path);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        setenv("VARENT_EMU_SCHEDULE", schedule, 1);
        execl(self, self, name, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    ssize_t n = pread(fd, err, cap - 1, 0);
    err[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Caught: the child's own check saw the bug (exit 3), or the emulator stopped it with
// a report containing want (under AddressSanitizer, whose SEGV report replaces the
// emulator's memcheck report, that report).
static void expect(const char *self, const char *name, const char *schedule, const char *want) {
    char err[4096], label[128], why[4400];
    int rc = run_child(self, name, schedule, err, sizeof err);
    bool asan_segv = strstr(err, "AddressSanitizer: SEGV") != NULL && want && strstr(want, "memcheck");
    bool ok = want ? rc != 0 && (strstr(err, want) || asan_segv) : rc == 3;
    snprintf(label, sizeof label, "cudaemu_catches_%s_%s", name, schedule);
    snprintf(why, sizeof why, "exit %d, stderr: %.3000s", rc, err);
    check(ok, label, why);
}

int main(int argc, char **argv) {
    if (argc > 1) return scenario(argv[1]);
    const char *self = argv[0];
    char err[4096];
    // the planted race shows under the forward and the random schedule; the correct
    // kernel passes under both
    expect(self, "reduce", "forward", NULL);
    expect(self, "reduce", "random:1", NULL);
    check(run_child(self, "reduce_ok", "forward", err, sizeof err) == 0 &&
              run_child(self, "reduce_ok", "random:1", err, sizeof err) == 0,
          "cudaemu_reduce_with_barrier_is_right", err);
    expect(self, "shuffle", "forward", "lane 31 named in the mask");
    expect(self, "oob", "forward", "memcheck: kernel read_past_end on device 0: out-of-bounds access");
    expect(self, "host_deref", "forward", "memcheck: host code dereferenced device memory");
    expect(self, "barrier", "forward", "synccheck");
    expect(self, "unwritten_shared", "forward", NULL);
    expect(self, "pinned_early", "forward", NULL);
    expect(self, "sync_in_capture", "forward", NULL);
    expect(self, "graph_replay", "forward", NULL);
    expect(self, "gemm_lda", "forward", NULL);
    expect(self, "launch_2048", "forward", NULL);
    // co-resident blocks (a cooperative launch): the right dataflow passes under both
    // schedules; a missing wait, a wrong target and a read before the wait each give a
    // wrong sum under both (the blocks run greedily, so one runs ahead of the others'
    // writes); a target nobody reaches is a deadlock reported with every block's place
    check(run_child(self, "coop_right", "forward", err, sizeof err) == 0 &&
              run_child(self, "coop_right", "random:1", err, sizeof err) == 0,
          "cudaemu_cooperative_dataflow_is_right", err);
    const char *bugs[] = {"coop_no_wait", "coop_wrong_target", "coop_read_early"};
    for (const char *b : bugs) {
        expect(self, b, "forward", NULL);
        expect(self, b, "random:1", NULL);
    }
    expect(self, "coop_deadlock", "forward", "deadlock: cooperative launch of kernel phases (8 co-resident blocks");
    expect(self, "coop_deadlock", "random:1",
           "block (7,0,0): thread 0 waits at tests/cudaemu/test_cudaemu_checks.cu");
    expect(self, "wait_not_coresident", "forward", "coresidency: kernel phases");
    expect(self, "coop_too_large", "forward", NULL);
    // programmatic dependent launch: reading the producer's output before
    // cudaGridDependencySynchronize sees the old values, in a stream and in a graph
    check(run_child(self, "pdl_right", "forward", err, sizeof err) == 0, "cudaemu_pdl_after_sync_is_right", err);
    expect(self, "pdl_read_early", "forward", NULL);
    expect(self, "pdl_read_early", "random:1", NULL);
    expect(self, "pdl_read_early_graph", "forward", NULL);
    // asynchronous copies into shared memory: the destination holds the data only after
    // the issuing thread's wait; a read before it sees the poison, a copy never waited
    // for, into global memory or from a misaligned source is reported
    check(run_child(self, "async_right", "forward", err, sizeof err) == 0 &&
              run_child(self, "async_right", "random:1", err, sizeof err) == 0,
          "cudaemu_async_copy_after_wait_is_right", err);
    expect(self, "async_read_early", "forward", NULL);
    check(run_child(self, "async_groups", "forward", err, sizeof err) == 0 &&
              run_child(self, "async_groups", "random:1", err, sizeof err) == 0,
          "cudaemu_async_groups_land_in_order", err);
    expect(self, "async_group_early", "forward", NULL);
    expect(self, "async_unwaited", "forward", "asynchronous copies never waited for");
    expect(self, "async_global_dst", "forward", "the destination is not the block's shared memory");
    expect(self, "async_misaligned", "forward", "an operand not aligned to its size");
    return failures ? 1 : 0;
}
