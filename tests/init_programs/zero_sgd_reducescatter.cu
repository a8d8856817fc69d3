// A ZeRO-style optimizer step: every rank holds the gradient of the whole flat parameter vector; the gradients
// are summed across ranks and each rank keeps its N/world shard (ncclReduceScatter into a staging buffer the
// program allocates itself), then a kernel applies SGD with momentum to this rank's shard of the parameters,
// writing the new parameters and the new momentum.
#include "cuco.h"

struct Staging {
  float* grad;  // this rank's shard of the summed gradient
};

__global__ void sgdMomentum(const float* g, const float* param, const float* mom, float* paramOut, float* momOut,
                            int64_t n, float lr, float beta) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = beta * mom[i] + g[i];
    momOut[i] = v;
    paramOut[i] = param[i] - lr * v;
  }
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  Staging* s = new Staging();
  ctx->state = s;
  const int64_t shard = cuco_param(ctx, "N") / ctx->nRanks;
  CUCO_CUDA(ctx, cudaMalloc(&s->grad, shard * sizeof(float)));
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  Staging* s = (Staging*)ctx->state;
  const int64_t total = cuco_param(ctx, "N");
  const int64_t shard = total / ctx->nRanks;
  float* grad = (float*)cuco_buffer(ctx, "grad")->ptr;
  float* param = (float*)cuco_buffer(ctx, "param")->ptr;
  float* mom = (float*)cuco_buffer(ctx, "momentum")->ptr;
  float* newParam = (float*)cuco_buffer(ctx, "new_param")->ptr;
  float* newMom = (float*)cuco_buffer(ctx, "new_momentum")->ptr;
  CUCO_NCCL(ctx, ncclReduceScatter(grad, s->grad, shard, ncclFloat, ncclSum, ctx->comm, ctx->stream));
  sgdMomentum<<<264, 256, 0, ctx->stream>>>(s->grad, param, mom, newParam, newMom, shard, 0.01f, 0.9f);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  Staging* s = (Staging*)ctx->state;
  CUCO_CUDA(ctx, cudaFree(s->grad));
  delete s;
  ctx->state = nullptr;
  return 0;
}
