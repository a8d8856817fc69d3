/*************************************************************************
 * GEMM + AllGather, host-driven with two streams: the best a careful engineer does from the host.
 *
 * The shard of A this rank already holds is multiplied at once on ctx->stream, while ctx->sideStreams[0]
 * receives the peers' shards in kChunks pieces (grouped ncclSend/ncclRecv). Each received piece has an
 * event; the compute stream waits for it and multiplies just those rows. Fork and join with events,
 * so the run is self-contained whatever the caller does around it.
 *
 * Requires: one side stream; M divisible by world (workload.toml).
 *************************************************************************/

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_program.cuh"

// Pieces each peer's shard is received in. More pieces start the GEMM earlier but make it smaller;
// 4 keeps every piece of the 8192-row shapes at 1024 rows, which cuBLAS still runs near peak.
#define K_CHUNKS 4
static_assert(K_CHUNKS <= cuco::kMaxChunks, "an event per piece");

struct State : cuco::Common<> {};  // chunkReady[j]: piece j of every peer's shard received

// One side stream (checked by the runner before cuco_setup).
CUCO_EXPORT void cuco_needs(cuco_needs_t* needs) { needs->sideStreams = 1; }

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  return cuco::newState(ctx, &s, 0);
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const int rank = ctx->rank, nRanks = ctx->nRanks;
  const int64_t mLocal = M / nRanks, nLocal = N / nRanks;
  const size_t rowBytes = (size_t)K * 2;  // bf16
  char* a = (char*)cuco_buffer(ctx, "a")->ptr;
  char* aFull = (char*)cuco_buffer(ctx, "a_gathered")->ptr;
  const char* b = (const char*)cuco_buffer(ctx, "b")->ptr;
  char* c = (char*)cuco_buffer(ctx, "c")->ptr;
  const size_t cRowBytes = (size_t)nLocal * 2;
  cudaStream_t comm = ctx->sideStreams[0];

  CUCO_CUDA(ctx, cuco::streamAfter(comm, ctx->stream, s->fork));
  for (int j = 0; j < K_CHUNKS; j++) {
    const int64_t r0 = mLocal * j / K_CHUNKS, r1 = mLocal * (j + 1) / K_CHUNKS;
    if (r1 > r0) {
      CUCO_NCCL(ctx, ncclGroupStart());
      for (int p = 0; p < nRanks; p++) {
        if (p == rank) continue;
        CUCO_NCCL(ctx, ncclSend(a + r0 * rowBytes, (r1 - r0) * K, ncclBfloat16, p, ctx->comm, comm));
        CUCO_NCCL(ctx, ncclRecv(aFull + (p * mLocal + r0) * rowBytes, (r1 - r0) * K, ncclBfloat16, p, ctx->comm, comm));
      }
      CUCO_NCCL(ctx, ncclGroupEnd());
    }
    CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[j], comm));
  }
  // Local rows first, straight from A's own shard: no communication needed.
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, a, b, c + rank * mLocal * cRowBytes, mLocal, K, nLocal));
  for (int j = 0; j < K_CHUNKS; j++) {
    const int64_t r0 = mLocal * j / K_CHUNKS, r1 = mLocal * (j + 1) / K_CHUNKS;
    CUCO_CUDA(ctx, cudaStreamWaitEvent(ctx->stream, s->chunkReady[j], 0));
    if (r1 == r0) continue;
    for (int p = 0; p < nRanks; p++) {
      if (p == rank) continue;
      const int64_t row = p * mLocal + r0;
      CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, aFull + row * rowBytes, b, c + row * cRowBytes, r1 - r0, K, nLocal));
    }
  }
  CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, comm, s->join));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
