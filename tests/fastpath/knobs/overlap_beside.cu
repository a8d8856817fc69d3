// allgather_bf16 with work of its own beside the all-gather: a kernel that zeroes a scratch buffer of the
// program's own touches none of the all-gather's buffers, so the all-gather may run on a side stream beside it;
// the kernel that adds the scratch into y uses the all-gather's output and must wait for it.
#include <cuda_bf16.h>

#include "cuco.h"

__global__ void zero(__nv_bfloat16* out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16(0.f);
}

__global__ void addInto(__nv_bfloat16* y, const __nv_bfloat16* add, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __hadd(y[i], add[i]);
}

struct State {
  __nv_bfloat16* scratch;
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s = new State();
  CUCO_CUDA(ctx, cudaMalloc(&s->scratch, cuco_param(ctx, "N") * sizeof(__nv_bfloat16)));
  ctx->state = s;
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  cuco_buffer_t *x = cuco_buffer(ctx, "x"), *y = cuco_buffer(ctx, "y");
  const int64_t n = cuco_param(ctx, "N") / ctx->nRanks;
  const int64_t all = cuco_param(ctx, "N");
  CUCO_NCCL(ctx, ncclAllGather(x->ptr, y->ptr, n, ncclBfloat16, ctx->comm, ctx->stream));
  zero<<<64, 256, 0, ctx->stream>>>(s->scratch, all);
  CUCO_CUDA(ctx, cudaGetLastError());
  addInto<<<64, 256, 0, ctx->stream>>>((__nv_bfloat16*)y->ptr, s->scratch, all);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->scratch));
  delete s;
  return 0;
}
