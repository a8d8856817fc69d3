/*************************************************************************
 * GEMM + AllGather, host-driven (the starting point of co-design).
 *
 * Each rank all-gathers A along M with ncclAllGather, then computes C_r = A @ B_r with cuBLAS, both on
 * ctx->stream, one after the other: communication and computation never overlap.
 *
 * Buffers (workload.toml): a [M/world, K], b [K, N/world], c [M, N/world], a_gathered [M, K]; bf16, row-major.
 * Evolve blocks: the state and the entry points' bodies; includes and signatures are frozen.
 *************************************************************************/

#include "cuco.h"
#include "cuco_gemm.h"

// EVOLVE-BLOCK-START
struct State {
  cublasHandle_t blas;
};
// EVOLVE-BLOCK-END

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = new State();
  ctx->state = s;
  CUCO_CUBLAS(ctx, cublasCreate(&s->blas));
  CUCO_CUBLAS(ctx, cublasSetStream(s->blas, ctx->stream));
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  const int64_t M = cuco_param(ctx, "M"), K = cuco_param(ctx, "K"), N = cuco_param(ctx, "N");
  const int64_t nLocal = N / ctx->nRanks;
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *b = cuco_buffer(ctx, "b"), *c = cuco_buffer(ctx, "c");
  cuco_buffer_t* aFull = cuco_buffer(ctx, "a_gathered");
  const size_t shardElems = (size_t)(M / ctx->nRanks) * K;
  CUCO_NCCL(ctx, ncclAllGather(a->ptr, aFull->ptr, shardElems, ncclBfloat16, ctx->comm, ctx->stream));
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, aFull->ptr, b->ptr, c->ptr, M, K, nLocal));
  return 0;
  // EVOLVE-BLOCK-END
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {
  // EVOLVE-BLOCK-START
  State* s = (State*)ctx->state;
  CUCO_CUBLAS(ctx, cublasDestroy(s->blas));
  delete s;
  ctx->state = NULL;
  return 0;
  // EVOLVE-BLOCK-END
}
