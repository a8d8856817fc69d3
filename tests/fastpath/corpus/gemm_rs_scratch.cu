// gemm_reducescatter as a user writes it: the partial products live in a buffer the program allocates itself,
// with typed pointers, and are reduce-scattered from there.
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"

struct State {
  cublasHandle_t blas;
  __nv_bfloat16* partials;  // M x N: this rank's A_r @ B_r
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  const size_t bytes = (size_t)cuco_param(ctx, "M") * cuco_param(ctx, "N") * sizeof(__nv_bfloat16);
  CUCO_CUDA(ctx, cudaMalloc(&s->partials, bytes));
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const __nv_bfloat16* A = (const __nv_bfloat16*)cuco_buffer(ctx, "a")->ptr;
  const __nv_bfloat16* B = (const __nv_bfloat16*)cuco_buffer(ctx, "b")->ptr;
  __nv_bfloat16* C = (__nv_bfloat16*)cuco_buffer(ctx, "c")->ptr;
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, A, B, s->partials, M, K / ctx->nRanks, N));
  CUCO_NCCL(ctx, ncclReduceScatter(s->partials, C, (size_t)(M / ctx->nRanks) * N, ncclBfloat16, ncclSum, ctx->comm,
                                   ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  CUCO_CUDA(ctx, cudaFree(s->partials));
  delete s;
  ctx->state = NULL;
  return 0;
}
