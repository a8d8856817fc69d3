/*************************************************************************
 * cuco_gemm.h: row-major bf16 GEMM through cuBLAS, for candidates (fp32 accumulation).
 *
 * cuBLAS is column-major; a row-major C[m, n] = A[m, k] @ B[k, n] is the column-major C^T = B^T A^T,
 * so the operands are passed swapped with leading dimensions n, k and n.
 *************************************************************************/
#ifndef CUCO_GEMM_H_
#define CUCO_GEMM_H_

#include <cublas_v2.h>
#include <stdint.h>

// C = A @ B + beta * C, row-major, where the rows of B and C are `ld` elements apart (ld >= n: n columns of wider
// matrices, B + c0 and C + c0 for columns c0..c0+n); the sum is formed in fp32 in cuBLAS's epilogue and rounded once.
static inline cublasStatus_t cuco_gemm_bf16_ld(cublasHandle_t h, const void* A, const void* B, void* C, int64_t m,
                                               int64_t k, int64_t n, int64_t ld, float beta) {
  const float alpha = 1.0f;
  return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, B, CUDA_R_16BF, (int)ld, A,
                      CUDA_R_16BF, (int)k, &beta, C, CUDA_R_16BF, (int)ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static inline cublasStatus_t cuco_gemm_bf16_beta(cublasHandle_t h, const void* A, const void* B, void* C, int64_t m,
                                                 int64_t k, int64_t n, float beta) {
  return cuco_gemm_bf16_ld(h, A, B, C, m, k, n, n, beta);
}

static inline cublasStatus_t cuco_gemm_bf16(cublasHandle_t h, const void* A, const void* B, void* C, int64_t m,
                                            int64_t k, int64_t n) {
  return cuco_gemm_bf16_beta(h, A, B, C, m, k, n, 0.0f);
}

// C = A @ B + C: a partial product that arrived from a peer is reduced without a kernel of its own.
static inline cublasStatus_t cuco_gemm_bf16_accumulate(cublasHandle_t h, const void* A, const void* B, void* C,
                                                       int64_t m, int64_t k, int64_t n) {
  return cuco_gemm_bf16_beta(h, A, B, C, m, k, n, 1.0f);
}

// `batch` products with one B: C + i * strideC = (A + i * strideA) @ B, strides in elements. One launch for
// the same rows of every rank's block, as a chunked reduce-scatter produces them.
static inline cublasStatus_t cuco_gemm_bf16_batched(cublasHandle_t h, const void* A, int64_t strideA, const void* B,
                                                    void* C, int64_t strideC, int64_t m, int64_t k, int64_t n,
                                                    int batch) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, B, CUDA_R_16BF,
                                    (int)n, 0, A, CUDA_R_16BF, (int)k, strideA, &beta, C, CUDA_R_16BF, (int)n,
                                    strideC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// A handle whose GEMMs go on `stream`.
static inline cublasStatus_t cuco_gemm_handle(cublasHandle_t* h, cudaStream_t stream) {
  const cublasStatus_t st = cublasCreate(h);
  return st != CUBLAS_STATUS_SUCCESS ? st : cublasSetStream(*h, stream);
}

// Keep `reserved` SMs of `device` free of the handle's GEMMs, for kernels that must run beside them (cuBLAS's
// persistent kernels otherwise hold every SM until they end).
static inline cublasStatus_t cuco_gemm_leave_sms(cublasHandle_t h, int device, int reserved) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return CUBLAS_STATUS_INTERNAL_ERROR;
  return cublasSetSmCountTarget(h, sms - reserved);
}

#endif  // CUCO_GEMM_H_
