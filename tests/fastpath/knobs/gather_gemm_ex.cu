// gemm_allgather as users write it with cuBLAS directly: all-gather the activations' rows, then C = A B in the
// row-major idiom (column-major C^T = B^T A^T, so the gathered A is cuBLAS's B, transb N): every gathered row is a
// column of that B, and the GEMM can run on the rows of each rank's block as they land.
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
  const int M = (int)cuco_param(ctx, "M"), K = (int)cuco_param(ctx, "K");
  const int nLocal = (int)(cuco_param(ctx, "N") / ctx->nRanks);
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *b = cuco_buffer(ctx, "b"), *c = cuco_buffer(ctx, "c");
  cuco_buffer_t* gathered = cuco_buffer(ctx, "a_gathered");
  const float one = 1.0f, zero = 0.0f;
  CUCO_NCCL(ctx, ncclAllGather(a->ptr, gathered->ptr, (size_t)(M / ctx->nRanks) * K, ncclBfloat16, ctx->comm,
                               ctx->stream));
  CUCO_CUBLAS(ctx, cublasGemmEx(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, nLocal, M, K, &one, b->ptr, CUDA_R_16BF, nLocal,
                                gathered->ptr, CUDA_R_16BF, K, &zero, c->ptr, CUDA_R_16BF, nLocal, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  delete s;
  return 0;
}
