// gemm_allreduce as users write it with cuBLAS directly: the row-parallel layer's partial product y = x w in the
// row-major idiom (column-major y^T = w^T x^T, so the weights are cuBLAS's A, transa N), then an in-place all-reduce;
// the stream and the handle through variables of the program's own.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuco.h"

struct State {
  cublasHandle_t blas;
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cudaStream_t stream = ctx->stream;
  cublasHandle_t blas = s->blas;
  const int M = (int)cuco_param(ctx, "M"), N = (int)cuco_param(ctx, "N");
  const int k = (int)(cuco_param(ctx, "K") / ctx->nRanks);
  __nv_bfloat16* x = (__nv_bfloat16*)cuco_buffer(ctx, "a")->ptr;
  __nv_bfloat16* w = (__nv_bfloat16*)cuco_buffer(ctx, "b")->ptr;
  __nv_bfloat16* y = (__nv_bfloat16*)cuco_buffer(ctx, "c")->ptr;
  const float one = 1.0f, zero = 0.0f;
  CUCO_CUBLAS(ctx, cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, k, &one, w, CUDA_R_16BF, N, x, CUDA_R_16BF, k,
                                &zero, y, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CUCO_NCCL(ctx, ncclAllReduce(y, y, (size_t)M * N, ncclBfloat16, ncclSum, ctx->comm, stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  delete s;
  return 0;
}
