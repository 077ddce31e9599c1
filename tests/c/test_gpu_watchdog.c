// test_gpu_watchdog.c: the persistent kernel's counter-wait watchdog (kernels/cuda/
// sync.cuh, CTR_WAIT_TIMEOUT_NS) on a GPU: a wait that nothing releases must end the
// launch with an error after about its timeout, not hang the process. The GPU window's
// guard stage runs it before test_cuda_persist, so a deadlocked persistent kernel there
// costs seconds, not a stage's whole share. Hardware only: the emulated device parks a
// wait and reports a deadlock itself (test_cudaemu_checks), so this program is not in
// its build; without a GPU it skips. After the trap the context is gone: this is the
// program's last CUDA call.
#include <stdio.h>

#include "check.h"

#ifndef VARENT_CUDA
int main(void) {
    SKIP("gpu_watchdog", "built without CUDA");
    CHECK_DONE();
}
#else

#include "kernels/ops_cuda.h"

#define TIMEOUT_NS 50000000ull  // 50 ms: the probe's, not the kernel's 10 s

int main(void) {
    if (cuda_device_count() == 0) {
        SKIP("gpu_watchdog", "no CUDA device");
        CHECK_DONE();
    }
    cuda_ctx C;
    verr e = { { 0 } };
    if (cuda_init(&C, 0, &e)) {
        CHECK(0, "gpu_watchdog: cuda_init", "%s", e.msg);
        CHECK_DONE();
    }
    cudaError_t end = cudaSuccess;
    double ms = 0;
    int rc = cuda_wait_probe(&C, TIMEOUT_NS, &end, &ms);
    CHECK(rc == 0 && end != cudaSuccess && ms >= 40 && ms < 5000,
          "gpu_watchdog: a counter wait nothing releases traps after its timeout (50 ms)",
          "rc %d (%s), the stream ended with '%s' after %.1f ms", rc, C.err.msg, cudaGetErrorString(end), ms);
    printf("NOTE gpu_watchdog: the trap ended the launch with '%s' after %.1f ms\n", cudaGetErrorString(end), ms);
    CHECK_DONE();
}
#endif
