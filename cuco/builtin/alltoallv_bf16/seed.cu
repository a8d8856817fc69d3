// Host-driven all-to-all with uneven blocks: the counts are data on the GPU, so the host first gathers every
// rank's counts, waits for them, computes the offsets, and then issues a group of ncclSend/ncclRecv.
#include "cuco.h"

#define MAX_RANKS 8

struct State {
  int64_t* allCounts;  // device: every rank's counts, rank-major
  int64_t* hostCounts;  // pinned copy the host reads
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  if (ctx->nRanks > MAX_RANKS) CUCO_FAIL(ctx, "at most %d ranks", MAX_RANKS);
  State* s = new State();
  ctx->state = s;
  CUCO_CUDA(ctx, cudaMalloc(&s->allCounts, ctx->nRanks * ctx->nRanks * sizeof(int64_t)));
  CUCO_CUDA(ctx, cudaMallocHost(&s->hostCounts, ctx->nRanks * ctx->nRanks * sizeof(int64_t)));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *counts = cuco_buffer(ctx, "counts"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N"), world = ctx->nRanks, me = ctx->rank;
  CUCO_NCCL(ctx, ncclAllGather(counts->ptr, s->allCounts, world, ncclInt64, ctx->comm, ctx->stream));
  CUCO_CUDA(ctx, cudaMemcpyAsync(s->hostCounts, s->allCounts, world * world * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                 ctx->stream));
  CUCO_CUDA(ctx, cudaStreamSynchronize(ctx->stream));
  const int64_t* c = s->hostCounts;  // c[src * world + dst]
  int64_t sendAt = 0, recvAt = 0;
  char *xp = (char*)x->ptr, *yp = (char*)y->ptr;
  CUCO_NCCL(ctx, ncclGroupStart());
  for (int64_t p = 0; p < world; p++) {
    const int64_t out = c[me * world + p], in = c[p * world + me];
    CUCO_NCCL(ctx, ncclSend(xp + sendAt * 2, out, ncclBfloat16, (int)p, ctx->comm, ctx->stream));
    CUCO_NCCL(ctx, ncclRecv(yp + recvAt * 2, in, ncclBfloat16, (int)p, ctx->comm, ctx->stream));
    sendAt += out;
    recvAt += in;
  }
  CUCO_NCCL(ctx, ncclGroupEnd());
  CUCO_CUDA(ctx, cudaMemsetAsync(yp + recvAt * 2, 0, (n - recvAt) * 2, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->allCounts));
  CUCO_CUDA(ctx, cudaFreeHost(s->hostCounts));
  delete s;
  ctx->state = NULL;
  return 0;
}
