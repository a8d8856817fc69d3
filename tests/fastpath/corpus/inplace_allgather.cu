// allgather_bf16 in place, NCCL's idiom: this rank's block is first copied into its slot of y, and the send
// buffer is that slot (recvbuff + rank * sendcount).
#include <cuda_bf16.h>

#include "cuco.h"

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const size_t block = (size_t)(cuco_param(ctx, "N") / ctx->nRanks);
  __nv_bfloat16* all = (__nv_bfloat16*)y->ptr;
  __nv_bfloat16* mine = all + ctx->rank * block;
  CUCO_CUDA(ctx, cudaMemcpyAsync(mine, x->ptr, x->bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  CUCO_NCCL(ctx, ncclAllGather(mine, all, block, ncclBfloat16, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
