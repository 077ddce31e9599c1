// blas.cuh: cuBLAS's entry points as a table, loaded when a context starts
// (kernels/cuda/blas.cu). varent does not link libcublas: loading it (and cublasLt)
// costs every process ~150 ms and ~200 MB of touched pages at start-up, which
// `varent tokenize`, `varent help` or a CPU run never use.
#ifndef VARENT_CUDA_BLAS_CUH
#define VARENT_CUDA_BLAS_CUH

#include <cublas_v2.h>
#include "kernels/ops_cuda.h"

struct cuda_blas {
    cublasStatus_t (*create)(cublasHandle_t *h);
    cublasStatus_t (*destroy)(cublasHandle_t h);
    cublasStatus_t (*set_stream)(cublasHandle_t h, cudaStream_t s);
    const char *(*status_string)(cublasStatus_t s);
    cublasStatus_t (*gemm_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const void *alpha, const void *a, cudaDataType_t at, int lda, const void *b,
                              cudaDataType_t bt, int ldb, const void *beta, void *c, cudaDataType_t ct, int ldc,
                              cublasComputeType_t compute, cublasGemmAlgo_t algo);
};

// Fills b: from libcublas.so.MAJOR (the headers' major version), or, on the emulated
// device, from the emulator's own functions. -1 with err naming the library and symbol.
int cuda_blas_load(struct cuda_blas *b, verr *err);

// A status as text; works before the table is loaded (then only the number).
const char *cuda_blas_status(const cuda_ctx *ctx, cublasStatus_t s);

#endif
