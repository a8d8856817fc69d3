// gemm_allreduce (decode) with the program's own check macros for CUDA, cuBLAS and NCCL, as in a standalone
// tool: the GEMM's output is all-reduced in place.
#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"

#define CHECK_CUBLAS(call) \
  do {                     \
    if ((call) != CUBLAS_STATUS_SUCCESS) return 1; \
  } while (0)
#define CHECK_NCCL(call) \
  do {                   \
    if ((call) != ncclSuccess) return 1; \
  } while (0)

struct State {
  cublasHandle_t blas;
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  CHECK_CUBLAS(cublasCreate(&s->blas));
  CHECK_CUBLAS(cublasSetStream(s->blas, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t m = cuco_param(ctx, "M"), k = cuco_param(ctx, "K"), n = cuco_param(ctx, "N");
  cuco_buffer_t* cb = cuco_buffer(ctx, "c");
  __nv_bfloat16* out = (__nv_bfloat16*)cb->ptr;
  CHECK_CUBLAS(cuco_gemm_bf16(s->blas, cuco_buffer(ctx, "a")->ptr, cuco_buffer(ctx, "b")->ptr, out, m,
                              k / ctx->nRanks, n));
  CHECK_NCCL(ncclAllReduce(out, out, (size_t)m * n, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CHECK_CUBLAS(cublasDestroy(s->blas));
  delete s;
  ctx->state = NULL;
  return 0;
}
