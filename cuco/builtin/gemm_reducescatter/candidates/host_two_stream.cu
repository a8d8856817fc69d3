/*************************************************************************
 * GEMM + ReduceScatter, host-driven with two streams: the best a careful engineer does from the host.
 *
 * Each destination block of M/world rows is cut into kChunks row ranges. ctx->stream multiplies chunk j of
 * every block in one strided-batched GEMM into its own contiguous piece of `staging` (block p of the chunk
 * at p * rows * N), which is the layout ncclReduceScatter wants; ctx->sideStreams[0] reduce-scatters each
 * piece once its event fires, while the next chunk is multiplied. Fork and join with events, so the run is
 * self-contained whatever the caller does around it.
 *
 * Requires: one side stream; M divisible by world (workload.toml).
 *************************************************************************/

#include "cuco.h"
#include "cuco_gemm.h"
#include "cuco_program.cuh"

// Row ranges each destination block is cut into. More of them start the reduction earlier but make each
// GEMM smaller; 4 keeps every chunk of the 8192-row shapes at 4096 rows over the batch, which cuBLAS still
// runs near peak.
#define K_CHUNKS 4
static_assert(K_CHUNKS <= cuco::kMaxChunks, "an event per chunk");

struct State : cuco::Common<> {};  // chunkReady[j]: chunk j of every block multiplied

// One side stream (checked by the runner before cuco_setup).
CUCO_EXPORT void cuco_needs(cuco_needs_t* needs) { needs->sideStreams = 1; }

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  State* s;
  return cuco::newState(ctx, &s, 0);
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const int nRanks = ctx->nRanks;
  const int64_t mLocal = M / nRanks, kLocal = K / nRanks;
  const size_t elemBytes = 2;  // bf16
  const char* a = (const char*)cuco_buffer(ctx, "a")->ptr;
  const void* b = cuco_buffer(ctx, "b")->ptr;
  char* c = (char*)cuco_buffer(ctx, "c")->ptr;
  char* staging = (char*)cuco_buffer(ctx, "staging")->ptr;
  cudaStream_t comm = ctx->sideStreams[0];

  CUCO_CUDA(ctx, cuco::streamAfter(comm, ctx->stream, s->fork));
  for (int j = 0; j < K_CHUNKS; j++) {
    const int64_t r0 = mLocal * j / K_CHUNKS, r1 = mLocal * (j + 1) / K_CHUNKS, rows = r1 - r0;
    if (rows == 0) continue;
    // Chunk j's piece of staging starts after the nRanks * r0 rows of the chunks before it.
    char* piece = staging + (size_t)nRanks * r0 * N * elemBytes;
    CUCO_CUBLAS(ctx, cuco_gemm_bf16_batched(s->blas, a + r0 * kLocal * elemBytes, mLocal * kLocal, b, piece,
                                            rows * N, rows, kLocal, N, nRanks));
    CUCO_CUDA(ctx, cudaEventRecord(s->chunkReady[j], ctx->stream));
    CUCO_CUDA(ctx, cudaStreamWaitEvent(comm, s->chunkReady[j], 0));
    CUCO_NCCL(ctx, ncclReduceScatter(piece, c + r0 * N * elemBytes, (size_t)rows * N, ncclBfloat16, ncclSum,
                                     ctx->comm, comm));
  }
  CUCO_CUDA(ctx, cuco::streamAfter(ctx->stream, comm, s->join));
  return 0;
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco::deleteState<State>(ctx); }
