// cuda_runtime.h (emulated device): the runtime API, plus, in C++, what kernel code
// sees: threadIdx and friends, barriers, warp intrinsics, atomics, shared memory and
// the launch (tests/cudaemu/include/emu_device.h).
#ifndef VARENT_EMU_CUDA_RUNTIME_H
#define VARENT_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "emu_device.h"
#endif

#endif
