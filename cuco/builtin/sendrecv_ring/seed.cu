// Host-driven ring shift: each rank sends x to the next rank and receives the previous rank's x into y,
// as one NCCL group of point-to-point calls.
#include "cuco.h"

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N");
  const int next = (ctx->rank + 1) % ctx->nRanks, prev = (ctx->rank + ctx->nRanks - 1) % ctx->nRanks;
  CUCO_NCCL(ctx, ncclGroupStart());
  CUCO_NCCL(ctx, ncclSend(x->ptr, n, ncclBfloat16, next, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclRecv(y->ptr, n, ncclBfloat16, prev, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclGroupEnd());
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
