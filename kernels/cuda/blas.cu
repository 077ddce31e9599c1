// blas.cu: cuBLAS loaded at run time (see blas.cuh for why it is not linked).
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "kernels/cuda/blas.cuh"

#ifdef VARENT_EMU_CUBLAS_V2_H
// The emulated device (tests/cudaemu/cublas.cpp) is linked in: its functions directly.
int cuda_blas_load(struct cuda_blas *b, verr *err) {
    (void)err;
    b->create = cublasCreate;
    b->destroy = cublasDestroy;
    b->set_stream = cublasSetStream;
    b->status_string = cublasGetStatusString;
    b->gemm_ex = cublasGemmEx;
    return 0;
}
#else
#define BLAS_STR2(x) #x
#define BLAS_STR(x) BLAS_STR2(x)
// The soname of the cuBLAS the build's headers describe (its ABI), then the unversioned
// development link as a last resort. Found through the binary's RUNPATH (the toolkit's
// lib64), LD_LIBRARY_PATH or the ld.so cache, as a linked library would be.
static const char *const blas_names[] = { "libcublas.so." BLAS_STR(CUBLAS_VER_MAJOR), "libcublas.so" };

static int blas_sym(void *lib, const char *name, void **fn, verr *err) {
    *fn = dlsym(lib, name);
    if (!*fn) return verr_set(err, "%s has no %s (%s): a cuBLAS %d is needed", blas_names[0], name, dlerror(),
                              CUBLAS_VER_MAJOR);
    return 0;
}

int cuda_blas_load(struct cuda_blas *b, verr *err) {
    void *lib = NULL;
    char why[512] = "";
    // dlopen counts references: every context after the first gets the loaded library.
    for (size_t i = 0; !lib && i < sizeof blas_names / sizeof *blas_names; i++) {
        lib = dlopen(blas_names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && i == 0) snprintf(why, sizeof why, "%s", dlerror());
    }
    if (!lib)
        return verr_set(err, "cannot load cuBLAS (%s): install the CUDA toolkit's cuBLAS %d or add its lib64 to "
                        "LD_LIBRARY_PATH", why, CUBLAS_VER_MAJOR);
    // The library stays loaded for the process: unloading it under a live CUDA runtime is unsafe.
    if (blas_sym(lib, "cublasCreate_v2", (void **)&b->create, err) ||
        blas_sym(lib, "cublasDestroy_v2", (void **)&b->destroy, err) ||
        blas_sym(lib, "cublasSetStream_v2", (void **)&b->set_stream, err) ||
        blas_sym(lib, "cublasGetStatusString", (void **)&b->status_string, err) ||
        blas_sym(lib, "cublasGemmEx", (void **)&b->gemm_ex, err))
        return -1;
    return 0;
}
#endif

const char *cuda_blas_status(const cuda_ctx *ctx, cublasStatus_t s) {
    if (ctx->blas && ctx->blas->status_string) return ctx->blas->status_string(s);
    return "cuBLAS status (library not loaded)";
}

extern "C" int cuda_blas_probe(verr *err) {
    struct cuda_blas b;
    memset(&b, 0, sizeof b);
    return cuda_blas_load(&b, err);
}
