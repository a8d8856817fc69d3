// sendrecv_ring passed around the ring in steps, double-buffered: step i receives into bufs[(i + 1) % 2] while
// bufs[i % 2] is sent on. With one step per run (the workload's ring shift) the last receive lands in y.
#include "cuco.h"

struct State {
  void* spare;  // the second buffer of the pair
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  CUCO_CUDA(ctx, cudaMalloc(&s->spare, cuco_buffer(ctx, "y")->bytes));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N");
  const int next = (ctx->rank + 1) % ctx->nRanks;
  const int prev = (ctx->rank - 1 + ctx->nRanks) % ctx->nRanks;
  void* bufs[2] = {s->spare, y->ptr};
  CUCO_CUDA(ctx, cudaMemcpyAsync(bufs[0], x->ptr, x->bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  const int steps = 1;
  for (int i = 0; i < steps; i++) {
    CUCO_NCCL(ctx, ncclGroupStart());
    CUCO_NCCL(ctx, ncclSend(bufs[i % 2], n, ncclBfloat16, next, ctx->comm, ctx->stream));
    CUCO_NCCL(ctx, ncclRecv(bufs[(i + 1) % 2], n, ncclBfloat16, prev, ctx->comm, ctx->stream));
    CUCO_NCCL(ctx, ncclGroupEnd());
  }
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->spare));
  delete s;
  ctx->state = NULL;
  return 0;
}
