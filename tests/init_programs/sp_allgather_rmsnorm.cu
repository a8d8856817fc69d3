// Sequence parallelism into a tensor-parallel block: every rank holds T/world tokens of the hidden states; they
// are all-gathered along the tokens, then normalised with RMSNorm (fp32 weights, bf16 activations) for the
// block's first GEMM. The gathered copy is the program's own staging; the normalised rows are its result.
#include <cuda_bf16.h>

#include "cuco.h"

constexpr int kThreads = 256;

// One block per row: y = x * rsqrt(mean(x^2) + eps) * gamma.
__global__ void rmsnorm(const __nv_bfloat16* __restrict__ x, const float* __restrict__ gamma,
                        __nv_bfloat16* __restrict__ y, int64_t rows, int64_t hidden, float eps) {
  __shared__ float partial[kThreads];
  const int64_t row = blockIdx.x;
  if (row >= rows) return;
  const __nv_bfloat16* in = x + row * hidden;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = __bfloat162float(in[j]);
    sum += v * v;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / hidden + eps);
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    y[row * hidden + j] = __float2bfloat16(__bfloat162float(in[j]) * scale * gamma[j]);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  const int64_t tokens = cuco_param(ctx, "T"), hidden = cuco_param(ctx, "H");
  const int64_t localTokens = tokens / ctx->nRanks;
  cuco_buffer_t* shard = cuco_buffer(ctx, "x");
  cuco_buffer_t* gathered = cuco_buffer(ctx, "x_full");
  const float* gamma = (const float*)cuco_buffer(ctx, "gamma")->ptr;
  __nv_bfloat16* out = (__nv_bfloat16*)cuco_buffer(ctx, "y")->ptr;
  CUCO_NCCL(ctx, ncclAllGather(shard->ptr, gathered->ptr, localTokens * hidden, ncclBfloat16, ctx->comm,
                               ctx->stream));
  rmsnorm<<<(unsigned)tokens, kThreads, 0, ctx->stream>>>((const __nv_bfloat16*)gathered->ptr, gamma, out, tokens,
                                                          hidden, 1e-6f);
  CUCO_CUDA(ctx, cudaGetLastError());
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
