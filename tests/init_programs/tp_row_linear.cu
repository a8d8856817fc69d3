// Row-parallel linear layer (tensor parallelism), as a user writes it: each rank multiplies its slice of the
// activations, x [M, K/world], by its slice of the weight, w [K/world, N], in bf16 with cublasGemmEx (fp32
// accumulation and an fp32 result, so that the partial sums lose nothing), then sums the partial results of all
// ranks in place with an fp32 all-reduce: y [M, N] is the same on every rank.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco.h"

struct Handles {
  cublasHandle_t blas;
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  Handles* h = new Handles();
  ctx->state = h;
  CUCO_CUBLAS(ctx, cublasCreate(&h->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(h->blas, ctx->stream));
  CUCO_CUBLAS(ctx, cublasSetMathMode(h->blas, CUBLAS_DEFAULT_MATH));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  Handles* h = static_cast<Handles*>(ctx->state);
  const int m = (int)cuco_param(ctx, "M");
  const int k = (int)(cuco_param(ctx, "K") / ctx->nRanks);  // this rank's slice of the reduction
  const int n = (int)cuco_param(ctx, "N");
  auto* x = (__nv_bfloat16*)cuco_buffer(ctx, "x")->ptr;
  auto* w = static_cast<const __nv_bfloat16*>(cuco_buffer(ctx, "w")->ptr);
  float* y = static_cast<float*>(cuco_buffer(ctx, "y")->ptr);
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y = x w is column-major y^T = w^T x^T: cuBLAS sees w as n x k and x as k x m.
  CUCO_CUBLAS(ctx, cublasGemmEx(h->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, n, x,
                                CUDA_R_16BF, k, &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CUCO_NCCL(ctx, ncclAllReduce(y, y, (size_t)m * n, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  Handles* h = static_cast<Handles*>(ctx->state);
  CUCO_CUBLAS(ctx, cublasDestroy(h->blas));
  delete h;
  ctx->state = nullptr;
  return 0;
}
