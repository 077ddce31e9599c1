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

// ---- scenarios (run in the child) ----------------------------------------------------------
static float *dev_floats(int n, float base) {
    float *h = (float *)malloc(n * sizeof(float)), *d;
    for (int i = 0; i < n; i++) h[i] = base + (float)i;
    cudaMalloc((void **)&d, n * sizeof(float));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
    return d;
}

// exit status: 0 = the bug went unnoticed, 3 = noticed by this scenario's own check
static int scenario(const char *name) {
    float *out;
    cudaMalloc((void **)&out, 256 * sizeof(float));
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
    return failures ? 1 : 0;
}
