// allgather_bf16 into one of two halves of a scratch buffer, alternating between runs (a user overlapping the
// next gather with the consumer of the last one), then copied out: the receive offset depends on a counter
// the program keeps, not on the shape.
#include <cuda_bf16.h>

#include "cuco.h"

struct State {
  __nv_bfloat16* gathered;  // 2 x N: two alternating copies of the gathered vector
  int64_t runs;
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  CUCO_CUDA(ctx, cudaMalloc(&s->gathered, 2 * cuco_buffer(ctx, "y")->bytes));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N");
  __nv_bfloat16* slot = s->gathered + (s->runs++ % 2) * n;
  CUCO_NCCL(ctx, ncclAllGather(x->ptr, slot, n / ctx->nRanks, ncclBfloat16, ctx->comm, ctx->stream));
  CUCO_CUDA(ctx, cudaMemcpyAsync(y->ptr, slot, y->bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->gathered));
  delete s;
  ctx->state = NULL;
  return 0;
}
