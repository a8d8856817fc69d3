/*************************************************************************
 * GEMM + AllGather, device-initiated at the conservative design point.
 *
 *   backend lsa (stores through NCCL 2.28 device-API windows) | placement deferred (all-gather kernel,
 *   then cuBLAS) | sync global (one LSA barrier per CTA, all ranks) | issuer cta | chunk: whole shard.
 *
 * allGatherLsaKernel pushes this rank's shard of A into slot `rank` of every rank's a_gathered window
 * with 16-byte stores through ncclGetLsaPointer, between two LSA barriers: the first makes sure no peer
 * is still reading a_gathered from its previous run, the second that every peer's stores have landed
 * before the GEMM reads them.
 *
 * Requires: a_gathered symmetric (a window); all ranks in one LSA team (one NVLink domain); a device
 * communicator with AG_CTA_COUNT LSA barriers (cuco_dev_requirements).
 *************************************************************************/
#include "cuco.h"
#include "cuco_gemm.h"

// CTA count must equal the device communicator's lsaBarrierCount: each CTA owns barrier blockIdx.x.
#define AG_CTA_COUNT 32
#define AG_THREADS_PER_CTA 512

struct State {
  cublasHandle_t blas;
};

__global__ void allGatherLsaKernel(ncclWindow_t gatherWin, const char* shard, size_t shardBytes, size_t slotOffset,
                                   ncclDevComm devComm) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), devComm, ncclTeamLsa(devComm), devComm.lsaBarrier,
                                         blockIdx.x};
  // Acquire: peers' reads of a_gathered in their previous run happen before our stores below.
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  const size_t nVec = shardBytes / sizeof(uint4);
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nThreads = (size_t)gridDim.x * blockDim.x;
  const uint4* src = (const uint4*)shard;
  for (int peer = 0; peer < devComm.lsaSize; peer++) {
    char* dst = (char*)ncclGetLsaPointer(gatherWin, slotOffset, peer);
    for (size_t i = tid; i < nVec; i += nThreads) ((uint4*)dst)[i] = src[i];
    for (size_t i = nVec * sizeof(uint4) + tid; i < shardBytes; i += nThreads) dst[i] = shard[i];  // tail bytes
  }
  // Release our stores to the peers; acquire theirs into our a_gathered before the GEMM reads it.
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

CUCO_EXPORT void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs) {
  reqs->lsaBarrierCount = AG_CTA_COUNT;
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  cuco_buffer_t* aFull = cuco_buffer(ctx, "a_gathered");
  if (!aFull || !aFull->symmetric) CUCO_FAIL(ctx, "a_gathered must be a symmetric buffer (a window)");
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  if (ctx->devComm.lsaSize != ctx->nRanks)
    CUCO_FAIL(ctx, "all %d ranks must share one LSA team; this one has %d", ctx->nRanks, ctx->devComm.lsaSize);
  return 0;
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *aFull = cuco_buffer(ctx, "a_gathered");
  const size_t shardBytes = a->bytes;
  allGatherLsaKernel<<<AG_CTA_COUNT, AG_THREADS_PER_CTA, 0, ctx->stream>>>(
      aFull->window, (const char*)a->ptr, shardBytes, (size_t)ctx->rank * shardBytes, ctx->devComm);
  CUCO_CUDA(ctx, cudaGetLastError());
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, aFull->ptr, cuco_buffer(ctx, "b")->ptr, cuco_buffer(ctx, "c")->ptr, M, K,
                                N / ctx->nRanks));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  delete s;
  ctx->state = NULL;
  return 0;
}
