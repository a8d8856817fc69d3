/*************************************************************************
 * KV-cache transfer, host-driven with two streams: the best a connector does from the host.
 *
 * The prefill rank computes layer l's K and V on ctx->stream and records an event; ctx->sideStreams[0] waits on
 * it and sends the layer while layer l+1 is computed. The decode rank receives each layer on ctx->stream and
 * scatters it into its pages at once. Only the last layer's transfer and scatter remain after prefill. Fork
 * and join with events, so the run is self-contained whatever the caller does around it.
 *
 * Buffers and layouts as in seed.cu. Requires: one side stream; KV*D a multiple of 8 (16-byte rows).
 *************************************************************************/

#include <cuda_bf16.h>

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_program.cuh"

constexpr int kVec = 8;         // bf16 values per 16-byte vector
constexpr int kThreads = 256;
constexpr int kMaxLayers = 128;  // events kept per layer; Llama-3-8B has 32 layers, the largest open models 126

// pool[page_of(t)][slot(t)] = kv[t] for every token t of one layer's K (half 0) and V (half 1).
__global__ void scatterToPages(const uint4* __restrict__ kv, uint4* __restrict__ pool, const int32_t* table,
                               int64_t S, int64_t page, int64_t rowVecs) {
  const int64_t perHalf = S * rowVecs;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < 2 * perHalf;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t half = i / perHalf, t = (i % perHalf) / rowVecs, v = i % rowVecs;
    const int64_t dst = ((int64_t)table[t / page] * 2 * page + half * page + t % page) * rowVecs + v;
    pool[dst] = kv[i];
  }
}

struct State : cuco::Common<kMaxLayers> {};  // chunkReady[l]: layer l's K and V computed

// One side stream (checked by the runner before cuco_setup).
CUCO_EXPORT void cuco_needs(cuco_needs_t* needs) { needs->sideStreams = 1; }

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  if (cuco_param(ctx, "L") > kMaxLayers) CUCO_FAIL(ctx, "at most %d layers, got %ld", kMaxLayers, (long)cuco_param(ctx, "L"));
  State* s;
  return cuco::newState(ctx, &s, 0);
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t S = cuco_param(ctx, "S"), L = cuco_param(ctx, "L"), HID = cuco_param(ctx, "HID");
  const int64_t cols = cuco_param(ctx, "KV") * cuco_param(ctx, "D"), page = cuco_param(ctx, "PAGE");
  const int64_t poolLayer = cuco_param(ctx, "POOL") * 2 * page * cols, stageLayer = 2 * S * cols;
  const int decode = ctx->nRanks - 1;
  const bool sends = decode != 0;
  __nv_bfloat16* stage = (__nv_bfloat16*)cuco_buffer(ctx, "kv_stage")->ptr;
  __nv_bfloat16* pool = (__nv_bfloat16*)cuco_buffer(ctx, "pool")->ptr;
  const int32_t* table = (const int32_t*)cuco_buffer(ctx, "block_table")->ptr;
  const int64_t rowVecs = cols / kVec;
  const int blocks = (int)((2 * S * rowVecs + kThreads - 1) / kThreads);
  cudaStream_t comm = ctx->sideStreams[0];

  CUCO_CUDA(ctx, cuco::streamAfter(comm, ctx->stream, s->fork));
  for (int64_t l = 0; l < L; l++) {
    __nv_bfloat16* kv = stage + l * stageLayer;
    if (ctx->rank == 0) {
      const __nv_bfloat16* x = (const __nv_bfloat16*)cuco_buffer(ctx, "x")->ptr;
      const __nv_bfloat16* wk = (const __nv_bfloat16*)cuco_buffer(ctx, "wk")->ptr;
      const __nv_bfloat16* wv = (const __nv_bfloat16*)cuco_buffer(ctx, "wv")->ptr;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, x, wk + l * HID * cols, kv, S, HID, cols));
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, x, wv + l * HID * cols, kv + S * cols, S, HID, cols));
      if (sends) {
        CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[l], ctx->stream));
        CUCO_CUDA(ctx, cudaStreamWaitEvent(comm, s->chunkReady[l], 0));
        CUCO_NCCL(ctx, ncclSend(kv, stageLayer, ncclBfloat16, decode, ctx->comm, comm));
      }
    }
    if (ctx->rank == decode) {
      if (sends) CUCO_NCCL(ctx, ncclRecv(kv, stageLayer, ncclBfloat16, 0, ctx->comm, ctx->stream));
      scatterToPages<<<blocks, kThreads, 0, ctx->stream>>>((const uint4*)kv, (uint4*)(pool + l * poolLayer), table,
                                                            S, page, rowVecs);
      CUCO_CUDA(ctx, cudaGetLastError());
    }
  }
  CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, comm, s->join));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
