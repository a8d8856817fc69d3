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

static inline cublasStatus_t cuco_gemm_bf16(cublasHandle_t h, const void* A, const void* B, void* C, int64_t m,
                                            int64_t k, int64_t n) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, B, CUDA_R_16BF, (int)n, A,
                      CUDA_R_16BF, (int)k, &beta, C, CUDA_R_16BF, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

#endif  // CUCO_GEMM_H_
