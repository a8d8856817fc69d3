// GEMM then ncclReduceScatter, host-driven (the tensor-parallel row GEMM).
#include <cublas_v2.h>
#include <nccl.h>

int gemmReduceScatter(cublasHandle_t blas, ncclComm_t comm, cudaStream_t stream, const __nv_bfloat16* a,
                      const __nv_bfloat16* b, __nv_bfloat16* partial, __nv_bfloat16* out, int m, int n, int k,
                      int nRanks) {
  const float alpha = 1.0f, beta = 0.0f;
  cublasSetStream(blas, stream);
  cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, n, a, CUDA_R_16BF, k, &beta,
               partial, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  ncclReduceScatter(partial, out, (size_t)m * n / nRanks, ncclBfloat16, ncclSum, comm, stream);
  return 0;
}
