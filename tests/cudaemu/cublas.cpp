// cublas.cpp (emulated device): the cuBLAS entry points varent uses. cublasGemmEx has
// cuBLAS's column-major semantics, C = alpha op(A) op(B) + beta C, and checks its
// arguments as cuBLAS does (a leading dimension too small for the matrix is
// CUBLAS_STATUS_INVALID_VALUE, never a wrong answer). It runs on the handle's stream,
// computing in fp32 from the declared input types.
#include <string.h>

#include "include/cublas_v2.h"
#include "internal.h"

struct cublasContext {
    cudaStream_t stream = nullptr;
};

namespace {

float load(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    unsigned short h = ((const unsigned short *)p)[i];
    if (t == CUDA_R_16BF) return __bfloat162float(__ushort_as_bfloat16(h));
    return __half2float(__ushort_as_half(h));
}

void store(void *p, cudaDataType t, size_t i, float v) {
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else if (t == CUDA_R_16BF) ((unsigned short *)p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    else ((unsigned short *)p)[i] = __half_as_ushort(__float2half_rn(v));
}

bool known_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

size_t elem(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

// The bytes a column-major rows x cols matrix with leading dimension ld spans.
size_t span(int rows, int cols, int ld, cudaDataType t) {
    if (rows == 0 || cols == 0) return 0;
    return ((size_t)(cols - 1) * ld + rows) * elem(t);
}

bool inside(const void *p, size_t bytes) {
    if (bytes == 0) return true;
    const char *start;
    size_t n;
    int d;
    return emu::device_range(p, &start, &n, &d) && (const char *)p + bytes <= start + n;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!known_type(at) || !known_type(bt) || !known_type(ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    // device memory large enough for each operand (a fault on a GPU)
    if (!inside(A, span(a_rows, a_cols, lda, at)) || !inside(B, span(b_rows, b_cols, ldb, bt)) ||
        !inside(C, span(m, n, ldc, ct)))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    float al = *(const float *)alpha, be = *(const float *)beta;  // host pointer mode
    emu::op o{"cublasGemmEx", 0, [=] {
                  for (int j = 0; j < n; j++)
                      for (int i = 0; i < m; i++) {
                          float acc = 0.f;
                          for (int p = 0; p < k; p++) {
                              size_t ai = ta == CUBLAS_OP_N ? (size_t)p * lda + i : (size_t)i * lda + p;
                              size_t bi = tb == CUBLAS_OP_N ? (size_t)j * ldb + p : (size_t)p * ldb + j;
                              acc += load(A, at, ai) * load(B, bt, bi);
                          }
                          size_t ci = (size_t)j * ldc + i;
                          float prev = be != 0.f ? load(C, ct, ci) : 0.f;  // beta 0: C is not read
                          store(C, ct, ci, al * acc + be * prev);
                      }
              }};
    emu::api_scope api(emu::API_CUBLAS_GEMM);
    emu::stream_enqueue(h->stream, o);
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
