// A halo exchange as users write it: each rank sends x to both neighbours and receives both of theirs, the one
// from the previous rank into y (sendrecv_ring's output) and the one from the next into a halo buffer of its own.
// The receives are posted in the other order from the sends; NCCL pairs them by peer.
#include "cuco.h"

struct State {
  void* halo;  // N bf16: the next rank's x
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  ctx->state = s;
  CUCO_CUDA(ctx, cudaMalloc(&s->halo, cuco_buffer(ctx, "x")->bytes));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N");
  const int rank = ctx->rank, world = ctx->nRanks;
  const int left = (rank - 1 + world) % world;
  const int right = (rank + 1) % world;
  CUCO_NCCL(ctx, ncclGroupStart());
  CUCO_NCCL(ctx, ncclSend(x->ptr, n, ncclBfloat16, left, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclSend(x->ptr, n, ncclBfloat16, right, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclRecv(s->halo, n, ncclBfloat16, right, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclRecv(y->ptr, n, ncclBfloat16, left, ctx->comm, ctx->stream));
  CUCO_NCCL(ctx, ncclGroupEnd());
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->halo));
  delete s;
  ctx->state = NULL;
  return 0;
}
