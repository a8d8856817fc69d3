/*************************************************************************
 * GEMM + AllReduce at decode, host-driven (the starting point of co-design).
 *
 * Each rank computes its partial product A_r @ B_r into c with cuBLAS, then ncclAllReduce sums c in place
 * across ranks, both on ctx->stream, one after the other.
 *
 * Buffers (workload.toml): a [M, K/world], b [K/world, N], c [M, N]; bf16, row-major.
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
  cuco_buffer_t *a = cuco_buffer(ctx, "a"), *b = cuco_buffer(ctx, "b"), *c = cuco_buffer(ctx, "c");
  CUCO_CUBLAS(ctx, cuco_gemm_bf16(s->blas, a->ptr, b->ptr, c->ptr, M, K / ctx->nRanks, N));
  CUCO_NCCL(ctx, ncclAllReduce(c->ptr, c->ptr, (size_t)M * N, ncclBfloat16, ncclSum, ctx->comm, ctx->stream));
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
