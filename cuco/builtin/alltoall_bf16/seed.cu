// Host-driven all-to-all: ncclAlltoAll from the host on the workload's buffers.
#include "cuco.h"

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N") / ctx->nRanks;  // elements per peer
  CUCO_NCCL(ctx, ncclAlltoAll(x->ptr, y->ptr, n, ncclBfloat16, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
