// alltoall_bf16 as a loop over the peers that copies its own block and sends and receives the others' in a group.
#include <cuda_bf16.h>

#include "cuco.h"

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  const __nv_bfloat16* x = (const __nv_bfloat16*)cuco_buffer(ctx, "x")->ptr;
  __nv_bfloat16* y = (__nv_bfloat16*)cuco_buffer(ctx, "y")->ptr;
  const size_t block = (size_t)(cuco_param(ctx, "N") / ctx->nRanks);
  CUCO_NCCL(ctx, ncclGroupStart());
  for (int p = 0; p < ctx->nRanks; p++) {
    if (p == ctx->rank) {  // its own block: a copy, not a send to itself
      CUCO_CUDA(ctx, cudaMemcpyAsync(y + p * block, x + p * block, block * sizeof(__nv_bfloat16),
                                     cudaMemcpyDeviceToDevice, ctx->stream));
      continue;
    }
    CUCO_NCCL(ctx, ncclSend(x + p * block, block, ncclBfloat16, p, ctx->comm, ctx->stream));
    CUCO_NCCL(ctx, ncclRecv(y + p * block, block, ncclBfloat16, p, ctx->comm, ctx->stream));
  }
  CUCO_NCCL(ctx, ncclGroupEnd());
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
