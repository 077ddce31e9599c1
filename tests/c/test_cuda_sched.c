// test_cuda_sched.c: tests/c/sched_cases.h on the CUDA backend (the emulated device in make test):
// the scheduler's sequences in one paged device pool, batched through cuda_forward_batch,
// must give generate()'s tokens, records and logits bit for bit: every row at once and
// one row at a time, with prefix and whole-prompt reuse, and a tiny pool that queues and
// evicts. The emulator is slow: one model, the first 13 sequences, 8 tokens each. Needs
// a GPU: prints "SKIP ..." without one.
#include <stdio.h>

#ifndef VARENT_CUDA
#include "check.h"
int main(void) {
    SKIP("sched on the device", "built without CUDA");
    CHECK_DONE();
}
#else
#include "kernels/ops_cuda.h"
#define SCHED_TEST_DEVICE "cuda"
#define SCHED_TEST_SMALL
#define SCHED_TEST_NEEDS_DEVICE() (cuda_device_count() > 0)
#include "sched_cases.h"
#endif
