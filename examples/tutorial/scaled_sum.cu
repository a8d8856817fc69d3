// scaled_sum.cu: one step of a tensor-parallel layer, written against cuco's candidate ABI (cuco.h).
//
// Every rank scales its activations x by its own per-channel gain, the ranks sum the scaled activations
// (all-reduce), and every rank gathers every rank's row sums of its scaled shard (all-gather), e.g. for a norm.
//   partial = x * gain                         (bf16, T x H, this rank's)
//   out     = sum over ranks of partial        (bf16, T x H)
//   sums_r  = row sums of partial, in fp32     (T)
//   all_sums = [sums_0, sums_1, ...]           (fp32, world * T)
#include <cuda_bf16.h>

#include "cuco.h"

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t err = (call);                                                              \
    if (err != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err));         \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

#define CHECK_NCCL(call)                                                                   \
  do {                                                                                     \
    ncclResult_t res = (call);                                                             \
    if (res != ncclSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ncclGetErrorString(res));         \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

static const int kThreads = 256;

__global__ void scale_rows(const __nv_bfloat16* x, const __nv_bfloat16* gain, __nv_bfloat16* partial,
                           float* sums, int64_t rows, int64_t cols) {
  // One block per row: scale it, keep the bf16 product, and sum the products in fp32.
  __shared__ float warpSums[kThreads / 32];
  const int64_t row = blockIdx.x;
  float acc = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    __nv_bfloat16 p = __hmul(x[row * cols + c], gain[c]);
    partial[row * cols + c] = p;
    acc += __bfloat162float(p);
  }
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (threadIdx.x % 32 == 0) warpSums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kThreads / 32; w++) total += warpSums[w];
    sums[row] = total;
  }
}

struct State {
  __nv_bfloat16* partial;  // this rank's scaled activations
  float* sums;             // their row sums
};

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  const int64_t T = cuco_param(ctx, "T"), H = cuco_param(ctx, "H");
  State* s = new State();
  CHECK_CUDA(cudaMalloc(&s->partial, T * H * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&s->sums, T * sizeof(float)));
  ctx->state = s;
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t T = cuco_param(ctx, "T"), H = cuco_param(ctx, "H");
  const __nv_bfloat16* x = (const __nv_bfloat16*)cuco_buffer(ctx, "x")->ptr;
  const __nv_bfloat16* gain = (const __nv_bfloat16*)cuco_buffer(ctx, "gain")->ptr;
  __nv_bfloat16* out = (__nv_bfloat16*)cuco_buffer(ctx, "out")->ptr;
  float* allSums = (float*)cuco_buffer(ctx, "all_sums")->ptr;

  scale_rows<<<T, kThreads, 0, ctx->stream>>>(x, gain, s->partial, s->sums, T, H);
  CHECK_CUDA(cudaGetLastError());
  CHECK_NCCL(ncclAllReduce(s->partial, out, T * H, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
  CHECK_NCCL(ncclAllGather(s->sums, allSums, T, ncclFloat32, ctx->comm, ctx->stream));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CHECK_CUDA(cudaFree(s->partial));
  CHECK_CUDA(cudaFree(s->sums));
  delete s;
  return 0;
}
