// A host-driven all-reduce in a communication buffer the program allocates itself: copy in, ncclAllReduce in
// place, copy out, on allreduce_sum's buffers. The rules move that buffer to ncclMemAlloc plus a window.
#include "cuco.h"

struct State {
  void* scratch;  // N bf16: where the all-reduce happens
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  CUCO_CUDA(ctx, cudaMalloc(&s->scratch, cuco_buffer(ctx, "x")->bytes));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N");
  CUCO_CUDA(ctx, cudaMemcpyAsync(s->scratch, x->ptr, x->bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  CUCO_NCCL(ctx, ncclAllReduce(s->scratch, s->scratch, n, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
  CUCO_CUDA(ctx, cudaMemcpyAsync(y->ptr, s->scratch, y->bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->scratch));
  delete s;
  ctx->state = NULL;
  return 0;
}
