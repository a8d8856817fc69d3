// allreduce_sum through a helper that wraps the NCCL call, as a library would: the buffer the collective sees is
// the helper's parameter.
#include "cuco.h"

static int allReduceSum(cuco_ctx_t* ctx, const void* in, void* out, size_t count) {
  CUCO_NCCL(ctx, ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  return allReduceSum(ctx, x->ptr, y->ptr, (size_t)cuco_param(ctx, "N"));
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
